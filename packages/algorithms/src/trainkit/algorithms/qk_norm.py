"""QK-norm: queries and keys RMS-normalised per head, with a learned gain, before attention.

As in OLMo-2, Qwen3 and modded-nanogpt, it bounds the attention logits (no softmax
saturation at high learning rates). The projections producing the queries and keys are
replaced by modules that hold the same ``weight`` and ``bias``
`Parameter` objects under the same names, and normalise their output per head:

- Hugging Face GPT-2 (`GPT2Attention` or rotary's `RotaryGPT2Attention`, fused ``c_attn``): ``attn.c_attn`` becomes a
  `QKNormConv1D` (the same computation as transformers' ``Conv1D``) with new gains ``attn.c_attn.q_norm.weight`` and
  ``attn.c_attn.k_norm.weight``; values pass unchanged. Cross-attention is left alone.
- Llama-style attention (``q_proj``, ``k_proj``, ``v_proj``, ``o_proj`` Linear layers and
  ``head_dim``: Llama, Mistral, Qwen2, ...): ``q_proj`` and ``k_proj`` become
  `QKNormLinear` with new gains ``q_proj.norm.weight`` and ``k_proj.norm.weight``; the
  norm acts before the model applies its rotary embedding, as in OLMo-2 and Qwen3.

Each gain has one entry per channel of a head, shared by the heads, and starts at 1. The
attention keeps the model's own softmax scale and attention implementation (eager, sdpa,
flash). A model that already normalises its queries and keys (``q_norm`` on the attention
module) or has no such attention is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from trainkit.algorithms._passes import ComposableAlgorithm
from trainkit.algorithms._surgery import replace_modules
from trainkit.core import Event, Logger, State
from trainkit.core.config import build_config, primary

__all__ = ["HeadRMSNorm", "QKNorm", "QKNormConfig", "QKNormConv1D", "QKNormLinear", "apply_qk_norm"]


@dataclass(kw_only=True)
class QKNormConfig:
    eps: float = primary(1e-6)
    """Added to the mean square before the reciprocal square root; positive."""

    def __post_init__(self) -> None:
        if not self.eps > 0:
            raise ValueError(f"eps must be positive, got {self.eps}")


class HeadRMSNorm(nn.Module):
    """RMSNorm over each head's channels (the last dim split into ``head_dim`` chunks)."""

    def __init__(self, head_dim: int, eps: float) -> None:
        super().__init__()
        self.head_dim, self.eps = head_dim, eps
        self.weight = nn.Parameter(torch.ones(head_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        heads = x.unflatten(-1, (-1, self.head_dim))
        return F.rms_norm(heads, (self.head_dim,), self.weight, self.eps).flatten(-2)

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, eps={self.eps}"


def _take_parameters(new: nn.Module, old: nn.Module) -> nn.Module:
    new.weight = old.weight
    new.bias = old.bias
    return new


class QKNormLinear(nn.Linear):
    """A query or key projection whose output is RMS-normalised per head (``norm``)."""

    def __init__(self, linear: nn.Linear, head_dim: int, eps: float) -> None:
        super().__init__(linear.in_features, linear.out_features, bias=False, device="meta")
        _take_parameters(self, linear)
        self.norm = HeadRMSNorm(head_dim, eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(super().forward(x))


class QKNormConv1D(nn.Module):
    """GPT-2's fused ``c_attn`` ([q | k | v], a transformers ``Conv1D``: ``x @ weight +
    bias``) with q and k RMS-normalised per head (``q_norm``, ``k_norm``)."""

    def __init__(self, conv: nn.Module, head_dim: int, eps: float) -> None:
        super().__init__()
        self.nf, self.nx = conv.nf, conv.nx
        _take_parameters(self, conv)
        self.q_norm = HeadRMSNorm(head_dim, eps)
        self.k_norm = HeadRMSNorm(head_dim, eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fused = torch.addmm(self.bias, x.reshape(-1, self.nx), self.weight)
        q, k, v = fused.view(*x.shape[:-1], self.nf).chunk(3, dim=-1)
        return torch.cat([self.q_norm(q), self.k_norm(k), v], dim=-1)

    def extra_repr(self) -> str:
        return f"nf={self.nf}, nx={self.nx}"


def _conv1d_class() -> type[nn.Module] | None:
    try:
        from transformers.pytorch_utils import Conv1D
    except ImportError:
        return None
    return Conv1D


def _is_gpt2_self_attention(module: nn.Module, conv1d: type[nn.Module] | None) -> bool:
    # GPT2Attention, and rotary's RotaryGPT2Attention (the same modules, another forward)
    c_attn = getattr(module, "c_attn", None)
    fused = (conv1d is not None and isinstance(c_attn, conv1d)) or isinstance(c_attn, QKNormConv1D)
    return (
        fused
        and isinstance(getattr(module, "head_dim", None), int)
        and (getattr(module, "is_cross_attention", None) is False)
    )


def _is_llama_style_attention(module: nn.Module) -> bool:
    projections = ("q_proj", "k_proj", "v_proj", "o_proj")
    return all(isinstance(getattr(module, name, None), nn.Linear) for name in projections) and (
        isinstance(getattr(module, "head_dim", None), int)
    )


def _plan(model: nn.Module, eps: float) -> dict[int, Any]:
    """``{id(projection): policy}`` for the query and key projections of every attention."""
    conv1d = _conv1d_class()
    plan: dict[int, Any] = {}
    for name, module in model.named_modules():
        if _is_gpt2_self_attention(module, conv1d):
            projections = [module.c_attn]
            make = QKNormConv1D
        elif _is_llama_style_attention(module):
            projections = [module.q_proj, module.k_proj]
            make = QKNormLinear
        else:
            continue
        if hasattr(module, "q_norm") or any(isinstance(p, make) for p in projections):
            raise ValueError(
                f"qk_norm: {name or 'the model'} ({type(module).__name__}) already normalises "
                "its queries and keys (a `q_norm`, or qk_norm applied before); apply it once, "
                "to a model without"
            )
        for projection in projections:
            plan[id(projection)] = lambda old, _, d=module.head_dim, make=make: make(old, d, eps)
    return plan


def apply_qk_norm(
    model: nn.Module,
    config: QKNormConfig | None = None,
    /,
    *,
    optimizers: torch.optim.Optimizer | list[torch.optim.Optimizer] | None = None,
    **options: Any,
) -> dict[str, nn.Module]:
    """Normalise the queries and keys of every GPT-2 and Llama-style attention in ``model``.

    Takes a `QKNormConfig` or its fields as keyword arguments. Optimizers given are
    re-bound (the gains join the first group). Returns ``{projection name: new module}``.

    Raises:
        ValueError: ``model`` has no such attention, or already normalises q and k.
    """
    eps = build_config(QKNormConfig, config, options).eps
    plan = _plan(model, eps)
    if not plan:
        raise ValueError(
            f"qk_norm found no attention it applies to in {type(model).__name__}; it supports "
            "Hugging Face GPT2Attention (fused `c_attn`) and Llama-style attention (`q_proj`, "
            "`k_proj`, `v_proj`, `o_proj` Linear layers and an int `head_dim`)"
        )
    return replace_modules(
        model,
        {(lambda module: id(module) in plan): (lambda module, i: plan[id(module)](module, i))},
        optimizers=optimizers,
        method="qk_norm",
    )


class QKNorm(ComposableAlgorithm, config=QKNormConfig):
    """Adds per-head RMSNorm to queries and keys at INIT (see `apply_qk_norm`).

    ``required_on_load``: the gains are new parameters, so a plain model refuses its
    checkpoints.
    """

    config: QKNormConfig
    required_on_load = True
    required_events = (Event.INIT,)

    def __init__(self, config: QKNormConfig | None = None, /, **options: Any) -> None:
        super().__init__(config, **options)

    match_events = frozenset({Event.INIT})

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        model = state.parallelism.unwrap(state.model)
        replaced = apply_qk_norm(model, self.config, optimizers=state.optimizers)
        logger.log_hyperparameters({"qk_norm/num_replaced": len(replaced)})
