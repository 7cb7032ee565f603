"""The ALiBi slopes and bias, and the attention wrapper that adds the bias to the mask."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

__all__ = ["AlibiAttention", "AlibiBias", "alibi_bias", "alibi_slopes"]

SUPPORTED_IMPLEMENTATIONS = ("eager", "sdpa")


def alibi_slopes(num_heads: int) -> torch.Tensor:
    """The head slopes of Press et al. (2022), for any number of heads.

    For ``n`` a power of two: the geometric sequence that starts at ``2 ** (-8 / n)`` with
    that same ratio (``1/2, 1/4, ..., 1/256`` for 8 heads). For other ``n``, with ``p`` the
    largest power of two below ``n``: the ``p`` slopes of ``p`` heads, then every other slope
    of the sequence for ``2 p`` heads (its 1st, 3rd, ...), up to ``n`` slopes in all.
    """
    if isinstance(num_heads, bool) or not isinstance(num_heads, int) or num_heads < 1:
        raise ValueError(f"alibi needs a positive int number of attention heads, got {num_heads!r}")

    def geometric(n: int) -> list[float]:
        return [2.0 ** (-8.0 * h / n) for h in range(1, n + 1)]

    power = 1 << (num_heads.bit_length() - 1)  # the largest power of two <= num_heads
    slopes = geometric(power) + geometric(2 * power)[0::2][: num_heads - power]
    return torch.tensor(slopes, dtype=torch.float32)


def alibi_bias(
    slopes: torch.Tensor, query_length: int, key_length: int, *, causal: bool
) -> torch.Tensor:
    """``(heads, query_length, key_length)``: ``-slope * |i - j|`` between positions.

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


class AlibiBias:
    """The bias of one model's attention layers, shared by them and built once per device.

    It is held as a plain attribute, not a buffer: it is not saved in checkpoints, not
    broadcast by DDP at every forward, and not duplicated per layer. It grows (doubling)
    to the longest sequence seen, never beyond ``max_sequence_length``; shorter sequences
    get a view of it.
    """

    def __init__(self, num_heads: int, max_sequence_length: int, *, causal: bool) -> None:
        self.slopes = alibi_slopes(num_heads)
        self.max_sequence_length = max_sequence_length
        self.causal = causal
        self._built: dict[torch.device, torch.Tensor] = {}

    @property
    def num_heads(self) -> int:
        return len(self.slopes)

    def get(
        self, query_length: int, key_length: int, device: torch.device, *, module: str = ""
    ) -> torch.Tensor:
        """``(heads, query_length, key_length)`` float32 bias for the last queries of the keys."""
        if key_length > self.max_sequence_length:
            where = f" in {module}" if module else ""
            raise ValueError(
                f"alibi{where}: a sequence of {key_length} positions is longer than "
                f"max_sequence_length={self.max_sequence_length}, the length its bias was sized "
                "and checked for; apply alibi with a larger max_sequence_length"
            )
        built = self._built.get(device)
        if built is None or built.shape[-1] < key_length:
            size = len(built[0]) if built is not None else 0
            size = min(self.max_sequence_length, max(key_length, 2 * size))
            built = alibi_bias(self.slopes.to(device), size, size, causal=self.causal)
            self._built[device] = built
        return built[:, key_length - query_length : key_length, :key_length]

    def __getstate__(self) -> dict[str, Any]:
        # Copies (deepcopy for EMA/SWA, pickling) rebuild the bias where they run.
        return {**self.__dict__, "_built": {}}


class AlibiAttention(nn.Module):
    """Wraps a Hugging Face self-attention module: its attention mask gains the ALiBi bias.

    The wrapped module computes attention with its own projections; only the additive
    mask it receives changes, so it works with the "eager" and "sdpa" implementations.
    Padding and causal masks are kept: a masked key stays masked. Without a mask (sdpa
    without padding), a causal module gets the causal mask from the bias itself.
    """

    def __init__(self, attention: nn.Module, bias: AlibiBias, *, name: str = "") -> None:
        super().__init__()
        self.attention = attention
        self.name = name or type(attention).__name__
        self._bias = bias

    @property
    def bias(self) -> AlibiBias:
        """The shared bias (its ``slopes``, ``causal`` and ``max_sequence_length``)."""
        return self._bias

    def forward(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if args:
            raise TypeError(
                f"alibi expects {self.name} ({type(self.attention).__name__}) to be called with "
                "keyword arguments after hidden_states (as transformers 5.x does); it got "
                f"{len(args)} more positional argument(s)"
            )
        implementation = _implementation(self.attention)
        if implementation not in SUPPORTED_IMPLEMENTATIONS:
            raise ValueError(
                f"alibi in {self.name}: the {implementation!r} attention implementation ignores "
                "the additive mask that carries the ALiBi bias; use attn_implementation='sdpa' "
                "or 'eager'"
            )
        mask = kwargs.get("attention_mask")
        query_length = hidden_states.shape[1]
        if mask is not None:
            key_length = mask.shape[-1]
        else:
            cache = kwargs.get("past_key_values")
            layer = getattr(self.attention, "layer_idx", None) or 0
            key_length = query_length + (cache.get_seq_length(layer) if cache is not None else 0)
        bias = self._bias.get(query_length, key_length, hidden_states.device, module=self.name)
        kwargs["attention_mask"] = _with_bias(mask, bias, _mask_dtype(mask, hidden_states))
        return self.attention(hidden_states, **kwargs)


def _with_bias(mask: torch.Tensor | None, bias: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The additive mask ``mask + bias``, finite where a key is masked (so that a row with
    every key masked gets uniform weights, as Hugging Face's own masks do, not NaN)."""
    lowest = torch.finfo(dtype).min
    if mask is None:
        return bias[None].to(dtype)
    if mask.dtype == torch.bool:
        return torch.where(mask, bias, lowest).clamp(min=lowest).to(dtype)
    return (mask.float() + bias).clamp(min=lowest).to(dtype)


def _mask_dtype(mask: torch.Tensor | None, hidden_states: torch.Tensor) -> torch.dtype:
    if mask is not None and mask.is_floating_point():
        return mask.dtype
    device_type = hidden_states.device.type
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)  # what sdpa's query will be in
    return hidden_states.dtype


def _implementation(attention: nn.Module) -> str:
    config = getattr(attention, "config", None)
    return getattr(config, "_attn_implementation", None) or "eager"
