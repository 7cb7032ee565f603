"""`PipelinePlan`: how a model runs as a chain of stages; ready plans for Llama and GPT-2.

A pipeline stage runs part of the model: the first stage turns the batch into hidden
states (`PipelinePlan.first`), every stage runs its share of the repeated blocks
(`PipelinePlan.block`), and the last stage turns hidden states into the model's outputs
(`PipelinePlan.last`), whose loss `PipelinePlan.loss` computes. Between stages travels
one tensor, the hidden states.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

import torch
from torch import nn

__all__ = ["PipelinePlan", "gpt2_pipeline_plan", "llama_pipeline_plan", "pipeline_plan"]


def _call_block(model: nn.Module, block: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    return block(hidden)


def _model_loss(model: nn.Module, outputs: Any, batch: Any) -> torch.Tensor:
    return model.loss(outputs, batch)


def _identity(model: nn.Module, outputs: Any) -> Any:
    return outputs


@dataclass(frozen=True, kw_only=True)
class PipelinePlan:
    """How to run a model as stages (`PipelineParallel`'s ``plan``).

    The modules with parameters outside ``blocks`` go to the first stage when they come
    before the blocks in ``model.named_modules()`` order (embeddings), to the last stage
    when they come after (final norm, head); modules without parameters (rotary tables)
    stay on every stage. Parameter names never change, so checkpoints load across
    pipeline degrees.

    Example, for a model with ``embed``, a ModuleList ``blocks`` and ``head``::

        PipelinePlan(
            blocks="blocks",
            inputs=lambda batch: (batch[0],),
            first=lambda model, x: model.embed(x),
            last=lambda model, hidden: model.head(hidden),
        )
    """

    blocks: str
    """fnmatch pattern naming the one ``nn.ModuleList`` whose blocks are split between
    stages (``"blocks"``, ``"*layers"``)."""
    inputs: Callable[[Any], tuple[torch.Tensor, ...]]
    """``batch -> tensors``: the first stage's inputs, taken from a (micro)batch."""
    first: Callable[..., torch.Tensor]
    """``(model, *inputs) -> hidden``: what runs before the blocks (embeddings)."""
    last: Callable[[nn.Module, torch.Tensor], Any]
    """``(model, hidden) -> outputs``: what runs after the blocks (norm, head)."""
    block: Callable[[nn.Module, nn.Module, torch.Tensor], torch.Tensor] = _call_block
    """``(model, block, hidden) -> hidden``: run one block (default ``block(hidden)``)."""
    loss: Callable[[nn.Module, Any, Any], torch.Tensor] = _model_loss
    """``(model, outputs, batch) -> loss`` on the last stage (default ``model.loss``)."""
    outputs: Callable[[nn.Module, Any], Any] = _identity
    """``(model, last's outputs) -> what model(batch) returns``, for evaluation and
    prediction (default: unchanged)."""

    def find_blocks(self, model: nn.Module) -> str:
        """The name of the ModuleList that ``blocks`` matches.

        Raises:
            ValueError: it matches no ModuleList, or several.
        """
        lists = [n for n, m in model.named_modules() if isinstance(m, nn.ModuleList)]
        found = [name for name in lists if fnmatchcase(name, self.blocks)]
        if len(found) != 1:
            raise ValueError(
                f"pipeline plan blocks={self.blocks!r} must match exactly one nn.ModuleList of "
                f"{type(model).__name__}, but matches {found or 'none'}; its ModuleLists: {lists}"
            )
        return found[0]


# model -> {pattern: module}: the plans run per block and microbatch; the search runs once.
_FOUND: weakref.WeakKeyDictionary[nn.Module, dict[str, nn.Module]] = weakref.WeakKeyDictionary()


def _find(model: nn.Module, pattern: str) -> nn.Module:
    found = _FOUND.setdefault(model, {})
    if pattern not in found:
        names = [name for name, _ in model.named_modules() if fnmatchcase(name, pattern)]
        if not names:
            raise ValueError(
                f"pipeline plan: no module of {type(model).__name__} matches {pattern!r} (on "
                "this stage)"
            )
        found[pattern] = model.get_submodule(names[0])
    return found[pattern]


def _causal_lm_loss(model: nn.Module, logits: torch.Tensor, batch: Any) -> torch.Tensor:
    # As transformers' causal LMs compute it: the mean over label tokens (shifted), divided
    # by the (micro)batch's label tokens as HuggingFaceModel passes num_items_in_batch.
    if not isinstance(batch, Mapping) or "labels" not in batch:
        raise ValueError("a causal-LM pipeline plan needs dict batches with 'labels'")
    from transformers.loss.loss_utils import ForCausalLMLoss

    count = (batch["labels"][..., 1:] != -100).sum()
    return ForCausalLMLoss(
        logits, batch["labels"], logits.shape[-1], num_items_in_batch=count.clamp(min=1)
    )


def _causal_lm_outputs(model: nn.Module, logits: torch.Tensor) -> Any:
    from transformers.modeling_outputs import CausalLMOutputWithPast

    return CausalLMOutputWithPast(logits=logits)


def _token_inputs(batch: Any) -> tuple[torch.Tensor, ...]:
    if not isinstance(batch, Mapping) or "input_ids" not in batch:
        raise ValueError(
            f"a causal-LM pipeline plan needs dict batches with 'input_ids', got "
            f"{type(batch).__name__}"
        )
    mask = batch.get("attention_mask")
    if mask is not None and not bool(mask.all()):
        raise ValueError(
            "a causal-LM pipeline plan runs full causal attention: batches with padding "
            "(attention_mask zeros) are not supported; pack sequences instead"
        )
    return (batch["input_ids"],)


def _positions(hidden: torch.Tensor) -> torch.Tensor:
    return torch.arange(hidden.shape[1], device=hidden.device).unsqueeze(0)


def llama_pipeline_plan() -> PipelinePlan:
    """Hugging Face Llama-style causal LMs (``model.layers``; Mistral, Qwen2, ... alike).

    The first stage holds ``embed_tokens``, the last ``norm`` and ``lm_head``; every stage
    recomputes the rotary tables. Attention is causal over whole sequences (no padding).
    """

    def first(model: nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
        return _find(model, "*embed_tokens")(input_ids)

    def block(model: nn.Module, layer: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        from transformers.masking_utils import create_causal_mask

        positions = _positions(hidden)
        rotary = _find(model, "*rotary_emb")(hidden, positions)
        # None where the attention kernel masks causally itself (SDPA), else eager's mask.
        mask = create_causal_mask(
            config=layer.self_attn.config, inputs_embeds=hidden, attention_mask=None,
            past_key_values=None, position_ids=positions,
        )  # fmt: skip
        return layer(
            hidden, attention_mask=mask, position_embeddings=rotary, position_ids=positions
        )

    def last(model: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        return _find(model, "*lm_head")(_find(model, "*model.norm")(hidden))

    return PipelinePlan(
        blocks="*layers", inputs=_token_inputs, first=first, block=block, last=last,
        loss=_causal_lm_loss, outputs=_causal_lm_outputs,
    )  # fmt: skip


def gpt2_pipeline_plan() -> PipelinePlan:
    """Hugging Face GPT-2 (``transformer.h``): ``wte`` and ``wpe`` on the first stage,
    ``ln_f`` and ``lm_head`` on the last. The embeddings must be untied
    (``GPT2Config(tie_word_embeddings=False)``): the first and last stages live on
    different ranks."""

    def first(model: nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        hidden = _find(model, "*wte")(input_ids) + _find(model, "*wpe")(positions)
        return _find(model, "*transformer.drop")(hidden)

    def block(model: nn.Module, layer: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        out = layer(hidden)
        return out[0] if isinstance(out, tuple) else out

    def last(model: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        return _find(model, "*lm_head")(_find(model, "*ln_f")(hidden))

    return PipelinePlan(
        blocks="*h", inputs=_token_inputs, first=first, block=block, last=last,
        loss=_causal_lm_loss, outputs=_causal_lm_outputs,
    )  # fmt: skip


_PLANS = {"llama": llama_pipeline_plan, "gpt2": gpt2_pipeline_plan}


def pipeline_plan(plan: PipelinePlan | str) -> PipelinePlan:
    """``plan`` itself, or the ready plan of that name (``"llama"``, ``"gpt2"``).

    Raises:
        ValueError: an unknown name.
    """
    if isinstance(plan, PipelinePlan):
        return plan
    if isinstance(plan, str) and plan in _PLANS:
        return _PLANS[plan]()
    raise ValueError(
        f"pipeline plan {plan!r} is not known; use one of {sorted(_PLANS)} or a PipelinePlan"
    )
