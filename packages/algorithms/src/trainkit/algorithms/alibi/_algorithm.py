"""The ALiBi config, its functional forms and the algorithm."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from trainkit.algorithms._passes import ComposableAlgorithm
from trainkit.algorithms._surgery import check_surgery_allowed, replace_modules
from trainkit.algorithms.alibi._attention import AlibiAttention, AlibiBias
from trainkit.algorithms.alibi._models import (
    ZeroPositionEmbedding,
    extend_position_buffers,
    find_sites,
    position_table,
)
from trainkit.algorithms.seq_length_warmup import set_batch_sequence_length
from trainkit.core import Event, Logger, State
from trainkit.core.config import build_config, primary

__all__ = ["Alibi", "AlibiConfig", "apply_alibi", "scale_sequence_length"]

BIAS_BUDGET_BYTES = 16 * 2**30
"""The most memory the bias of one head count may take at ``max_sequence_length`` (and at
most half of a CUDA device's memory)."""


@dataclass(kw_only=True)
class AlibiConfig:
    max_sequence_length: int = primary(8192)
    """The longest sequence the model accepts after surgery: it bounds the bias (heads x
    length^2 float32, checked to fit in memory) and sets the position capacity (BERT's and
    RoBERTa's position buffers, the model config's ``max_position_embeddings``)."""
    train_sequence_length_scaling: float = 0.25
    """During training, each batch's sequences of length S become sequences of
    ``int(S * scaling)`` tokens, more of them (reshaped as Composer does, so no token is
    lost but a remainder); in (0, 1], 1.0 leaves batches alone. Evaluation sees full length."""

    def __post_init__(self) -> None:
        if (
            isinstance(self.max_sequence_length, bool)
            or not isinstance(self.max_sequence_length, int)
            or self.max_sequence_length < 1
        ):
            raise ValueError(
                f"max_sequence_length must be a positive int, got {self.max_sequence_length!r}"
            )
        scaling = self.train_sequence_length_scaling
        if (
            isinstance(scaling, bool)
            or not isinstance(scaling, int | float)
            or not 0 < scaling <= 1
        ):
            raise ValueError(
                f"train_sequence_length_scaling must be a number in (0, 1], got {scaling!r} "
                "(0.25 trains on quarter-length sequences, 1.0 on the data's own length)"
            )


def apply_alibi(
    model: nn.Module,
    config: AlibiConfig | None = None,
    /,
    *,
    optimizers: torch.optim.Optimizer | list[torch.optim.Optimizer] | None = None,
    **options: Any,
) -> dict[str, nn.Module]:
    """Give ``model``'s self-attention ALiBi and drop its learned position embeddings.

    Works on Hugging Face GPT-2, BERT and RoBERTa (any model holding their attention and
    embedding modules), with the "eager" or "sdpa" attention implementation. Takes an
    `AlibiConfig` or its fields as keyword arguments (``train_sequence_length_scaling`` is
    the algorithm's business and is not used here). Returns the replaced modules by name.

    Unlike Composer, which warns and carries on, a model it cannot change is an error: a
    `ValueError` naming the module for an unsupported model, a missing attribute, a head
    count that does not divide the hidden size, an attention implementation that ignores
    masks, a bias that would not fit in memory, or optimizers that already hold state.
    """
    max_sequence_length = build_config(AlibiConfig, config, options).max_sequence_length
    _require_transformers()
    optimizer_list = (
        [optimizers] if isinstance(optimizers, torch.optim.Optimizer) else list(optimizers or [])
    )
    check_surgery_allowed(optimizer_list, "alibi")
    if any(isinstance(m, AlibiAttention) for m in model.modules()):
        warnings.warn("alibi is already applied to this model; left as it is", stacklevel=2)
        return {}
    sites, holders = find_sites(model)
    biases: dict[tuple[int, bool], AlibiBias] = {}
    for site in sites:
        if (site.heads, site.causal) not in biases:
            _check_bias_fits(site.name, site.module, site.heads, max_sequence_length)
            biases[site.heads, site.causal] = AlibiBias(
                site.heads, max_sequence_length, causal=site.causal
            )
    by_id = {id(site.module): site for site in sites}
    tables = {id(position_table(name, holder, family)) for name, holder, family in holders}

    def wrap(module: nn.Module, index: int) -> nn.Module:
        site = by_id[id(module)]
        return AlibiAttention(module, biases[site.heads, site.causal], name=site.name)

    policies = {
        (lambda m: id(m) in by_id): wrap,
        (lambda m: id(m) in tables): lambda m, i: ZeroPositionEmbedding(m.embedding_dim),
    }
    replaced = replace_modules(model, policies, optimizers=optimizer_list, method="alibi")
    capacity = {
        family.name: extend_position_buffers(holder, family, max_sequence_length)
        for _, holder, family in holders
    }
    for site in sites:
        model_config = getattr(site.module, "config", None)
        if model_config is not None and site.family in capacity:
            model_config.max_position_embeddings = capacity[site.family]
    return replaced


def scale_sequence_length(
    batch: Mapping[str, Any], train_sequence_length_scaling: float
) -> dict[str, Any]:
    """Composer's reshape: every (N, S, ...) tensor becomes (N * S // S', S', ...), with
    ``S' = int(S * scaling)``; the last ``S % S'`` tokens of each sequence are dropped.

    Raises `ValueError` for a batch that is not a dict with an (N, S) ``input_ids``, or that
    holds a per-sample tensor (N, ...) that cannot follow the sequences into new rows.
    """
    ids = batch.get("input_ids") if isinstance(batch, Mapping) else None
    if not isinstance(ids, torch.Tensor) or ids.ndim != 2:
        raise ValueError(
            "alibi's train_sequence_length_scaling needs dict batches with an 'input_ids' "
            f"tensor shaped (N, S); got {type(batch).__name__}"
            + (f" with keys {sorted(batch)}" if isinstance(batch, Mapping) else "")
            + ". Set train_sequence_length_scaling=1.0 to leave batches alone"
        )
    n, length = ids.shape
    for key, value in batch.items():
        per_sample = isinstance(value, torch.Tensor) and value.ndim >= 1 and len(value) == n
        if per_sample and (value.ndim < 2 or value.shape[1] != length):
            raise ValueError(
                f"alibi's train_sequence_length_scaling splits each sequence into several "
                f"rows, but the batch's {key!r} (shape {tuple(value.shape)}) holds one value "
                f"per sample, not per token (input_ids: {(n, length)}); set "
                "train_sequence_length_scaling=1.0 for such batches"
            )
    return set_batch_sequence_length(
        batch, max(1, int(length * train_sequence_length_scaling)), truncate=False
    )


def _check_bias_fits(name: str, module: nn.Module, heads: int, max_sequence_length: int) -> None:
    needed = heads * max_sequence_length**2 * 4
    budget, where = BIAS_BUDGET_BYTES, "the bound for the bias"
    device = next(module.parameters(), torch.zeros(0)).device
    if device.type == "cuda":
        half = torch.cuda.get_device_properties(device).total_memory // 2
        if half < budget:
            budget, where = half, f"half of {device}'s memory"
    if needed > budget:
        largest = int((budget / (4 * heads)) ** 0.5)
        raise ValueError(
            f"alibi: at max_sequence_length={max_sequence_length} the bias of {name} "
            f"({heads} heads x {max_sequence_length}^2 float32) needs {needed / 2**30:.1f} GiB, "
            f"more than {where} ({budget / 2**30:.1f} GiB); use a max_sequence_length of at "
            f"most {largest}"
        )


def _require_transformers() -> None:
    try:
        import transformers  # noqa: F401
    except ImportError as err:
        raise ImportError(
            'alibi needs transformers: pip install "trainkit-algorithms[nlp]"'
        ) from err


class Alibi(ComposableAlgorithm, config=AlibiConfig):
    """ALiBi (Press et al. 2022): attention biased by distance instead of position embeddings.

    At INIT, `apply_alibi` wraps each self-attention module in an `AlibiAttention` that
    adds ``-slope_h * |i - j|`` to its attention mask and replaces the learned position
    table with a `ZeroPositionEmbedding`. At AFTER_DATALOADER, training batches are
    reshaped to ``train_sequence_length_scaling`` of their length (see `AlibiConfig`).
    Train short, evaluate long: nothing depends on absolute positions.

    Where trainkit differs from Composer, on purpose: a model it cannot change is an error
    naming the module, not a logged warning; the position table is replaced by a module
    without parameters (Composer keeps a zeroed, frozen table), and the wrapper puts the
    attention's parameters under ``<name>.attention.`` in the state dict, so checkpoints
    load into a model with ALiBi applied (``required_on_load``); one bias is shared by all
    layers and built on first use instead of a buffer per layer (which DDP would broadcast
    at every step). The bias is ``-slope * |i - j|`` for causal models too (Composer's
    ``slope * j`` gives the same softmax, but its large values lose precision late in long
    sequences in half precision).
    """

    config: AlibiConfig
    required_on_load = True
    required_events = (Event.INIT, Event.AFTER_DATALOADER)

    def __init__(self, config: AlibiConfig | None = None, /, **options: Any) -> None:
        super().__init__(config, **options)

    match_events = frozenset({Event.INIT, Event.AFTER_DATALOADER})

    def match(self, event: Event, state: State) -> bool:
        if event == Event.AFTER_DATALOADER:
            return self.config.train_sequence_length_scaling < 1
        return event == Event.INIT

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        if event == Event.AFTER_DATALOADER:
            state.batch = scale_sequence_length(
                state.batch, self.config.train_sequence_length_scaling
            )
            return
        model = state.parallelism.unwrap(state.model)
        replaced = apply_alibi(model, self.config, optimizers=state.optimizers)
        logger.log_hyperparameters({"alibi/num_replaced": len(replaced)})
