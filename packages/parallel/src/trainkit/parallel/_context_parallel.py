"""`ContextParallel`: split each sequence across ranks (ring attention on SDPA).

Built on torch's ``torch.distributed.tensor.experimental.context_parallel``. In training,
each forward of the model takes the whole batch (every rank of a context group reads the
same one), and hooks on the model give the model only this rank's part of every sequence,
in torch's load-balanced order (the chunks from both ends, when the length is a multiple
of twice the degree), with its position ids and its labels shifted *before* the split, so
no label is lost at a chunk boundary. Scaled dot-product attention meanwhile runs as ring
attention over the group, in forward and in backward (the context stays open until the
backward of that forward has run, so recomputed activations see it too).

The model computes its loss in forward from the batch it is given (as transformers'
causal language models do from ``labels``): a sum over label tokens divided by
``num_items_in_batch``, which the hooks set so that the sum of the group's losses is the
mean over every label token of the whole sequences. The loss each rank then reports is the
group's (the same on every rank); its gradient is this rank's part. Evaluation and
prediction run the whole sequence on every rank, as without context parallel.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.nn import functional as F

from trainkit.core import ParallelStrategy, Precision, State
from trainkit.parallel._common import require_process_group

__all__ = ["ContextParallel", "ContextParallelConfig", "apply_context_parallel"]

IGNORE_INDEX = -100
"""Label value that leaves a position out of the loss (transformers' and torch's default)."""


@dataclass(kw_only=True)
class ContextParallelConfig:
    """The options of `ContextParallel`."""

    degree: int | None = None
    """Ranks that split each sequence (default: the world size). Inside
    ``FSDP(context_parallel=...)`` the degree must be given."""
    shift_labels: bool = True
    """Shift ``labels`` left by one before the split (next-token prediction, as causal
    language models do inside their loss) and give them to the model as ``labels`` and
    ``shift_labels`` (transformers then does not shift again). False: the batch's labels
    are already aligned with its positions."""
    sequence_keys: tuple[str, ...] | None = None
    """Batch keys whose dim 1 is the sequence, split with ``input_ids``. None: every tensor
    of the batch whose first two dims are those of ``input_ids``."""

    def __post_init__(self) -> None:
        if self.degree is not None and (
            isinstance(self.degree, bool) or not isinstance(self.degree, int) or self.degree < 1
        ):
            raise ValueError(f"ContextParallel degree must be a positive int, got {self.degree!r}")
        if self.sequence_keys is not None:
            keys = self.sequence_keys
            if isinstance(keys, str) or not all(isinstance(k, str) for k in keys):
                raise TypeError(
                    f"ContextParallel sequence_keys must be a list of batch keys, got {keys!r}"
                )
            self.sequence_keys = tuple(keys)


class ContextParallel(ParallelStrategy, config=ContextParallelConfig):
    """Context parallel over every rank; combine with data parallel and tensor parallel as
    ``FSDP(context_parallel=ContextParallel(degree=d))``.

    Alone, it is ``FSDP(context_parallel=...)`` with the context degree spanning the world:
    the ranks shard parameters, gradients and optimizer state between them (torchtitan's
    FSDP over data x context), and read the same batches.
    """

    config: ContextParallelConfig
    needs_process_group = True
    materializes_meta = True

    def __init__(self, config: ContextParallelConfig | None = None, /, **options: Any) -> None:
        super().__init__(config, **options)
        self._fsdp: ParallelStrategy | None = None  # set by prepare

    @property
    def data_parallel_size(self) -> int:
        """One: every rank of the context group reads the same batch."""
        return 1

    def prepare(self, state: State) -> None:
        """Shard the model over every rank with FSDP and split sequences (collective)."""
        from trainkit.parallel._fsdp import FSDP

        world_size = require_process_group("ContextParallel")
        degree = self.config.degree or world_size
        if degree != world_size:
            raise ValueError(
                f"ContextParallel(degree={degree}) alone must span the world size "
                f"{world_size}; to add data parallelism over the other ranks use "
                f"FSDP(context_parallel=ContextParallel(degree={degree}))"
            )
        spanning = ContextParallel(self.config, degree=world_size)
        self._fsdp = FSDP(context_parallel=spanning)
        self._fsdp.prepare(state)

    def _prepared(self) -> ParallelStrategy:
        if self._fsdp is None:
            raise RuntimeError("ContextParallel.prepare(state) has not run yet")
        return self._fsdp

    def no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager[None]:
        """FSDP's: gradients kept local for all microbatches but the last."""
        return self._prepared().no_sync(model)

    def precision_for(self, precision: Precision) -> Precision:
        """FSDP's: a sharded grad scaler when the precision scales the loss."""
        return self._prepared().precision_for(precision)

    def reset_after_oom(self, model: nn.Module) -> None:
        """FSDP's reset of the interrupted forward or backward."""
        self._prepared().reset_after_oom(model)

    def add_oom_checkpoints(
        self, model: nn.Module, checkpoint: Callable[[], None]
    ) -> Callable[[], None]:
        """FSDP's checkpoints before its collectives."""
        return self._prepared().add_oom_checkpoints(model, checkpoint)

    def compile(self, model: nn.Module, options: Mapping[str, Any]) -> None:
        """FSDP's: each sharded block in place."""
        self._prepared().compile(model, options)


