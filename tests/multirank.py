"""Run a function on N gloo ranks forked from the test process.

    def check(rank, world_size):
        ...  # runs inside an initialised process group
        return something_picklable

    results = run_ranks(check, world_size=2)   # [rank0_result, rank1_result]

Rules from shared/TESTING.md that keep forked ranks from hanging: every child calls
``torch.set_num_threads(1)`` first; a fresh free port per call; a deadline after which
children are SIGKILLed; the process group is destroyed in a ``finally``.
"""

from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import pickle
import signal
import socket
import time
import traceback
from collections.abc import Callable
from typing import Any


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _child(
    fn: Callable[..., Any], rank: int, world_size: int, port: int, conn: Any, args: tuple
) -> None:
    import torch

    torch.set_num_threads(1)
    import torch.distributed as dist

    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    status, payload = "ok", None
    try:
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=60),
        )
        payload = fn(rank, world_size, *args)
    except BaseException:
        status, payload = "error", traceback.format_exc()
    finally:
        try:
            if dist.is_initialized():
                dist.destroy_process_group()
        finally:
            # Plain pickle: torch's multiprocessing pickler would share tensors through file
            # descriptors that die with this process.
            try:
                conn.send_bytes(pickle.dumps((status, payload)))
            except Exception as err:  # unpicklable result
                conn.send_bytes(pickle.dumps(("error", f"could not send the result back: {err!r}")))
            conn.close()
            os._exit(0)  # skip pytest's atexit handlers inherited through fork


def run_ranks(
    fn: Callable[..., Any], world_size: int, *args: Any, timeout: float = 120.0
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` forked ranks; return their results."""
    ctx = mp.get_context("fork")
    port = free_port()
    pipes, procs = [], []
    for rank in range(world_size):
        receiver, sender = ctx.Pipe(duplex=False)
        proc = ctx.Process(
            target=_child, args=(fn, rank, world_size, port, sender, args), daemon=True
        )
        proc.start()
        sender.close()
        pipes.append(receiver)
        procs.append(proc)
    deadline = time.monotonic() + timeout
    results: list[Any] = [None] * world_size
    errors: list[str] = []
    try:
        for rank, receiver in enumerate(pipes):
            remaining = max(deadline - time.monotonic(), 0.0)
            if not receiver.poll(remaining):
                errors.append(f"rank {rank}: no result within {timeout:.0f} s (hung or crashed)")
                continue
            try:
                status, payload = pickle.loads(receiver.recv_bytes())
            except EOFError:
                errors.append(f"rank {rank}: exited without a result")
                continue
            if status == "ok":
                results[rank] = payload
            else:
                errors.append(f"rank {rank} failed:\n{payload}")
    finally:
        for proc in procs:
            proc.join(timeout=max(deadline - time.monotonic(), 0.1))
            if proc.is_alive():
                os.kill(proc.pid, signal.SIGKILL)
                proc.join()
    if errors:
        raise AssertionError("\n\n".join(errors))
    return results
