#!/usr/bin/env bash
# Packs what tools/gpu/gpu_checks.sh needs on the lent GPU machine and cannot get there (no
# network): trainkit's wheels, and the third-party distributions in tools/gpu/device_carry.txt
# at uv.lock's versions, installed here for CPython 3.12 on x86-64 Linux and compressed.
#
#   tools/gpu/device_prep.sh
#
# .device/ (which git ignores) then holds wheels/ (the seven packages and
# examples/third_party_algorithm) and site.tar.xz. Carry .device with the call (the device
# tool's `carry`); gpu_checks.sh installs both into a fresh folder on PYTHONPATH. The
# packed dependencies are rebuilt only when uv.lock, device_carry.txt or this script
# changed (~1 min: xz); the wheels every time (~5 s). A call carries at most 64 MiB with
# the working tree (~4 MiB): the script stops when .device is over 58 MiB.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
cd "$repo"
dir=$(mkdir -p .device && cd .device && pwd)
limit_mib=58

rm -rf "$dir/wheels"
uv build --quiet --all-packages --wheel -o "$dir/wheels"
uv build --quiet --wheel -o "$dir/wheels" examples/third_party_algorithm
ls "$dir/wheels"

stamp=$(cat uv.lock tools/gpu/device_carry.txt tools/gpu/device_prep.sh | sha256sum | cut -c1-16)
if [ -f "$dir/site.tar.xz" ] && [ "$(cat "$dir/site.stamp" 2>/dev/null)" = "$stamp" ]; then
  echo "site.tar.xz is current (uv.lock, device_carry.txt and this script unchanged)"
else
  rm -f "$dir/site.tar.xz" "$dir/site.stamp"
  # Each carried name at the version uv.lock resolves for Python 3.12 on Linux.
  uv export --quiet --frozen --no-hashes --all-packages --all-extras --all-groups \
    --format requirements-txt > "$dir/locked.txt"
  uv run --no-sync python - "$dir/locked.txt" tools/gpu/device_carry.txt > "$dir/carry.txt" <<'EOF'
import re
import sys

from packaging.requirements import Requirement

linux_312 = {
    "python_full_version": "3.12.3", "python_version": "3.12", "sys_platform": "linux",
    "platform_machine": "x86_64", "platform_system": "Linux", "os_name": "posix",
    "implementation_name": "cpython", "platform_python_implementation": "CPython",
    "extra": "",
}


def key(name):
    return re.sub(r"[-_.]+", "-", name).lower()


locked = {}
for line in open(sys.argv[1]):
    line = line.strip()
    if not line or line[0] in "#-" or "==" not in line:
        continue
    req = Requirement(line)
    if req.marker is None or req.marker.evaluate(linux_312):
        locked[key(req.name)] = str(req.specifier)
missing = []
for line in open(sys.argv[2]):
    line = line.split("#")[0].strip()
    if not line:
        continue
    name, _, version = line.partition("==")
    pin = f"=={version}" if version else locked.get(key(name))
    if pin is None:
        missing.append(name)
    print(f"{name}{pin}")
if missing:
    sys.exit(f"not in uv.lock for Python 3.12 on Linux: {', '.join(missing)}")
EOF
  site="$dir/site"
  rm -rf "$site"
  uv pip install --quiet --no-deps --no-compile --only-binary :all: --target "$site" \
    --python-version 3.12 --python-platform x86_64-manylinux_2_28 -r "$dir/carry.txt"
  echo "installed $(ls -d "$site"/*.dist-info | wc -l) distributions for 3.12; packing"
  rm -rf "$site/bin"  # their commands would start this machine's interpreter, not that one's
  tar -C "$site" -cf - . | xz -T0 -6e > "$dir/site.tar.xz"
  rm -rf "$site" "$dir/locked.txt"
  echo "$stamp" > "$dir/site.stamp"
fi

size=$(du -sm "$dir" | cut -f1)
echo "$dir: ${size} MiB (limit ${limit_mib})"
if [ "$size" -gt "$limit_mib" ]; then
  echo "too large to carry with the working tree: drop distributions from tools/gpu/device_carry.txt" >&2
  exit 1
fi
