"""Float8 training: eligible `nn.Linear` layers compute their matmuls in fp8 (torchao).

At INIT each eligible linear becomes torchao's ``Float8Linear``
(``torchao.float8.convert_to_float8_training``): its input, weight and output gradient are
cast to fp8 with dynamic scales ("tensorwise": one scale per tensor, the fastest;
"rowwise": one per row, more accurate), the three matmuls run on fp8 tensor cores, and
the weights, the optimizer and everything else stay as they were. The layers keep their
`Parameter` objects and their state-dict names, so optimizers, checkpoints and FSDP2
(applied after INIT) see the same model. Run it with ``precision="amp_bf16"``: torchao
recommends bf16 autocast around float8 linears (this is trainkit's ``amp_fp8``), and
``compile=True`` fuses the casts (eager float8 is correct but slower than bf16).

A layer is eligible when it is a plain `nn.Linear` (not a subclass such as
`nn.MultiheadAttention`'s ``out_proj``, whose weight is used without its forward), both
its sizes are multiples of 16 (fp8 matmuls need it), its qualified name matches ``modules`` and none of ``exclude``, and it is not the output head
(kept in high precision unless ``keep_output_head=False``; the head is the model's
``get_output_embeddings()`` where a Hugging Face model has one, else the last `nn.Linear`
registered). Hugging Face GPT-2 builds its blocks from ``Conv1D``, not `nn.Linear`: there
only the head would be eligible.

fp8 matmuls need an NVIDIA GPU of compute capability 8.9 or newer (Ada, Hopper,
Blackwell); an older GPU is refused with its name. On CPU torchao emulates the casts (for
testing; no speed-up). Needs torchao: ``pip install "trainkit-algorithms[fp8]"``.

Differs from Composer: Composer's ``amp_fp8`` precision goes through TransformerEngine's
modules; trainkit converts layers with torchao, the library PyTorch maintains for this.
"""

from __future__ import annotations

import fnmatch
import functools
import importlib.util
import warnings
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import nn

from trainkit.algorithms._passes import ComposableAlgorithm
from trainkit.algorithms._surgery import check_surgery_allowed
from trainkit.core import Event, Logger, State, rebind_optimizers
from trainkit.core.config import build_config, primary

__all__ = [
    "Float8Training",
    "Float8TrainingConfig",
    "apply_float8_training",
    "check_float8_device",
    "float8_eligible",
]

INSTALL_HINT = 'Float8Training needs torchao: pip install "trainkit-algorithms[fp8]"'
RECIPES = ("tensorwise", "rowwise")
MIN_CAPABILITY = (8, 9)


@dataclass(kw_only=True)
class Float8TrainingConfig:
    recipe: Literal["tensorwise", "rowwise"] = primary("tensorwise")
    """torchao's scaling recipe: "tensorwise" (one dynamic scale per tensor, fastest) or
    "rowwise" (one per row, more accurate)."""
    modules: list[str] | None = None
    """Glob patterns of the qualified layer names to convert (``"blocks.*.mlp.*"``); None
    converts every eligible `nn.Linear`."""
    exclude: list[str] = field(default_factory=list)
    """Glob patterns of layer names never converted (applied after ``modules``)."""
    keep_output_head: bool = True
    """Leave the output head (``get_output_embeddings()``, else the last `nn.Linear`) in
    high precision: its logits feed the loss directly and fp8 there costs accuracy."""

    def __post_init__(self) -> None:
        if self.recipe not in RECIPES:
            raise ValueError(f"recipe {self.recipe!r} is not a float8 recipe; use one of {RECIPES}")
        for name in ("modules", "exclude"):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, str) or not all(isinstance(p, str) for p in value):
                raise ValueError(
                    f"{name} must be a list of glob patterns of layer names, got {value!r}"
                )
            setattr(self, name, list(value))


def _require_torchao() -> None:
    if importlib.util.find_spec("torchao") is None:
        raise ImportError(INSTALL_HINT)


def check_float8_device(device: torch.device | str, recipe: str = "tensorwise") -> None:
    """Raise if ``device`` cannot train with float8 ``recipe``: a CUDA GPU without fp8
    tensor cores (compute capability < 8.9), or, for "rowwise", a CPU whose torch emulates
    only per-tensor scales."""
    device = torch.device(device)
    if device.type != "cuda":
        if recipe == "rowwise" and not _cpu_rowwise_scales():
            raise RuntimeError(
                f"Float8Training's 'rowwise' recipe on CPU needs a torch whose CPU fp8 matmul "
                f"(torch._scaled_mm) takes row-wise scales; torch {torch.__version__}'s takes "
                "one scale per tensor only. On CPU use recipe='tensorwise' (the emulation is "
                "for testing), or train 'rowwise' on a CUDA GPU of SM 8.9+"
            )
        return  # CPU: torchao emulates the fp8 casts
    index = device.index if device.index is not None else torch.cuda.current_device()
    major, minor = torch.cuda.get_device_capability(index)
    if (major, minor) < MIN_CAPABILITY:
        name = torch.cuda.get_device_name(index)
        raise RuntimeError(
            f"Float8Training needs fp8 tensor cores, on an NVIDIA GPU of compute capability "
            f"8.9 or newer (SM 8.9+: Ada, e.g. L4/L40/RTX 4090, or Hopper, e.g. H100/H200), "
            f"but cuda:{index} is {name} (SM {major}.{minor}); on this GPU train with "
            "precision='amp_bf16' and without Float8Training"
        )


