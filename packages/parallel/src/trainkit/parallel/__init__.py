"""trainkit.parallel: DDP, FSDP2, tensor, context and pipeline parallel, combined on one
DeviceMesh; fault-tolerant data parallel across replica groups on torchft (the ``ft`` extra).

Start the process group first with `trainkit.core.dist.init_distributed`.
"""

from torch.distributed.fsdp import MixedPrecisionPolicy
from torch.distributed.tensor.parallel import (
    ParallelStyle,
    PrepareModuleInput,
    PrepareModuleOutput,
    SequenceParallel,
)

from trainkit.parallel._context_parallel import (
    ContextParallel,
    ContextParallelConfig,
    apply_context_parallel,
)
from trainkit.parallel._ddp import DDP, DDPConfig
from trainkit.parallel._fault_tolerant import FaultTolerant, FaultTolerantConfig
from trainkit.parallel._fsdp import FSDP, FSDPConfig, mixed_precision_policy
from trainkit.parallel._ft_data import ReplicaBatches
from trainkit.parallel._mesh import MESH_DIMS, ParallelDims
from trainkit.parallel._pipeline import PipelineParallel, PipelineParallelConfig
from trainkit.parallel._pipeline_plans import (
    PipelinePlan,
    gpt2_pipeline_plan,
    llama_pipeline_plan,
    pipeline_plan,
)
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
    TensorParallelConfig,
    apply_tensor_parallel,
    expand_plan,
)

__all__ = [
    "DDP",
    "FSDP",
    "MESH_DIMS",
    "ColwiseParallel",
    "ContextParallel",
    "ContextParallelConfig",
    "DDPConfig",
    "FSDPConfig",
    "FaultTolerant",
    "FaultTolerantConfig",
    "FusedColwiseParallel",
    "MixedPrecisionPolicy",
    "ParallelDims",
    "ParallelStyle",
    "PipelineParallel",
    "PipelineParallelConfig",
    "PipelinePlan",
    "Plan",
    "PrepareModuleInput",
    "PrepareModuleOutput",
    "ReplicaBatches",
    "RowwiseParallel",
    "SequenceParallel",
    "ShardedAttributes",
    "TensorParallel",
    "TensorParallelConfig",
    "apply_context_parallel",
    "apply_tensor_parallel",
    "expand_plan",
    "gpt2_pipeline_plan",
    "gpt2_plan",
    "llama_pipeline_plan",
    "llama_plan",
    "mixed_precision_policy",
    "pipeline_plan",
]
