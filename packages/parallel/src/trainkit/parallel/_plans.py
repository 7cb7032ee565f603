"""Ready tensor-parallel plans for Hugging Face GPT-2 and Llama-style models.

Patterns start with ``*`` so they match the bare model (``h.0.attn``), the LM-head model
(``transformer.h.0.attn``) and the model inside `HuggingFaceModel`
(``model.transformer.h.0.attn``) alike.
"""

from __future__ import annotations

from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import ParallelStyle, PrepareModuleInput, SequenceParallel

from trainkit.parallel._styles import (
    ColwiseParallel,
    FusedColwiseParallel,
    RowwiseParallel,
    ShardedAttributes,
)
from trainkit.parallel._tensor_parallel import Plan

__all__ = ["gpt2_plan", "llama_plan"]


def gpt2_plan(*, blocks: str = "*h.*") -> Plan:
    """Attention and MLP of every GPT-2 block, split over the tensor-parallel ranks.

    GPT-2 uses transformers' ``Conv1D`` (weights stored ``(in, out)``) and one fused
    ``c_attn`` projection for q, k and v: ``c_attn`` is sharded per head block with
    `FusedColwiseParallel` (each rank gets its heads' q, k and v), the attention's
    ``split_size`` becomes the local width, and ``c_proj`` is row-wise. Embeddings,
    layer norms and the LM head stay replicated. The number of heads must be divisible
    by the degree.

    Args:
        blocks: pattern matching the transformer blocks (``transformer.h.N``).
    """
    return {
        f"{blocks}.attn": ShardedAttributes("split_size", "embed_dim", "num_heads"),
        f"{blocks}.attn.c_attn": FusedColwiseParallel(chunks=3),
        f"{blocks}.attn.c_proj": RowwiseParallel(),
        f"{blocks}.mlp.c_fc": ColwiseParallel(),
        f"{blocks}.mlp.c_proj": RowwiseParallel(),
    }


def llama_plan(*, blocks: str = "*layers.*", sequence_parallel: bool = False) -> Plan:
    """Attention and MLP of every Llama-style block (q/k/v/o, gate/up/down projections).

    Matches Hugging Face Llama, Mistral, Qwen2 and others with the same module names.
    The numbers of attention heads and of key-value heads must be divisible by the degree.

    Args:
        blocks: pattern matching the decoder layers (``model.layers.N``).
        sequence_parallel: also split the activations between the blocks along the
            sequence (norms and residuals), saving activation memory. This shards the
            whole causal LM: the token embedding (``*embed_tokens``) starts the split,
            the final norm (``*model.norm``) and ``*lm_head`` end it, so the model must
            be a ``...ForCausalLM`` (possibly inside `HuggingFaceModel`), and the
            sequence length must be divisible by the degree.
    """
    plan: dict[str, ParallelStyle] = {
        f"{blocks}.self_attn.q_proj": ColwiseParallel(),
        f"{blocks}.self_attn.k_proj": ColwiseParallel(),
        f"{blocks}.self_attn.v_proj": ColwiseParallel(),
        f"{blocks}.self_attn.o_proj": RowwiseParallel(),
        f"{blocks}.mlp.gate_proj": ColwiseParallel(),
        f"{blocks}.mlp.up_proj": ColwiseParallel(),
        f"{blocks}.mlp.down_proj": RowwiseParallel(),
    }
    if sequence_parallel:
        plan.update(_llama_sequence_parallel(blocks))
    return plan


def _llama_sequence_parallel(blocks: str) -> dict[str, ParallelStyle]:
    # The residual stream stays a DTensor sharded on the sequence (dim 1) from the
    # embedding to the final norm: Hugging Face computes positions and the causal mask
    # from the embedding's shape, which must therefore be the global one.
    sequence = Shard(1)
    return {
        "*embed_tokens": RowwiseParallel(
            input_layouts=Replicate(), output_layouts=sequence, use_local_output=False
        ),
        f"{blocks}.input_layernorm": SequenceParallel(),
        f"{blocks}.post_attention_layernorm": SequenceParallel(),
        f"{blocks}.self_attn": PrepareModuleInput(
            input_kwarg_layouts={"hidden_states": sequence},
            desired_input_kwarg_layouts={"hidden_states": Replicate()},
        ),
        f"{blocks}.self_attn.o_proj": RowwiseParallel(
            output_layouts=sequence, use_local_output=False
        ),
        f"{blocks}.mlp": PrepareModuleInput(
            input_layouts=(sequence,), desired_input_layouts=(Replicate(),)
        ),
        f"{blocks}.mlp.down_proj": RowwiseParallel(output_layouts=sequence, use_local_output=False),
        "*model.norm": SequenceParallel(),
        "*lm_head": ColwiseParallel(input_layouts=sequence, output_layouts=Replicate()),
    }
