"""`PipelineParallel`: the model's layers split into stages on ``torch.distributed.pipelining``.

Each rank of a pipeline group keeps only its stages' modules (the others are removed from
``state.model``, parameter names unchanged, so checkpoints load across pipeline degrees)
and runs a schedule (GPipe, 1F1B, interleaved 1F1B) over the batch's microbatches: the
first stage reads the batch, activations and their gradients pass from stage to stage,
and the last stage computes the loss, which every rank of the group then reports.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as tdist
from torch import nn

from trainkit.core import (
    Callback,
    Engine,
    Event,
    ParallelStrategy,
    State,
    dist,
    rebind_optimizers,
)
from trainkit.core.config import primary, slot
from trainkit.parallel._common import (
    broadcast_module_states,
    check_not_wrapped,
    require_process_group,
)
from trainkit.parallel._fsdp import FSDP
from trainkit.parallel._mesh import ParallelDims
from trainkit.parallel._pipeline_plans import PipelinePlan, pipeline_plan
from trainkit.parallel._wrap import apply_compile

__all__ = ["PipelineParallel", "PipelineParallelConfig"]

_SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b")
# Fired once per microbatch inside the schedule, interleaved with other microbatches'
# forward and backward, on the last stage only: no component can run at them in place.
_NOT_FIRED = (Event.AFTER_FORWARD, Event.BEFORE_LOSS, Event.AFTER_LOSS, Event.BEFORE_BACKWARD)


@dataclass(kw_only=True)
class PipelineParallelConfig:
    """The options of `PipelineParallel`."""

    plan: PipelinePlan | str = primary()
    """How the model runs as stages: ``"llama"`` (Hugging Face Llama-style,
    ``model.layers``), ``"gpt2"`` (``transformer.h``, untied embeddings), or a
    `PipelinePlan` for your own model."""
    degree: int | None = None
    """Ranks in each pipeline group (default: the world size; with ``fsdp``, required:
    the other ranks are FSDP's)."""
    schedule: str = "1f1b"
    """``"gpipe"`` (all forwards, then all backwards), ``"1f1b"`` (one forward, one
    backward: fewer activations alive) or ``"interleaved_1f1b"`` (``stages_per_rank``
    >= 2 stages per rank, a smaller bubble)."""
    stages_per_rank: int = 1
    """Stages each rank holds (virtual stages, looped: rank r holds stages r, r + degree,
    ...); 1 for gpipe and 1f1b, 2 or more for interleaved_1f1b."""
    split_points: list[str] | None = None
    """Names of the blocks where each stage after the first begins (``["model.layers.2"]``);
    ``degree * stages_per_rank - 1`` of them, in order. Default: blocks split evenly."""
    fsdp: FSDP | None = slot("trainkit.parallel", default=None)
    """Data parallelism inside each stage (2-D PP x FSDP), with tensor parallel through
    its own ``tensor_parallel`` (3-D PP x FSDP x TP)."""

    def __post_init__(self) -> None:
        pipeline_plan(self.plan)  # fail early on an unknown name
        if self.schedule not in _SCHEDULES:
            raise ValueError(
                f"pipeline schedule {self.schedule!r} is not known; use one of {list(_SCHEDULES)}"
            )
        for name in ("degree", "stages_per_rank"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 1
            ):
                raise ValueError(f"PipelineParallel {name} must be a positive int, got {value!r}")
        interleaved = self.schedule == "interleaved_1f1b"
        if interleaved != (self.stages_per_rank > 1):
            raise ValueError(
                f"PipelineParallel schedule {self.schedule!r} with stages_per_rank="
                f"{self.stages_per_rank}: interleaved_1f1b needs 2 or more stages per rank, "
                "gpipe and 1f1b exactly 1"
            )
        if self.fsdp is not None and not isinstance(self.fsdp, FSDP):
            raise TypeError(f"fsdp must be an FSDP(...), got {type(self.fsdp).__name__}")
        if self.fsdp is not None and self.stages_per_rank > 1:
            raise ValueError(
                "PipelineParallel(fsdp=...) supports one stage per rank (gpipe, 1f1b); "
                "interleaved_1f1b with FSDP is not supported yet"
            )


class PipelineParallel(ParallelStrategy, config=PipelineParallelConfig):
    """Pipeline parallelism: each rank of a pipeline group holds a slice of the layers.

    Needs ``device_train_microbatch_size`` (the microbatches flow through the stages) and
    the same batches on every rank of a pipeline group. Under it, the step fires
    BEFORE_FORWARD once before the schedule (``state.batch``: the whole batch) and
    AFTER_BACKWARD once after it (``state.loss``: the batch's loss, on every rank);
    components that run at AFTER_FORWARD, BEFORE_LOSS, AFTER_LOSS or BEFORE_BACKWARD, read
    ``state.outputs``, or train metrics are refused. Calling the model
    (``state.model(batch)``, evaluation, prediction) runs the pipeline forward and returns
    the outputs on every rank of the group.

    Example::

        PipelineParallel(plan="llama", schedule="1f1b")  # 2 ranks: 2 stages
        PipelineParallel(plan="llama", degree=2, fsdp=FSDP())  # 4 ranks: 2 stages x 2 shards
    """

    config: PipelineParallelConfig
    needs_process_group = True
    runs_forward_backward = True

    def __init__(self, config: PipelineParallelConfig | None = None, /, **options: Any) -> None:
        super().__init__(config, **options)
        self._plan = pipeline_plan(self.config.plan)
        self._dims: ParallelDims | None = None
        self._model: nn.Module | None = None
        self._stages: list[_StageModule] = []  # this rank's, in stage order
        self._group: Any = None  # the pipeline group
        self._last_rank = 0  # global rank holding the last stage, in this rank's group
        self._device = torch.device("cpu")
        self._schedules: dict[Any, Any] = {}
        self._losses: list[torch.Tensor] = []
        self._share: torch.Tensor | None = None
        self._targets: list[tuple[Any, Any]] = []  # this step's (microbatch, weight)
        self._checked = False

    @property
    def data_parallel_size(self) -> int:
        """Pipeline groups times FSDP's data-parallel ranks (every stage of a group reads
        the same batch)."""
        if self._dims is None and dist.get_world_size() == 1:
            return 1  # one process, no group yet: one stream of data
        dims = self._dims or self.dims(dist.get_world_size())
        return dims.data_parallel

    @property
    def is_last(self) -> bool:
        """Whether this rank holds the last stage (where the loss is computed)."""
        return any(stage.last for stage in self._stages)

    def dims(self, world_size: int) -> ParallelDims:
        """The pipeline x replicate x shard x tensor degrees on ``world_size`` ranks.

        Raises:
            ValueError: the degrees do not fit the world size.
        """
        fsdp = self.config.fsdp
        degree = self.config.degree or (world_size if fsdp is None else None)
        if degree is None:
            raise ValueError(
                "PipelineParallel(fsdp=FSDP(...)) needs the pipeline degree: "
                "PipelineParallel(plan=..., degree=d, fsdp=...), d dividing the world size"
            )
        if world_size % degree:
            raise ValueError(
                f"pipeline degree {degree} does not divide the world size {world_size}"
            )
        if fsdp is None:
            if degree != world_size:
                raise ValueError(
                    f"PipelineParallel(degree={degree}) alone must span the world size "
                    f"{world_size}; for data parallelism over the other ranks add "
                    f"fsdp=FSDP() (PipelineParallel(plan=..., degree={degree}, fsdp=FSDP()))"
                )
            return ParallelDims(pipeline=degree, replicate=1, shard=1, tensor=1).resolve(world_size)
        if fsdp.config.context_parallel is not None:
            raise ValueError(
                "PipelineParallel(fsdp=FSDP(context_parallel=...)) is not supported yet: "
                "context parallel splits sequences inside one model, and under pipeline "
                "parallel each rank holds only a stage; use one or the other"
            )
        inner = fsdp.dims(world_size // degree)
        return dataclasses.replace(inner, pipeline=degree).resolve(world_size)

    def prepare(self, state: State) -> None:
        """Keep this rank's stages of ``state.model`` and build their pipeline (collective)."""
        world_size = require_process_group("PipelineParallel")
        check_not_wrapped(state.model, "PipelineParallel")
        _check_run_settings(state)
        dims = self.dims(world_size)
        mesh = dims.build_mesh(state.device.type, world_size)
        model = state.model
        broadcast_module_states(model)  # every stage starts from one model: rank 0's
        pipeline = mesh["pipeline"]
        position, degree = pipeline.get_local_rank(), dims.pipeline
        count = degree * self.config.stages_per_rank
        blocks_name = self._plan.find_blocks(model)
        ranges = _stage_blocks(model, blocks_name, count, self.config.split_points)
        mine = [s for s in range(count) if s % degree == position]
        names_before = {id(p): n for n, p in model.named_parameters()}
        kept = _prune(model, blocks_name, ranges, mine)
        rebind_optimizers(
            state.optimizers, model, names_before, new_parameters="add_to_first_group"
        )
        self._stages = [
            _StageModule(model, self._plan, [kept[i] for i in ranges[s]], s, count) for s in mine
        ]
        if self.config.fsdp is not None:
            # The stage is the FSDP root: it is what the schedule calls (the model is not).
            self.config.fsdp.shard(state, mesh, dims, list(kept.values()), root=self._stages[0])
        self._group = pipeline.get_group()
        self._last_rank = tdist.get_global_rank(self._group, (count - 1) % degree)
        self._dims, self._model, self._device = dims, model, state.device
        # Calling the model runs the whole pipeline (evaluation, prediction).
        model.forward = self._pipelined_forward

    def forward_backward(
        self, state: State, engine: Engine, microbatches: list, weights: list, share: Any
    ) -> torch.Tensor:
        """Run the schedule over ``microbatches``: BEFORE_FORWARD, every microbatch's
        forward and backward, AFTER_BACKWARD; returns the batch's loss on every rank."""
        if not self._checked:
            _check_components(state, engine)
            self._checked = True
        engine.run_event(Event.BEFORE_FORWARD)
        inputs = [tuple(self._plan.inputs(microbatch)) for microbatch in microbatches]
        schedule = self._schedule(inputs, train=True)
        self._losses, self._share = [], share
        self._targets = list(zip(microbatches, weights, strict=True))
        # Targets must be tensors: each microbatch's index, looked up by `_loss`.
        indices = [torch.tensor(i) for i in range(len(microbatches))]
        with state.precision.autocast():
            schedule.step(arg_mbs=inputs, target_mbs=indices, return_outputs=False)
        state.loss = self._broadcast_loss(len(microbatches))
        state.outputs = None
        engine.run_event(Event.AFTER_BACKWARD)
        return state.loss

    def compile(self, model: nn.Module, options: Mapping[str, Any]) -> None:
        """The Trainer's ``compile``: each of this rank's blocks, in place."""
        apply_compile([b for stage in self._stages for b in stage.blocks], model, options)

    def _broadcast_loss(self, count: int) -> torch.Tensor:
        # Metadata inference calls the loss on the first step of a new shape: the
        # microbatches' losses are the last ``count``.
        if self.is_last:
            loss = torch.stack(self._losses[-count:]).sum().detach()
        else:
            loss = torch.zeros((), dtype=torch.float32, device=self._device)
        tdist.broadcast(loss, src=self._last_rank, group=self._group)
        return loss

    def _loss(self, outputs: Any, index: torch.Tensor) -> torch.Tensor:
        microbatch, weight = self._targets[int(index)]
        loss = self._plan.loss(self._model, outputs, microbatch).float()
        if weight is not None:
            loss = loss * weight
        self._losses.append(loss.detach())
        return loss if self._share is None else loss * self._share

    def _schedule(self, inputs: list[tuple[torch.Tensor, ...]], train: bool) -> Any:
        # One schedule (and its stages) per input shape: a stage's buffers are sized by it.
        key = (train, len(inputs), tuple(tuple(t.shape) for t in inputs[0]))
        schedule = self._schedules.get(key)
        if schedule is None:
            schedule = self._build_schedule(len(inputs), train)
            self._schedules[key] = schedule
        return schedule

    def _build_schedule(self, count: int, train: bool) -> Any:
        from torch.distributed import pipelining

        stages = [
            pipelining.PipelineStage(
                stage, stage.index, stage.count, self._device, group=self._group
            )
            for stage in self._stages
        ]
        loss_fn = self._loss if train else None
        name = self.config.schedule
        if name == "interleaved_1f1b":
            return pipelining.ScheduleInterleaved1F1B(
                stages, count, loss_fn=loss_fn, scale_grads=False
            )
        kind = pipelining.ScheduleGPipe if name == "gpipe" or not train else pipelining.Schedule1F1B
        return kind(stages[0], count, loss_fn=loss_fn, scale_grads=False)

    def _pipelined_forward(self, batch: Any) -> Any:
        inputs = [tuple(self._plan.inputs(batch))]
        output = self._schedule(inputs, train=False).eval(arg_mbs=inputs)
        box = [output if self.is_last else None]
        tdist.broadcast_object_list(box, src=self._last_rank, group=self._group)
        output = box[0]
        if isinstance(output, torch.Tensor):
            output = output.to(self._device)
        return self._plan.outputs(self._model, output)


class _StageModule(nn.Module):
    """One stage: the plan's first part (stage 0), a run of blocks, its last part (last)."""

    def __init__(
        self, model: nn.Module, plan: PipelinePlan, blocks: list[nn.Module], index: int, count: int
    ) -> None:
        super().__init__()
        self.model = model  # parameters keep their names under state.model
        self.blocks = blocks  # a plain list: not registered twice
        self.plan, self.index, self.count = plan, index, count
        self.first, self.last = index == 0, index == count - 1

    def forward(self, *inputs: torch.Tensor) -> Any:
        hidden = self.plan.first(self.model, *inputs) if self.first else inputs[0]
        for block in self.blocks:
            hidden = self.plan.block(self.model, block, hidden)
        return self.plan.last(self.model, hidden) if self.last else hidden


def _check_run_settings(state: State) -> None:
    if state.auto_microbatching:
        raise ValueError(
            "PipelineParallel cannot search the microbatch size (device_train_microbatch_size="
            "'auto'): the schedule is built for a fixed number of microbatches; give a size, "
            "e.g. the batch size / (2 x the number of stages)"
        )
    if not state.device_train_microbatch_size:
        raise ValueError(
            "PipelineParallel needs device_train_microbatch_size: the batch is split into "
            "microbatches that flow through the stages one after another (e.g. a batch of 16 "
            "with device_train_microbatch_size=4 runs 4 microbatches; use at least as many "
            "microbatches as stages)"
        )
    if state.precision.scales_loss:
        raise ValueError(
            f"PipelineParallel does not support precision {state.precision.name!r}: its "
            "loss scaling runs outside the pipeline schedule's backward; use 'amp_bf16' or "
            "'fp32'"
        )


def _check_components(state: State, engine: Engine) -> None:
    problems = []
    for algorithm in state.algorithms:
        declared = algorithm.match_events
        events = [
            e for e in _NOT_FIRED
            if (e in declared if declared is not None else algorithm.match(e, state))
        ]  # fmt: skip
        if events:
            problems.append(f"algorithm {type(algorithm).__name__} runs at {_names(events)}")
    for callback in [*state.callbacks, *engine.logger.destinations]:
        events = [
            e for e in _NOT_FIRED
            if getattr(type(callback), e.value, None) not in (None, getattr(Callback, e.value))
        ]  # fmt: skip
        if events:
            problems.append(f"callback {type(callback).__name__} handles {_names(events)}")
    if engine.outputs_needed():
        problems.append("a component declares needs_outputs (state.outputs)")
    if state.train_metrics:
        problems.append(f"the model's train metrics {sorted(state.train_metrics)}")
    if problems:
        raise ValueError(
            "PipelineParallel cannot run " + "; ".join(problems) + ". Under pipeline "
            "parallel the model's outputs and each microbatch's loss exist only on the last "
            "stage, inside the schedule, so AFTER_FORWARD, BEFORE_LOSS, AFTER_LOSS and "
            "BEFORE_BACKWARD are not fired and state.outputs stays None; BEFORE_FORWARD and "
            "AFTER_BACKWARD fire once per batch. Remove these components (evaluate metrics "
            "with eval_dataloader instead of train metrics)"
        )


def _names(events: list[Event]) -> str:
    return ", ".join(e.name for e in events)


def _stage_blocks(
    model: nn.Module, blocks_name: str, count: int, split_points: list[str] | None
) -> list[list[int]]:
    """The block indices of each of ``count`` stages."""
    total = len(model.get_submodule(blocks_name))
    if split_points is None:
        if total < count:
            raise ValueError(
                f"{blocks_name!r} has {total} blocks, fewer than the {count} pipeline stages; "
                "use fewer stages (degree x stages_per_rank)"
            )
        starts = [s * total // count for s in range(count)]
    else:
        names = [f"{blocks_name}.{i}" for i in range(total)]
        if len(split_points) != count - 1 or any(p not in names for p in split_points):
            raise ValueError(
                f"split_points {split_points!r} must name {count - 1} of the blocks "
                f"{[*names[:3], '...'] if total > 3 else names} (one where each stage after "
                f"the first begins, for {count} stages)"
            )
        starts = [0, *(names.index(p) for p in split_points)]
        if starts != sorted(set(starts)) or starts[1] == 0:
            raise ValueError(f"split_points {split_points!r} must be increasing, after block 0")
    ends = [*starts[1:], total]
    return [list(range(a, b)) for a, b in zip(starts, ends, strict=True)]


def _prune(
    model: nn.Module, blocks_name: str, ranges: list[list[int]], mine: list[int]
) -> dict[int, nn.Module]:
    """Remove every module this rank's stages do not run; returns the kept blocks by index.

    The ModuleList becomes a ModuleDict keyed by the original indices, so every parameter
    keeps its name (``layers.5.mlp.up.weight``).
    """
    parent_name, _, leaf = blocks_name.rpartition(".")
    parent = model.get_submodule(parent_name)
    blocks = parent.get_submodule(leaf)
    before, after = _outer_modules(model, blocks_name)
    _check_untied(model, blocks_name, before, after)
    count = len(ranges)
    keep = {i for s in mine for i in ranges[s]}
    kept = {i: blocks[i] for i in sorted(keep)}
    setattr(parent, leaf, nn.ModuleDict({str(i): block for i, block in kept.items()}))
    for names, needed in ((before, 0 in mine), (after, count - 1 in mine)):
        if not needed:
            for name in names:
                owner, _, attr = name.rpartition(".")
                setattr(model.get_submodule(owner), attr, None)
    return kept


def _outer_modules(model: nn.Module, blocks_name: str) -> tuple[list[str], list[str]]:
    """Modules with parameters of their own outside the blocks: before them, after them."""
    before: list[str] = []
    after: list[str] = []
    seen_blocks = False
    for name, module in model.named_modules():
        if name == blocks_name:
            seen_blocks = True
            continue
        if name.startswith(blocks_name + ".") or not any(True for _ in module.parameters(False)):
            continue
        if not name:
            raise ValueError(
                f"{type(model).__name__} holds parameters of its own "
                f"({[n for n, _ in model.named_parameters(recurse=False)]}); pipeline parallel "
                "places submodules on stages: move them into a submodule"
            )
        (after if seen_blocks else before).append(name)
    return before, after


def _check_untied(model: nn.Module, blocks_name: str, before: list[str], after: list[str]) -> None:
    def place(name: str) -> str:
        if name.startswith(blocks_name + "."):
            return name[len(blocks_name) + 1 :].split(".")[0]
        return "first" if any(name.startswith(b + ".") for b in before) else "last"

    names: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), []).append(name)
    for shared in names.values():
        if len({place(n) for n in shared}) > 1:
            raise ValueError(
                f"parameters {shared} are one tensor (tied weights) used by different pipeline "
                "stages; untie them (e.g. tie_word_embeddings=False) to split this model"
            )
