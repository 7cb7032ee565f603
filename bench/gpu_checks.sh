#!/usr/bin/env bash
# The GPU checks of issue 14 in one command, for a machine with a CUDA GPU and trainkit
# installed (`uv sync`, or the wheels on PYTHONPATH). Each step writes OUT/<step>.log;
# OUT/summary.txt gets one line per step (exit status, seconds).
#
#   bench/gpu_checks.sh OUT                       every step, in this order:
#     gpu_tests    pytest -m gpu (bf16/fp16, real-OOM auto-microbatching, compile, fp8,
#                  DDP/FSDP2 on NCCL, memory snapshots, the peak-memory target)
#     throughput   bench/gpu_throughput.py --repeats $REPEATS (default 2), all variants
#     default_run  `trainkit train` with its embedded defaults, in a fresh folder
#     cpu_suite    the CPU suite on this machine (CUDA visible: tests/conftest.py hides it)
#   bench/gpu_checks.sh OUT gpu_tests throughput  only those steps
#
# Budget (one H100, 2026-11-25): gpu_tests ~3 min; throughput ~45 s per variant and round
# (compiled ones more), so ~10 min for 2 rounds; default_run ~5 min; cpu_suite ~3 min on
# 12 workers. PYTHON picks the interpreter (default python3), WORKERS the suite's workers.
set -uo pipefail
out=${1:?usage: bench/gpu_checks.sh OUT [STEP ...]}
shift
steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(gpu_tests throughput default_run cpu_suite)
python=${PYTHON:-python3}
repo=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$repo"
export PYTHONUNBUFFERED=1

{
  nvidia-smi -L
  "$python" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
torch.cuda.get_device_name() if torch.cuda.is_available() else 'no CUDA device')"
} > "$out/env.txt" 2>&1

run_step() {
  local name=$1 start rc
  start=$(date +%s)
  case $name in
    gpu_tests) "$python" -m pytest -m gpu -v -p no:cacheprovider -rA tests ;;
    throughput) "$python" bench/gpu_throughput.py --repeats "${REPEATS:-2}" \
      --json "$out/throughput.json" ;;
    default_run) (cd "$(mktemp -d)" && "$python" -m trainkit.cli train \
      && cp runs/default/sample.txt "$out/sample.txt") ;;
    cpu_suite) "$python" -m pytest -n "${WORKERS:-12}" -v -p no:cacheprovider -rfE tests ;;
    *) echo "unknown step $name: use gpu_tests, throughput, default_run or cpu_suite"; false ;;
  esac > "$out/$name.log" 2>&1
  rc=$?
  echo "$name: exit $rc after $(( $(date +%s) - start )) s" | tee -a "$out/summary.txt"
}

for step in "${steps[@]}"; do run_step "$step"; done