def apply_context_parallel(
    model: nn.Module,
    mesh: DeviceMesh,
    config: ContextParallelConfig | None = None,
    **options: Any,
) -> Callable[[], None]:
    """Split the sequences of ``model``'s training batches over the 1-D ``mesh``.

    Installs the hooks described in this module's docstring on ``model`` (a `TrainModel`
    whose forward takes a dict batch with ``input_ids``); returns what removes them.
    """
    config = ContextParallelConfig(**options) if config is None else replace(config, **options)
    if mesh.ndim != 1:
        raise ValueError(f"context parallel needs a 1-D mesh, got {mesh.ndim} dims")
    hooks = _SequenceSplit(mesh, config)
    before = model.register_forward_pre_hook(hooks.before_forward, with_kwargs=True)
    after = model.register_forward_hook(hooks.after_forward, always_call=True)

    def remove() -> None:
        before.remove()
        after.remove()
        hooks.close()

    return remove


class _SequenceSplit:
    """The hooks of `apply_context_parallel`, and the context open from a training forward
    to the end of its backward."""

    def __init__(self, mesh: DeviceMesh, config: ContextParallelConfig) -> None:
        self.mesh, self.config = mesh, config
        self.degree = mesh.size()
        self.group = mesh.get_group()
        self.open: contextlib.ExitStack | None = None
        self.checked = False  # whether the group was seen to read the same batch

    def close(self) -> None:
        if self.open is not None:
            stack, self.open = self.open, None
            stack.close()

    def before_forward(
        self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        self.close()  # a forward that had no backward (or whose backward failed)
        if not (module.training and torch.is_grad_enabled()):
            return None  # evaluation and prediction: whole sequences on every rank
        if len(args) != 1 or kwargs:
            raise TypeError(
                "context parallel splits the batch a TrainModel's forward(batch) takes; "
                f"this forward got {len(args)} positional and {sorted(kwargs)} keyword arguments"
            )
        batch = args[0]
        keys, tensors, rest = _sequences(batch, self.config)
        if not self.checked:
            _check_same_batch(tensors[0], self.group)
            self.checked = True
        _check_length(tensors[0].shape[1], self.degree)
        stack = contextlib.ExitStack()
        try:
            _enter_context_parallel(stack, self.mesh, tensors)
        except BaseException:
            stack.close()
            raise
        self.open = stack
        local = dict(zip(keys, tensors, strict=True))  # now this rank's parts
        if self.config.shift_labels and "labels" in local and "shift_labels" not in local:
            local["shift_labels"] = local["labels"]  # shifted before the split
        labels = local["shift_labels"] if "shift_labels" in local else local["labels"]
        counted = (labels != IGNORE_INDEX).sum()
        dist.all_reduce(counted, group=self.group)
        # Each rank's loss is its label tokens' sum over the group's count, times the
        # degree: FSDP averages the gradients over the group, which then sum to the
        # gradient of the mean over every label token.
        local["num_items_in_batch"] = counted.clamp(min=1).float() / self.degree
        return ({**rest, **local},), {}

    def after_forward(self, module: nn.Module, args: Any, outputs: Any) -> Any:
        if self.open is None:
            return None
        if outputs is None:  # the forward raised (an always-called hook): close at once
            self.close()
            return None
        try:
            loss = _loss_of(outputs)
        except ValueError:
            self.close()
            raise
        group_loss = loss.detach().clone()
        dist.all_reduce(group_loss, group=self.group)
        # The group's loss as the value (what every rank reports), this rank's as gradient.
        reported = group_loss / self.degree + (loss - loss.detach())
        if reported.requires_grad:
            reported.register_hook(self._close_after_backward)
        _set_loss(outputs, reported)
        return outputs

    def _close_after_backward(self, grad: torch.Tensor) -> None:
        torch.autograd.Variable._execution_engine.queue_callback(self.close)


def _sequences(
    batch: Any, config: ContextParallelConfig
) -> tuple[list[str], list[torch.Tensor], dict[str, Any]]:
    """The batch's sequence tensors (copies, ``input_ids`` first, position ids and shifted
    labels made), their keys, and its other entries."""
    if not isinstance(batch, Mapping) or not isinstance(batch.get("input_ids"), torch.Tensor):
        raise TypeError(
            "context parallel splits dict batches with an 'input_ids' tensor of shape "
            f"(batch, sequence); got {_describe(batch)}"
        )
    ids = batch["input_ids"]
    if ids.ndim != 2:
        raise ValueError(
            f"context parallel needs input_ids of shape (batch, sequence), got {tuple(ids.shape)}"
        )
    if "labels" not in batch and "shift_labels" not in batch:
        raise ValueError(
            "context parallel needs the batch's 'labels' (or 'shift_labels'): the model "
            "computes its loss on its part of each sequence in forward, as transformers' "
            f"causal LMs do from labels; got {_describe(batch)}"
        )
    if "attention_mask" in batch:
        raise ValueError(
            "context parallel runs causal attention over whole packed sequences, and ring "
            "attention cannot apply the batch's 'attention_mask': pack sequences without "
            "padding and leave attention_mask out (label -100 keeps a position out of the loss)"
        )
    if config.sequence_keys is None:
        keys = [
            key
            for key, value in batch.items()
            if isinstance(value, torch.Tensor) and value.shape[:2] == ids.shape
        ]
    else:
        keys = ["input_ids", *(k for k in config.sequence_keys if k != "input_ids")]
        for key in keys:
            value = batch.get(key)
            if not (isinstance(value, torch.Tensor) and value.shape[:2] == ids.shape):
                raise ValueError(
                    f"ContextParallel sequence_keys names {key!r}, but the batch's {key!r} is "
                    f"not a tensor of shape {tuple(ids.shape)} + (...): {_describe(value)}"
                )
    keys.remove("input_ids")
    keys.insert(0, "input_ids")
    sequences = {key: batch[key].clone() for key in keys}
    if "position_ids" not in sequences:
        sequences["position_ids"] = torch.arange(ids.shape[1], device=ids.device).repeat(
            ids.shape[0], 1
        )
    if config.shift_labels and "labels" in sequences and "shift_labels" not in batch:
        sequences["labels"] = F.pad(sequences["labels"][:, 1:], (0, 1), value=IGNORE_INDEX)
    rest = {key: value for key, value in batch.items() if key not in sequences}
    return list(sequences), list(sequences.values()), rest


def _enter_context_parallel(
    stack: contextlib.ExitStack, mesh: DeviceMesh, tensors: list[torch.Tensor]
) -> None:
    from torch.distributed.tensor.experimental import context_parallel

    stack.enter_context(
        context_parallel(
            mesh,
            buffers=tensors,
            buffer_seq_dims=[1] * len(tensors),
            no_restore_buffers=set(tensors),
        )
    )
    if mesh.device_type == "cpu":
        stack.enter_context(_attention_refused_on_cpu())


@contextlib.contextmanager
def _attention_refused_on_cpu() -> Iterator[None]:
    # torch's ring attention dispatches the flash, memory-efficient and cuDNN SDPA kernels
    # only; on CPU it fails deep inside DTensor ("..._for_cpu does not have a sharding
    # strategy registered"). Said plainly instead, before any collective.
    patched = F.scaled_dot_product_attention

    def refuse(query: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        raise NotImplementedError(
            f"context parallel attention needs CUDA: torch {torch.__version__}'s ring "
            "attention (torch.distributed.tensor.experimental.context_parallel) runs the "
            "flash, memory-efficient and cuDNN kernels of scaled_dot_product_attention, and "
            f"this model called it on {query.device.type}. Train with context parallel on "
            "GPUs (models without attention split their sequences on CPU too)"
        )

    F.scaled_dot_product_attention = refuse
    try:
        yield
    finally:
        F.scaled_dot_product_attention = patched


def _check_same_batch(ids: torch.Tensor, group: dist.ProcessGroup) -> None:
    # Once, on the first batch: ranks of a context group that read different batches would
    # train on chunks of unrelated sequences without any error.
    mine = torch.stack(
        [torch.tensor(ids.shape[0]), torch.tensor(ids.shape[1]), ids.long().sum().cpu()]
    ).to(ids.device)
    seen = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(seen, mine, group=group)
    if any(not torch.equal(other, mine) for other in seen):
        raise ValueError(
            "the ranks of a context-parallel group read different batches; they must read "
            "the same one and each computes its part of the sequence. Give their samplers "
            "the data-parallel rank and size, e.g. DistributedSampler(ds, "
            "num_replicas=dims.data_parallel, rank=dims.data_parallel_rank(rank)), dims "
            "being the run's ParallelDims (FSDP(...).dims(world_size))"
        )


def _check_length(length: int, degree: int) -> None:
    if length % degree:
        raise ValueError(
            f"sequence length {length} does not split over context-parallel degree {degree}: "
            f"use sequences whose length is a multiple of {degree} (of {2 * degree} to balance "
            "causal attention), or another degree"
        )


def _loss_of(outputs: Any) -> torch.Tensor:
    loss = outputs.get("loss") if isinstance(outputs, Mapping) else getattr(outputs, "loss", None)
    if not isinstance(loss, torch.Tensor):
        raise ValueError(
            f"context parallel needs the model's forward to compute the loss on its part of "
            f"the sequence (outputs with a 'loss', as transformers' causal LMs return when the "
            f"batch has 'labels'); got {_describe(outputs)} without one. Include 'labels' in "
            "the batch"
        )
    return loss


def _set_loss(outputs: Any, loss: torch.Tensor) -> None:
    if isinstance(outputs, MutableMapping):
        outputs["loss"] = loss  # transformers' ModelOutput keeps its attribute in step
    else:
        outputs.loss = loss


def _describe(value: Any) -> str:
    if isinstance(value, Mapping):
        return f"a {type(value).__name__} with keys {sorted(map(str, value))}"
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    return f"a {type(value).__name__}"
