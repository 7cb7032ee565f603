"""The run of the elastic launch tests (tests/integration/test_elastic_launch.py).

`trainkit launch` starts it as a script (``python elastic_job.py FOLDER JOURNAL [--kill-at B]
[--hold-at B]``) on each node's worker; the tests also run `train` in forked ranks for the
uninterrupted reference. A small classifier, a checkpoint after every batch, autoresume: a
restarted worker continues from the newest checkpoint.

The journal gets one JSON line per fit start and end (rank, world size, batch, the agent's
restart count, the node), so a test can tell what happened on each attempt.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from pathlib import Path

import torch

from toy import blobs, flat_params, loader, mlp
from trainkit.core import Callback
from trainkit.trainer import Trainer

BATCHES = 12  # 3 epochs of 4 batches per rank at world size 2


class Journal(Callback):
    """Records each attempt; once, rank 1 at world size 2 SIGKILLs itself after batch
    ``kill_at``, or stops after batch ``hold_at`` (before the next) and waits to be killed."""

    def __init__(self, path: Path, kill_at: int | None, hold_at: int | None) -> None:
        self.path, self.kill_at, self.hold_at = path, kill_at, hold_at
        self.restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))

    def _record(self, event: str, state, **extra) -> None:
        line = {
            "event": event,
            "rank": state.rank,
            "world": state.world_size,
            "batch": int(state.timestamp.batch),
            "restart": self.restart,
            "node": os.environ.get("ELASTIC_NODE", ""),
            **extra,
        }
        with open(self.path, "a") as stream:  # one short append per line: not interleaved
            stream.write(json.dumps(line) + "\n")

    def fit_start(self, state, logger) -> None:
        self._record("start", state)

    def fit_end(self, state, logger) -> None:
        self._record("end", state)
        if state.rank == 0:
            torch.save(flat_params(state.model), self.path.with_name("final.pt"))

    def _once(self, state, batch: int | None) -> bool:
        """Rank 1 at world size 2 from ``batch`` on, the first time in the whole test (a
        worker restarted for a membership change keeps restart count 0). From, not at: a
        node that joined late finds the run further on."""
        if batch is None or state.rank != 1 or state.world_size != 2:
            return False
        if int(state.timestamp.batch) < batch:
            return False
        try:
            self.path.with_name("fault").touch(exist_ok=False)
        except FileExistsError:
            return False
        return True

    def batch_end(self, state, logger) -> None:
        if self._once(state, self.kill_at):
            self._record("kill", state)
            os.kill(os.getpid(), signal.SIGKILL)  # no cleanup of any kind

    def batch_start(self, state, logger) -> None:
        # BATCH_START of batch hold_at + 1: checkpoint hold_at is published on every rank.
        if self._once(state, self.hold_at):
            self._record("hold", state, pid=os.getpid(), agent=os.getppid())
            while True:  # the test kills this node (agent and worker) now
                time.sleep(1)


def trainer(folder: Path, journal: Path, kill_at=None, hold_at=None) -> Trainer:
    return Trainer(
        model=mlp(dropout=0.0),
        train_dataloader=loader(blobs(128)),
        optimizers=None,
        max_duration=f"{BATCHES}ba",
        callbacks=[Journal(journal, kill_at, hold_at)],
        save_folder=str(folder),
        save_interval="1ba",
        autoresume=True,
        progress_bar=False,
        device="cpu",
        seed=7,
        python_log_level="warning",
    )


def train(folder: Path, journal: Path, kill_at=None, hold_at=None) -> torch.Tensor:
    run = trainer(folder, journal, kill_at, hold_at)
    run.fit()
    return flat_params(run.state.model)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("folder", type=Path)
    parser.add_argument("journal", type=Path)
    parser.add_argument("--kill-at", type=int)
    parser.add_argument("--hold-at", type=int)
    args = parser.parse_args()
    torch.set_num_threads(1)
    train(args.folder, args.journal, args.kill_at, args.hold_at)
