"""ALiBi (Press et al. 2022): attention biased by distance instead of position embeddings.

Each self-attention module is wrapped in an `AlibiAttention` that adds ``-slope_h * |i - j|``
to its attention mask (one slope per head, `alibi_slopes`), and the learned position
embedding becomes a `ZeroPositionEmbedding`. Nothing in the model then depends on absolute
positions, so a model trained on short sequences evaluates on longer ones; `Alibi` also
trains on shorter sequences (``train_sequence_length_scaling``). Supports Hugging Face
GPT-2 (causal), BERT and RoBERTa with the "eager" or "sdpa" attention implementation.
Needs transformers: ``pip install "trainkit-algorithms[nlp]"``.
"""

from trainkit.algorithms.alibi._algorithm import (
    Alibi,
    AlibiConfig,
    apply_alibi,
    scale_sequence_length,
)
from trainkit.algorithms.alibi._attention import AlibiAttention, AlibiBias, alibi_bias, alibi_slopes
from trainkit.algorithms.alibi._models import ZeroPositionEmbedding

__all__ = [
    "Alibi",
    "AlibiAttention",
    "AlibiBias",
    "AlibiConfig",
    "ZeroPositionEmbedding",
    "alibi_bias",
    "alibi_slopes",
    "apply_alibi",
    "scale_sequence_length",
]
