"""Where ALiBi goes in each supported Hugging Face model family."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

__all__ = ["Family", "ZeroPositionEmbedding", "families", "find_family"]


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
    """A model family: its attention class, embeddings holder, and how to adapt both."""

    name: str
    attention: type[nn.Module]
    embeddings: type[nn.Module]
    position_attribute: str
    causal: bool

    def is_self_attention(self, module: nn.Module) -> bool:
        return isinstance(module, self.attention) and not getattr(
            module, "is_cross_attention", False
        )


def families() -> list[Family]:
    from transformers.models.bert.modeling_bert import BertEmbeddings, BertSelfAttention
    from transformers.models.gpt2.modeling_gpt2 import GPT2Attention, GPT2Model

    return [
        Family("GPT-2", GPT2Attention, GPT2Model, "wpe", causal=True),
        Family("BERT", BertSelfAttention, BertEmbeddings, "position_embeddings", causal=False),
    ]


def find_family(model: nn.Module) -> tuple[Family, Any] | None:
    """The family of ``model`` and its config, or None when it is none of them."""
    for family in families():
        for module in model.modules():
            if isinstance(module, family.embeddings):
                config = getattr(module, "config", None) or _config_of(model)
                return family, config
    return None


def _config_of(model: nn.Module) -> Any:
    for module in model.modules():
        config = getattr(module, "config", None)
        if config is not None and hasattr(config, "num_attention_heads"):
            return config
    return None


def extend_bert_buffers(embeddings: nn.Module, max_sequence_length: int) -> None:
    """BERT slices its ``position_ids`` / ``token_type_ids`` buffers: make them long enough."""
    device = embeddings.position_ids.device
    positions = torch.arange(max_sequence_length, device=device).expand((1, -1))
    embeddings.register_buffer("position_ids", positions, persistent=False)
    if hasattr(embeddings, "token_type_ids"):
        zeros = torch.zeros(positions.shape, dtype=torch.long, device=device)
        embeddings.register_buffer("token_type_ids", zeros, persistent=False)
