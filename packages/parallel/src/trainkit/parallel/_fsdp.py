"""`FSDP`: shard parameters, gradients and optimizer state (FSDP2, ``fully_shard``).

`FSDP.prepare` applies the parallelisms in a fixed order, torchtitan's:

1. tensor parallel (``tensor_parallel``) on the mesh's ``"tensor"`` dim,
2. activation checkpointing (``activation_checkpointing``),
3. ``torch.compile`` of each block (``compile``),
4. ``fully_shard`` of each block, then of the whole model, on the data-parallel dims (and
   the ``"context"`` dim: context-parallel ranks shard parameters too),
5. context parallel (``context_parallel``): training batches split along the sequence.

A model built on the meta device is allocated and initialised one block at a time, each
block just before it is sharded (`trainkit.core.meta.materialize`): no rank ever holds
more than its shards and one whole block, and the weights are those one process would
initialise with the same seed, on any number of ranks.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    FSDPModule,
    MixedPrecisionPolicy,
    OffloadPolicy,
    fully_shard,
)

from trainkit.core import ParallelStrategy, Precision, State, TrainModel, dist
from trainkit.core.config import slot
from trainkit.core.meta import materialize, on_meta
from trainkit.parallel._common import (
    ModuleSelector,
    broadcast_module_states,
    check_not_wrapped,
    require_process_group,
    sharded_precision,
)
from trainkit.parallel._context_parallel import ContextParallel, apply_context_parallel
from trainkit.parallel._mesh import ParallelDims
from trainkit.parallel._oom import fsdp_checkpoints, reset_fsdp_after_oom
from trainkit.parallel._tensor_parallel import TensorParallel, apply_tensor_parallel
from trainkit.parallel._wrap import apply_activation_checkpointing, apply_compile, find_blocks

__all__ = ["FSDP", "FSDPConfig", "mixed_precision_policy"]

_SHARDING = ("full", "grad_op", "hybrid", "none")
_MIXED_PRECISION = ("default", "pure", "full")


@dataclass(kw_only=True)
class FSDPConfig:
    """The options of `FSDP`."""

    sharding: str = "full"
    """``"full"`` (ZeRO-3: parameters resharded after forward), ``"grad_op"`` (ZeRO-2-like:
    parameters kept gathered from forward to backward), ``"hybrid"`` (shard within groups of
    ``shard_degree`` ranks, replicate across ``replicate_degree`` groups) or ``"none"``
    (replicate everything, like DDP)."""
    mixed_precision: str | MixedPrecisionPolicy = "default"
    """``"default"``: compute in the Trainer's precision (bf16 for ``amp_bf16``), reduce
    gradients in fp32; ``"pure"``: compute and reduce in the Trainer's precision;
    ``"full"``: fp32 throughout; or a `MixedPrecisionPolicy`. With ``precision="fp32"``
    all three are fp32."""
    cpu_offload: bool = False
    """Keep sharded parameters, gradients and optimizer state in CPU memory (the optimizer
    step runs on CPU)."""
    activation_checkpointing: bool | ModuleSelector = False
    """Recompute activations in backward: True for every block, module classes, or a
    predicate ``module -> bool``."""
    wrap: ModuleSelector | str | None = "auto"
    """Which modules get their own group: ``"auto"`` (each repeated block of a ModuleList,
    e.g. a transformer's layers), module classes, a predicate, or None (one group)."""
    reshard_after_forward: bool | int | None = None
    """Override the sharding's choice: True, False, or a smaller world size to reshard to."""
    replicate_degree: int | None = None
    """Replicas for ``"hybrid"`` (e.g. the number of nodes); inferred from ``shard_degree``."""
    shard_degree: int | None = None
    """Ranks sharing one copy for ``"hybrid"`` (e.g. GPUs per node); inferred from
    ``replicate_degree``."""
    tensor_parallel: TensorParallel | None = slot("trainkit.parallel", default=None)
    """Tensor parallelism inside each data-parallel rank (a 2-D or 3-D mesh): a
    `TensorParallel` with its plan and degree."""
    context_parallel: ContextParallel | None = slot("trainkit.parallel", default=None)
    """Context parallelism inside each data-parallel rank: a `ContextParallel` with its
    degree; its ranks read the same batches, split each sequence, and shard parameters
    with the data-parallel ranks (FSDP over shard x context)."""
    compile: bool | dict[str, Any] = False
    """``torch.compile`` each block (True, or keyword arguments for ``torch.compile``)."""
    sync_module_states: bool = True
    """Copy rank 0's weights to all ranks before sharding (so ranks that initialised the
    model differently still train one model); False skips the broadcast. A model on the
    meta device needs none: every rank initialises its blocks from the run's seed."""

    def __post_init__(self) -> None:
        if self.sharding not in _SHARDING:
            raise ValueError(
                f"FSDP sharding {self.sharding!r} is not known; use one of {list(_SHARDING)}"
            )
        mp = self.mixed_precision
        if not isinstance(mp, MixedPrecisionPolicy) and mp not in _MIXED_PRECISION:
            raise ValueError(
                f"FSDP mixed_precision {mp!r} is not known; use one of "
                f"{list(_MIXED_PRECISION)} or a torch.distributed.fsdp.MixedPrecisionPolicy"
            )
        for name in ("replicate_degree", "shard_degree"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 1
            ):
                raise ValueError(f"FSDP {name} must be a positive int or None, got {value!r}")
        if self.tensor_parallel is not None and not isinstance(
            self.tensor_parallel, TensorParallel
        ):
            raise TypeError(
                f"tensor_parallel must be a TensorParallel(plan=..., degree=...), got "
                f"{type(self.tensor_parallel).__name__}"
            )
        if self.context_parallel is not None and not isinstance(
            self.context_parallel, ContextParallel
        ):
            raise TypeError(
                f"context_parallel must be a ContextParallel(degree=...), got "
                f"{type(self.context_parallel).__name__}"
            )
        if not isinstance(self.compile, bool | Mapping):
            raise TypeError(
                f"FSDP compile must be a bool or a dict of torch.compile arguments, got "
                f"{self.compile!r}"
            )


class FSDP(ParallelStrategy, config=FSDPConfig):
    """Fully sharded data parallel on FSDP2 (``torch.distributed.fsdp.fully_shard``).

    Each block (see ``wrap``) becomes one group of parameters, gathered just before it runs
    and freed after; gradients are reduce-scattered so each rank keeps the optimizer state
    of its shard only. Parameter names do not change, so optimizers built on the model
    before the Trainer are re-bound to the sharded parameters by name.
    ``FSDP(sharding="grad_op")`` and ``FSDP(FSDPConfig(sharding="grad_op"))`` are the same.
    """

    config: FSDPConfig
    needs_process_group = True
    materializes_meta = True

    def __init__(self, config: FSDPConfig | None = None, /, **options: Any) -> None:
        super().__init__(config, **options)
        self._dims: ParallelDims | None = None  # set by prepare
        self._blocks: list[nn.Module] = []  # the sharded blocks, set by prepare

    @property
    def data_parallel_size(self) -> int:
        """The ranks that read distinct data: replicate x shard (each tensor-parallel and
        context-parallel group of ranks reads one slice)."""
        if self._dims is None:
            return self.dims(dist.get_world_size()).data_parallel
        return self._dims.data_parallel

    def dims(self, world_size: int) -> ParallelDims:
        """The replicate x shard x context x tensor degrees this strategy uses on
        ``world_size`` ranks.

        Raises:
            ValueError: the degrees do not fit the world size.
        """
        tensor, context = self._tensor_degree(), self._context_degree()
        if world_size % (tensor * context):
            degrees = f"tensor-parallel degree {tensor}"
            if context > 1:
                degrees = f"context-parallel degree {context} x {degrees} = {context * tensor}"
            raise ValueError(
                f"{degrees} does not divide the world size {world_size}; {_fitting(world_size)}"
            )
        data = world_size // (tensor * context)
        within = {"context": context, "tensor": tensor}
        replicate, shard = self.config.replicate_degree, self.config.shard_degree
        if self.config.sharding in ("full", "grad_op"):
            _expect(replicate, 1, "replicate_degree", self.config.sharding, "it does not replicate")
            _expect(shard, data, "shard_degree", self.config.sharding, "it shards over all ranks")
            return ParallelDims(replicate=1, shard=data, **within).resolve(world_size)
        if self.config.sharding == "none":
            _expect(shard, 1, "shard_degree", "none", "it does not shard")
            _expect(replicate, data, "replicate_degree", "none", "it replicates on all ranks")
            return ParallelDims(replicate=data, shard=1, **within).resolve(world_size)
        return _hybrid_dims(replicate, shard, data, within, world_size)

    def prepare(self, state: State) -> None:
        """Apply tensor parallel, checkpointing, compile, FSDP and context parallel in that
        order (collective)."""
        world_size = require_process_group("FSDP")
        check_not_wrapped(state.model, "FSDP")
        dims = self.dims(world_size)
        mesh = dims.build_mesh(state.device.type, world_size)
        model = state.model
        if self.config.context_parallel is not None:
            _check_no_train_metrics(model)
        if self.config.sync_module_states and not on_meta(model):  # meta: every rank inits the same
            broadcast_module_states(model)
        self.shard(state, mesh, dims, find_blocks(model, self.config.wrap))
        if self.config.context_parallel is not None:
            apply_context_parallel(model, mesh["context"], self.config.context_parallel.config)
        self._dims = dims

    def shard(
        self,
        state: State,
        mesh: DeviceMesh,
        dims: ParallelDims,
        blocks: list[nn.Module],
        root: nn.Module | None = None,
    ) -> None:
        """Tensor parallel, checkpointing, compile and ``fully_shard`` of ``blocks`` then of
        ``root`` (default ``state.model``), on ``mesh``'s ``"tensor"`` and data-parallel dims
        of ``dims`` (collective): `prepare`'s work on a mesh built by the caller (pipeline
        parallel's)."""
        model = state.model
        meta = on_meta(model)
        if meta and self.config.tensor_parallel is not None:
            raise ValueError(
                "FSDP(tensor_parallel=...) cannot take a model on the meta device yet; build "
                "the model on a real device, or drop tensor_parallel"
            )
        if self.config.tensor_parallel is not None:
            apply_tensor_parallel(model, self.config.tensor_parallel.config.plan, mesh["tensor"])
        apply_activation_checkpointing(model, self.config.activation_checkpointing, blocks)
        apply_compile(blocks, model, self.config.compile)
        options: dict[str, Any] = {
            "mesh": _sharding_mesh(mesh, dims),
            "mp_policy": mixed_precision_policy(self.config.mixed_precision, state.precision),
            "offload_policy": _offload_policy(self.config.cpu_offload, state.device),
        }
        reshard = self._reshard_after_forward()
        for i, block in enumerate(blocks):
            if meta:  # allocated and initialised whole one block at a time, then sharded
                materialize(model, state.device, state.seed, part=block, skip=blocks[:i])
            fully_shard(block, reshard_after_forward=reshard, **options)
        if meta:
            materialize(model, state.device, state.seed, skip=blocks)
        # None lets FSDP keep the root gathered after forward: backward needs it first.
        root = model if root is None else root
        fully_shard(root, reshard_after_forward=self.config.reshard_after_forward, **options)
        self._blocks = blocks

    def compile(self, model: nn.Module, options: Mapping[str, Any]) -> None:
        """The Trainer's ``compile``: each sharded block in place (the whole model when there
        are none), so FSDP's gathers and frees run between compiled regions and repeated
        blocks share one compiled graph; as the ``compile`` field does before sharding."""
        apply_compile(self._blocks, model, options)

    def precision_for(self, precision: Precision) -> Precision:
        """``precision``, with a `ShardedGradScaler` when it scales the loss (fp16): every
        rank then agrees whether an inf or nan in any shard skips the step."""
        return sharded_precision(precision)

    def no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager[None]:
        """Accumulate gradients locally, without reduce-scatter or all-reduce."""
        return _no_gradient_sync(model)

    def reset_after_oom(self, model: nn.Module) -> None:
        """Forget the forward or backward that failed: every group resharded and idle,
        nothing in flight, its gradients dropped (`reset_fsdp_after_oom`)."""
        reset_fsdp_after_oom(model)

    def add_oom_checkpoints(
        self, model: nn.Module, checkpoint: Callable[[], None]
    ) -> Callable[[], None]:
        """Before each block's gathers and reductions (`fsdp_checkpoints`)."""
        return fsdp_checkpoints(model, checkpoint)

    def unwrap(self, model: nn.Module) -> nn.Module:
        """The model itself: ``fully_shard`` works in place."""
        return model

    def _tensor_degree(self) -> int:
        if self.config.tensor_parallel is None:
            return 1
        if self.config.tensor_parallel.config.degree is None:
            raise ValueError(
                "FSDP(tensor_parallel=TensorParallel(plan=plan)) needs the tensor-parallel "
                "degree: TensorParallel(plan=plan, degree=d), with d dividing the world size"
            )
        return self.config.tensor_parallel.config.degree

    def _context_degree(self) -> int:
        if self.config.context_parallel is None:
            return 1
        if self.config.context_parallel.config.degree is None:
            raise ValueError(
                "FSDP(context_parallel=ContextParallel()) needs the context-parallel degree: "
                "ContextParallel(degree=d), with d dividing the world size"
            )
        return self.config.context_parallel.config.degree

    def _reshard_after_forward(self) -> bool | int:
        if self.config.reshard_after_forward is not None:
            return self.config.reshard_after_forward
        # grad_op keeps parameters gathered until backward; with one shard there is
        # nothing to gather again.
        return self.config.sharding in ("full", "hybrid")


def mixed_precision_policy(
    setting: str | MixedPrecisionPolicy, precision: Precision
) -> MixedPrecisionPolicy:
    """FSDP2's policy for ``setting`` (see `FSDPConfig.mixed_precision`) under ``precision``
    (its ``autocast_dtype`` is the low precision; none means fp32 throughout)."""
    if isinstance(setting, MixedPrecisionPolicy):
        return setting
    low = precision.autocast_dtype
    if setting == "full" or low is None:
        return MixedPrecisionPolicy()
    if setting == "pure":
        return MixedPrecisionPolicy(param_dtype=low, reduce_dtype=low)
    return MixedPrecisionPolicy(param_dtype=low, reduce_dtype=torch.float32)


@contextlib.contextmanager
def _no_gradient_sync(model: nn.Module) -> Iterator[None]:
    if not isinstance(model, FSDPModule):
        yield
        return
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


def _expect(value: int | None, expected: int, name: str, sharding: str, why: str) -> None:
    if value is not None and value != expected:
        raise ValueError(
            f"FSDP(sharding={sharding!r}) got {name}={value}, but {why}: leave it None "
            f"(or {expected}); use sharding='hybrid' to choose the degrees"
        )


def _hybrid_dims(
    replicate: int | None,
    shard: int | None,
    data: int,
    within: dict[str, int],
    world_size: int,
) -> ParallelDims:
    divisors = [d for d in range(1, data + 1) if data % d == 0]
    where = (
        f"{data} data-parallel ranks (world size {world_size} / tensor degree {within['tensor']}"
    )
    if within["context"] > 1:
        where += f" / context degree {within['context']}"
    where += ")"
    if replicate is None and shard is None:
        raise ValueError(
            f"FSDP(sharding='hybrid') needs replicate_degree or shard_degree (e.g. the "
            f"number of nodes, or GPUs per node) so that replicate x shard = {where}; "
            f"each may be one of {divisors}"
        )
    for name, value in (("replicate_degree", replicate), ("shard_degree", shard)):
        if value is not None and data % value:
            raise ValueError(
                f"FSDP(sharding='hybrid') {name}={value} does not fit {where}; use one of "
                f"{divisors}"
            )
    replicate = replicate or data // shard  # type: ignore[operator]
    shard = shard or data // replicate
    if replicate * shard != data:
        raise ValueError(
            f"FSDP(sharding='hybrid') replicate_degree={replicate} x shard_degree={shard} = "
            f"{replicate * shard}, but there are {where}"
        )
    return ParallelDims(replicate=replicate, shard=shard, **within).resolve(world_size)


def _check_no_train_metrics(model: nn.Module) -> None:
    # The Trainer updates training metrics with the model's outputs and the batch it
    # loaded: under context parallel, this rank's part of the outputs beside whole sequences.
    metrics = model.get_metrics(is_train=True) if isinstance(model, TrainModel) else {}
    if metrics:
        raise ValueError(
            f"FSDP(context_parallel=...) cannot update training metrics {sorted(metrics)}: "
            "each rank's outputs cover its part of the sequences only. Leave them out of "
            "training (evaluation metrics run on whole sequences and work as usual)"
        )


def _fitting(world_size: int) -> str:
    divisors = [d for d in range(1, world_size + 1) if world_size % d == 0]
    return f"it must be one of the world size's divisors {divisors}"


def _sharding_mesh(mesh: DeviceMesh, dims: ParallelDims) -> DeviceMesh:
    # Context-parallel ranks hold the same parameters and their gradients add up, so they
    # shard with the shard ranks: one flattened dim (torchtitan's dp_shard_cp).
    shard = "shard"
    if dims.context > 1:
        mesh["shard", "context"]._flatten("shard_context")
        shard = "shard_context"
    return mesh[shard] if dims.replicate == 1 else mesh["replicate", shard]


def _offload_policy(cpu_offload: bool, device: torch.device) -> OffloadPolicy:
    if not cpu_offload:
        return OffloadPolicy()
    return CPUOffloadPolicy(pin_memory=device.type == "cuda")
