"""`TensorParallel`: split each layer's matrices across ranks, by module-name pattern."""

from __future__ import annotations

import contextlib
import copy
import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor.parallel import ParallelStyle, SequenceParallel, parallelize_module

from trainkit.core import ParallelStrategy, Precision, State, repeated_blocks
from trainkit.core.config import primary
from trainkit.parallel._common import (
    broadcast_module_states,
    check_not_wrapped,
    require_process_group,
    sharded_precision,
)
from trainkit.parallel._mesh import ParallelDims
from trainkit.parallel._styles import ColwiseParallel, FusedColwiseParallel, RowwiseParallel
from trainkit.parallel._wrap import apply_compile

__all__ = [
    "Plan",
    "TensorParallel",
    "TensorParallelConfig",
    "apply_tensor_parallel",
    "expand_plan",
]

Plan = Mapping[str, ParallelStyle | str]
"""Module-name pattern (fnmatch: ``*`` matches any characters, dots included) -> style."""

_ALIASES: dict[str, type[ParallelStyle]] = {
    "colwise": ColwiseParallel,
    "rowwise": RowwiseParallel,
    "sequence_parallel": SequenceParallel,
    "fused_qkv": FusedColwiseParallel,
}


@dataclass(kw_only=True)
class TensorParallelConfig:
    """The options of `TensorParallel`."""

    plan: Plan = primary()
    """Module-name pattern (fnmatch: ``*`` matches any characters, dots included) -> a
    `ParallelStyle` or one of ``"colwise"``, ``"rowwise"``, ``"sequence_parallel"``,
    ``"fused_qkv"``. Every pattern must match a module. Ready plans: `gpt2_plan`,
    `llama_plan`."""
    degree: int | None = None
    """Ranks that share each layer (default: the world size). Alone, tensor parallelism
    spans every rank; inside ``FSDP(tensor_parallel=...)`` the degree must be given."""

    def __post_init__(self) -> None:
        if not isinstance(self.plan, Mapping) or not self.plan:
            raise TypeError(
                f"TensorParallel plan must be a non-empty mapping of module-name pattern to "
                f"style, got {self.plan!r}"
            )
        for pattern, style in self.plan.items():
            _as_style(pattern, style)  # fail early on a bad style
        if self.degree is not None and (
            isinstance(self.degree, bool) or not isinstance(self.degree, int) or self.degree < 1
        ):
            raise ValueError(f"TensorParallel degree must be a positive int, got {self.degree!r}")


class TensorParallel(ParallelStrategy, config=TensorParallelConfig):
    """Tensor parallelism over every rank (combine with FSDP via ``FSDP(tensor_parallel=...)``).

    Every rank must see the same batches (no `DistributedSampler` across a tensor-parallel
    group): the ranks together are one data-parallel replica.

    Example::

        TensorParallel(plan={"*mlp.up": "colwise", "*mlp.down": "rowwise"}, degree=2)
    """

    config: TensorParallelConfig
    needs_process_group = True

    def __init__(self, config: TensorParallelConfig | None = None, /, **options: Any) -> None:
        super().__init__(config, **options)

    @property
    def data_parallel_size(self) -> int:
        """One: every rank of the tensor-parallel group reads the same data."""
        return 1

    def prepare(self, state: State) -> None:
        """Shard ``state.model``'s layers across all ranks (collective)."""
        world_size = require_process_group("TensorParallel")
        check_not_wrapped(state.model, "TensorParallel")
        degree = self.config.degree or world_size
        if degree != world_size:
            raise ValueError(
                f"TensorParallel(degree={degree}) alone must span the world size {world_size}; "
                f"to add data parallelism over the other ranks use "
                f"FSDP(tensor_parallel=TensorParallel(plan=plan, degree={degree}))"
            )
        mesh = ParallelDims(replicate=1, shard=1, tensor=degree).build_mesh(
            state.device.type, world_size
        )
        # Layers outside the plan stay replicated: every rank must start from rank 0's copy.
        broadcast_module_states(state.model)
        apply_tensor_parallel(state.model, self.config.plan, mesh["tensor"])

    def precision_for(self, precision: Precision) -> Precision:
        """``precision``, with a `ShardedGradScaler` when it scales the loss (fp16): every
        rank then agrees whether an inf or nan in its shards skips the step."""
        return sharded_precision(precision)

    def no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager[None]:
        """Nothing to skip: tensor-parallel communication is part of the computation."""
        return contextlib.nullcontext()

    def unwrap(self, model: nn.Module) -> nn.Module:
        """The model itself (tensor parallelism shards it in place)."""
        return model

    def compile(self, model: nn.Module, options: Mapping[str, Any]) -> None:
        """The Trainer's ``compile``: each repeated block (a transformer's layers) in place,
        or the whole model when it has none."""
        apply_compile(repeated_blocks(model), model, options)


def expand_plan(model: nn.Module, plan: Plan) -> dict[str, ParallelStyle]:
    """Map each module name matched by a pattern to its style.

    Raises:
        ValueError: a pattern matches no module (the closest names are listed), or two
            patterns match the same module.
    """
    names = [name for name, _ in model.named_modules() if name]
    expanded: dict[str, ParallelStyle] = {}
    owner: dict[str, str] = {}
    for pattern, style in plan.items():
        matches = [name for name in names if fnmatchcase(name, pattern)]
        if not matches:
            raise ValueError(_no_match_message(model, pattern, names))
        for name in matches:
            if name in owner:
                raise ValueError(
                    f"module {name!r} is matched by two tensor-parallel plan entries, "
                    f"{owner[name]!r} and {pattern!r}; make the patterns disjoint"
                )
            owner[name] = pattern
            expanded[name] = copy.copy(_as_style(pattern, style))
    return expanded


def apply_tensor_parallel(model: nn.Module, plan: Plan, mesh: DeviceMesh) -> int:
    """Apply ``plan`` to ``model`` on the 1-D ``mesh`` (collective). Returns modules changed.

    Raises:
        ValueError: see `expand_plan`.
        TypeError: a style cannot shard the module it was given (e.g. colwise on a norm).
    """
    expanded = expand_plan(model, plan)
    for name, style in expanded.items():
        try:
            parallelize_module(model, mesh, {name: style})
        except NotImplementedError as err:
            raise TypeError(
                f"tensor-parallel style {style!r} cannot shard module {name!r} "
                f"({type(model.get_submodule(name)).__name__}): {err}"
            ) from None
    return len(expanded)


def _as_style(pattern: str, style: ParallelStyle | str) -> ParallelStyle:
    if isinstance(style, ParallelStyle):
        return style
    if isinstance(style, str) and style in _ALIASES:
        return _ALIASES[style]()
    raise TypeError(
        f"tensor-parallel plan entry {pattern!r} has style {style!r}; use a ParallelStyle "
        f"(ColwiseParallel(), RowwiseParallel(), ...) or one of {sorted(_ALIASES)}"
    )


def _no_match_message(model: nn.Module, pattern: str, names: list[str]) -> str:
    close = difflib.get_close_matches(pattern, names, n=5, cutoff=0.3)
    with_params = [n for n in names if any(True for _ in model.get_submodule(n).parameters(False))]
    sample = with_params[:12] + (["..."] if len(with_params) > 12 else [])
    return (
        f"tensor-parallel plan entry {pattern!r} matches no module of "
        f"{type(model).__name__}; closest names: {close or 'none'}; modules with parameters: "
        f"{sample}. Patterns are fnmatch patterns on names from model.named_modules() "
        "(* matches any characters, dots included)"
    )
