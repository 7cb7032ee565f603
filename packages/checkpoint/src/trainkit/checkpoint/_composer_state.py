"""From a Composer checkpoint's dict to this run's state: names, optimizer state, time, RNG.

`plan_model` checks everything on each rank before anything changes; `apply_to_run` then
loads (collectively, when the model is sharded).
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.tensor import DTensor

from trainkit.checkpoint._errors import CheckpointError
from trainkit.checkpoint._manifest import Manifest
from trainkit.core import State, Timestamp
from trainkit.core.messages import warn

__all__ = ["ModelPlan", "apply_to_run", "plan_model"]

# Names wrappers insert into parameter names: torch.compile, FSDP1, activation checkpointing.
_WRAPPER_PARTS = ("_orig_mod.", "_fsdp_wrapped_module.", "_checkpoint_wrapped_module.")


@dataclasses.dataclass
class ModelPlan:
    """What to load into the run, checked: tensors under the model's own names, and so on."""

    manifest: Manifest
    model: dict[str, torch.Tensor]
    missing: list[str] = dataclasses.field(default_factory=list)
    optimizers: list[tuple[torch.optim.Optimizer, dict[str, Any]]] = dataclasses.field(
        default_factory=list
    )
    schedulers: list[tuple[Any, dict[str, Any]]] = dataclasses.field(default_factory=list)
    rest: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Entries for `State.load_state_dict` (``timestamp``, ``rng``)."""


def plan_model(
    raw: dict[str, Any],
    state: State,
    where: str,
    *,
    strict: bool,
    weights_only: bool,
    ignored: set[str],
) -> ModelPlan:
    """Check what ``raw`` (Composer's dict) gives the run; ``ignored``: the checkpoint's model
    names that ``ignore_keys`` dropped (the run keeps its own values for them)."""
    saved = raw["state"]
    live = get_model_state_dict(state.model)
    model = saved.get("model") or {}
    if not all(isinstance(v, torch.Tensor) for v in model.values()):
        raise CheckpointError(f"{where}: state/model holds values that are not tensors")
    how, rename = _renaming(model, set(live))
    mapped = {rename(k): v for k, v in model.items()}
    kept = set(live) & {rename(k) for k in ignored}
    missing = sorted(set(live) - set(mapped) - kept)
    unexpected = sorted(set(mapped) - set(live))
    if strict and (missing or unexpected):
        raise CheckpointError(
            f"checkpoint {where} does not fit this model (its names taken {how}): missing from "
            f"the checkpoint {missing[:20]}{' ...' if len(missing) > 20 else ''}; not in the "
            f"model {unexpected[:20]}{' ...' if len(unexpected) > 20 else ''}. Load with "
            "strict=False to skip them, or ignore_keys=['state/model/<name pattern>']"
        )
    if missing:
        warn(f"not in checkpoint {where}, left as they are: {missing[:20]}")
    if unexpected:
        warn(f"not in the model, not loaded from {where}: {unexpected[:20]}")
    mapped = {k: v for k, v in mapped.items() if k in live}
    wrong = [
        f"{k} {tuple(v.shape)} (model: {tuple(live[k].shape)})"
        for k, v in mapped.items()
        if tuple(v.shape) != tuple(live[k].shape)
    ]
    if wrong:
        raise CheckpointError(f"checkpoint {where} has tensors of other shapes: {wrong[:10]}")
    timestamp = None if weights_only else _timestamp(saved, where)
    plan = ModelPlan(manifest=_manifest(raw, timestamp), model=mapped, missing=[*missing, *kept])
    if not weights_only:
        plan.optimizers = _optimizers(saved.get("optimizers"), state, rename, live, where)
        plan.schedulers = _schedulers(saved.get("schedulers"), state)
        if timestamp is not None:
            plan.rest["timestamp"] = timestamp
        if (rng := _rng(raw.get("rng"), where)) is not None:
            plan.rest["rng"] = rng
    return plan


def apply_to_run(plan: ModelPlan, state: State) -> None:
    """Load the plan into ``state`` (collective when the model is sharded)."""
    sharded = any(isinstance(p, DTensor) for p in state.model.parameters())
    model = dict(plan.model)
    if sharded and plan.missing:
        # A full state dict is distributed key by key: give the missing ones their own values.
        live = get_model_state_dict(state.model)
        model.update({k: _full(live[k]) for k in plan.missing})
    set_model_state_dict(
        state.model, model, options=StateDictOptions(full_state_dict=sharded, strict=False)
    )
    for optimizer, optimizer_state in plan.optimizers:
        set_optimizer_state_dict(
            state.model,
            optimizer,
            optimizer_state,
            options=StateDictOptions(full_state_dict=sharded),
        )
    for scheduler, scheduler_state in plan.schedulers:
        scheduler.load_state_dict(scheduler_state)
    if plan.rest:
        state.load_state_dict(plan.rest)


def _full(value: Any) -> Any:
    return value.full_tensor() if isinstance(value, DTensor) else value


def _renaming(saved: Iterable[str], wanted: set[str]) -> tuple[str, Callable[[str], str]]:
    """How to turn the checkpoint's parameter names into the model's: the candidate that
    matches the most names (as saved, if it is as good as any)."""
    saved = list(saved)

    def unwrapped(key: str) -> str:
        for part in _WRAPPER_PARTS:
            key = key.replace(part, "")
        return key

    source, target = _first_part(map(unwrapped, saved)), _first_part(wanted)
    candidates: list[tuple[str, Callable[[str], str]]] = [
        ("as saved", lambda k: k),
        (f"without {list(_WRAPPER_PARTS)}", unwrapped),
    ]
    if source:
        candidates.append(
            (f"without the prefix '{source}.'", lambda k: unwrapped(k).removeprefix(f"{source}."))
        )
    if source and target and source != target:
        swap = f"with the prefix '{source}.' replaced by '{target}.'"
        candidates.append((swap, lambda k: f"{target}.{unwrapped(k).removeprefix(f'{source}.')}"))
    if target:
        candidates.append(
            (f"with the prefix '{target}.' added", lambda k: f"{target}.{unwrapped(k)}")
        )
    return max(candidates, key=lambda c: len({c[1](k) for k in saved} & wanted))


def _first_part(names: Iterable[str]) -> str | None:
    """The first dotted part all ``names`` share (``"module"`` in ``module.0.weight``), if any."""
    heads = {name.partition(".")[0] if "." in name else None for name in names}
    return heads.pop() if len(heads) == 1 and None not in heads else None


def _optimizers(
    saved: Any,
    state: State,
    rename: Callable[[str], str],
    live: dict[str, Any],
    where: str,
) -> list[tuple[torch.optim.Optimizer, dict[str, Any]]]:
    if saved is None:
        return []
    if not isinstance(saved, dict):
        raise CheckpointError(f"{where}: state/optimizers is not a dict (class name -> state)")
    plans = []
    classes = [type(o).__qualname__ for o in state.optimizers]
    for optimizer, name in zip(state.optimizers, classes, strict=True):
        if name not in saved:
            warn(
                f"{where} has no state for the optimizer {name} (it has {sorted(saved)}); "
                f"the run's {name} starts fresh",
            )
            continue
        if classes.count(name) > 1:
            warn(
                f"the run has {classes.count(name)} {name} optimizers and {where} one state for "
                "that class; none of them was restored",
            )
            continue
        converted = _optimizer_state(
            saved[name], optimizer, state, rename, live, f"{where} ({name})"
        )
        plans.append((optimizer, converted))
    return plans


def _optimizer_state(
    saved: Any,
    optimizer: torch.optim.Optimizer,
    state: State,
    rename: Callable[[str], str],
    live: dict[str, Any],
    where: str,
) -> dict[str, Any]:
    """Composer's optimizer state keyed by the run's parameter names (it keys by name, or,
    before torch's state-dict API, by position), checked against the run's optimizer."""
    groups, values = saved.get("param_groups"), saved.get("state", {})
    hint = "; skip it with ignore_keys=['state/optimizers']"
    ours = [g["params"] for g in get_optimizer_state_dict(state.model, optimizer)["param_groups"]]
    if not isinstance(groups, list) or len(groups) != len(ours):
        count = len(groups) if isinstance(groups, list) else "no"
        raise CheckpointError(
            f"optimizer state of {where} has {count} parameter groups, the run's optimizer "
            f"{len(ours)}{hint}"
        )
    new_state: dict[str, Any] = {}
    new_groups = []
    for index, (group, names) in enumerate(zip(groups, ours, strict=True)):
        params = list(group.get("params", []))
        if all(isinstance(p, str) for p in params):
            keyed = {p: rename(p) for p in params}
        elif len(params) == len(names):
            keyed = dict(zip(params, names, strict=True))
        else:
            keyed = {}
        if sorted(keyed.values()) != sorted(names):
            raise CheckpointError(
                f"optimizer state of {where}: parameter group {index} holds other parameters "
                f"than the run's ({len(params)} saved, {len(names)} in the run){hint}"
            )
        new_state.update({keyed[p]: values[p] for p in params if p in values})
        new_groups.append({**group, "params": [keyed[p] for p in params]})
    for name, entry in new_state.items():
        shape = tuple(live[name].shape)
        for key, value in entry.items():
            if isinstance(value, torch.Tensor) and value.dim() > 0 and tuple(value.shape) != shape:
                raise CheckpointError(
                    f"optimizer state of {where}: {name}'s {key} has shape "
                    f"{tuple(value.shape)}, the parameter {shape}{hint}"
                )
    return {"state": new_state, "param_groups": new_groups}


def _schedulers(saved: Any, state: State) -> list[tuple[Any, dict[str, Any]]]:
    """Torch LR schedulers whose class (one in the run) Composer saved a state for."""
    if not isinstance(saved, dict):
        return []
    classes = [type(s).__qualname__ for s in state.schedulers]
    return [
        (scheduler, saved[name])
        for scheduler, name in zip(state.schedulers, classes, strict=True)
        if isinstance(scheduler, torch.optim.lr_scheduler.LRScheduler)
        and name in saved
        and classes.count(name) == 1
    ]


def _timestamp(saved: dict[str, Any], where: str) -> dict[str, Any] | None:
    value = saved.get("timestamp")
    if value is None:
        return None
    if isinstance(value, dict) and isinstance(value.get("Timestamp"), dict):
        value = value["Timestamp"]  # Composer keys it by class name
    if not isinstance(value, dict):
        raise CheckpointError(f"{where}: state/timestamp is not a Timestamp's state")
    fields = {}
    for name in Timestamp._fields:
        number = value.get(name, 0)
        if isinstance(number, datetime.timedelta):
            number = number.total_seconds()
        fields[name] = float(number) if name.endswith("_wct") else int(number)
    return fields


def _rng(saved: Any, where: str) -> list[dict[str, Any]] | None:
    """Composer's per-rank generator states in trainkit's form (None if there are none)."""
    if not isinstance(saved, list) or not saved:
        return None
    try:
        return [_rng_entry(entry) for entry in saved]
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        warn(
            f"{where}: random generator states not restored ({type(err).__name__}: {err})",
        )
        return None


def _rng_entry(entry: dict[str, Any]) -> dict[str, Any]:
    version, internal, gauss = entry["python"]
    ours: dict[str, Any] = {"python": [version, list(internal), gauss], "torch": entry["torch"]}
    if "numpy" in entry:
        kind, keys, position, has_gauss, cached = entry["numpy"]
        keys = torch.from_numpy(keys.astype("int64"))
        ours["numpy"] = [kind, keys, position, has_gauss, cached]
    if "cuda" in entry:
        ours["cuda"] = entry["cuda"]
    return ours


def _manifest(raw: dict[str, Any], timestamp: dict[str, Any] | None) -> Manifest:
    saved = raw["state"]
    metadata = saved.get("metadata") if isinstance(saved.get("metadata"), dict) else {}
    rng = raw.get("rng")
    world = len(rng) if isinstance(rng, list) and rng else metadata.get("world_size", 1)
    return Manifest(
        timestamp=timestamp or {},
        world_size=int(world),
        layout={"source": "composer"},
        files={},
        trainkit_version="",
        torch_version=str(metadata.get("torch_version", "")),
        run_name=str(saved.get("run_name", "")),
        weights_only="timestamp" not in saved and "optimizers" not in saved,
        format="composer",
    )