@functools.cache
def _cpu_rowwise_scales() -> bool:
    """Whether this torch's CPU ``_scaled_mm`` takes one scale per row (torch 2.11's
    refuses with an internal assert; later releases take them). Tried once, on 16x16."""
    a = torch.ones(16, 16, dtype=torch.float8_e4m3fn)
    try:
        torch._scaled_mm(
            a, a.t(), scale_a=torch.ones(16, 1), scale_b=torch.ones(1, 16), out_dtype=torch.float32
        )
    except RuntimeError:
        return False
    return True


def _output_head(model: nn.Module) -> nn.Module | None:
    for module in model.modules():
        getter = getattr(module, "get_output_embeddings", None)
        if callable(getter):
            head = getter()
            if isinstance(head, nn.Module):
                return head
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    return linears[-1] if linears else None


def float8_eligible(
    model: nn.Module, config: Float8TrainingConfig | None = None, /, **options: Any
) -> list[str]:
    """The qualified names of ``model``'s layers that `apply_float8_training` would convert.

    Takes a `Float8TrainingConfig` or its fields as keyword arguments.
    """
    config = build_config(Float8TrainingConfig, config, options)
    head = _output_head(model) if config.keep_output_head else None

    def matches(name: str, patterns: list[str]) -> bool:
        return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)

    names = []
    for name, module in model.named_modules():
        if not name or type(module) is not nn.Linear or module is head:
            continue  # the root cannot be replaced in place; subclasses may be custom
        if module.in_features % 16 or module.out_features % 16:
            continue
        if config.modules is not None and not matches(name, config.modules):
            continue
        if matches(name, config.exclude):
            continue
        names.append(name)
    return names


def apply_float8_training(
    model: nn.Module,
    config: Float8TrainingConfig | None = None,
    /,
    *,
    optimizers: torch.optim.Optimizer | list[torch.optim.Optimizer] | None = None,
    device: torch.device | str | None = None,
    **options: Any,
) -> list[str]:
    """Convert ``model``'s eligible linears to torchao ``Float8Linear``; returns their names.

    Takes a `Float8TrainingConfig` or its fields as keyword arguments. ``device`` is where
    the model will train (default: where its parameters are); a CUDA GPU older than SM 8.9
    is refused. ``optimizers`` are re-bound to the model's parameters.
    """
    config = build_config(Float8TrainingConfig, config, options)
    _require_torchao()
    if device is None:
        first = next(iter(model.parameters()), None)
        device = first.device if first is not None else torch.device("cpu")
    check_float8_device(device, config.recipe)
    optimizers = [optimizers] if isinstance(optimizers, torch.optim.Optimizer) else optimizers
    optimizers = list(optimizers or [])
    check_surgery_allowed(optimizers, "float8_training")
    selected = set(float8_eligible(model, config))
    if not selected:
        warnings.warn(
            f"float8_training matched no module in {type(model).__name__} (it converts "
            "nn.Linear layers with both sizes multiples of 16, other than the output head); "
            "it has no effect on this model",
            stacklevel=2,
        )
        return []
    try:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    except ImportError as err:
        raise ImportError(INSTALL_HINT) from err
    names_before = {id(p): n for n, p in model.named_parameters()}
    convert_to_float8_training(
        model,
        config=Float8LinearConfig.from_recipe_name(config.recipe),
        module_filter_fn=lambda module, name: name in selected,
    )
    if optimizers:
        rebind_optimizers(optimizers, model, names_before, new_parameters="add_to_first_group")
    return sorted(selected)


class Float8Training(ComposableAlgorithm, config=Float8TrainingConfig):
    """Converts eligible linears to fp8 matmuls at INIT (see `Float8TrainingConfig`).

    Raises ImportError with the install command when torchao is missing, here rather than
    at import; the GPU is checked at INIT, once the run's device is known.
    """

    config: Float8TrainingConfig
    required_on_load = False  # the state-dict names do not change: checkpoints load either way
    required_events = (Event.INIT,)

    def __init__(self, config: Float8TrainingConfig | None = None, /, **options: Any) -> None:
        super().__init__(config, **options)
        _require_torchao()

    match_events = frozenset({Event.INIT})

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        model = state.parallelism.unwrap(state.model)
        converted = apply_float8_training(
            model, self.config, optimizers=state.optimizers, device=state.device
        )
        logger.log_hyperparameters({"float8_training/num_converted": len(converted)})
