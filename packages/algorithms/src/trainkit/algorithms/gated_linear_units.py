"""Gated Linear Units (Shazeer 2020) in the feed-forward blocks of Hugging Face BERT.

BERT's feed-forward is ``dense_out(act(dense_in(x)))``; with GLU it becomes
``dense_out(act(gate(x)) * dense_in(x))``. Each `BertIntermediate` is replaced by a
`GatedIntermediate` that keeps its ``dense`` (the same `Parameter` objects) as the
ungated projection and adds a new ``gate`` projection; `BertOutput` (down projection,
dropout, residual, LayerNorm) is unchanged. The new parameters join the optimizer.
Needs transformers: ``pip install "trainkit-algorithms[nlp]"``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch
from torch import nn

from trainkit.algorithms._passes import ComposableAlgorithm
from trainkit.algorithms._surgery import replace_modules
from trainkit.core import Event, Logger, State
from trainkit.core.config import build_config, primary

__all__ = [
    "GatedIntermediate",
    "GatedLinearUnits",
    "GatedLinearUnitsConfig",
    "apply_gated_linear_units",
]


@dataclass(kw_only=True)
class GatedLinearUnitsConfig:
    act_fn: str | None = primary(None)
    """Activation of the gate, by transformers' name ("gelu", "silu" for SwiGLU, ...);
    None keeps the model's ``hidden_act``."""
    gated_layer_bias: bool = False
    """Give the new gate projection a bias."""

    def __post_init__(self) -> None:
        if self.act_fn is not None:
            _activation(self.act_fn)


def _transformers() -> ModuleType:
    try:
        import transformers
    except ImportError as err:
        raise ImportError(
            'gated_linear_units needs transformers: pip install "trainkit-algorithms[nlp]"'
        ) from err
    return transformers


def _activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    _transformers()
    from transformers.activations import ACT2FN

    if name not in ACT2FN:
        raise ValueError(
            f"act_fn {name!r} is not a transformers activation; use one of {sorted(ACT2FN)}"
        )
    return ACT2FN[name]


class GatedIntermediate(nn.Module):
    """``act(gate(x)) * dense(x)``: a BERT intermediate layer with a gated linear unit."""

    def __init__(self, dense: nn.Linear, act: Callable[[torch.Tensor], torch.Tensor], bias: bool):
        super().__init__()
        self.dense = dense
        self.gate = nn.Linear(dense.in_features, dense.out_features, bias=bias)
        self.act = act

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.act(self.gate(hidden_states)) * self.dense(hidden_states)


def apply_gated_linear_units(
    model: nn.Module,
    config: GatedLinearUnitsConfig | None = None,
    /,
    *,
    optimizers: torch.optim.Optimizer | list[torch.optim.Optimizer] | None = None,
    **options: Any,
) -> dict[str, nn.Module]:
    """Replace every `BertIntermediate` in ``model`` by a `GatedIntermediate`.

    Takes a `GatedLinearUnitsConfig` or its fields as keyword arguments.
    """
    cfg = build_config(GatedLinearUnitsConfig, config, options)
    act_fn, gated_layer_bias = cfg.act_fn, cfg.gated_layer_bias
    transformers = _transformers()
    from transformers.models.bert.modeling_bert import BertIntermediate

    def to_glu(module: nn.Module, index: int) -> nn.Module:
        dense = getattr(module, "dense", None)
        act = _activation(act_fn) if act_fn else getattr(module, "intermediate_act_fn", None)
        if not isinstance(dense, nn.Linear) or act is None:
            raise ValueError(
                f"BertIntermediate in transformers {transformers.__version__} has no `dense` "
                "Linear and `intermediate_act_fn`; gated_linear_units was written for "
                "transformers 4.45 to 5.x, whose BertIntermediate has both"
            )
        return GatedIntermediate(dense, act, gated_layer_bias)

    return replace_modules(
        model, {BertIntermediate: to_glu}, optimizers=optimizers, method="gated_linear_units"
    )


class GatedLinearUnits(ComposableAlgorithm, config=GatedLinearUnitsConfig):
    """Puts GLUs in BERT's feed-forward blocks at INIT (see `GatedLinearUnitsConfig`)."""

    config: GatedLinearUnitsConfig
    required_on_load = True
    required_events = (Event.INIT,)

    def __init__(self, config: GatedLinearUnitsConfig | None = None, /, **options: Any) -> None:
        super().__init__(config, **options)

    match_events = frozenset({Event.INIT})

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        model = state.parallelism.unwrap(state.model)
        replaced = apply_gated_linear_units(model, self.config, optimizers=state.optimizers)
        logger.log_hyperparameters({"gated_linear_units/num_replaced": len(replaced)})
