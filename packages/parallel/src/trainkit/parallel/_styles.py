"""Tensor-parallel styles: torch's, taught about transformers' ``Conv1D`` and fused QKV.

GPT-2 (and other OpenAI-style models in transformers) use ``Conv1D``: a linear layer whose
weight is stored transposed, ``(in_features, out_features)``. torch's styles accept only
``nn.Linear`` and ``nn.Embedding``; these accept ``Conv1D`` too, sharding the transposed
dims, so parameter names and full shapes stay those of the unsharded model (checkpoints
load with or without tensor parallelism). transformers is never imported: ``Conv1D`` is
recognised by its class name and its ``nf`` / ``nx`` attributes.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import (
    DTensor,
    Partial,
    Placement,
    Replicate,
    Shard,
    distribute_module,
)
from torch.distributed.tensor import distribute_tensor as _distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel as _TorchColwise
from torch.distributed.tensor.parallel import ParallelStyle
from torch.distributed.tensor.parallel import RowwiseParallel as _TorchRowwise
from torch.distributed.tensor.placement_types import _StridedShard
from torch.nn import functional as F

__all__ = [
    "ColwiseParallel",
    "FusedColwiseParallel",
    "RowwiseParallel",
    "ShardedAttributes",
    "is_conv1d",
]


def is_conv1d(module: nn.Module) -> bool:
    """True for transformers' ``Conv1D`` (a linear layer with a ``(in, out)`` weight)."""
    return type(module).__name__ == "Conv1D" and hasattr(module, "nf") and hasattr(module, "nx")


def _shard_params(
    module: nn.Module, mesh: DeviceMesh, placements: dict[str, Placement], src_data_rank: Any
) -> None:
    for name, param in list(module.named_parameters(recurse=False)):
        placement = placements.get(name, Replicate())
        dist_param = nn.Parameter(
            _distribute_tensor(param, mesh, [placement], src_data_rank=src_data_rank),
            requires_grad=param.requires_grad,
        )
        module.register_parameter(name, dist_param)


class ColwiseParallel(_TorchColwise):
    """Shard the output features (torch's `ColwiseParallel`, also for ``Conv1D``).

    The input is replicated; each rank computes its slice of the output features.
    """

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        if not is_conv1d(module):
            return super()._apply(module, device_mesh)
        placements = {"weight": Shard(1), "bias": Shard(0)}
        return distribute_module(
            module,
            device_mesh,
            lambda _, m, mesh: _shard_params(m, mesh, placements, self.src_data_rank),
            partial(self._prepare_input_fn, self.input_layouts, self.desired_input_layouts),
            partial(self._prepare_output_fn, self.output_layouts, self.use_local_output),
        )


class RowwiseParallel(_TorchRowwise):
    """Shard the input features (torch's `RowwiseParallel`, also for ``Conv1D``).

    The input is sharded on its last dim; partial outputs are summed across ranks.
    """

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        if not is_conv1d(module):
            return super()._apply(module, device_mesh)
        self.desired_input_layouts = (Shard(-1),)
        placements = {"weight": Shard(0), "bias": Replicate()}
        return distribute_module(
            module,
            device_mesh,
            lambda _, m, mesh: _shard_params(m, mesh, placements, self.src_data_rank),
            partial(self._prepare_input_fn, self.input_layouts, self.desired_input_layouts),
            partial(self._prepare_output_fn, self.output_layouts, self.use_local_output),
        )


