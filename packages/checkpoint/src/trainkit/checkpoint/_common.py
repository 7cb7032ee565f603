"""Small pieces shared by saving and loading: agreeing across ranks, DCP's quirks."""

from __future__ import annotations

import contextlib
import socket
import traceback
import warnings
from collections.abc import Callable, Iterator
from typing import TypeVar

from torch.distributed.checkpoint.api import CheckpointException

from trainkit.checkpoint._errors import CheckpointError
from trainkit.core import dist

__all__ = [
    "agreed",
    "is_node_leader",
    "on_rank0",
    "plain_error",
    "plain_errors",
    "shareable",
    "single_process_is_intended",
]

T = TypeVar("T")


def on_rank0(fn: Callable[[], T]) -> T:
    """``fn()`` run on rank 0; its result, or the error it raised, on every rank (collective)."""
    if dist.get_world_size() == 1:
        return fn()
    result: T | None = None
    error: BaseException | None = None
    if dist.get_rank() == 0:
        try:
            result = fn()
        except Exception as err:
            error = shareable(err)
    result, error = dist.broadcast_object((result, error))
    if error is not None:
        raise error
    return result  # type: ignore[return-value]


def agreed(fn: Callable[[], T]) -> T:
    """``fn()`` run on every rank; if it failed on any rank, an error on all (collective).

    For checks before a collective step: no rank goes on into it while another has failed.
    """
    if dist.get_world_size() == 1:
        return fn()
    result: T | None = None
    error: Exception | None = None
    try:
        result = fn()
    except Exception as err:
        error = shareable(err)
    errors = [e for e in dist.all_gather_object(error) if e is not None]
    if errors:
        raise error if error is not None else errors[0]
    return result  # type: ignore[return-value]


def shareable(err: Exception) -> Exception:
    """``err`` if it is one of ours (plain, safe to send to other ranks), else a `CheckpointError`."""
    if isinstance(err, CheckpointError) and type(err).__module__.startswith("trainkit."):
        return err
    return CheckpointError(f"{type(err).__name__}: {err}")


def is_node_leader() -> bool:
    """Whether this rank is the first of its machine (collective)."""
    # Host names rather than LOCAL_RANK: correct however the ranks were started.
    hosts = dist.all_gather_object(socket.gethostname())
    rank = dist.get_rank()
    return hosts.index(hosts[rank]) == rank


_SINGLE_PROCESS_WARNING = "torch.distributed is disabled, unavailable or uninitialized"


@contextlib.contextmanager
def single_process_is_intended(*, background: bool = False) -> Iterator[None]:
    """DCP warns on every call without a process group; one process is a supported layout.

    ``background``: the call goes on in DCP's own thread (an async save), after this
    context has ended, so the warning is filtered for the process instead, once, and only
    when no process group is running (this message, nothing else)."""
    if background and not dist.is_initialized():
        warnings.filterwarnings("ignore", message=_SINGLE_PROCESS_WARNING, category=UserWarning)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_SINGLE_PROCESS_WARNING)
        yield


@contextlib.contextmanager
def plain_errors(what: str) -> Iterator[None]:
    # DCP reports failures as CheckpointException, a BaseException that ordinary handlers
    # miss: surface our own errors as they are, and anything else as a CheckpointError.
    try:
        yield
    except CheckpointException as err:
        raise plain_error(err, what) from err


def release_frames(*errors: BaseException | None) -> None:
    """Drop the local variables of the finished frames in these errors' tracebacks (and
    their causes'); the tracebacks still name every file and line.

    A failed DCP write leaves its frames holding a memoryview of a ``BytesIO`` (DCP writes
    each non-tensor entry from ``getbuffer()``), in a reference cycle with the error. CPython
    3.12.1 (python/cpython#111049) crashes when its garbage collector breaks such a cycle;
    without the locals there is no cycle to break.
    """
    seen: set[int] = set()
    pending = list(errors)
    while pending:
        error = pending.pop()
        if error is None or id(error) in seen:
            continue
        seen.add(id(error))
        traceback.clear_frames(error.__traceback__)  # frames still running are skipped
        pending += [error.__cause__, error.__context__]


def plain_error(err: BaseException, what: str) -> BaseException:
    """``err`` as the error to raise: one of ours inside DCP's `CheckpointException` as it
    is, DCP's other failures as a `CheckpointError`, anything else unchanged."""
    if not isinstance(err, CheckpointException):
        return err
    causes = [exc for exc, _ in err.failures.values()]
    release_frames(err, *causes)
    for cause in causes:
        if isinstance(cause, CheckpointError):
            return cause
    summary = "; ".join(f"{type(c).__name__}: {c}" for c in causes)
    return CheckpointError(f"{what} failed: {summary}")
