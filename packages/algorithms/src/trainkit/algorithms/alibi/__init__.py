"""ALiBi (Press et al. 2022): attention biased by distance instead of position embeddings.

Each self-attention module is wrapped in an `AlibiAttention` that adds ``-slope_h * |i - j|``
to its attention mask (one slope per head), and the learned position embedding becomes a
`ZeroPositionEmbedding`. Nothing in the model then depends on absolute positions, so a
model trained on short sequences evaluates on longer ones. Supports Hugging Face GPT-2
(causal) and BERT (bidirectional) with the "eager" or "sdpa" attention implementation.
Needs transformers: ``pip install "trainkit-algorithms[nlp]"``.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from trainkit.algorithms._passes import ComposableAlgorithm
from trainkit.algorithms._surgery import replace_modules
from trainkit.algorithms.alibi._attention import AlibiAttention, alibi_bias, alibi_slopes
from trainkit.algorithms.alibi._models import (
    ZeroPositionEmbedding,
    extend_bert_buffers,
    find_family,
)
from trainkit.core import Event, Logger, State
from trainkit.core.config import build_config

__all__ = [
    "Alibi",
    "AlibiAttention",
    "AlibiConfig",
    "ZeroPositionEmbedding",
    "alibi_bias",
    "alibi_slopes",
    "apply_alibi",
]

_BIAS_BUDGET_BYTES = 16 * 2**30


@dataclass(kw_only=True)
class AlibiConfig:
    max_sequence_length: int = 8192
    """The longest sequence the model must accept after surgery (BERT's position buffers
    are extended to it; the model config records it)."""

    def __post_init__(self) -> None:
        if isinstance(self.max_sequence_length, bool) or self.max_sequence_length < 1:
            raise ValueError(
                f"max_sequence_length must be a positive int, got {self.max_sequence_length!r}"
            )


def apply_alibi(
    model: nn.Module,
    config: AlibiConfig | None = None,
    /,
    *,
    optimizers: torch.optim.Optimizer | list[torch.optim.Optimizer] | None = None,
    **options: Any,
) -> dict[str, nn.Module]:
    """Give ``model``'s self-attention ALiBi and drop its position embeddings.

    Takes an `AlibiConfig` or its fields as keyword arguments. Returns the replaced
    modules by name. Raises `ValueError` for a model that is neither GPT-2 nor BERT, a
    head count that is not a power of two, an attention implementation other than
    "eager"/"sdpa", or a length whose bias would not fit in memory.
    """
    max_sequence_length = build_config(AlibiConfig, config, options).max_sequence_length
    _require_transformers()
    if any(isinstance(m, AlibiAttention) for m in model.modules()):
        warnings.warn("alibi is already applied to this model; left as it is", stacklevel=2)
        return {}
    found = find_family(model)
    if found is None:
        raise ValueError(
            f"alibi supports Hugging Face GPT-2 and BERT models, and {type(model).__name__} "
            "contains no GPT2Model or BertEmbeddings"
        )
    family, config = found
    heads = _check_config(config, family.name, max_sequence_length)
    alibi_slopes(heads)  # the power-of-two check, before anything changes
    positions = [_position_embedding(m, family) for m in model.modules()
                 if isinstance(m, family.embeddings)]  # fmt: skip
    position_ids = {id(p) for p in positions}
    policies = {
        family.is_self_attention: lambda m, i: AlibiAttention(m, heads, causal=family.causal),
        (lambda m: id(m) in position_ids): lambda m, i: ZeroPositionEmbedding(m.embedding_dim),
    }
    replaced = replace_modules(model, policies, optimizers=optimizers, method="alibi")
    if family.name == "BERT":
        for embeddings in model.modules():
            if isinstance(embeddings, family.embeddings):
                extend_bert_buffers(embeddings, max_sequence_length)
    for key in ("max_position_embeddings", "n_positions"):
        if hasattr(config, key):
            setattr(config, key, max_sequence_length)
    return replaced


def _require_transformers() -> None:
    try:
        import transformers  # noqa: F401
    except ImportError as err:
        raise ImportError(
            'alibi needs transformers: pip install "trainkit-algorithms[nlp]"'
        ) from err


def _check_config(config: Any, family: str, max_sequence_length: int) -> int:
    heads = getattr(config, "num_attention_heads", None)
    if not isinstance(heads, int):
        raise ValueError(f"alibi found no num_attention_heads in the {family} model's config")
    implementation = getattr(config, "_attn_implementation", None) or "eager"
    if implementation not in ("eager", "sdpa"):
        raise ValueError(
            f"alibi adds its bias to the attention mask, which the {implementation!r} attention "
            "implementation does not take; load the model with attn_implementation='sdpa' or "
            "'eager'"
        )
    bias_bytes = heads * max_sequence_length**2 * 4
    if bias_bytes > _BIAS_BUDGET_BYTES:
        raise ValueError(
            f"at max_sequence_length={max_sequence_length} the ALiBi bias of one sequence "
            f"({heads} heads x {max_sequence_length}^2 floats) needs {bias_bytes / 2**30:.0f} "
            f"GiB; use a max_sequence_length of at most "
            f"{int((_BIAS_BUDGET_BYTES / (4 * heads)) ** 0.5)}"
        )
    return heads


def _position_embedding(embeddings: nn.Module, family: Any) -> nn.Embedding:
    import transformers

    table = getattr(embeddings, family.position_attribute, None)
    if not isinstance(table, nn.Embedding):
        raise ValueError(
            f"{type(embeddings).__name__} has no learned position embedding "
            f"`{family.position_attribute}` (an nn.Embedding) in transformers "
            f"{transformers.__version__}; alibi replaces it, and was written for transformers "
            "versions whose GPT-2/BERT have one"
        )
    return table


class Alibi(ComposableAlgorithm, config=AlibiConfig):
    """Applies ALiBi to a GPT-2 or BERT model at INIT (see `AlibiConfig`)."""

    config: AlibiConfig
    required_on_load = True
    required_events = (Event.INIT,)

    def __init__(self, config: AlibiConfig | None = None, /, **options: Any) -> None:
        super().__init__(config, **options)

    def match(self, event: Event, state: State) -> bool:
        return event == Event.INIT

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        model = state.parallelism.unwrap(state.model)
        replaced = apply_alibi(model, self.config, optimizers=state.optimizers)
        logger.log_hyperparameters({"alibi/num_replaced": len(replaced)})
