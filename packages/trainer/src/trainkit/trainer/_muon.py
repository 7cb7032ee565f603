"""Muon for the hidden weight matrices, AdamW for everything else, as one optimizer."""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import nn

# Module names whose 2-D weights are not hidden layers: token and position embeddings and
# output heads, as GPT-2 (wte, wpe, lm_head), Llama, Mistral, Qwen and OPT (embed_tokens,
# lm_head), GPT-NeoX (embed_in, embed_out), Falcon (word_embeddings), T5 (shared) and
# torchtitan (tok_embeddings, output) name them. Matched against a parameter's module name.
ADAMW_MODULES = ("*embed*", "wte", "wpe", "lm_head", "head", "output", "shared", "classifier")

NamedParameters = Iterable[tuple[str, nn.Parameter]]


def split_for_muon(
    named_params: NamedParameters | nn.Module,
    adamw_modules: Sequence[str] = ADAMW_MODULES,
) -> tuple[list[tuple[str, nn.Parameter]], list[tuple[str, nn.Parameter]]]:
    """``(muon, adamw)``: which parameters Muon updates and which AdamW does.

    Muon takes the 2-D parameters of hidden layers (linear and GPT-2 ``Conv1D`` weights);
    AdamW takes the rest: parameters that are not 2-D (biases, norm gains, convolution
    kernels) and the weights of modules whose name matches one of ``adamw_modules``
    (``fnmatch`` patterns; by default embeddings and output heads). Parameters that do
    not require gradients are left out.

    Raises:
        ValueError: ``named_params`` holds bare tensors (their roles need names).
    """
    if isinstance(named_params, nn.Module):
        named_params = named_params.named_parameters()
    muon: list[tuple[str, nn.Parameter]] = []
    adamw: list[tuple[str, nn.Parameter]] = []
    for item in named_params:
        if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)):
            raise ValueError(
                "MuonWithAdamW sends each parameter to Muon or AdamW by its role, so it needs "
                f"names: pass model.named_parameters() or the model itself, got {_kind(item)}"
            )
        name, param = item
        if not param.requires_grad:
            continue
        hidden = param.ndim == 2 and not _matches(name, adamw_modules)
        (muon if hidden else adamw).append((name, param))
    return muon, adamw


def _matches(name: str, patterns: Sequence[str]) -> bool:
    parts = name.split(".")
    module = parts[-2] if len(parts) > 1 and parts[-1] == "weight" else parts[-1]
    return any(fnmatch.fnmatchcase(module, pattern) for pattern in patterns)


def _kind(item: Any) -> str:
    if isinstance(item, torch.Tensor):
        return f"a bare tensor of shape {tuple(item.shape)} (as model.parameters() gives)"
    if isinstance(item, dict):
        return "a parameter group dict (groups are made here, one for Muon and one for AdamW)"
    return f"a {type(item).__name__}"


def _raw_step(engine: torch.optim.Optimizer) -> Callable[..., Any]:
    """The engine class's ``step`` without torch's hook wrapper (ours runs the hooks once)."""
    step = type(engine).step
    return step.__wrapped__ if getattr(step, "hooked", False) else step  # type: ignore[attr-defined]


