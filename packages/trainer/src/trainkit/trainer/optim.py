"""Optimizers whose weight decay is decoupled from the learning rate, as Composer's are.

`DecoupledSGDW` and `DecoupledAdamW` shrink every parameter that has a gradient by
``weight_decay * lr / initial_lr`` per step, before the usual SGD / Adam update, where
``initial_lr`` is the parameter group's learning rate when it joined the optimizer (kept
in the group as ``"initial_lr"``, the key torch's LR schedulers use too). The decay thus
follows the learning-rate *schedule* but is not multiplied by the learning rate itself:
with ``lr=1e-3, weight_decay=1e-5`` each step multiplies the weights by ``1 - 1e-5``,
where ``torch.optim.AdamW`` would multiply them by ``1 - 1e-3 * 1e-5``. Weight-decay
values from Composer runs therefore carry over unchanged; values tuned for torch's AdamW
(``1e-2``) are far too large here.

The gradient update itself is torch's own (`torch.optim.SGD` / `torch.optim.AdamW`, run
with their coupled weight decay switched off), so with ``weight_decay=0`` each optimizer
is bitwise identical to its torch counterpart. Both are registered in the
``trainkit.optimizers`` entry-point group under their class names, so a config file can
name them (``optimizers: {name: DecoupledAdamW, lr: 0.001, weight_decay: 1e-5}``).

`MuonWithAdamW` (``optimizers: {name: muon}``) runs ``torch.optim.Muon`` on the hidden
weight matrices and ``torch.optim.AdamW`` on embeddings, heads, biases and gains, as one
optimizer; it is built on ``model.named_parameters()`` (or the model), since the split needs
each parameter's name.

Reference: Loshchilov & Hutter, *Decoupled Weight Decay Regularization* (2019).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from trainkit.core.messages import warn
from trainkit.core.plugins import name_hints
from trainkit.trainer._muon import ADAMW_MODULES, MuonWithAdamW, split_for_muon

__all__ = ["ADAMW_MODULES", "DecoupledAdamW", "DecoupledSGDW", "MuonWithAdamW", "split_for_muon"]

# Composer keeps its schedules in composer.optim; trainkit in trainkit.trainer.schedulers
# (tests/integration/test_composer_names.py keeps this list equal to that module's).
_SCHEDULES = (
    "ConstantScheduler",
    "ConstantWithWarmupScheduler",
    "CosineAnnealingScheduler",
    "CosineAnnealingWarmRestartsScheduler",
    "CosineAnnealingWithWarmupScheduler",
    "ExponentialScheduler",
    "LinearScheduler",
    "LinearWithWarmupScheduler",
    "MultiStepScheduler",
    "MultiStepWithWarmupScheduler",
    "PolynomialScheduler",
    "PolynomialWithWarmupScheduler",
    "StepScheduler",
    "WarmupStableDecayScheduler",
)
__getattr__ = name_hints(
    __name__,
    {
        **{
            name: f"schedules are in trainkit.trainer.schedulers: "
            f"from trainkit.trainer.schedulers import {name}"
            for name in _SCHEDULES
        },
        "ComposerScheduler": "a schedule is any callable (state, ssr) -> float; the base "
        "class of trainkit's is trainkit.trainer.schedulers.Scheduler",
        "compile_composer_scheduler": "not needed: the Trainer calls a schedule directly",
    },
)

_LARGE_DECAY = 1e-3  # per-step shrink factors at least this large are almost always a mistake


def _raw_step(cls: type[torch.optim.Optimizer]) -> Callable[..., Any]:
    """``cls.step`` without the hook wrapper torch puts on it once an instance exists.

    The subclass's own ``step`` is wrapped too, and runs the optimizer's step hooks;
    calling the parent's wrapped ``step`` from it would run them a second time.
    """
    step = cls.step
    return step.__wrapped__ if getattr(step, "hooked", False) else step  # type: ignore[attr-defined]


class _DecoupledDecay:
    """The decoupled decay shared by both optimizers (a mixin before the torch class)."""

    param_groups: list[dict[str, Any]]
    _torch_class: type[torch.optim.Optimizer]

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        super().add_param_group(param_group)  # type: ignore[misc]
        group = self.param_groups[-1]
        group.setdefault("initial_lr", group["lr"])
        decay = group["weight_decay"]
        if decay >= _LARGE_DECAY:
            warn(
                f"{type(self).__name__}: weight_decay={decay} is decoupled from the learning "
                f"rate, so the weights are multiplied by {1.0 - decay} on every step at the "
                "initial learning rate; values tuned for torch.optim's coupled decay (1e-2) "
                "are usually far too large here (Composer's default for DecoupledAdamW is 1e-5)",
                UserWarning,
            )

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # A state dict saved by a plain torch optimizer has no "initial_lr": keep ours.
        initial = [group.get("initial_lr") for group in self.param_groups]
        super().load_state_dict(state_dict)  # type: ignore[misc]
        for group, value in zip(self.param_groups, initial, strict=True):
            if "initial_lr" not in group:
                group["initial_lr"] = value if value is not None else group["lr"]

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Decay the parameters that have gradients, then take torch's step without decay.

        Args:
            closure: Re-evaluates the model and returns the loss; it runs before the decay,
                on the parameters as they were.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        # A fused optimizer under a GradScaler is stepped even when the gradients overflowed
        # (the kernel skips the update); the decay must be skipped too, without a sync.
        found_inf = getattr(self, "found_inf", None)
        decays = []
        for group in self.param_groups:
            decay = group["weight_decay"]
            decays.append(decay)
            if decay != 0:
                initial_lr = group["initial_lr"]
                scale = group["lr"] / initial_lr if initial_lr else 1.0
                factor = 1 - scale * decay
                for param in group["params"]:
                    if param.grad is None:
                        continue
                    if isinstance(found_inf, torch.Tensor):
                        skip = found_inf.to(param.device) > 0
                        param.mul_(torch.where(skip, 1.0, factor).to(param.dtype))
                    else:
                        param.mul_(factor)
            group["weight_decay"] = 0.0
        try:
            _raw_step(self._torch_class)(self)
        finally:
            for group, decay in zip(self.param_groups, decays, strict=True):
                group["weight_decay"] = decay
        return loss


class DecoupledSGDW(_DecoupledDecay, torch.optim.SGD):
    """SGD with weight decay decoupled from the learning rate (Composer's ``DecoupledSGDW``).

    Each step multiplies every parameter that has a gradient by
    ``1 - weight_decay * lr / initial_lr``, then takes torch's SGD step (momentum,
    dampening, Nesterov) on the gradient alone: the decay never enters the momentum
    buffer and is not scaled by the learning rate, only by the schedule's multiplier.
    Argument defaults are torch's, except that ``lr`` must be given (as in Composer).

    Args:
        params: Parameters to optimize, or dicts defining parameter groups.
        lr: Learning rate.
        momentum: Momentum factor.
        dampening: Dampening applied to the momentum.
        weight_decay: Fraction of each weight removed per step at the initial learning
            rate (not multiplied by ``lr``); use values around 1e-5, not torch's 1e-2.
        nesterov: Use Nesterov momentum.
        maximize: Maximize the objective instead of minimizing it.
        foreach: Use torch's multi-tensor implementation (None: torch decides).
        fused: Use torch's fused implementation (None: torch decides).
    """

    _torch_class = torch.optim.SGD

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        lr: float,
        momentum: float = 0.0,
        dampening: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
        *,
        maximize: bool = False,
        foreach: bool | None = None,
        fused: bool | None = None,
    ) -> None:
        super().__init__(
            params,
            lr=lr,
            momentum=momentum,
            dampening=dampening,
            weight_decay=weight_decay,
            nesterov=nesterov,
            maximize=maximize,
            foreach=foreach,
            fused=fused,
        )


class DecoupledAdamW(_DecoupledDecay, torch.optim.AdamW):
    """AdamW with weight decay decoupled from the learning rate (Composer's ``DecoupledAdamW``).

    Each step multiplies every parameter that has a gradient by
    ``1 - weight_decay * lr / initial_lr``, then takes torch's Adam step. torch's AdamW
    multiplies by ``1 - lr * weight_decay`` instead, so ``weight_decay`` here is about
    ``lr`` times smaller for the same effect. The defaults are Composer's: ``betas=(0.9,
    0.95)`` and ``weight_decay=1e-5`` (torch: ``(0.9, 0.999)`` and ``1e-2``).

    Args:
        params: Parameters to optimize, or dicts defining parameter groups.
        lr: Learning rate.
        betas: Coefficients of the running averages of the gradient and its square.
        eps: Added to the denominator for numerical stability.
        weight_decay: Fraction of each weight removed per step at the initial learning
            rate (not multiplied by ``lr``).
        amsgrad: Use the AMSGrad variant (the maximum of the second-moment averages).
        maximize: Maximize the objective instead of minimizing it.
        foreach: Use torch's multi-tensor implementation (None: torch decides).
        capturable: Keep the step count on the device, for CUDA graph capture.
        fused: Use torch's fused implementation (None: torch decides).
    """

    _torch_class = torch.optim.AdamW

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.95),
        eps: float = 1e-8,
        weight_decay: float = 1e-5,
        amsgrad: bool = False,
        *,
        maximize: bool = False,
        foreach: bool | None = None,
        capturable: bool = False,
        fused: bool | None = None,
    ) -> None:
        super().__init__(
            params,
            lr=lr,
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            amsgrad=amsgrad,
            maximize=maximize,
            foreach=foreach,
            capturable=capturable,
            fused=fused,
        )
