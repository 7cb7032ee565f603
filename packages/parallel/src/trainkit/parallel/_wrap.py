"""Choosing blocks to shard, activation checkpointing and per-block compilation."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import nn

from trainkit.core import repeated_blocks
from trainkit.parallel._common import ModuleSelector, select_modules

__all__ = ["apply_activation_checkpointing", "apply_compile", "find_blocks"]


def find_blocks(model: nn.Module, wrap: ModuleSelector | str | None) -> list[nn.Module]:
    """The submodules that get their own FSDP group, deepest first (never ``model`` itself).

    Args:
        model: the model.
        wrap: ``"auto"`` (each repeated block of a ModuleList, e.g. a transformer's
            layers), module classes, a predicate ``module -> bool``, or None (no blocks:
            the whole model is one group).
    """
    if wrap is None:
        return []
    if isinstance(wrap, str):
        if wrap != "auto":
            raise ValueError(
                f"wrap {wrap!r} is not known; use 'auto', module classes, a callable "
                "module -> bool, or None"
            )
        return repeated_blocks(model)
    return [m for m in select_modules(model, wrap, "wrap") if m is not model]


def apply_activation_checkpointing(
    model: nn.Module, setting: bool | ModuleSelector, blocks: list[nn.Module]
) -> int:
    """Recompute the chosen modules' activations in backward instead of storing them.

    Uses the composable ``checkpoint``, which keeps parameter names unchanged (so state
    dicts and optimizer re-binding see the same names as without checkpointing).

    Args:
        model: the model.
        setting: False (none), True (the FSDP blocks), module classes, or a predicate.
        blocks: the FSDP blocks, used when ``setting`` is True.

    Returns:
        How many modules were checkpointed.
    """
    from torch.distributed._composable import checkpoint

    if setting is False or setting is None:
        return 0
    if setting is True:
        if not blocks:
            raise ValueError(
                "activation_checkpointing=True checkpoints the FSDP blocks, but the model has "
                "none (no ModuleList of repeated blocks, and wrap chose none); give module "
                "classes or a callable module -> bool instead"
            )
        chosen = blocks
    else:
        chosen = select_modules(model, setting, "activation_checkpointing")
    for module in chosen:
        checkpoint(module)
    return len(chosen)


def apply_compile(
    blocks: list[nn.Module], model: nn.Module, setting: bool | Mapping[str, Any]
) -> None:
    """``torch.compile`` each block in place (the whole model when there are no blocks).

    Compiling block by block keeps names unchanged and lets FSDP's hooks run between
    compiled regions; repeated blocks share one compiled graph.
    """
    if setting is False:
        return
    options = {} if setting is True else dict(setting)
    for module in blocks or [model]:
        module.compile(**options)