class MuonWithAdamW(torch.optim.Optimizer):
    """Muon (``torch.optim.Muon``) on hidden weight matrices, AdamW on the rest, as one optimizer.

    `split_for_muon` decides who updates what. There are two parameter groups, AdamW's
    first, each with its own ``lr`` and ``weight_decay`` and a ``"use_muon"`` flag; LR
    schedules scale both, and ``state_dict`` / ``load_state_dict`` / ``zero_grad`` are
    torch's own. The updates are exactly ``torch.optim.Muon``'s and ``torch.optim.AdamW``'s
    (both decay as ``param *= 1 - lr * weight_decay``).

    The defaults are those of Keller Jordan's ``MuonWithAuxAdam`` (github.com/KellerJordan/
    Muon, the optimizer of the modded-nanogpt speedruns): Muon ``lr=0.02, momentum=0.95``,
    Nesterov, 5 Newton-Schulz steps, ``weight_decay=0.01``; AdamW ``lr=3e-4, betas=(0.9,
    0.95), weight_decay=0.01``. Moonlight (Liu et al. 2025, "Muon is Scalable for LLM
    Training") instead sets ``adjust_lr_fn="match_rms_adamw"`` so that Muon reuses AdamW's
    learning rate and weight decay: then give ``lr`` and ``adamw_lr`` the same value.

    Args:
        named_params: ``model.named_parameters()`` or the model (names give the roles).
        lr: Muon's learning rate.
        momentum: Muon's momentum.
        nesterov: Use Nesterov momentum in Muon.
        ns_steps: Newton-Schulz iterations that orthogonalize Muon's update.
        weight_decay: Muon's weight decay (multiplied by its learning rate).
        adjust_lr_fn: Muon's shape-based learning-rate scaling: None or "original"
            (``sqrt(max(1, rows / cols))``), "match_rms_adamw" (Moonlight's
            ``0.2 * sqrt(max(rows, cols))``) or "spectral_unclamped".
        adamw_lr: AdamW's learning rate (embeddings, head, biases, gains).
        adamw_betas: AdamW's coefficients of the running averages.
        adamw_eps: AdamW's term added to the denominator.
        adamw_weight_decay: AdamW's weight decay (multiplied by its learning rate).
        adamw_modules: ``fnmatch`` patterns of module names whose 2-D weights go to AdamW
            (embeddings and output heads; see `ADAMW_MODULES`).
    """

    def __init__(
        self,
        named_params: NamedParameters | nn.Module,
        lr: float = 0.02,
        momentum: float = 0.95,
        nesterov: bool = True,
        ns_steps: int = 5,
        weight_decay: float = 0.01,
        adjust_lr_fn: str | None = None,
        adamw_lr: float = 3e-4,
        adamw_betas: tuple[float, float] = (0.9, 0.95),
        adamw_eps: float = 1e-8,
        adamw_weight_decay: float = 0.01,
        adamw_modules: Sequence[str] = ADAMW_MODULES,
    ) -> None:
        if isinstance(adamw_modules, str) or not all(isinstance(p, str) for p in adamw_modules):
            raise ValueError(
                f"adamw_modules must be a list of module-name patterns such as "
                f"['*embed*', 'lm_head'], got {adamw_modules!r}"
            )
        muon, adamw = split_for_muon(named_params, adamw_modules)
        if not muon:
            raise ValueError(
                "MuonWithAdamW found no hidden 2-D weight matrix for Muon (every parameter is "
                f"not 2-D or belongs to a module matching {list(adamw_modules)}); use AdamW for "
                "this model, or narrow adamw_modules"
            )
        betas = tuple(adamw_betas)
        if len(betas) != 2:
            raise ValueError(f"adamw_betas must be two numbers, got {adamw_betas!r}")
        # The engines check their own arguments and fill each group's options; MuonWithAdamW
        # runs their step functions on its own groups and state.
        self._muon = torch.optim.Muon(
            [p for _, p in muon],
            lr=lr,
            momentum=momentum,
            nesterov=nesterov,
            ns_steps=ns_steps,
            weight_decay=weight_decay,
            adjust_lr_fn=adjust_lr_fn,
        )
        self._adamw = torch.optim.AdamW(
            [p for _, p in adamw] or [torch.empty(0, requires_grad=True)],
            lr=adamw_lr,
            betas=betas,  # type: ignore[arg-type]
            eps=adamw_eps,
            weight_decay=adamw_weight_decay,
        )
        groups = [{**self._muon.param_groups[0], "use_muon": True}]
        if adamw:
            groups.insert(0, {**self._adamw.param_groups[0], "use_muon": False})
        super().__init__(groups, {})
        # What to_plain logs as the optimizer's hyperparameters (the groups carry their own).
        self.defaults = {
            "lr": lr,
            "momentum": momentum,
            "nesterov": nesterov,
            "ns_steps": ns_steps,
            "weight_decay": weight_decay,
            "adjust_lr_fn": adjust_lr_fn,
            "adamw_lr": adamw_lr,
            "adamw_betas": betas,
            "adamw_eps": adamw_eps,
            "adamw_weight_decay": adamw_weight_decay,
            "adamw_modules": list(adamw_modules),
        }

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group; ``param_group["use_muon"]`` (default False: AdamW) says which updates it."""
        use_muon = param_group.setdefault("use_muon", False)
        if not isinstance(use_muon, bool):
            raise ValueError(f"use_muon must be True or False, got {use_muon!r}")
        engine = self._muon if use_muon else self._adamw
        for key, value in engine.defaults.items():
            param_group.setdefault(key, value)
        params = param_group["params"]
        params = [params] if isinstance(params, torch.Tensor) else list(params)
        if use_muon and any(p.ndim != 2 for p in params):
            shapes = [tuple(p.shape) for p in params if p.ndim != 2]
            raise ValueError(f"Muon updates 2-D matrices only; this group has shapes {shapes}")
        param_group["params"] = params
        # torch's add_param_group fills missing keys from self.defaults, which here are the
        # logged hyperparameters, not group options: the group is complete already.
        defaults, self.defaults = self.defaults, {}
        try:
            super().add_param_group(param_group)
        finally:
            self.defaults = defaults

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Take AdamW's step on the AdamW group(s) and Muon's on the Muon group(s).

        Args:
            closure: Re-evaluates the model and returns the loss.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        # Re-read every step: load_state_dict and re-binding replace the groups and state.
        for engine, use_muon in ((self._adamw, False), (self._muon, True)):
            engine.param_groups = [g for g in self.param_groups if bool(g["use_muon"]) == use_muon]
            engine.state = self.state
            _raw_step(engine)(engine)
        return loss
