"""Re-binding optimizers to a model whose parameters a strategy or surgery replaced."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Literal

import torch
from torch import nn

__all__ = ["rebind_optimizers"]


def rebind_optimizers(
    optimizers: Iterable[torch.optim.Optimizer],
    model: nn.Module,
    names_before: Mapping[int, str],
    *,
    new_parameters: Literal["error", "add_to_first_group"] = "error",
) -> int:
    """Point optimizers at the model's current parameters; the one re-binding utility.

    ``names_before`` maps ``id(parameter)`` to its name when the optimizers were built
    (``{id(p): n for n, p in model.named_parameters()}``). A parameter that a strategy or
    surgery replaced under the same name is swapped in, with its optimizer state.

    A parameter that left the model with no same-named replacement is an error by default
    (``"error"``: a strategy must not lose parameters). Surgery that changes the model's
    structure passes ``new_parameters="add_to_first_group"``: vanished parameters are
    dropped, and parameters that are new in the model (not in ``names_before``, held by no
    optimizer) join the first optimizer's first group. Returns how many were swapped or added.

    Raises:
        ValueError: in ``"error"`` mode, a parameter vanished without a replacement.
    """
    optimizers = list(optimizers)
    current = dict(model.named_parameters())
    live = {id(p) for p in current.values()}
    changed = 0
    held: set[int] = set()
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            params = []
            for param in group["params"]:
                replacement = (
                    param if id(param) in live else _same_name(param, current, names_before)
                )
                if replacement is None:
                    if new_parameters == "error":
                        name = names_before.get(id(param))
                        raise ValueError(
                            f"an optimizer holds parameter {name or '<unnamed>'!r}, which is no "
                            "longer in the model and has no replacement of the same name; the "
                            "algorithm or strategy that replaced it must re-bind the optimizer "
                            "(trainkit.core.rebind_optimizers)"
                        )
                    continue  # surgery removed it
                if replacement is not param:
                    if param in optimizer.state:
                        optimizer.state[replacement] = optimizer.state.pop(param)
                    changed += 1
                params.append(replacement)
                held.add(id(replacement))
            group["params"] = params
    if new_parameters == "add_to_first_group" and optimizers:
        added = [p for p in current.values() if id(p) not in held and id(p) not in names_before]
        optimizers[0].param_groups[0]["params"].extend(added)
        changed += len(added)
    return changed


def _same_name(
    param: torch.Tensor, current: Mapping[str, nn.Parameter], names_before: Mapping[int, str]
) -> nn.Parameter | None:
    name = names_before.get(id(param))
    return current.get(name) if name is not None else None
