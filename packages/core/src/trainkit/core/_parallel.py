"""The `ParallelStrategy` protocol and the single-process strategy."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from torch import nn

if TYPE_CHECKING:
    from trainkit.core._state import State

__all__ = ["ParallelStrategy", "SingleProcess"]


@runtime_checkable
class ParallelStrategy(Protocol):
    """How the model is placed across processes.

    ``prepare`` wraps or shards ``state.model`` in place (the model is already on
    ``state.device``); the Trainer then re-binds the optimizers to the new parameters by
    name. ``no_sync`` skips gradient synchronisation for all microbatches but the last.
    ``unwrap`` returns the user's module from whatever ``prepare`` made of it.

    Optional members: ``data_parallel_size`` (how many ranks read distinct data, when
    not all of them do, e.g. under tensor parallel; samples and tokens are counted with
    it) and ``reset(model)`` (called after an out-of-memory error, before the retry).
    """

    def prepare(self, state: State) -> None: ...

    def no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager[None]: ...

    def unwrap(self, model: nn.Module) -> nn.Module: ...


class SingleProcess:
    """One process, one device: nothing to wrap, nothing to synchronise."""

    def prepare(self, state: State) -> None:
        pass

    @contextlib.contextmanager
    def no_sync(self, model: nn.Module) -> Iterator[None]:
        yield

    def unwrap(self, model: nn.Module) -> nn.Module:
        return model
