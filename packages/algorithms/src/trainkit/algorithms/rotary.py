"""Rotary position embeddings (Su et al. 2021) for Hugging Face GPT-2.

GPT-2 adds a learned position vector (``wpe``) to each token. With rotary embeddings the
positions enter attention instead: each head's query and key channels are taken in pairs
``(x_i, x_{i + d/2})`` (the rotate-half layout of GPT-NeoX and Llama) and rotated by the
angle ``position * base ** (-2 i / d)``, so a query-key product depends on their distance
only. The surgery:

- ``transformer.wpe`` becomes a `ZeroPositionEmbedding` (adds nothing at any position; its
  learned table leaves the model and the optimizer, so checkpoints need the method);
- each self-attention `GPT2Attention` becomes a `RotaryGPT2Attention` holding the same
  ``c_attn``, ``c_proj`` and dropouts (the same parameter names), whose forward rotates q
  and k before the KV cache and then calls the model's own attention implementation
  (eager, sdpa, flash). Positions are the model's ``position_ids`` (after the cached
  tokens by default), so generation with a cache rotates each token once, by its position,
  and sequences may be longer than ``n_positions``.

Llama-style models already rotate q and k and are refused, as are GPT-2 options the new
forward does not implement (``reorder_and_upcast_attn``). Needs transformers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from trainkit.algorithms._passes import ComposableAlgorithm
from trainkit.algorithms._surgery import replace_modules
from trainkit.algorithms.alibi import ZeroPositionEmbedding
from trainkit.core import Event, Logger, State
from trainkit.core.config import build_config, primary

__all__ = ["Rotary", "RotaryConfig", "RotaryGPT2Attention", "apply_rotary", "rotate"]


@dataclass(kw_only=True)
class RotaryConfig:
    base: float = primary(10000.0)
    """Wavelength base: channel pair ``i`` of ``d`` turns by ``base ** (-2 i / d)`` radians
    per position (10000 in the paper and Llama); above 1."""

    def __post_init__(self) -> None:
        if not self.base > 1:
            raise ValueError(f"base must be above 1, got {self.base}")


def rotate(x: torch.Tensor, positions: torch.Tensor, base: float) -> torch.Tensor:
    """``x`` (N, heads, L, d) rotated pairwise by ``positions`` (N or 1, L), rotate-half layout."""
    half = x.shape[-1] // 2
    frequencies = base ** (-torch.arange(half, device=x.device, dtype=torch.float32) / half)
    angles = positions.to(torch.float32)[:, None, :, None] * frequencies  # (N, 1, L, half)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    first, second = x[..., :half], x[..., half:]
    return torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1)


class RotaryGPT2Attention(nn.Module):
    """GPT-2 self-attention with rotary q and k; the modules and names of the one it replaces."""

    def __init__(self, attention: nn.Module, base: float) -> None:
        super().__init__()
        self.config, self.layer_idx = attention.config, attention.layer_idx
        self.num_heads, self.head_dim = attention.num_heads, attention.head_dim
        self.split_size, self.scaling = attention.split_size, attention.scaling
        self.is_causal, self.is_cross_attention = attention.is_causal, False
        self.c_attn, self.c_proj = attention.c_attn, attention.c_proj
        self.attn_dropout, self.resid_dropout = attention.attn_dropout, attention.resid_dropout
        self.base = base
        from transformers.cache_utils import EncoderDecoderCache
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
        from transformers.models.gpt2.modeling_gpt2 import eager_attention_forward

        # looked up once here, not at every forward
        self._encoder_decoder_cache = EncoderDecoderCache
        self._attention_functions = ALL_ATTENTION_FUNCTIONS
        self._eager = eager_attention_forward

    def forward(
        self,
        hidden_states: torch.Tensor,
        past_key_values: Any = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        for unused in ("encoder_hidden_states", "encoder_attention_mask", "output_attentions"):
            kwargs.pop(unused, None)  # cross-attention is GPT-2's separate `crossattention`
        cache = past_key_values
        if isinstance(cache, self._encoder_decoder_cache):
            cache = cache.self_attention_cache
        q, k, v = (
            t.unflatten(-1, (-1, self.head_dim)).transpose(1, 2)
            for t in self.c_attn(hidden_states).split(self.split_size, dim=2)
        )
        positions = position_ids
        if positions is None:
            seen = cache.get_seq_length(self.layer_idx) if cache is not None else 0
            positions = torch.arange(seen, seen + q.shape[2], device=q.device)[None]
        q, k = rotate(q, positions, self.base), rotate(k, positions, self.base)
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx)
        interface = self._attention_functions.get_interface(
            self.config._attn_implementation, self._eager
        )
        output, weights = interface(
            self,
            q,
            k,
            v,
            attention_mask,
            dropout=self.attn_dropout.p if self.training else 0.0,
            scaling=self.scaling,
            position_ids=position_ids,  # as GPT2Attention passes them on (flash uses them)
            **kwargs,
        )
        output = self.c_proj(output.reshape(*output.shape[:-2], -1).contiguous())
        return self.resid_dropout(output), weights


def _gpt2_classes() -> tuple[type[nn.Module], type[nn.Module]]:
    try:
        from transformers.models.gpt2.modeling_gpt2 import GPT2Attention, GPT2Model
    except ImportError as err:
        raise ImportError(
            'rotary needs transformers: pip install "trainkit-algorithms[nlp]"'
        ) from err
    return GPT2Attention, GPT2Model


def _targets(model: nn.Module) -> tuple[list[nn.Module], list[nn.Module]]:
    """The GPT-2 self-attention modules and position tables of ``model``, checked."""
    gpt2_attention, gpt2_model = _gpt2_classes()
    attentions, tables = [], []
    for name, module in model.named_modules():
        label = f"{name or 'the model'} ({type(module).__name__})"
        if type(module).__name__.endswith("RotaryEmbedding") or isinstance(
            module, RotaryGPT2Attention
        ):
            raise ValueError(
                f"rotary: {label} shows that {type(model).__name__} already applies rotary "
                "position embeddings (as Llama-style models do); rotary adds them to Hugging "
                "Face GPT-2, once"
            )
        if isinstance(module, gpt2_attention) and not module.is_cross_attention:
            if module.reorder_and_upcast_attn:
                raise ValueError(
                    f"rotary: {label} uses reorder_and_upcast_attn=True, which "
                    "RotaryGPT2Attention does not implement; build the model without it"
                )
            if module.head_dim % 2:
                raise ValueError(
                    f"rotary: {label} has heads of odd size {module.head_dim}; rotary turns "
                    "channel pairs and needs an even head size"
                )
            attentions.append(module)
        elif isinstance(module, gpt2_model):
            tables.append((label, module.wpe))
    if not attentions:
        raise ValueError(
            f"rotary supports Hugging Face GPT-2 models, and {type(model).__name__} contains "
            "no GPT2Attention"
        )
    for label, table in tables:
        if not isinstance(table, nn.Embedding):
            raise ValueError(
                f"rotary: the position table `wpe` of {label} is a {type(table).__name__}, "
                "not the learned nn.Embedding (alibi applied?); rotary replaces the learned one"
            )
    return attentions, [table for _, table in tables]


def apply_rotary(
    model: nn.Module,
    config: RotaryConfig | None = None,
    /,
    *,
    optimizers: torch.optim.Optimizer | list[torch.optim.Optimizer] | None = None,
    **options: Any,
) -> dict[str, nn.Module]:
    """Rotary q and k in every GPT-2 self-attention of ``model``; zero for ``wpe``.

    Takes a `RotaryConfig` or its fields as keyword arguments. Optimizers given are
    re-bound (the position table leaves them). Returns ``{name: new module}``.

    Raises:
        ValueError: ``model`` is no GPT-2, or already rotates q and k (Llama-style models).
    """
    base = build_config(RotaryConfig, config, options).base
    attentions, tables = _targets(model)
    targets = {id(module) for module in [*attentions, *tables]}

    def policy(module: nn.Module, index: int) -> nn.Module:
        if isinstance(module, nn.Embedding):
            return ZeroPositionEmbedding(module.embedding_dim)
        return RotaryGPT2Attention(module, base)

    return replace_modules(
        model,
        {(lambda module: id(module) in targets): policy},
        optimizers=optimizers,
        method="rotary",
    )


class Rotary(ComposableAlgorithm, config=RotaryConfig):
    """Replaces GPT-2's learned positions by rotary embeddings at INIT (see `apply_rotary`).

    ``required_on_load``: the learned position table leaves the model, so a plain GPT-2
    refuses its checkpoints (and the reverse).
    """

    config: RotaryConfig
    required_on_load = True
    required_events = (Event.INIT,)

    def __init__(self, config: RotaryConfig | None = None, /, **options: Any) -> None:
        super().__init__(config, **options)

    match_events = frozenset({Event.INIT})

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        model = state.parallelism.unwrap(state.model)
        replaced = apply_rotary(model, self.config, optimizers=state.optimizers)
        logger.log_hyperparameters({"rotary/num_replaced": len(replaced)})
