"""`ParallelDims`: how the ranks split into pipeline x replicate x shard x context x tensor,
and its `DeviceMesh`."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

__all__ = ["MESH_DIMS", "ParallelDims"]

MESH_DIMS = ("pipeline", "replicate", "shard", "context", "tensor")
"""Names of the mesh dimensions, outermost first: ranks next to each other share a tensor-
parallel group (the fastest links), then a context-parallel group, then a shard group, then
the replicas, then the pipeline stages (which exchange only activations, point to point)."""


@dataclass(frozen=True, kw_only=True)
class ParallelDims:
    """Degrees of each kind of parallelism; they multiply to the world size.

    Rank ``r`` sits at mesh coordinate ``(r // (replicate * shard * context * tensor),
    r // (shard * context * tensor) % replicate, r // (context * tensor) % shard,
    r // tensor % context, r % tensor)``, the last dimension varying fastest. One degree may
    be -1: it takes whatever the others leave.

    Example: 8 GPUs as 2 replicas of a model sharded over 2 ranks, each rank holding half
    of every layer (tensor parallel 2): ``ParallelDims(replicate=2, shard=2, tensor=2)``.
    """

    pipeline: int = 1
    """Pipeline stages: each rank of a pipeline group holds a slice of the model's layers,
    and the group reads one batch (pipeline parallel)."""
    replicate: int = 1
    """Data-parallel replicas: parameters copied, gradients all-reduced (HSDP's outer dim)."""
    shard: int = -1
    """Data-parallel ranks that shard parameters, gradients and optimizer state (FSDP)."""
    context: int = 1
    """Ranks that split each sequence between them (context parallel): they read the same
    batch, each computes its slice of the sequence, and they shard parameters with the
    ``shard`` ranks (FSDP over shard x context)."""
    tensor: int = 1
    """Ranks that split each layer's matrices between them (tensor parallel)."""

    def __post_init__(self) -> None:
        degrees = self.as_dict()
        for name, value in degrees.items():
            if isinstance(value, bool) or not isinstance(value, int) or (value < 1 and value != -1):
                raise ValueError(
                    f"ParallelDims {name}={value!r} is not a degree; use a positive int, or -1 "
                    "for 'the rest of the world size'"
                )
        inferred = [name for name, value in degrees.items() if value == -1]
        if len(inferred) > 1:
            raise ValueError(
                f"ParallelDims can infer one degree, but {inferred} are all -1; give all but one"
            )

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in MESH_DIMS}

    def resolve(self, world_size: int) -> ParallelDims:
        """These degrees with -1 filled in, checked against ``world_size``.

        Raises:
            ValueError: the degrees do not multiply to ``world_size``.
        """
        degrees = self.as_dict()
        known = math.prod(v for v in degrees.values() if v != -1)
        for name, value in degrees.items():
            if value == -1:
                if world_size % known:
                    raise ValueError(
                        f"cannot infer ParallelDims {name}: the other degrees ({known}) do not "
                        f"divide the world size {world_size}; {_accepted(world_size)}"
                    )
                degrees[name] = world_size // known
        product = math.prod(degrees.values())
        if product != world_size:
            shown = " x ".join(f"{k}={v}" for k, v in degrees.items())
            raise ValueError(
                f"ParallelDims {shown} = {product} ranks, but the world size is {world_size}; "
                f"the degrees must multiply to the world size ({_accepted(world_size)})"
            )
        return dataclasses.replace(self, **degrees)

    @property
    def data_parallel(self) -> int:
        """Ranks that see different batches: replicate x shard."""
        return self.replicate * self.shard

    def data_parallel_rank(self, rank: int) -> int:
        """Which slice of the data global ``rank`` reads: ranks that differ only in their
        pipeline stage or their place in a context or tensor group read the same (its index
        among the ``data_parallel`` slices)."""
        self._check_resolved("data_parallel_rank")
        return rank // (self.context * self.tensor) % self.data_parallel

    def context_parallel_rank(self, rank: int) -> int:
        """Which part of each sequence global ``rank`` computes (0 to ``context - 1``)."""
        self._check_resolved("context_parallel_rank")
        return rank // self.tensor % self.context

    def build_mesh(self, device_type: str, world_size: int) -> DeviceMesh:
        """The ``DeviceMesh`` over every rank, one dim per name of `MESH_DIMS` (collective)."""
        dims = self.resolve(world_size)
        shape = tuple(dims.as_dict().values())
        return init_device_mesh(device_type, shape, mesh_dim_names=MESH_DIMS)

    def _check_resolved(self, what: str) -> None:
        inferred = [name for name, value in self.as_dict().items() if value == -1]
        if inferred:
            raise ValueError(
                f"ParallelDims.{what} needs every degree, but {inferred} is -1; call "
                "resolve(world_size) first"
            )


def _accepted(world_size: int) -> str:
    divisors = [d for d in range(1, world_size + 1) if world_size % d == 0]
    return f"each degree must be one of {divisors}"
