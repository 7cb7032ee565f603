"""The `ParallelStrategy` contract and the single-process strategy."""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from torch import nn

from trainkit.core import dist
from trainkit.core.config import Configurable

if TYPE_CHECKING:
    import torch

    from trainkit.core._engine import Engine
    from trainkit.core._precision import Precision
    from trainkit.core._state import State

__all__ = ["ParallelStrategy", "SingleProcess"]

_NO_SYNC = contextlib.nullcontext()


def _NOTHING_TO_REMOVE() -> None:
    pass


class ParallelStrategy(Configurable, abc.ABC):
    """How the model is placed across processes.

    ``prepare`` wraps or shards ``state.model`` in place (the model is already on
    ``state.device``, or on the meta device for a strategy that `materializes_meta`); the run then re-binds the optimizers to the new parameters by name.
    Subclass it, implement ``prepare`` and ``data_parallel_size``, and override the rest
    where the defaults (a single replica's behaviour) do not fit.
    """

    needs_process_group: ClassVar[bool] = False
    """True for strategies that communicate (DDP, FSDP, tensor parallel): run without a
    launcher, the Trainer then starts a one-rank process group for them (as Composer)."""

    materializes_meta: ClassVar[bool] = False
    """True for strategies that take a model on the meta device and allocate and initialise
    it part by part where its shards live (FSDP, with `trainkit.core.meta.materialize`); for
    the others the run materialises the whole model on ``state.device`` first."""

    runs_forward_backward: ClassVar[bool] = False
    """True for strategies whose forward and backward run together (pipeline parallel's
    schedule): the step then calls `forward_backward` instead of its own per microbatch."""

    def forward_backward(
        self, state: State, engine: Engine, microbatches: list, weights: list, share: Any
    ) -> torch.Tensor:
        """For a strategy that `runs_forward_backward`: forward, loss and backward of
        ``microbatches`` (each loss times its ``weights`` entry unless None, and times
        ``share`` in backward unless None), firing the events it supports; returns the
        weighted loss of ``state.batch``, the same on every rank that read it."""
        raise NotImplementedError(f"{type(self).__name__} does not run forward_backward")

    @abc.abstractmethod
    def prepare(self, state: State) -> None:
        """Wrap or shard ``state.model`` (and anything else the strategy owns)."""

    @property
    @abc.abstractmethod
    def data_parallel_size(self) -> int:
        """How many ranks read distinct data (all of them for DDP/FSDP; fewer under tensor
        parallel, where a group of ranks shares a batch). Samples and tokens are counted
        with it. Read after `prepare`."""

    @property
    def step_committed(self) -> bool:
        """Whether the last optimizer step was taken (default True). A fault-tolerant
        strategy skips a step that a failed replica did not finish; the loop then does not
        count it: no timestamp advance, no BATCH_END, and its data comes again."""
        return True

    def no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager[None]:
        """Skip gradient synchronisation (for all microbatches but the last)."""
        return _NO_SYNC

    def unwrap(self, model: nn.Module) -> nn.Module:
        """The user's module inside whatever `prepare` made of it."""
        return model

    def reset_after_oom(self, model: nn.Module) -> None:
        """Clear per-iteration state after an out-of-memory error, before the retry."""

    def add_oom_checkpoints(
        self, model: nn.Module, checkpoint: Callable[[], None]
    ) -> Callable[[], None]:
        """Call ``checkpoint()`` before each collective the strategy issues inside the
        forward and backward of ``model`` (what `prepare` made); return what removes them.

        Used with auto-microbatching on several ranks while the microbatch size is being
        searched: ``checkpoint`` raises `torch.OutOfMemoryError` on every rank still
        running when another rank ran out of memory, before this rank enters a collective
        that the failed rank will never join (see ``trainkit.trainer._oom``). It may be
        called from forward hooks, backward hooks and communication hooks. The default
        installs nothing: a strategy without collectives inside forward and backward.
        """
        return _NOTHING_TO_REMOVE

    def precision_for(self, precision: Precision) -> Precision:
        """The precision to train with under this strategy (e.g. with a sharded grad
        scaler); called once by `prepare_run` after `prepare`."""
        return precision

    def compile(self, model: nn.Module, options: Mapping[str, Any]) -> None:
        """``torch.compile`` what `prepare` made of ``model``, in place, with ``options``
        (the Trainer's ``compile``); called once by `prepare_run` after `prepare`.

        The default compiles the user's module (`unwrap`) in place with
        ``nn.Module.compile``: parameter names and state-dict keys stay as they were, and
        training, evaluation and prediction all call the compiled module. Sharding
        strategies compile each sharded block instead.
        """
        self.unwrap(model).compile(**options)


class SingleProcess(ParallelStrategy):
    """No wrapping, no synchronisation: each process trains its own model on its own data."""

    def prepare(self, state: State) -> None:
        pass

    @property
    def data_parallel_size(self) -> int:
        return dist.get_world_size()
