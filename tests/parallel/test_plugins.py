"""The strategies are found by name through the `trainkit.parallel` entry points."""

from trainkit.core import ParallelStrategy, plugins
from trainkit.parallel import DDP, FSDP, PipelineParallel, TensorParallel


def test_entry_points_resolve_to_the_strategies():
    assert {"ddp", "fsdp", "tensor_parallel"} <= set(plugins.available("trainkit.parallel"))
    assert plugins.load("trainkit.parallel", "ddp") is DDP
    assert plugins.load("trainkit.parallel", "fsdp") is FSDP
    assert plugins.load("trainkit.parallel", "tensor_parallel") is TensorParallel
    assert plugins.load("trainkit.parallel", "pipeline_parallel") is PipelineParallel


def test_strategies_satisfy_the_core_protocol():
    for strategy in (DDP(), FSDP(), TensorParallel(plan={"*": "colwise"}, degree=2)):
        assert isinstance(strategy, ParallelStrategy)
