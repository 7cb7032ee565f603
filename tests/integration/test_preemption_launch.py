"""End to end: ``trainkit launch -n 2`` sent SIGTERM mid-training, as a cluster does.

torchrun forwards the signal to both ranks; they stop after the same batch, save one
checkpoint, and the launch exits with 75. Real processes (~20 s: torch is imported by
every rank), so this is the only launch test of preemption; the rest is in
test_preemption.py on forked ranks.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import torch

from multirank import process_env
from toy import blobs, flat_params, loader, mlp
from trainkit.checkpoint import list_checkpoints, load_checkpoint
from trainkit.core import PREEMPTED_EXIT_CODE
from trainkit.trainer import Trainer

SCRIPT = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    import torch
    sys.path.insert(0, {tests!r})
    from toy import blobs, loader, mlp
    from trainkit.core import Callback
    from trainkit.trainer import Trainer
    from trainkit.checkpoint import Checkpointer

    class Marker(Callback):
        # Says training is under way (batch 3), then goes slowly so the signal lands mid-run.
        def batch_end(self, state, logger):
            if state.timestamp.batch == 3 and state.rank == 0:
                Path(sys.argv[2]).write_text("3")
            time.sleep(0.02)

    torch.manual_seed(0)
    model = mlp(dropout=0.0)
    Trainer(
        model=model,
        train_dataloader=loader(blobs(128)),
        max_duration="200ep",
        callbacks=[Checkpointer(folder=sys.argv[1], interval="4ba"), Marker()],
        progress_bar=False,
        device="cpu",
        seed=7,
        python_log_level="warning",
        preemption_grace_period=25,
    ).fit()
    """
)


def test_trainkit_launch_two_ranks_preempted_by_sigterm_saves_and_exits_75(tmp_path):
    script, folder, marker = tmp_path / "job.py", tmp_path / "ckpt", tmp_path / "started"
    script.write_text(SCRIPT.format(tests=str(Path(__file__).parents[1])))
    launch = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "trainkit.cli",
            "launch",
            "-n",
            "2",
            str(script),
            str(folder),
            str(marker),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=process_env(),
    )
    try:
        deadline = time.monotonic() + 180
        while not marker.exists() and launch.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert marker.exists(), "training never reached batch 3"
        launch.send_signal(signal.SIGTERM)  # to the launcher only, as Kubernetes does
        out, _ = launch.communicate(timeout=120)
    finally:
        if launch.poll() is None:
            launch.kill()
            launch.wait()
    assert launch.returncode == PREEMPTED_EXIT_CODE, out[-4000:]
    assert "trainkit launch: stopped by SIGTERM" in out
    stops = [line for line in out.splitlines() if "s from the signal to exit" in line]
    assert len(stops) == 2, out[-4000:]  # one line per rank
    batch = int(stops[0].split(" after batch ")[1].split(",")[0])
    assert all(f" after batch {batch}, checkpoint " in line for line in stops)
    assert any("[rank0]" in line and "preempted by SIGTERM" in line for line in stops)
    # The preemption checkpoint is the latest, and holds the state of that batch.
    latest = (folder / "latest").read_text().strip()
    assert latest.endswith(f"-ba{batch}") and latest in [p.name for p in list_checkpoints(folder)]
    saved = _load(folder / latest)
    assert saved["batch"] == batch and torch.isfinite(saved["params"]).all()


def _load(path):
    run = Trainer(
        model=mlp(dropout=0.0),
        train_dataloader=loader(blobs(128)),
        max_duration="200ep",
        progress_bar=False,
        device="cpu",
    )
    load_checkpoint(run.state, path, ignore_keys=["data", "rng"])  # saved by 2 ranks
    return {"batch": run.state.timestamp.batch, "params": flat_params(run.state.model)}
