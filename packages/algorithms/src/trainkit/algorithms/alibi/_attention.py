"""The ALiBi bias and the attention wrapper that adds it to the attention mask."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

__all__ = ["AlibiAttention", "alibi_bias", "alibi_slopes"]


def alibi_slopes(num_heads: int) -> torch.Tensor:
    """The geometric slopes of Press et al.: ``2 ** (-8 * h / num_heads)`` for h = 1..n."""
    if num_heads < 1 or num_heads & (num_heads - 1):
        raise ValueError(
            f"alibi needs a number of attention heads that is a power of two (its slopes are "
            f"defined for those), got {num_heads}"
        )
    return torch.tensor([2.0 ** (-8.0 * h / num_heads) for h in range(1, num_heads + 1)])


def alibi_bias(
    slopes: torch.Tensor, query_length: int, key_length: int, *, causal: bool
) -> torch.Tensor:
    """``(heads, query_length, key_length)``: ``-slope * distance`` between positions.

    Queries are the last ``query_length`` of the ``key_length`` positions (a KV cache holds
    the others). Causal: future keys get -inf. Bidirectional: the distance is symmetric.
    """
    device = slopes.device
    keys = torch.arange(key_length, device=device)
    queries = torch.arange(key_length - query_length, key_length, device=device)
    offset = keys[None, :] - queries[:, None]  # j - i
    bias = -slopes[:, None, None] * offset.abs()
    if causal:
        bias = bias.masked_fill(offset > 0, -math.inf)
    return bias


class AlibiAttention(nn.Module):
    """Wraps a Hugging Face attention module: its attention mask gains the ALiBi bias.

    The wrapped module computes attention with its own projections; only the additive
    mask it receives changes, so it works with the "eager" and "sdpa" implementations.
    """

    def __init__(self, attention: nn.Module, num_heads: int, *, causal: bool):
        super().__init__()
        self.attention = attention
        self.causal = causal
        self.register_buffer("slopes", alibi_slopes(num_heads), persistent=False)

    def forward(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if args:
            raise TypeError(
                f"alibi expects {type(self.attention).__name__} to be called with keyword "
                "arguments after hidden_states (as transformers 4.48 to 5.x do); this "
                "transformers version passes them by position"
            )
        mask = kwargs.get("attention_mask")
        query_length = hidden_states.shape[1]
        if mask is not None:
            key_length = mask.shape[-1]
        else:
            cache = kwargs.get("past_key_values")
            layer = getattr(self.attention, "layer_idx", None) or 0
            past = cache.get_seq_length(layer) if cache is not None else 0
            key_length = query_length + past
        dtype = mask.dtype if mask is not None and mask.is_floating_point() else hidden_states.dtype
        lowest = torch.finfo(dtype).min
        bias = alibi_bias(self.slopes, query_length, key_length, causal=self.causal)[None]
        if mask is not None and mask.dtype == torch.bool:
            mask = torch.zeros(mask.shape, device=mask.device).masked_fill(~mask, -math.inf)
        combined = bias if mask is None else mask.float() + bias
        # Finite, so that a row with every key masked gives uniform weights, not NaN.
        kwargs["attention_mask"] = combined.clamp(min=lowest).to(dtype)
        return self.attention(hidden_states, **kwargs)
