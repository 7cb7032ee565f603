"""The Composer docs' Trainer examples, ported (examples/composer_*.py), run as a user runs
them: in a fresh interpreter on CPU, and the BERT one under `trainkit launch -n 2` (gloo),
where both ranks must end with one model and a run killed with SIGKILL resumes bitwise."""

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from multirank import process_env

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
ENV = process_env()


def accuracy(output: str) -> float:
    match = re.search(r"final eval accuracy: ([0-9.]+)", output)
    assert match, f"no final accuracy line in the output:\n{output[-3000:]}"
    return float(match.group(1))


def test_resnet_classifier_with_a_recipe_learns_and_saves(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            str(EXAMPLES / "composer_resnet.py"),
            "--save-folder",
            str(tmp_path / "run"),
            "--samples",
            "384",
            "--max-duration",
            "3ep",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=ENV,
    )
    assert result.returncode == 0, result.stderr[-8000:]
    assert accuracy(result.stdout) > 0.5  # 10 classes: chance is 0.1
    # save_num_checkpoints_to_keep=1: only the last checkpoint, and `latest` naming it.
    saved = (p.name for p in (tmp_path / "run").iterdir() if not p.name.startswith("goodput."))
    assert sorted(saved) == ["ep3-ba18", "latest"]  # and the Trainer's goodput ledger


def test_bert_fsdp_alone_starts_its_own_one_rank_group(tmp_path):
    # No launcher: as in Composer, FSDP on one device works; the Trainer starts the group.
    result = subprocess.run(
        [
            sys.executable,
            str(EXAMPLES / "composer_bert_fsdp.py"),
            "--save-folder",
            str(tmp_path / "run"),
            "--samples",
            "64",
            "--max-duration",
            "3ba",
            "--print-weights-digest",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=ENV,
    )
    assert result.returncode == 0, result.stderr[-8000:]
    assert re.search(r"rank 0 weights sha256: [0-9a-f]{64}", result.stdout)
    assert 0.0 <= accuracy(result.stdout) <= 1.0  # evaluated at the end of training
    assert (tmp_path / "run" / "ep0-ba3").is_dir()


BERT = [
    "-m",
    "trainkit.cli",
    "launch",
    "-n",
    "2",
    str(EXAMPLES / "composer_bert_fsdp.py"),
    "--samples",
    "256",  # 8 batches per rank per epoch
    "--max-duration",
    "4ep",
    "--save-interval",
    "4ba",
    "--print-weights-digest",
]


def digests(output: str) -> dict[int, str]:
    found = dict(re.findall(r"rank (\d) weights sha256: ([0-9a-f]{64})", output))
    return {int(rank): digest for rank, digest in found.items()}


def run_bert(folder: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *BERT, "--save-folder", str(folder)],
        capture_output=True,
        text=True,
        timeout=600,
        env=ENV,
    )


def kill_tree(root: int) -> list[int]:
    """SIGKILL ``root`` and every process below it (torchrun puts the ranks in sessions of
    their own, so killing the launcher's process group would leave them running)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            parents.setdefault(ppid, []).append(int(entry.name))
    tree, queue = [], [root]
    while queue:
        pid = queue.pop()
        tree.append(pid)
        queue.extend(parents.get(pid, []))
    for pid in tree:
        with contextlib.suppress(ProcessLookupError):  # already gone
            os.kill(pid, signal.SIGKILL)
    return tree


def test_bert_fsdp_under_launch_trains_one_model_and_resumes_bitwise_after_kill_9(tmp_path):
    full = run_bert(tmp_path / "full")
    assert full.returncode == 0, full.stderr[-8000:]
    out = full.stdout + full.stderr
    reference = digests(out)
    assert set(reference) == {0, 1} and reference[0] == reference[1]  # one model
    assert accuracy(out) > 0.9

    # The same run, killed with SIGKILL (the launcher and both ranks) once its first
    # checkpoint is published, then started again: autoresume continues from it.
    folder = tmp_path / "killed"
    process = subprocess.Popen(
        [sys.executable, *BERT, "--save-folder", str(folder)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=ENV,
        start_new_session=True,
    )
    latest = folder / "latest"
    deadline = time.monotonic() + 300
    try:
        while not latest.exists():
            assert process.poll() is None, "the run ended before its first checkpoint"
            assert time.monotonic() < deadline, "no checkpoint within 300 s"
            time.sleep(0.02)
    finally:
        killed = kill_tree(process.pid)
        process.wait()
    assert len(killed) >= 3  # the launcher and both ranks
    killed_at = latest.read_text().strip()
    assert killed_at != "ep4-ba32", "the run finished before it could be killed"

    resumed = run_bert(folder)
    assert resumed.returncode == 0, resumed.stderr[-8000:]
    assert digests(resumed.stdout + resumed.stderr) == reference
