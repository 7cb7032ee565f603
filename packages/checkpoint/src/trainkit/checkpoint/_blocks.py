"""DTensors whose local shard is several blocks of the whole tensor, as DCP can save them.

torch.distributed.checkpoint describes each rank's part of a DTensor as one block (its
offsets and sizes in the whole tensor). A ``_StridedShard`` placement that is alone on
its dim gives a rank several blocks instead: a fused q/k/v projection split by heads
(trainkit.parallel's ``FusedColwiseParallel``) leaves each rank its slice of q, of k and of
v. DCP would describe that as one block at a wrong offset, and refuses the save
("overlapping chunks"). Such tensors are handed to DCP as `LocalBlocks`, one view of the
local tensor per block, so the checkpoint holds the whole tensor in its unsharded layout
(and loads into any other layout, or none).

`split_blocks` swaps them into a state dict in place; the planners below find the blocks
that DCP asks for.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, DefaultSavePlanner
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    MetadataIndex,
    TensorProperties,
)
from torch.distributed.checkpoint.planner import TensorWriteData, WriteItem, WriteItemType
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.placement_types import _StridedShard

from trainkit.core import dist

__all__ = [
    "BlockLoadPlanner",
    "BlockSavePlanner",
    "LocalBlocks",
    "full_model_state",
    "split_blocks",
]

Interval = tuple[int, int]  # (start, length) along one dim


class LocalBlocks(torch.Tensor):
    """This rank's blocks of a sharded tensor: each a view of its local tensor, with where
    it sits in the whole tensor. DCP reads and writes them through the ``_Checkpointable``
    protocol that DTensor also implements.

    A tensor of the whole tensor's shape holding no data itself (as DTensor is), so that
    DCP's walks over a state dict keep it, and its checks of sizes see the whole shape. Its
    only operation is ``new_empty``, with which DCP's asynchronous stager starts the host
    copy (then copies the blocks).
    """

    blocks: list[tuple[torch.Size, torch.Size, torch.Tensor]]
    properties: TensorProperties

    @staticmethod
    def __new__(cls, shape: torch.Size, local: torch.Tensor, blocks: list[Any]) -> LocalBlocks:
        self = cls._shell(shape, local.dtype, local.device)
        self.properties = TensorProperties.create_from_tensor(local)
        self.blocks = blocks  # (offsets in the whole tensor, sizes, the view of the local tensor)
        return self

    @classmethod
    def _shell(cls, shape: Any, dtype: torch.dtype, device: Any) -> LocalBlocks:
        return torch.Tensor._make_wrapper_subclass(cls, shape, dtype=dtype, device=device)  # type: ignore[attr-defined]

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is torch.ops.aten.new_empty.default:
            this, shape = args[0], args[1]
            return cls._shell(shape, this.dtype, (kwargs or {}).get("device", this.device))
        raise NotImplementedError(
            f"LocalBlocks only carries a sharded tensor's blocks to torch.distributed.checkpoint; "
            f"it does not support {func}"
        )

    def __create_write_items__(self, fqn: str, obj: Any) -> list[WriteItem]:
        return [
            WriteItem(
                index=MetadataIndex(fqn, offsets, i),
                type=WriteItemType.SHARD,
                tensor_data=TensorWriteData(
                    chunk=ChunkStorageMetadata(offsets=offsets, sizes=sizes),
                    properties=self.properties,
                    size=self.shape,
                ),
            )
            for i, (offsets, sizes, _) in enumerate(self.blocks)
        ]

    def __create_chunk_list__(self) -> list[ChunkStorageMetadata]:
        return [ChunkStorageMetadata(offsets=o, sizes=s) for o, s, _ in self.blocks]

    def block(self, index: MetadataIndex) -> torch.Tensor:
        """The view of the block at ``index.offset``."""
        if index.index is not None and index.index < len(self.blocks):
            offsets, _, view = self.blocks[index.index]
            if offsets == index.offset:
                return view
        for offsets, _, view in self.blocks:
            if offsets == index.offset:
                return view
        raise ValueError(f"{index.fqn} has no block at offsets {tuple(index.offset or ())}")


def local_blocks(tensor: DTensor) -> LocalBlocks | None:
    """``tensor``'s blocks on this rank, or None when DCP describes it right by itself (no
    ``_StridedShard``, or one composed with another placement on the same dim, as FSDP2 on
    top of tensor parallelism makes; or this rank is outside its mesh)."""
    placements = tensor.placements
    if not any(isinstance(p, _StridedShard) for p in placements):
        return None
    mesh = tensor.device_mesh
    coordinate = mesh.get_coordinate()
    if coordinate is None:
        return None
    by_dim: dict[int, list[int]] = {}
    for mesh_dim, placement in enumerate(placements):
        if isinstance(placement, _StridedShard) or placement.is_shard():
            by_dim.setdefault(placement.dim, []).append(mesh_dim)  # type: ignore[attr-defined]
    if any(len(mesh_dims) > 1 for mesh_dims in by_dim.values()):
        return None
    per_dim: list[list[Interval]] = []
    for dim, size in enumerate(tensor.shape):
        if dim not in by_dim:
            per_dim.append([(0, size)])
            continue
        mesh_dim = by_dim[dim][0]
        placement, ranks = placements[mesh_dim], mesh.size(mesh_dim)
        mine = coordinate[mesh_dim]
        if isinstance(placement, _StridedShard):
            # As DTensor splits it: `split_factor` chunks, each cut in `ranks` pieces; this
            # rank holds its piece of every chunk, side by side.
            chunks = _chunked((0, size), placement.split_factor)
            per_dim.append([_chunked(chunk, ranks)[mine] for chunk in chunks])
        else:
            per_dim.append([_chunked((0, size), ranks)[mine]])
    local = tensor.to_local()
    blocks = []
    for parts in itertools.product(*(_with_local_starts(intervals) for intervals in per_dim)):
        if any(length == 0 for _, _, length in parts):
            continue
        view = local
        for dim, (_, local_start, length) in enumerate(parts):
            view = view.narrow(dim, local_start, length)
        offsets = torch.Size(start for start, _, _ in parts)
        blocks.append((offsets, torch.Size(length for _, _, length in parts), view))
    return LocalBlocks(tensor.shape, local, blocks)


def _chunked(interval: Interval, parts: int) -> list[Interval]:
    # torch.chunk's split (what DTensor uses): pieces of ceil(length / parts), the last ones
    # shorter or empty.
    start, length = interval
    step = -(-length // parts)
    return [
        (start + min(i * step, length), max(0, min(step, length - i * step))) for i in range(parts)
    ]


def _with_local_starts(intervals: list[Interval]) -> list[tuple[int, int, int]]:
    # (start in the whole tensor, start in the local tensor, length)
    local, out = 0, []
    for start, length in intervals:
        out.append((start, local, length))
        local += length
    return out


def split_blocks(tree: Any) -> Callable[[Any], None]:
    """Replace, in place, every DTensor in ``tree`` (nested dicts and lists) whose local
    shard is several blocks by its `LocalBlocks`; returns a function that puts the DTensors
    back into a tree (the same one, or the one DCP rebuilt from it). Blocks are views: what
    DCP loads into them lands in the DTensors."""
    originals: dict[int, DTensor] = {}

    def swap(value: Any) -> Any:
        if isinstance(value, DTensor):
            blocks = local_blocks(value)
            if blocks is not None:
                originals[id(blocks)] = value
                return blocks
        return _walk(value, swap)

    _walk(tree, swap)

    def restore(loaded: Any) -> None:
        def back(value: Any) -> Any:
            if isinstance(value, LocalBlocks):
                return originals[id(value)]
            return _walk(value, back)

        _walk(loaded, back)

    return restore


def _walk(value: Any, fn: Callable[[Any], Any]) -> Any:
    # Applies fn to each value of a dict or list, in place; returns the container.
    if isinstance(value, dict):
        for key, item in value.items():
            value[key] = fn(item)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            value[index] = fn(item)
    return value


def full_model_state(module: nn.Module) -> dict[str, torch.Tensor]:
    """``module``'s state dict gathered whole, on the CPU of rank 0 (``{}`` on the other
    ranks). Collective: every rank calls it.

    Torch's ``get_model_state_dict(full_state_dict=True)`` gathers each DTensor with
    ``full_tensor()``, which torch 2.11 cannot do for a strided shard; here such a tensor is
    gathered as its blocks, each put where it sits. One tensor at a time, as torch does.
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    sharded = get_model_state_dict(module, options=StateDictOptions(full_state_dict=False))
    keep = dist.get_rank() == 0
    full = {}
    for name, value in sharded.items():
        if isinstance(value, DTensor):
            blocks = local_blocks(value)
            value = value.full_tensor() if blocks is None else _assembled(blocks)
        if keep:
            full[name] = value.detach().cpu()
    return full


def _assembled(blocks: LocalBlocks) -> torch.Tensor:
    mine = [(offsets, sizes, view.detach().cpu()) for offsets, sizes, view in blocks.blocks]
    whole = torch.empty(blocks.shape, dtype=blocks.dtype)
    for pieces in dist.all_gather_object(mine):
        for offsets, sizes, data in pieces:
            whole[tuple(slice(o, o + n) for o, n in zip(offsets, sizes, strict=True))] = data
    return whole


class BlockSavePlanner(DefaultSavePlanner):
    """DCP's default save planner, which also finds the blocks of `LocalBlocks`."""

    def lookup_object(self, index: MetadataIndex) -> Any:
        found = self.state_dict.get(index.fqn)
        if isinstance(found, LocalBlocks):
            return found.block(index)
        return super().lookup_object(index)


class BlockLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner, which also finds the blocks of `LocalBlocks`."""

    def lookup_tensor(self, index: MetadataIndex) -> torch.Tensor:
        found = self.state_dict.get(index.fqn)
        if isinstance(found, LocalBlocks):
            return found.block(index)
        return super().lookup_tensor(index)
