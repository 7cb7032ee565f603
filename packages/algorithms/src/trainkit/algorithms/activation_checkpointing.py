"""Activation memory for compute: recompute a block's activations in backward, keep only
the expensive ones, or keep them in CPU memory, under any strategy (or none).

Three modes, each applied to the model's repeated blocks (a transformer's layers) or to
the modules chosen:

- ``"full"``: keep only each block's inputs; backward runs the block's forward again
  (about one more forward per step).
- ``"selective"``: keep the outputs of the block's matrix multiplications and attention
  (the expensive operations), recompute the rest (norms, activations, dropout masks are
  replayed from the same RNG state): most of the memory saved for a fraction of the time
  (torch's selective activation checkpoint).
- ``"offload"``: recompute nothing; the tensors each block saves for backward go to CPU
  memory during forward and come back in backward (``torch.autograd.graph.save_on_cpu``):
  device memory for copies. On a CPU-only run there is nothing to gain.

The composable form is used (forward hooks on the module), so parameter names do not change:
checkpoints, optimizers and `FSDP` see the same model. `FSDP(activation_checkpointing=...)`
does "full" for FSDP's blocks; use one or the other, not both.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from trainkit.algorithms._passes import ComposableAlgorithm
from trainkit.core import Event, Logger, State, repeated_blocks
from trainkit.core.config import primary
from trainkit.core.messages import warn

__all__ = [
    "ActivationCheckpointing",
    "ActivationCheckpointingConfig",
    "apply_activation_checkpointing",
    "selective_policy",
]

MODES = ("full", "selective", "offload")
# What selective checkpointing keeps: the matmuls and attention (torchtitan keeps these too).
_SAVED_OPS = (
    "mm", "addmm", "bmm", "baddbmm",
    "_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_cudnn_attention",
)  # fmt: skip
_SAVED = {
    getattr(torch.ops.aten, name).default for name in _SAVED_OPS if hasattr(torch.ops.aten, name)
}


@dataclass(kw_only=True)
class ActivationCheckpointingConfig:
    """The options of `ActivationCheckpointing`."""

    mode: str = primary("full")
    """``"full"`` (recompute each block), ``"selective"`` (keep matmul and attention outputs,
    recompute the rest) or ``"offload"`` (keep everything, in CPU memory)."""
    modules: Sequence[type[nn.Module]] | Callable[[nn.Module], bool] | str = "auto"
    """Which modules: ``"auto"`` (each repeated block of a ModuleList, e.g. a transformer's
    layers), module classes, or a predicate ``module -> bool``."""

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(
                f"activation checkpointing mode {self.mode!r} is not known; use one of {list(MODES)}"
            )
        if isinstance(self.modules, str) and self.modules != "auto":
            raise ValueError(
                f"modules {self.modules!r}: use 'auto', module classes, or a callable "
                "module -> bool"
            )


def selective_policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> Any:
    """torch's selective-checkpoint policy: keep matmul and attention outputs, recompute the
    rest."""
    from torch.utils.checkpoint import CheckpointPolicy

    return CheckpointPolicy.MUST_SAVE if op in _SAVED else CheckpointPolicy.PREFER_RECOMPUTE


def apply_activation_checkpointing(
    model: nn.Module,
    mode: str = "full",
    modules: Sequence[type[nn.Module]] | Callable[[nn.Module], bool] | str = "auto",
) -> int:
    """Apply ``mode`` to ``model``'s chosen modules in place; returns how many (a model
    without any is warned about: the run goes on without checkpointing)."""
    ActivationCheckpointingConfig(mode=mode, modules=modules)  # checks both
    chosen = _choose(model, modules)
    if not chosen:
        warn(
            f"activation_checkpointing matched no module in {type(model).__name__}"
            + (
                " (no ModuleList of repeated blocks): give module classes or a callable "
                "module -> bool as modules"
                if modules == "auto"
                else ": no module matches the classes or predicate given"
            )
        )
    for module in chosen:
        if mode == "offload":
            _offload(module)
        else:
            from torch.distributed._composable import checkpoint
            from torch.utils.checkpoint import create_selective_checkpoint_contexts

            if mode == "full":
                checkpoint(module)
            else:
                checkpoint(
                    module,
                    context_fn=lambda: create_selective_checkpoint_contexts(selective_policy),
                )
    return len(chosen)


def _choose(model: nn.Module, modules: Any) -> list[nn.Module]:
    if isinstance(modules, str):
        return repeated_blocks(model)
    if callable(modules) and not isinstance(modules, type):
        return [m for m in model.modules() if modules(m)]
    classes = tuple(modules) if not isinstance(modules, type) else (modules,)
    return [m for m in model.modules() if isinstance(m, classes)]


def _offload(module: nn.Module) -> None:
    # The module's forward inside save_on_cpu: what autograd saves there goes to CPU memory
    # (pinned when CUDA is there, so the copies overlap) and returns for backward.
    contexts: list[contextlib.AbstractContextManager[Any]] = []

    def enter(module: nn.Module, args: Any) -> None:
        context = torch.autograd.graph.save_on_cpu(pin_memory=torch.cuda.is_available())
        context.__enter__()
        contexts.append(context)

    def leave(module: nn.Module, args: Any, output: Any) -> None:
        if contexts:
            contexts.pop().__exit__(None, None, None)

    module.register_forward_pre_hook(enter)
    module.register_forward_hook(leave, always_call=True)


class ActivationCheckpointing(ComposableAlgorithm, config=ActivationCheckpointingConfig):
    """Full, selective or offloaded activation checkpointing of the model's blocks, applied
    at INIT (before the strategy wraps or shards the model).

    ``ActivationCheckpointing("selective")`` or ``{name: activation_checkpointing, mode:
    selective}`` in a config file. Not ``required_on_load``: names and parameters are
    unchanged, so checkpoints load with or without it.
    """

    config: ActivationCheckpointingConfig
    required_events = (Event.INIT,)
    match_events = frozenset({Event.INIT})

    def __init__(
        self, config: ActivationCheckpointingConfig | None = None, /, **options: Any
    ) -> None:
        super().__init__(config, **options)

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        model = state.parallelism.unwrap(state.model)
        count = apply_activation_checkpointing(model, self.config.mode, self.config.modules)
        logger.log_hyperparameters(
            {
                "activation_checkpointing/mode": self.config.mode,
                "activation_checkpointing/modules": count,
            }
        )
