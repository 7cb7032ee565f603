"""Module surgery: replace modules in a model, and keep optimizers pointing at the model.

def to_blurconv(module: nn.Conv2d, index: int) -> nn.Module | None:
    return BlurConv2d.from_conv(module) if module.stride != (1, 1) else None

replaced = replace_modules(model, {nn.Conv2d: to_blurconv}, optimizers=state.optimizers)
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from torch import nn

from trainkit.core import rebind_optimizers

__all__ = ["Policy", "check_surgery_allowed", "replace_modules"]

Policy = Callable[[nn.Module, int], nn.Module | None]
"""``(module, index) -> replacement`` (or None to keep it); ``index`` counts matches so far."""

Matcher = type[nn.Module] | tuple[type[nn.Module], ...] | Callable[[nn.Module], bool]


def _matches(matcher: Matcher, module: nn.Module) -> bool:
    if isinstance(matcher, type | tuple):
        return isinstance(module, matcher)
    return bool(matcher(module))


def replace_modules(
    model: nn.Module,
    policies: Mapping[Matcher, Policy],
    *,
    optimizers: torch.optim.Optimizer | Iterable[torch.optim.Optimizer] | None = None,
    method: str = "surgery",
    warn_if_none: bool = True,
) -> dict[str, nn.Module]:
    """Replace every submodule matched by a policy key (a module type or a predicate).

    Replacements take the replaced module's training mode, device and floating dtype; parameters
    they share with the old module stay the same objects. Optimizers given are re-bound
    (`trainkit.core.rebind_optimizers` with ``new_parameters="add_to_first_group"``):
    parameters that left the model are dropped, a parameter replaced under the same name
    takes its predecessor's place, and new ones join the first optimizer's first group.
    Returns ``{qualified name: new module}``.

    Raises:
        ValueError: optimizers already hold state for parameters that would be replaced.
    """
    optimizers = _as_list(optimizers)
    check_surgery_allowed(optimizers, method)
    names_before = {id(p): n for n, p in model.named_parameters()}
    counts: dict[int, int] = {}
    replaced: dict[str, nn.Module] = {}
    for name, module in list(model.named_modules()):
        if not name:
            continue  # the root cannot replace itself in place
        if any(name.startswith(f"{done}.") for done in replaced):
            continue  # inside a module already replaced: the replacement owns it now
        for key, (matcher, policy) in enumerate(policies.items()):
            if not _matches(matcher, module):
                continue
            new = policy(module, counts.get(key, 0))
            counts[key] = counts.get(key, 0) + 1
            if new is not None and new is not module:
                _place_like(new, module)
                parent_name, _, child = name.rpartition(".")
                setattr(model.get_submodule(parent_name) if parent_name else model, child, new)
                replaced[name] = new
            break
    if not replaced and warn_if_none:
        warnings.warn(
            f"{method} matched no module in {type(model).__name__}; it has no effect on this model",
            stacklevel=2,
        )
    if optimizers:
        rebind_optimizers(optimizers, model, names_before, new_parameters="add_to_first_group")
    return replaced


def _place_like(new: nn.Module, old: nn.Module) -> None:
    new.train(old.training)  # a replacement inside an eval-mode model starts in eval mode too
    reference = next(iter(old.parameters()), None)
    if reference is None:
        reference = next(iter(old.buffers()), None)
    if reference is None:
        return
    new.to(device=reference.device)
    if reference.is_floating_point():
        new.to(dtype=reference.dtype)


def check_surgery_allowed(optimizers: Iterable[torch.optim.Optimizer], method: str) -> None:
    """Surgery after training started would silently drop optimizer state: refuse it."""
    for optimizer in optimizers:
        if optimizer.state:
            raise ValueError(
                f"{method} changes the model, but {type(optimizer).__name__} already holds state "
                "(training has started): apply it before the first step, e.g. at Event.INIT, or "
                "to the model before building the optimizer"
            )


def _as_list(optimizers: Any) -> list[torch.optim.Optimizer]:
    if optimizers is None:
        return []
    if isinstance(optimizers, torch.optim.Optimizer):
        return [optimizers]
    return list(optimizers)
