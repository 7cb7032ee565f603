#!/usr/bin/env bash
# The GPU checks of issue 14 in one command, for a machine with a CUDA GPU and trainkit
# installed (`uv sync`, or tools/gpu/device_prep.sh's .device carried along). Each step writes
# OUT/<step>.log; OUT/summary.txt gets one line per step (exit status, seconds).
#
#   tools/gpu/gpu_checks.sh OUT [STEP ...]
#     gpu_tests    pytest -m gpu (bf16/fp16, real-OOM auto-microbatching, compile, fp8,
#                  DDP/FSDP2 on NCCL, memory snapshots, the peak-memory target)
#     throughput   bench/gpu_throughput.py --repeats $REPEATS (default 1), the variants in
#                  $VARIANTS (default all)
#     diagnose     bench/throughput_diagnostics.py: throughput's options, and --trace $TRACE
#                  (default 0: no profile), --pyprofile $PYPROFILE (default 0), --phases
#                  when $PHASES is set; $VARIANTS may name its variants and changes
#     default_run  `trainkit train` with its embedded defaults, in a fresh folder
#     time_to_quality  bench/time_to_quality.py on the GPU preset (6 x 384, bf16, compile):
#                  --budget $TTQ_BUDGET (default 100 s) --seeds $TTQ_SEEDS (default 1),
#                  variants $TTQ_VARIANTS (default baseline,lm_fast), to OUT/ttq.json
#     cpu_suite    the CPU suite on this machine (CUDA visible: tests/conftest.py hides it
#                  from the CPU tests and their child processes)
#     STEP&        runs STEP in the background, beside the steps after it
#     wait         waits for the steps running in the background
#   With no STEP: cpu_suite& gpu_tests wait throughput default_run.
#
# The CPU suite never touches the GPU, so it can run beside gpu_tests or default_run (each
# pytest run gets a temporary folder of its own); the GPU steps run one at a time (the
# out-of-memory test fills the GPU, and throughput is timed). Each step is stopped after
# its limit (LIMIT_<step> seconds: gpu_tests 540, throughput and diagnose 540, default_run
# 480, cpu_suite 480), so one hung step cannot take a whole device call; both benches
# write each variant to OUT/throughput.json as it ends. BUDGET (seconds) stops every step
# at that long after the command began: set it a little under the device call's limit, so
# that the summary and the logs come back.
#
# Measured on one H100 (2026-11-25): gpu_tests 156 s. On one H200 (2026-11-28), with
# cpu_suite beside it (8 workers): gpu_tests 351 s, cpu_suite 441 s; throughput, a round
# of all variants, ~3.5 min (compile ~1 min, each other ~20 s, all in fresh processes).
# Again there, 12 workers: cpu_suite 410 s, gpu_tests beside it 419 s (one more test).
# Not measured there yet: default_run (estimate ~5 min). PYTHON picks the interpreter
# (default python3), WORKERS the suite's workers (default 8). On the lent GPU machine, run
# tools/gpu/device_prep.sh here first and carry .device (tools/gpu/README.md, "On the lent GPU
# machine").
set -uo pipefail
began=$(date +%s)
out=${1:?usage: tools/gpu/gpu_checks.sh OUT [STEP ...]}
shift
steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=("cpu_suite&" gpu_tests wait throughput default_run)
python=${PYTHON:-python3}
repo=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$repo"
export PYTHONUNBUFFERED=1

for step in "${steps[@]}"; do
  case ${step%&} in
    gpu_tests | throughput | diagnose | default_run | time_to_quality | cpu_suite | wait) ;;
    *) echo "unknown step '$step': use gpu_tests, throughput, diagnose, default_run," \
      "time_to_quality, cpu_suite" \
      "(each may end in &) or wait" >&2; exit 2 ;;
  esac
done

# What tools/gpu/device_prep.sh packed (trainkit's wheels and the dependencies the GPU image
# lacks), carried as .device: installed into a fresh folder put first on PYTHONPATH.
if [ -d .device/wheels ]; then
  site=${TRAINKIT_SITE:-/tmp/trainkit-site}
  rm -rf "$site" && mkdir -p "$site"
  { [ ! -f .device/site.tar.xz ] || xz -dc .device/site.tar.xz | tar -C "$site" -xf -; } &&
    "$python" -m pip install -q --no-index --no-deps --no-compile --target "$site" \
      .device/wheels/*.whl > "$out/install.log" 2>&1 ||
    { echo "installing .device failed: see $out/install.log" | tee -a "$out/summary.txt"; exit 1; }
  export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
fi

{
  nvidia-smi -L
  "$python" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
torch.cuda.get_device_name() if torch.cuda.is_available() else 'no CUDA device')"
  # Requirements the carried packages have on the image's versions (none of these stopped
  # the suite in the check recorded in bench/results/2026-11-28_cpu-2core_default-run.md; a failing import shows here first).
  echo "pip check:"
  "$python" -m pip check
} > "$out/env.txt" 2>&1

run_step() {
  local name=$1 start rc limit_var limit
  limit_var=LIMIT_$name
  case $name in
    gpu_tests | throughput | diagnose | time_to_quality) limit=540 ;; *) limit=480 ;;
  esac
  limit=${!limit_var:-$limit}
  start=$(date +%s)
  if [ -n "${BUDGET:-}" ] && [ $(( began + BUDGET - start )) -lt "$limit" ]; then
    limit=$(( began + BUDGET - start ))  # what is left of the whole command's budget
  fi
  if [ "$limit" -le 0 ]; then
    echo "$name: not run (BUDGET spent)" | tee -a "$out/summary.txt"; return
  fi
  case $name in
    gpu_tests) timeout -k 15 "$limit" "$python" -m pytest -m gpu -v -p no:cacheprovider -rA \
      --basetemp "$(mktemp -d)/gpu_tests" tests ;;
    throughput) timeout -k 15 "$limit" "$python" bench/gpu_throughput.py \
      --repeats "${REPEATS:-1}" --json "$out/throughput.json" \
      ${VARIANTS:+--variants "$VARIANTS"} ;;
    diagnose) timeout -k 15 "$limit" "$python" bench/throughput_diagnostics.py \
      --repeats "${REPEATS:-1}" --trace "${TRACE:-0}" --json "$out/throughput.json" \
      ${VARIANTS:+--variants "$VARIANTS"} ${PYPROFILE:+--pyprofile "$PYPROFILE"} \
      ${PHASES:+--phases} ;;
    default_run) (cd "$(mktemp -d)" && timeout -k 15 "$limit" "$python" -m trainkit.cli train \
      && cp runs/default/sample.txt "$out/sample.txt") ;;
    time_to_quality) timeout -k 15 "$limit" "$python" bench/time_to_quality.py \
      --budget "${TTQ_BUDGET:-100}" --seeds "${TTQ_SEEDS:-1}" --json "$out/ttq.json" \
      --variants "${TTQ_VARIANTS:-baseline,lm_fast}" ;;
    cpu_suite) timeout -k 15 "$limit" "$python" -m pytest -n "${WORKERS:-8}" -v \
      -p no:cacheprovider -rfE --basetemp "$(mktemp -d)/cpu_suite" tests ;;
  esac > "$out/$name.log" 2>&1
  rc=$?
  echo "$name: exit $rc after $(( $(date +%s) - start )) s$([ $rc -eq 124 ] && echo \
    " (stopped at its ${limit} s limit)")" | tee -a "$out/summary.txt"
}

for step in "${steps[@]}"; do
  case $step in
    wait) wait ;;
    *\&) run_step "${step%&}" & ;;
    *) run_step "$step" ;;
  esac
done
wait
