"""`OptimizerMonitor`: gradient and parameter norms, right under FSDP2 and tensor parallel."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from trainkit.core import Callback, Event, Logger, State, Time
from trainkit.core.interval import interval_trigger
from trainkit.loggers._common import check_interval

__all__ = ["OptimizerMonitor", "OptimizerMonitorConfig", "l2_norms"]


@dataclass(kw_only=True)
class OptimizerMonitorConfig:
    interval: str | int | Time = "1ba"
    """How often: ``"1ba"``, ``"10ba"``, ... All ranks measure together (a collective per
    measurement under FSDP / tensor parallel)."""
    per_parameter: bool = False
    """Also log one norm per parameter (``l2_norm/grad/<name>``, ``l2_norm/param/<name>``)."""

    def __post_init__(self) -> None:
        check_interval(self.interval)


def _is_dtensor(tensor: torch.Tensor) -> bool:
    if not torch.distributed.is_available():
        return False
    from torch.distributed.tensor import DTensor

    return isinstance(tensor, DTensor)


def l2_norms(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """The L2 norm of each tensor, as one 1-D float32 tensor in input order.

    A `DTensor` (a parameter or gradient sharded by FSDP2 or tensor parallel) counts as
    its full tensor: the norms of the local shards are reduced over the device mesh by
    DTensor itself (``full_tensor()`` of the stacked norms), which handles sharded and
    replicated mesh dimensions alike. That is one collective per (mesh, placements) group,
    so every rank must call this with the same parameters. Nothing is copied to the host:
    the result stays on the device, and reading it is left to whoever logs it.
    """
    if not tensors:
        return torch.zeros(0)
    groups: dict[Any, list[int]] = {}
    for index, tensor in enumerate(tensors):
        where = (tensor.device_mesh, tensor.placements) if _is_dtensor(tensor) else tensor.device
        groups.setdefault((where, tensor.dtype), []).append(index)
    device = tensors[0].device
    if _is_dtensor(tensors[0]):
        device = tensors[0].to_local().device
    parts, order = [], []
    for (where, dtype), indices in groups.items():
        # Fused: one kernel per group (what clip_grad_norm_ uses); half precision summed in fp32.
        wide = torch.float32 if dtype in (torch.float16, torch.bfloat16) else None
        norms = torch._foreach_norm([tensors[i] for i in indices], 2, dtype=wide)
        stacked = torch.stack(list(norms))
        if not isinstance(where, torch.device):
            stacked = stacked.full_tensor()
        parts.append(stacked.to(device, torch.float32))
        order.extend(indices)
    flat = torch.cat(parts)
    return flat[torch.argsort(torch.tensor(order, device=device))]


class OptimizerMonitor(Callback, config=OptimizerMonitorConfig):
    """Logs the global L2 norms of the gradients and the parameters, every ``interval``.

    Keys: ``l2_norm/grad/global`` and ``l2_norm/param/global``; with ``per_parameter``
    also ``l2_norm/grad/<name>`` and ``l2_norm/param/<name>``. Measured at the end of the
    batch: the gradients are true gradients by then (a precision that scales the loss,
    ``amp_fp16``, has unscaled them in its optimizer step), and the parameters are the
    updated ones. Sharded parameters (FSDP2, tensor parallel DTensors) are measured as
    full tensors (see `l2_norms`); DDP gradients are already averaged. The norms stay on
    the device until a destination writes them. Options: `OptimizerMonitorConfig`.
    """

    config: OptimizerMonitorConfig

    def __init__(self, config: OptimizerMonitorConfig | None = None, /, **options: Any) -> None:
        super().__init__(config, **options)
        self._trigger = interval_trigger(self.config.interval, at_end=False)

    def batch_end(self, state: State, logger: Logger) -> None:
        if not self._trigger(state, Event.BATCH_END):
            return
        model = state.parallelism.unwrap(state.model)
        params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        grads = [(n, p.grad) for n, p in params if p.grad is not None]
        metrics: dict[str, torch.Tensor] = {}
        for kind, named in (("grad", grads), ("param", [(n, p.detach()) for n, p in params])):
            if not named:
                continue
            norms = l2_norms([t for _, t in named])
            metrics[f"l2_norm/{kind}/global"] = torch.linalg.vector_norm(norms)
            if self.config.per_parameter:
                for (name, _), norm in zip(named, norms, strict=True):
                    metrics[f"l2_norm/{kind}/{name}"] = norm
        logger.log_metrics(metrics)
