"""Runs shared by the checkpoint tests: a small classifier trained with a Checkpointer."""

from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, DistributedSampler

from multirank import fork_context
from toy import blobs, loader, mlp
from trainkit.checkpoint import Checkpointer, _write
from trainkit.checkpoint._commit import TMP_PREFIX
from trainkit.core import Callback, ParallelStrategy, dist
from trainkit.trainer import Trainer


class KillAt(Callback):
    """SIGKILLs the process at the end of batch ``batch``: no cleanup of any kind runs."""

    def __init__(self, batch: int):
        self.batch = batch

    def batch_checkpoint(self, state, logger):
        if state.timestamp.batch == self.batch:
            os.kill(os.getpid(), signal.SIGKILL)


def trainer(
    folder=None,
    *,
    callbacks=(),
    loggers=(),
    algorithms=(),
    model=None,
    max_duration="3ep",
    **checkpointer,
) -> Trainer:
    model = model or mlp(dropout=0.2)
    extra = [Checkpointer(folder=folder, **checkpointer)] if folder is not None else []
    return Trainer(
        model=model,
        train_dataloader=loader(blobs(128)),
        optimizers=torch.optim.AdamW(model.parameters(), lr=0.01),
        max_duration=max_duration,
        algorithms=list(algorithms),
        callbacks=[*extra, *callbacks],
        loggers=list(loggers),
        device_train_microbatch_size=8,
        progress_bar=False,
        device="cpu",
        seed=11,
    )


def takes_over_the_dead_run():
    """Expect the run resumed after a SIGKILL to take the folder's lock over from the
    killed run (which never let go of it), with a warning that says so."""
    return pytest.warns(
        UserWarning,
        match=r"took over the lock of run '[^']+' \(pid (\d+) on host .*\): process \1 is dead$",
    )


def writes_into(stream: Any, name: str) -> bool:
    """Whether a checkpoint writer's ``stream`` writes checkpoint ``name``: into its folder,
    or into the hidden one it is written in before it is published (``.tmp-<name>-<token>``).

    A part of the path is compared, not a substring: the token is random hex, so a test
    looking for "ba7" anywhere in the path also found it in other saves' tokens.
    """
    return any(
        part == name or part.startswith(f"{TMP_PREFIX}{name}-") for part in Path(stream.path).parts
    )


def abandon_while_writing(monkeypatch, checkpointer, name="ep0-ba4"):
    """Make ``checkpointer`` abandon the save of ``name`` while its shards are being written
    (as when a preemption's grace period runs out meanwhile)."""
    write = _write._DigestingStream.write

    def write_then_give_up(stream, data):
        if writes_into(stream, name):
            checkpointer.abandon("preempted")
        return write(stream, data)

    monkeypatch.setattr(_write._DigestingStream, "write", write_then_give_up)


def in_child(fn, *args) -> int:
    """Run ``fn(*args)`` in a forked process; return its exit code (-9 when SIGKILLed)."""

    def target():
        torch.set_num_threads(1)
        # A child that hangs prints every thread's stack (to the test's captured output)
        # and exits before the deadline below kills it without a trace.
        faulthandler.dump_traceback_later(100, exit=True)
        fn(*args)

    proc = fork_context().Process(target=target)  # refuses while CUDA is visible
    proc.start()
    proc.join(120)
    if proc.is_alive():
        proc.kill()
        proc.join()
        raise AssertionError("child run did not finish within 120 s")
    return proc.exitcode


def in_child_with_reply(fn, *args) -> tuple[int, Any]:
    """`in_child`, with a pipe's sending end as ``fn``'s first argument: the exit code and
    what the child sent (None if nothing)."""
    receiver, sender = fork_context().Pipe(duplex=False)
    status = in_child(fn, sender, *args)
    sender.close()
    return status, receiver.recv() if receiver.poll() else None


class Shard(ParallelStrategy):
    """FSDP2 on every Linear and the root: enough of a strategy to shard the checkpoint."""

    @property
    def data_parallel_size(self):
        return dist.get_world_size()

    def prepare(self, state):
        for module in state.model.modules():
            if isinstance(module, torch.nn.Linear):
                fully_shard(module)
        fully_shard(state.model)

    def no_sync(self, model):
        return contextlib.nullcontext()

    def unwrap(self, model):
        return model


def sharded_trainer(
    world: int, sharded: bool = True, *, callbacks=(), max_duration="3ba", **kwargs
) -> Trainer:
    """A run whose data is split over ``world`` ranks, sharded with FSDP2 unless told not to,
    with ``callbacks`` (a Checkpointer, ...) and the Trainer's other ``kwargs``."""
    data = blobs(128)
    sampler = DistributedSampler(data, shuffle=False) if world > 1 else None
    return Trainer(
        model=mlp(dropout=0.0, hidden=24),
        train_dataloader=DataLoader(data, batch_size=8, sampler=sampler),
        max_duration=max_duration,
        parallelism=Shard() if sharded else None,
        callbacks=list(callbacks),
        progress_bar=False,
        device="cpu",
        seed=2,
        **kwargs,
    )
