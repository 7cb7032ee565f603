"""`DDP`: every rank holds the whole model; gradients are averaged across ranks."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils._pytree import tree_leaves

from trainkit.core import ParallelStrategy, State
from trainkit.parallel._common import check_not_wrapped, require_process_group
from trainkit.parallel._oom import ddp_checkpoints, reset_ddp_after_oom

__all__ = ["DDP", "DDPConfig"]

_SYNC_MODES = ("single_auto", "multi_auto", "forced")
_FORCED_ATTR = "_trainkit_forced_sync"


@dataclass(kw_only=True)
class DDPConfig:
    """The options of `DDP`."""

    find_unused_parameters: bool = False
    """Let DDP handle parameters that get no gradient in some steps (costs a graph walk)."""
    sync: str = "single_auto"
    """When gradients are synchronised under gradient accumulation:

    - ``"single_auto"``: during the last microbatch's backward only (fastest).
    - ``"multi_auto"``: during every microbatch's backward (the safe choice with
      ``find_unused_parameters=True`` when microbatches use different parameters).
    - ``"forced"``: once, after the last microbatch's backward, with one all-reduce of
      every gradient; works when ranks use different parameters, without
      ``find_unused_parameters``' cost in every backward.
    """

    def __post_init__(self) -> None:
        if self.sync not in _SYNC_MODES:
            raise ValueError(f"DDP sync {self.sync!r} is not known; use one of {list(_SYNC_MODES)}")
        if not isinstance(self.find_unused_parameters, bool):
            raise TypeError(
                f"find_unused_parameters must be a bool, got {self.find_unused_parameters!r}"
            )


class DDP(ParallelStrategy, config=DDPConfig):
    """Distributed data parallel (`torch.nn.parallel.DistributedDataParallel`).

    Each rank trains on its own slice of the data; gradients are averaged in backward, so
    every rank takes the same optimizer step. Rank 0's weights are copied to every rank
    when the Trainer is built. ``DDP(sync="forced")`` and ``DDP(DDPConfig(sync="forced"))``
    are the same.
    """

    config: DDPConfig
    needs_process_group = True

    def __init__(self, config: DDPConfig | None = None, /, **options: Any) -> None:
        super().__init__(config, **options)

    @property
    def data_parallel_size(self) -> int:
        """Every rank reads its own data."""
        return dist.get_world_size() if dist.is_initialized() else 1

    def prepare(self, state: State) -> None:
        """Wrap ``state.model`` in `DistributedDataParallel` (collective)."""
        require_process_group("DDP")
        check_not_wrapped(state.model, "DDP")
        device = state.device
        if device.type == "cuda":
            index = device.index if device.index is not None else torch.cuda.current_device()
            device_ids: list[int] | None = [index]
        else:
            device_ids = None
        wrapped = DistributedDataParallel(
            state.model,
            device_ids=device_ids,
            find_unused_parameters=self.config.find_unused_parameters,
        )
        if self.config.sync == "forced":
            _install_forced_sync(wrapped)
        state.model = wrapped

    def no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager[None]:
        """Skip gradient synchronisation (used for all microbatches but the last)."""
        forced = getattr(model, _FORCED_ATTR, None)
        if forced is not None:
            return forced.deferred()
        if self.config.sync == "multi_auto" or not isinstance(model, DistributedDataParallel):
            return contextlib.nullcontext()
        return model.no_sync()

    def reset_after_oom(self, model: nn.Module) -> None:
        """Let DDP's reducer start over after an interrupted backward."""
        reset_ddp_after_oom(model)

    def add_oom_checkpoints(
        self, model: nn.Module, checkpoint: Callable[[], None]
    ) -> Callable[[], None]:
        """Before each gradient bucket's all-reduce (`ddp_checkpoints`)."""
        if not isinstance(model, DistributedDataParallel):
            return super().add_oom_checkpoints(model, checkpoint)
        return ddp_checkpoints(model, checkpoint, getattr(model, _FORCED_ATTR, None))

    def unwrap(self, model: nn.Module) -> nn.Module:
        """The user's module inside the DDP wrapper."""
        return model.module if isinstance(model, DistributedDataParallel) else model


class _ForcedSync:
    """All-reduces every gradient once, after the backward of the last microbatch.

    DDP's own reducer stays off (``require_backward_grad_sync = False``); a hook on the
    forward's outputs queues the all-reduce to run when autograd has finished the backward.
    """

    def __init__(self, ddp: DistributedDataParallel):
        self.ddp = ddp
        self.defer = False
        self.queued = False
        self.checkpoint: Callable[[], None] | None = None  # see DDP.add_oom_checkpoints

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        previous, self.defer = self.defer, True
        try:
            yield
        finally:
            self.defer = previous

    def after_forward(self, module: nn.Module, inputs: Any, outputs: Any) -> None:
        if self.defer or not torch.is_grad_enabled() or not module.training:
            return
        self.queued = False
        tensors = [t for t in tree_leaves(outputs) if isinstance(t, torch.Tensor)]
        tensors = [t for t in tensors if t.requires_grad]
        if not tensors:
            raise TypeError(
                f"DDP(sync='forced') found no tensor that requires grad in the output of "
                f"{type(module).__name__} ({type(outputs).__name__}); it syncs gradients "
                "from a hook on the outputs. Return tensors (or tuples, lists, dicts of "
                "them), or use sync='single_auto'"
            )
        for tensor in tensors:
            tensor.register_hook(self._queue)

    def _queue(self, grad: torch.Tensor) -> None:
        if not self.queued:
            self.queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self.all_reduce)

    @torch.no_grad()
    def all_reduce(self) -> None:
        if self.checkpoint is not None:
            self.checkpoint()
        params = [p for p in self.ddp.module.parameters() if p.requires_grad]
        has_grad = torch.tensor(
            [p.grad is not None for p in params], dtype=torch.int32, device=params[0].device
        )
        # A parameter may get a gradient on some ranks only; it gets one on all of them.
        dist.all_reduce(has_grad, op=dist.ReduceOp.MAX)
        synced = [p for p, flag in zip(params, has_grad.tolist(), strict=True) if flag]
        for param in synced:
            if param.grad is None:
                param.grad = torch.zeros_like(param)
        grads = [p.grad for p in synced]
        # Sorted: every rank must issue the same all-reduces in the same order.
        for dtype in sorted({g.dtype for g in grads}, key=str):
            group = [g for g in grads if g.dtype == dtype]
            flat = torch.cat([g.reshape(-1) for g in group])
            dist.all_reduce(flat)
            flat /= dist.get_world_size()
            offset = 0
            for grad in group:
                grad.copy_(flat[offset : offset + grad.numel()].view_as(grad))
                offset += grad.numel()


def _install_forced_sync(ddp: DistributedDataParallel) -> None:
    forced = _ForcedSync(ddp)
    ddp.require_backward_grad_sync = False
    ddp.register_forward_hook(forced.after_forward)
    setattr(ddp, _FORCED_ATTR, forced)
