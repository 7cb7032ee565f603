"""trainkit.parallel: DDP, FSDP2, tensor parallel and their combination on a DeviceMesh."""

from torch.distributed.fsdp import MixedPrecisionPolicy
from torch.distributed.tensor.parallel import (
    ParallelStyle,
    PrepareModuleInput,
    PrepareModuleOutput,
    SequenceParallel,
)

from trainkit.parallel._ddp import DDP
from trainkit.parallel._fsdp import FSDP, mixed_precision_policy
from trainkit.parallel._launch import init_distributed
from trainkit.parallel._mesh import MESH_DIMS, ParallelDims
from trainkit.parallel._plans import gpt2_plan, llama_plan
from trainkit.parallel._styles import (
    ColwiseParallel,
    FusedColwiseParallel,
    RowwiseParallel,
    ShardedAttributes,
)
from trainkit.parallel._tensor_parallel import (
    Plan,
    TensorParallel,
    apply_tensor_parallel,
    expand_plan,
)

__all__ = [
    "DDP",
    "FSDP",
    "MESH_DIMS",
    "ColwiseParallel",
    "FusedColwiseParallel",
    "MixedPrecisionPolicy",
    "ParallelDims",
    "ParallelStyle",
    "Plan",
    "PrepareModuleInput",
    "PrepareModuleOutput",
    "RowwiseParallel",
    "SequenceParallel",
    "ShardedAttributes",
    "TensorParallel",
    "apply_tensor_parallel",
    "expand_plan",
    "gpt2_plan",
    "init_distributed",
    "llama_plan",
    "mixed_precision_policy",
]