class FusedColwiseParallel(ParallelStyle):
    """Column-wise sharding of a fused projection such as GPT-2's ``c_attn`` (q, k, v).

    The output features are ``chunks`` blocks side by side (``[q | k | v]``); each rank
    gets its slice of every block (``[q_r | k_r | v_r]``), so the module's own
    ``split`` into q, k and v still works on the local output. The weight is stored as a
    DTensor with a ``_StridedShard`` placement: gathering it gives back the unsharded
    layout, so checkpoints are the same as without tensor parallelism. The bias stays
    replicated (it is small): a strided bias cannot be sharded again by FSDP on the
    same dim, while a replicated one can.

    The projection itself runs on local tensors (the module's ``forward`` is replaced):
    the rank's weight block times the replicated input, plus the rank's slices of the
    bias. Only the gradients cross ranks: the input's partial gradients are summed and
    the bias's slices gathered, as DTensor does for `ColwiseParallel`. No op sees a
    strided DTensor, which torch 2.11's DTensor cannot re-lay out.

    Args:
        chunks: how many blocks are fused (3 for q, k, v).
        use_local_output: return the local tensor (True) or a DTensor.
    """

    def __init__(self, *, chunks: int = 3, use_local_output: bool = True):
        super().__init__()
        if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 1:
            raise ValueError(f"chunks must be a positive int, got {chunks!r}")
        self.chunks = chunks
        self.use_local_output = use_local_output

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        if is_conv1d(module):
            out_dim = 1
        elif isinstance(module, nn.Linear):
            out_dim = 0
        else:
            raise NotImplementedError(
                f"FusedColwiseParallel shards nn.Linear and transformers' Conv1D, not "
                f"{type(module).__name__}"
            )
        features, degree = module.weight.shape[out_dim], device_mesh.size()
        if features % (self.chunks * degree):
            raise ValueError(
                f"FusedColwiseParallel(chunks={self.chunks}) cannot shard a "
                f"{type(module).__name__} with {features} output features over {degree} "
                f"ranks: each of its {self.chunks} blocks must split evenly, so the features "
                f"must be divisible by {self.chunks * degree}. Use a tensor-parallel degree "
                f"that divides {features // self.chunks} (the features of one block), or check "
                f"chunks={self.chunks} against the model"
            )
        strided = partial(_StridedShard, split_factor=self.chunks)
        placements = {"weight": strided(out_dim), "bias": Replicate()}
        distribute_module(
            module,
            device_mesh,
            lambda _, m, mesh: _shard_params(m, mesh, placements, self.src_data_rank),
            self._prepare_input,
        )
        module.forward = partial(_fused_forward, module, self.chunks, self.use_local_output)
        return module

    @staticmethod
    def _prepare_input(module: nn.Module, inputs: Any, mesh: DeviceMesh) -> Any:
        # The input, replicated, as a local tensor whose gradient is partial: every rank's
        # share of it is summed on the way back.
        tensor = inputs[0]
        if not isinstance(tensor, DTensor):
            tensor = DTensor.from_local(tensor, mesh, (Replicate(),), run_check=False)
        elif tensor.placements != (Replicate(),):
            tensor = tensor.redistribute(placements=(Replicate(),))
        return (tensor.to_local(grad_placements=(Partial(),)), *inputs[1:])

    def __repr__(self) -> str:
        return f"FusedColwiseParallel(chunks={self.chunks})"


def _fused_forward(
    module: nn.Module, chunks: int, use_local_output: bool, inputs: torch.Tensor
) -> torch.Tensor:
    # [q_r | k_r | v_r] from the rank's weight block; the gradient of the local block is
    # the local block of the gradient, so the weight's gradient stays where it is.
    weight = module.weight
    local_weight = weight.to_local()
    bias = module.bias
    if bias is not None:
        # [b_q | b_k | b_v] -> [b_q_r | b_k_r | b_v_r]: plain Shard placements, which every
        # torch re-lays out (the gradient is gathered back into the replicated bias).
        blocks = bias.view(chunks, -1).redistribute(placements=(Shard(1),))
        bias = blocks.to_local().reshape(-1)
    if is_conv1d(module):
        flat = inputs.reshape(-1, inputs.shape[-1])
        product = flat @ local_weight if bias is None else torch.addmm(bias, flat, local_weight)
        output = product.view(*inputs.shape[:-1], product.shape[-1])
    else:
        output = F.linear(inputs, local_weight, bias)
    if use_local_output:
        return output
    placements = (_StridedShard(output.ndim - 1, split_factor=chunks),)
    return DTensor.from_local(output, weight.device_mesh, placements, run_check=False)


class ShardedAttributes(ParallelStyle):
    """Divide integer attributes of a module by the tensor-parallel degree.

    For modules whose forward uses a global size that becomes local under tensor
    parallelism, e.g. GPT-2 attention's ``split_size`` (the width of each of q, k, v).
    No parameter is touched.

    Args:
        names: the attributes to divide; each must be divisible by the degree.
    """

    def __init__(self, *names: str):
        super().__init__()
        if not names:
            raise ValueError("ShardedAttributes needs at least one attribute name")
        self.names = names

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        degree = device_mesh.size()
        for name in self.names:
            value = getattr(module, name, None)
            if not isinstance(value, int):
                raise ValueError(
                    f"{type(module).__name__} has no integer attribute {name!r} to shard "
                    f"(got {value!r})"
                )
            if value % degree:
                raise ValueError(
                    f"{type(module).__name__}.{name} = {value} is not divisible by the "
                    f"tensor-parallel degree {degree}; use a degree that divides it"
                )
            setattr(module, name, value // degree)
        return module

    def __repr__(self) -> str:
        return f"ShardedAttributes{self.names}"
