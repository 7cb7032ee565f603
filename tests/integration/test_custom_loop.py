"""examples/custom_loop.py: killed mid-run, resumed, equals an uninterrupted run bitwise."""

import importlib.util
from pathlib import Path

import torch

from multirank import fork_context

EXAMPLE = Path(__file__).parents[2] / "examples" / "custom_loop.py"


def _load_example():
    spec = importlib.util.spec_from_file_location("custom_loop_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(argv, results):
    torch.set_num_threads(1)  # forked children stay single-threaded (TESTING.md)
    results.put(_load_example().main(argv))


def run_in_child(argv):
    ctx = fork_context()  # refuses while CUDA is visible (docs/testing.md)
    results = ctx.Queue()
    proc = ctx.Process(target=_run, args=(argv, results))
    proc.start()
    proc.join(180)
    digest = results.get(timeout=5) if proc.exitcode == 0 else None
    return proc.exitcode, digest


def test_killed_and_resumed_equals_uninterrupted(tmp_path):
    args = ["--max-duration", "2ep"]
    code, uninterrupted = run_in_child([*args, "--run-dir", str(tmp_path / "a")])
    assert code == 0

    code, _ = run_in_child([*args, "--run-dir", str(tmp_path / "b"), "--crash-at-batch", "45"])
    assert code == -9  # SIGKILL: nothing was cleaned up or flushed
    latest = (tmp_path / "b" / "checkpoints" / "latest").read_text().strip()
    assert latest == "ep1-ba40"

    code, resumed = run_in_child([*args, "--run-dir", str(tmp_path / "b")])
    assert code == 0
    assert resumed == uninterrupted
    lines = (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()
    assert lines  # the logger destination wrote metrics in both runs
