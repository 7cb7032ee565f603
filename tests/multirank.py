"""Run a function on N gloo ranks forked from the test process.

    def check(rank, world_size):
        ...  # runs inside an initialised process group
        return something_picklable

    results = run_ranks(check, world_size=2)   # [rank0_result, rank1_result]

Rules from shared/TESTING.md that keep forked ranks from hanging: every child calls
``torch.set_num_threads(1)`` first; a deadline after which children are SIGKILLed; the
process group is destroyed in a ``finally``.

No port is ever guessed: the parent starts a ``TCPStore`` on port 0 (the kernel picks a free
port and the parent holds it bound) and every rank joins it as a client, the way torchrun's
agent hosts the store for its workers. Inside a rank, `torchrun_env` describes that store
as torchrun variables, for tests of code that reads them.

Forking is refused while CUDA is visible or initialised in the parent: a forked child
cannot use CUDA, and fails in backward once the parent's autograd engine has started its
device threads. tests/conftest.py hides CUDA from CPU test runs (see docs/testing.md).
"""

from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import pickle
import signal
import time
import traceback
from collections.abc import Callable
from typing import Any

_HOST = "127.0.0.1"
_store_port: int | None = None  # the parent's store, while run_ranks runs (children inherit it)


def autograd_threads_started() -> bool:
    """Whether autograd's engine runs device threads (``pt_autograd_N``) in this process.

    Once it does, every backward in a forked child fails ("Unable to handle autograd's
    threading in combination with fork-based multiprocessing"). Linux names the threads in
    /proc; elsewhere this says False.
    """
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return False
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/comm") as comm:
                if comm.read().startswith("pt_autograd_"):
                    return True
        except OSError:  # the thread ended
            continue
    return False


def fork_context() -> Any:
    """The "fork" multiprocessing context, once the parent is known to be safe to fork.

    Every test helper that forks (ranks, killed and resumed runs) takes its context here.
    """
    import torch

    if torch.cuda.is_initialized() or torch.cuda.is_available():
        raise RuntimeError(
            "refusing to fork test processes while CUDA is visible to the test process: a "
            'forked child cannot use CUDA, and its backward fails ("Unable to handle '
            "autograd's threading in combination with fork-based multiprocessing\") once the "
            "parent has run one. CPU tests run with CUDA hidden (tests/conftest.py sets "
            "CUDA_VISIBLE_DEVICES=''); run GPU tests on their own with `uv run pytest -m gpu` "
            "and keep forking tests out of them (docs/testing.md)"
        )
    if autograd_threads_started():
        raise RuntimeError(
            "refusing to fork test processes: autograd's device threads run in the test "
            "process, so a forked child's backward would fail (\"Unable to handle autograd's "
            'threading in combination with fork-based multiprocessing"). The engine starts '
            "them once, at its first backward, if a non-CPU device counts then: CUDA, or "
            "AOTAutograd tracing with CUDA hidden (torch.compile, some torch.export and ONNX "
            "exports). tests/conftest.py runs a backward before any test so that on CPU it "
            "never does; something started them before that backward (docs/testing.md)"
        )
    return mp.get_context("fork")


def process_env(**extra: str) -> dict[str, str]:
    """The environment of a fresh interpreter that a test starts (`trainkit launch`, an
    example script): gloo on the loopback interface, one thread per process, CUDA hidden (so
    these tests train on CPU, GPU or not), a plain PATH, and Python's fault handler (a child
    that dies of a fatal signal, e.g. a C++ ``std::terminate``, prints every thread's Python
    stack to its stderr, which the failing test shows); then this process's PYTHONPATH,
    where it has one (trainkit installed with ``pip install --target``, as tools/gpu/gpu_checks.sh
    does on the GPU machine), and ``extra``."""
    env = {
        "GLOO_SOCKET_IFNAME": "lo",
        "OMP_NUM_THREADS": "1",
        "PATH": "/usr/bin:/bin",
        "CUDA_VISIBLE_DEVICES": "",
        "PYTHONFAULTHANDLER": "1",
    }
    if os.environ.get("PYTHONPATH"):
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return {**env, **extra}


def torchrun_env(rank: int, world_size: int) -> dict[str, str]:
    """Inside a rank: torchrun's variables for this job, pointing at the parent's store.

    As under torchrun, every rank connects to the store as a client (the agent store:
    ``TORCHELASTIC_USE_AGENT_STORE``); torch reads that flag, ``MASTER_ADDR`` and
    ``MASTER_PORT`` from ``os.environ``, so they are set there too (in this child only).
    """
    if _store_port is None:
        raise RuntimeError("torchrun_env() is for code running inside run_ranks()")
    env = {
        "RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_RANK": str(rank),
        "MASTER_ADDR": _HOST,
        "MASTER_PORT": str(_store_port),
    }
    os.environ.update(
        TORCHELASTIC_USE_AGENT_STORE="True", MASTER_ADDR=_HOST, MASTER_PORT=str(_store_port)
    )
    return env


def _child(
    fn: Callable[..., Any], rank: int, world_size: int, conn: Any, args: tuple, go: Any
) -> None:
    import torch

    torch.set_num_threads(1)
    import torch.distributed as dist

    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    status, payload = "ok", None
    try:
        assert _store_port is not None
        if not go.wait(60):
            raise RuntimeError("the parent did not finish starting the ranks within 60 s")
        timeout = datetime.timedelta(seconds=60)
        store = dist.TCPStore(_HOST, _store_port, world_size, is_master=False, timeout=timeout)
        # A prefix of its own: tests may start more groups on the same store (torchrun_env).
        store = dist.PrefixStore("multirank", store)
        dist.init_process_group(
            "gloo", store=store, rank=rank, world_size=world_size, timeout=timeout
        )
        # Gloo's mesh can be complete on one rank while another still reads its handshake: a
        # test that destroys the group at once (to start its own) then breaks the slower
        # rank's connection ("Connection closed by peer", seen on busy cores).
        dist.barrier()
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
    import torch.distributed as dist

    global _store_port
    ctx = fork_context()
    # Port 0: the kernel picks a free port, bound by this process before any rank needs it.
    store = dist.TCPStore(
        _HOST,
        0,
        world_size,
        is_master=True,
        timeout=datetime.timedelta(seconds=60),
        wait_for_workers=False,
    )
    _store_port = store.port
    pipes, procs = [], []
    # The ranks connect only once all are forked: the store's server thread, busy with a
    # connection while a fork happens, could hold a lock (malloc's) the child then waits on
    # forever.
    go = ctx.Event()
    try:
        for rank in range(world_size):
            receiver, sender = ctx.Pipe(duplex=False)
            proc = ctx.Process(
                target=_child, args=(fn, rank, world_size, sender, args, go), daemon=True
            )
            proc.start()
            sender.close()
            pipes.append(receiver)
            procs.append(proc)
    finally:
        _store_port = None
        go.set()
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
        del store  # the ranks are gone: stop serving
    if errors:
        raise AssertionError("\n\n".join(errors))
    return results
