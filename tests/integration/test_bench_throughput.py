"""bench/gpu_throughput.py on CPU: the figures it compares, and --trace's profile of the
steps after the timed ones (the GPU figures: tests/core/test_gpu_training.py)."""

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "gpu_throughput.py"


def test_trace_profiles_the_steps_after_the_timed_ones(tmp_path):
    out = tmp_path / "results.json"
    command = [
        sys.executable, str(BENCH), "--tiny", "--device", "cpu", "--steps", "2", "--warmup", "1",
        "--trace", "2", "--variants", "eager,trainer", "--json", str(out),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    results = {r["variant"]: r for r in json.loads(out.read_text())["results"]}
    for variant in ("eager", "trainer"):
        result = results[variant]
        assert result["tokens_per_s"] > 0
        profile = result["profile"]
        # CPU: operators and wall time, no device work.
        assert profile["wall_ms"] > 0
        assert profile["aten_ops"] > 10  # a GPT-2 step runs hundreds
        assert profile["device_ms"] == 0 and profile["kernels_ms"] == {}
    assert "per traced step" in done.stdout
    # Tracing adds steps after the timed ones; the loss reported is the last timed step's
    # in every variant, as without --trace.
    again = subprocess.run(
        [*command[: command.index("--trace")], "--variants", "eager", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert again.returncode == 0, again.stderr[-3000:]
    [untraced] = json.loads(out.read_text())["results"]
    assert "profile" not in untraced
    assert untraced["loss"] == results["eager"]["loss"]
