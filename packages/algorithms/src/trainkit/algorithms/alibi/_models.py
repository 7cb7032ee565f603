"""Where ALiBi goes in each supported Hugging Face family, and the checks of what it assumes.

Each assumption the surgery makes about a module (attribute names, head count and width,
causality, attention implementation, position buffers) is checked before anything
changes, and a failed check names the module.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from trainkit.algorithms.alibi._attention import SUPPORTED_IMPLEMENTATIONS

__all__ = [
    "AttentionSite",
    "Family",
    "ZeroPositionEmbedding",
    "check_attention",
    "extend_position_buffers",
    "families",
    "find_sites",
    "position_table",
]


class ZeroPositionEmbedding(nn.Module):
    """Stands in for a learned position embedding: adds nothing, at any position."""

    def __init__(self, embedding_dim: int):
        super().__init__()
        self.embedding_dim = embedding_dim
        self.register_buffer("anchor", torch.zeros(0), persistent=False)  # device and dtype

    def forward(self, position_ids: torch.Tensor) -> torch.Tensor:
        return self.anchor.new_zeros(()).expand(*position_ids.shape, self.embedding_dim)


@dataclass(frozen=True)
class Family:
    """A model family: its self-attention class, the module holding the position table."""

    name: str
    attention: type[nn.Module]
    holder: type[nn.Module]
    position_attribute: str
    shape: Callable[[nn.Module], tuple[Any, Any, Any]]
    """``attention -> (heads, head size, projection width)``, read from its attributes."""
    position_offset: Callable[[nn.Module], int] = lambda holder: 0
    """The first position id the holder uses (RoBERTa counts from ``padding_idx + 1``)."""
    position_buffers: bool = False
    """The holder slices ``position_ids`` / ``token_type_ids`` buffers sized to the table."""

    def is_self_attention(self, module: nn.Module) -> bool:
        return isinstance(module, self.attention) and not getattr(
            module, "is_cross_attention", False
        )


def _gpt2_shape(attention: nn.Module) -> tuple[Any, Any, Any]:
    width = getattr(getattr(attention, "c_proj", None), "nf", None)
    return attention.num_heads, attention.head_dim, width


def _bert_shape(attention: nn.Module) -> tuple[Any, Any, Any]:
    width = getattr(getattr(attention, "query", None), "out_features", None)
    return attention.num_attention_heads, attention.attention_head_size, width


def families() -> list[Family]:
    from transformers.models.bert.modeling_bert import BertEmbeddings, BertSelfAttention
    from transformers.models.gpt2.modeling_gpt2 import GPT2Attention, GPT2Model
    from transformers.models.roberta.modeling_roberta import (
        RobertaEmbeddings,
        RobertaSelfAttention,
    )

    return [
        Family("GPT-2", GPT2Attention, GPT2Model, "wpe", _gpt2_shape),
        Family(
            "BERT",
            BertSelfAttention,
            BertEmbeddings,
            "position_embeddings",
            _bert_shape,
            position_buffers=True,
        ),
        Family(
            "RoBERTa",
            RobertaSelfAttention,
            RobertaEmbeddings,
            "position_embeddings",
            _bert_shape,
            position_offset=lambda holder: holder.padding_idx + 1,
            position_buffers=True,
        ),
    ]


@dataclass(frozen=True)
class AttentionSite:
    """One self-attention module to wrap, with what was read from it."""

    name: str
    module: nn.Module
    family: str
    heads: int
    causal: bool


def find_sites(
    model: nn.Module,
) -> tuple[list[AttentionSite], list[tuple[str, nn.Module, Family]]]:
    """The self-attention modules and the position-table holders of ``model``, checked.

    Raises `ValueError` (naming the module) when one breaks an assumption of the surgery,
    or when the model holds none of the supported families.
    """
    sites: list[AttentionSite] = []
    holders: list[tuple[str, nn.Module, Family]] = []
    for family in families():
        found_attention = found_holder = ""
        for name, module in model.named_modules():
            if family.is_self_attention(module):
                sites.append(check_attention(name, module, family))
                found_attention = found_attention or name
            elif isinstance(module, family.holder):
                position_table(name, module, family)
                holders.append((name, module, family))
                found_holder = found_holder or name
        if bool(found_attention) != bool(found_holder):
            missing = family.holder if found_attention else family.attention
            raise ValueError(
                f"alibi found {family.name} modules ({found_attention or found_holder}) but no "
                f"{missing.__name__}; it needs both the self-attention modules and the module "
                "that holds the position embedding"
            )
    if not sites:
        names = ", ".join(f.name for f in families())
        raise ValueError(
            f"alibi supports Hugging Face {names} models, and {type(model).__name__} contains "
            f"no {', '.join(f.attention.__name__ for f in families())}"
        )
    return sites, holders


def check_attention(name: str, module: nn.Module, family: Family) -> AttentionSite:
    """Read and check what the wrapper relies on in one self-attention module."""
    label = f"{name} ({type(module).__name__})"
    try:
        heads, head_size, width = family.shape(module)
    except AttributeError as err:
        raise ValueError(
            f"alibi: {label} has no attribute `{err.name}`, which {_version()} {family.name} "
            "attention modules have; alibi reads the head count and sizes from it"
        ) from err
    if isinstance(heads, bool) or not isinstance(heads, int) or heads < 1:
        raise ValueError(f"alibi: {label} has a head count of {heads!r}; a positive int is needed")
    if not isinstance(width, int) or width % heads or head_size * heads != width:
        raise ValueError(
            f"alibi: in {label}, {heads} heads of size {head_size} do not split its projection "
            f"width {width}; the head count must divide the hidden size, one bias per head"
        )
    causal = getattr(module, "is_causal", None)
    if not isinstance(causal, bool):
        raise ValueError(
            f"alibi: {label} has no boolean `is_causal` attribute ({causal!r}); alibi reads "
            "from it whether future positions are masked"
        )
    implementation = getattr(getattr(module, "config", None), "_attn_implementation", None)
    if (implementation or "eager") not in SUPPORTED_IMPLEMENTATIONS:
        raise ValueError(
            f"alibi: {label} uses the {implementation!r} attention implementation, which ignores "
            "the additive mask that carries the ALiBi bias; build or load the model with "
            "attn_implementation='sdpa' or 'eager'"
        )
    return AttentionSite(name, module, family.name, heads, causal)


def position_table(name: str, holder: nn.Module, family: Family) -> nn.Embedding:
    """The learned position table of ``holder``, checked."""
    table = getattr(holder, family.position_attribute, None)
    if not isinstance(table, nn.Embedding):
        raise ValueError(
            f"alibi: {name or 'the model'} ({type(holder).__name__}) has no learned position "
            f"embedding `{family.position_attribute}` (an nn.Embedding; found "
            f"{type(table).__name__}) in {_version()}; alibi replaces it"
        )
    if family.position_buffers and not isinstance(
        getattr(holder, "position_ids", None), torch.Tensor
    ):
        raise ValueError(
            f"alibi: {name} ({type(holder).__name__}) has no `position_ids` buffer in "
            f"{_version()}; alibi extends it to max_sequence_length"
        )
    return table


def extend_position_buffers(holder: nn.Module, family: Family, max_sequence_length: int) -> int:
    """Resize the position buffers the holder slices (on their device); returns their length."""
    length = max_sequence_length + family.position_offset(holder)
    if not family.position_buffers:
        return length
    device = holder.position_ids.device
    positions = torch.arange(length, device=device).expand((1, -1))
    holder.register_buffer("position_ids", positions, persistent=False)
    if isinstance(getattr(holder, "token_type_ids", None), torch.Tensor):
        zeros = torch.zeros(positions.shape, dtype=torch.long, device=device)
        holder.register_buffer("token_type_ids", zeros, persistent=False)
    return length


def _version() -> str:
    import transformers

    return f"transformers {transformers.__version__}"
