"""A fault-tolerant run on this machine: replica groups forked from this process around a
torchft lighthouse (itself a forked process), one group killed with SIGKILL every few
committed steps and started again (as its launcher would), the others never stopped.

Used by tests/parallel/test_fault_tolerant.py and bench/ft_goodput.py. Each group appends a
JSON line per committed step (its incarnation, the timestamp, the sample ids it trained on,
the time) to ``group<N>.jsonl`` and saves its final weights to ``group<N>.pt``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

from multirank import fork_context
from toy import mlp
from trainkit.core import Callback

FEATURES = 8


@dataclass(kw_only=True)
class ChaosRun:
    folder: Path
    groups: int = 3
    victim: int | None = 2
    """The group that is killed (None: no kills)."""
    kill_every: int = 6
    """The victim dies in the forward of the step after this many committed steps of each
    incarnation."""
    kills: int = 3
    samples: int = 120
    batch_size: int = 4
    max_duration: str = "4ep"
    step_time: float = 0.05
    """Seconds each forward sleeps: a step that takes as long as a small model's would."""
    heartbeat_ms: int = 500
    deadline: float = 150.0
    checkpoint: dict[str, Any] | None = None
    """Checkpointer options for group 0, the one that writes (None: no checkpoints)."""


@dataclass
class GroupResult:
    steps: list[dict[str, Any]]
    """Committed steps in order: incarnation, epoch, batch, sample ids, time."""
    weights: dict[str, torch.Tensor]
    incarnations: int
    exit_codes: list[int] = field(default_factory=list)


def dataset(samples: int) -> TensorDataset:
    """Blobs whose last feature is the sample's id (exact in float32)."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(samples, FEATURES, generator=generator)
    x[:, -1] = torch.arange(samples, dtype=torch.float32)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).long()
    return TensorDataset(x, y)


class Recorder(Callback):
    """Logs each committed step; sleeps in each forward; SIGKILLs itself in the forward after
    ``kill_after`` committed steps."""

    def __init__(self, path: Path, incarnation: int, kill_after: int | None, step_time: float):
        self.file = path.open("a", buffering=1)
        self.incarnation, self.kill_after, self.step_time = incarnation, kill_after, step_time
        self.committed = 0

    def after_forward(self, state, logger):
        if self.kill_after is not None and self.committed >= self.kill_after:
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(self.step_time)

    def batch_end(self, state, logger):
        self.committed += 1
        ids = state.batch[0][:, -1].round().long().tolist()
        stamp = state.timestamp
        record = {"inc": self.incarnation, "epoch": stamp.epoch, "batch": stamp.batch}
        self.file.write(json.dumps({**record, "ids": ids, "time": time.time()}) + "\n")


def _group(run: ChaosRun, group: int, incarnation: int, lighthouse: str) -> None:
    torch.set_num_threads(1)
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    code = 0
    try:
        from trainkit.checkpoint import Checkpointer
        from trainkit.parallel import FaultTolerant
        from trainkit.trainer import Trainer

        killed = run.victim == group and incarnation < run.kills
        recorder = Recorder(
            run.folder / f"group{group}.jsonl",
            incarnation,
            run.kill_every if killed else None,
            run.step_time,
        )
        callbacks: list[Any] = [recorder]
        if run.checkpoint is not None and group == 0:
            callbacks.append(Checkpointer(**run.checkpoint))
        model = mlp(features=FEATURES, seed=group)  # different weights: the first quorum syncs
        strategy = FaultTolerant(
            replica_group=group, lighthouse=lighthouse, hostname="127.0.0.1", timeout=10.0
        )
        trainer = Trainer(
            model=model,
            train_dataloader=DataLoader(
                dataset(run.samples), batch_size=run.batch_size, shuffle=True
            ),
            optimizers=torch.optim.AdamW(model.parameters(), lr=0.01),
            max_duration=run.max_duration,
            parallelism=strategy,
            callbacks=callbacks,
            device="cpu",
            progress_bar=False,
            seed=group,  # each group its own seed: the data order is its peers' after recovery
        )
        trainer.fit()
        torch.save(model.state_dict(), run.folder / f"group{group}.pt")
    except BaseException:
        (run.folder / f"group{group}.error").write_text(traceback.format_exc())
        code = 1
    os._exit(code)


def _lighthouse(conn: Any, heartbeat_ms: int) -> None:
    code = 0
    try:
        from torchft._torchft import LighthouseServer

        server = LighthouseServer(
            bind="0.0.0.0:0",
            min_replicas=1,
            join_timeout_ms=1000,
            quorum_tick_ms=10,
            heartbeat_timeout_ms=heartbeat_ms,
        )
        conn.send(server.address())
        conn.recv()  # until the parent says stop
    except BaseException:
        traceback.print_exc()
        code = 1
    os._exit(code)


def run_chaos(run: ChaosRun) -> dict[int, GroupResult]:
    """Run the groups to the end (restarting the victim after each kill); their results."""
    import torchft  # noqa: F401  (once here: each forked group then starts at once)

    ctx = fork_context()
    parent, child = ctx.Pipe()
    lighthouse = ctx.Process(target=_lighthouse, args=(child, run.heartbeat_ms), daemon=True)
    lighthouse.start()
    procs: dict[int, Any] = {}
    incarnations = dict.fromkeys(range(run.groups), 0)
    exit_codes: dict[int, list[int]] = {g: [] for g in range(run.groups)}
    try:
        if not parent.poll(30):
            raise RuntimeError("the lighthouse did not start within 30 s")
        address = parent.recv().replace("0.0.0.0", "127.0.0.1")

        def start(group: int) -> None:
            args = (run, group, incarnations[group], address)
            procs[group] = ctx.Process(target=_group, args=args, daemon=True)
            procs[group].start()

        for group in range(run.groups):
            start(group)
        deadline = time.monotonic() + run.deadline
        while procs:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the groups did not finish within {run.deadline:.0f} s")
            for group, proc in list(procs.items()):
                if proc.is_alive():
                    continue
                exit_codes[group].append(proc.exitcode)
                del procs[group]
                if proc.exitcode == -signal.SIGKILL and group == run.victim:
                    incarnations[group] += 1
                    start(group)  # what the group's launcher (torchrun) does
                elif proc.exitcode != 0:
                    error = run.folder / f"group{group}.error"
                    detail = error.read_text() if error.exists() else ""
                    raise RuntimeError(f"group {group} exited {proc.exitcode}\n{detail}")
            time.sleep(0.02)
    finally:
        for proc in procs.values():
            os.kill(proc.pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            parent.send("stop")
        lighthouse.join(5)
        if lighthouse.is_alive():
            os.kill(lighthouse.pid, signal.SIGKILL)
    return {
        g: _result(run.folder, g, incarnations[g] + 1, exit_codes[g]) for g in range(run.groups)
    }


def _result(folder: Path, group: int, incarnations: int, codes: list[int]) -> GroupResult:
    lines = (folder / f"group{group}.jsonl").read_text().splitlines()
    weights = torch.load(folder / f"group{group}.pt", weights_only=True)
    return GroupResult([json.loads(line) for line in lines], weights, incarnations, codes)
