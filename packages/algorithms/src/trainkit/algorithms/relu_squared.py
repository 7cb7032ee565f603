"""ReLU² (So et al. 2021, "Primer"): ``relu(x) ** 2`` as the feed-forward activation.

Hugging Face GPT-2: each `GPT2MLP`'s ``act`` becomes `SquaredReLU`, so its feed-forward
is ``c_proj(relu(c_fc(x)) ** 2)``. Llama-style gated MLPs (`LlamaMLP` and those built the
same way, with ``gate_proj``, ``up_proj``, ``down_proj`` and ``act_fn``: Mistral, Qwen2,
...): ``act_fn`` becomes `SquaredReLU` and the gate stays, so the block computes
``down_proj(relu(gate_proj(x)) ** 2 * up_proj(x))``, the squared-ReLU GLU of Primer's
appendix; every projection and parameter name is kept. A model with neither is refused.
Needs only torch at run time; the GPT-2 match imports transformers if it is installed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from trainkit.algorithms._passes import ComposableAlgorithm
from trainkit.core import Event, Logger, State

__all__ = ["ReLUSquared", "ReLUSquaredConfig", "SquaredReLU", "apply_relu_squared"]


@dataclass(kw_only=True)
class ReLUSquaredConfig:
    """ReLU² has no options; the class exists so every method has a config (and a
    ``{name: relu_squared}`` entry of a config file builds it like any other)."""


class SquaredReLU(nn.Module):
    """``relu(x) ** 2``, elementwise."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.square(F.relu(x))


def _gpt2_mlp_class() -> type[nn.Module] | None:
    try:
        from transformers.models.gpt2.modeling_gpt2 import GPT2MLP
    except ImportError:
        return None
    return GPT2MLP


def _is_gated_mlp(module: nn.Module) -> bool:
    return all(
        isinstance(getattr(module, name, None), nn.Linear)
        for name in ("gate_proj", "up_proj", "down_proj")
    ) and callable(getattr(module, "act_fn", None))


def _activation_slots(model: nn.Module) -> list[tuple[str, nn.Module, str]]:
    """``(MLP name, MLP, attribute of its activation)`` for every MLP ReLU² applies to."""
    gpt2_mlp = _gpt2_mlp_class()
    slots = []
    for name, module in model.named_modules():
        if gpt2_mlp is not None and isinstance(module, gpt2_mlp):
            slots.append((name, module, "act"))
        elif _is_gated_mlp(module):
            slots.append((name, module, "act_fn"))
    return slots


def apply_relu_squared(model: nn.Module) -> dict[str, nn.Module]:
    """Make ReLU² the activation of every GPT-2 and Llama-style MLP in ``model``.

    Returns ``{qualified name of the activation: SquaredReLU}``. No parameter changes, so
    optimizers need no re-binding.

    Raises:
        ValueError: ``model`` has no GPT-2 or Llama-style MLP.
    """
    slots = _activation_slots(model)
    if not slots:
        raise ValueError(
            f"relu_squared found no MLP it applies to in {type(model).__name__}; it replaces "
            "the activation of Hugging Face GPT2MLP (`act`) and of Llama-style gated MLPs "
            "(`gate_proj`, `up_proj`, `down_proj` Linear layers and `act_fn`)"
        )
    replaced = {}
    for name, mlp, attribute in slots:
        setattr(mlp, attribute, SquaredReLU())
        replaced[f"{name}.{attribute}" if name else attribute] = getattr(mlp, attribute)
    return replaced


class ReLUSquared(ComposableAlgorithm, config=ReLUSquaredConfig):
    """Makes ReLU² the MLP activation at INIT (see `apply_relu_squared`).

    Not ``required_on_load``: no parameter or name changes, so a plain model loads its
    checkpoints; but the weights were trained for ReLU², so evaluate and export the model
    with it applied.
    """

    config: ReLUSquaredConfig
    required_events = (Event.INIT,)

    def __init__(self, config: ReLUSquaredConfig | None = None, /, **options: Any) -> None:
        super().__init__(config, **options)

    match_events = frozenset({Event.INIT})

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        replaced = apply_relu_squared(state.parallelism.unwrap(state.model))
        logger.log_hyperparameters({"relu_squared/num_replaced": len(replaced)})
