"""Loading a checkpoint Composer saved: one ``.pt`` file written by ``torch.save``.

Composer's layout (``composer/utils/checkpoint.py``, ``composer/core/state.py``)::

    {"state": {"model": {name: tensor}, "optimizers": {"AdamW": optimizer state},
               "schedulers": {"LambdaLR": ...}, "timestamp": {"Timestamp": {...}},
               "algorithms": [(name, state), ...], "callbacks": {...}, "run_name": ...,
               "rank_zero_seed": ..., "integrations": ..., "metadata": ...},
     "rng": [per-rank generator states]}

a weights-only one holds ``{"state": {"model": ..., "integrations": ..., "metadata": ...}}``.
A plain ``torch.save(model.state_dict())`` file is read as weights only.

The file is unpickled with ``torch.load(weights_only=True)``, which builds tensors and plain
Python values only; beyond those it accepts what Composer's own loader allows (``timedelta``,
numpy arrays and dtypes, torch's version string), none of which runs code. Anything else
stops the load with `UnsafeCheckpointError` before it is built.
"""

from __future__ import annotations

import contextlib
import datetime
import importlib
import os
import pickle
import re
import secrets
import shutil
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from trainkit.checkpoint._common import agreed, is_node_leader, shareable
from trainkit.checkpoint._composer_state import ModelPlan, apply_to_run, plan_model
from trainkit.checkpoint._errors import CheckpointError, UnsafeCheckpointError
from trainkit.checkpoint._manifest import Manifest
from trainkit.checkpoint._select import (
    IgnoreKeys,
    check_required_algorithms,
    drop_matching,
)
from trainkit.checkpoint._storage import default_local_dir, is_url, open_storage, split_location
from trainkit.core import Algorithm, State, dist, plugins

__all__ = ["is_torch_file", "load_torch_file"]

_SUFFIXES = (".pt", ".pth")
_COMPRESSED = (
    ".tar", ".tgz", ".tar.gz", ".tar.bz2", ".tar.lzma",
    ".pt.bz2", ".pt.gz", ".pt.lz4", ".pt.lzma", ".pt.lzo", ".pt.xz", ".pt.zst",
)  # fmt: skip
_ZIP, _PICKLE = b"PK\x03\x04", b"\x80"  # torch.save's archive; the legacy (pickle) format


def is_torch_file(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` names one file written by ``torch.save`` (Composer's checkpoints)
    rather than a trainkit checkpoint folder: a name ending in ``.pt``/``.pth`` (or one of
    Composer's compressed forms), or a local file that starts like one."""
    text = os.fspath(path).lower()
    if text.endswith(_SUFFIXES + _COMPRESSED):
        return True
    if is_url(path) or not os.path.isfile(path):
        return False
    with open(path, "rb") as stream:
        head = stream.read(4)
    return head.startswith((_ZIP, _PICKLE))


def load_torch_file(
    state: State,
    path: str | os.PathLike[str],
    *,
    weights_only: bool = False,
    strict: bool = True,
    ignore_keys: IgnoreKeys = (),
    exclude_algorithms: Sequence[str] = (),
    storage_options: Mapping[str, Any] | None = None,
    local_dir: str | os.PathLike[str] | None = None,
) -> Manifest:
    """Load a checkpoint Composer saved (a ``.pt`` file) into ``state``. Collective.

    Restores the model weights, mapping Composer's parameter names to the model's (a
    wrapper's ``module.`` prefix, ``_orig_mod.``, or another single leading prefix), and,
    unless ``weights_only``: the optimizer state (Composer keys it by class name: it is
    loaded into the run's optimizer of that class), the timestamp (so training goes on from
    there), torch LR schedulers of the same class, and the random generators. Composer's
    algorithm and callback states are not loaded (their formats differ); its algorithms
    are checked against the run's ``required_on_load`` ones by class name.

    A local ``path`` must be readable by every rank; a URL (``s3://...``) is downloaded once
    per machine through its `Storage`. Arguments are those of `load_checkpoint`;
    ``ignore_keys`` patterns and callables see Composer's dict (``"state/model/..."``,
    ``"rng"``).
    """
    text = os.fspath(path)
    if text.lower().endswith(_COMPRESSED):
        raise CheckpointError(
            f"{text} is compressed or an archive; trainkit reads Composer checkpoints as plain "
            "'.pt' files: decompress it first (a tar archive holds 'composer_states.pt')"
        )
    with _local_copy(text, storage_options, local_dir) as file:
        raw = agreed(lambda: _read(file, text))
        plan = agreed(
            lambda: _plan(raw, state, text, weights_only, strict, ignore_keys, exclude_algorithms)
        )
        apply_to_run(plan, state)
    return plan.manifest


def _read(file: Path, where: str) -> dict[str, Any]:
    """The file's dict, built with torch's weights-only unpickler; Composer's layout checked."""
    if not file.is_file():
        what = (
            "is a folder, not a file"
            if file.is_dir()
            else "is not a regular file (a FIFO, a device, ...); it was not opened"
            if file.exists()
            else "does not exist"
        )
        raise CheckpointError(f"checkpoint file {where} {what}")
    try:
        with torch.serialization.safe_globals(_safe_globals()):
            raw = torch.load(file, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        found = re.search(r"GLOBAL ([\w.]+)", str(err))
        if found is None:
            raise CheckpointError(f"{where} is not a readable torch.save file ({err})") from None
        raise UnsafeCheckpointError(
            f"{where} holds a Python object of {found.group(1)}, which only a full unpickler "
            "could build, and that can run any code; refusing to load it (nothing from it was "
            "executed). Only if you trust the file: where Composer is installed, load it with "
            "torch.load(path, weights_only=False) and save the parts made of tensors and plain "
            "values, e.g. torch.save({'state': {'model': ckpt['state']['model'], 'optimizers': "
            "ckpt['state']['optimizers']}}, 'plain.pt'), then load that file"
        ) from None
    except (RuntimeError, EOFError, OSError, ValueError) as err:
        raise CheckpointError(f"{where} is not a readable torch.save file ({err})") from None
    return _as_composer_layout(raw, where)


def _safe_globals() -> list[Any]:
    # What Composer's own loader allows beyond torch's defaults: plain values, no code.
    import numpy

    allowed: list[Any] = [datetime.timedelta, numpy.ndarray, numpy.dtype]
    allowed += [t for t in vars(numpy.dtypes).values() if isinstance(t, type)]
    allowed.append(torch.torch_version.TorchVersion)
    # Arrays are rebuilt by multiarray._reconstruct, which numpy 2 moved from numpy.core to
    # numpy._core: files name it by the numpy version that wrote them. Allow both names.
    modules = ("numpy._core.multiarray", "numpy.core.multiarray")
    for module in modules:
        try:
            reconstruct = importlib.import_module(module)._reconstruct
        except (ImportError, AttributeError):
            continue
        allowed += [(reconstruct, f"{name}._reconstruct") for name in modules]
        break
    return allowed


def _as_composer_layout(raw: Any, where: str) -> dict[str, Any]:
    if isinstance(raw, dict) and raw and all(isinstance(v, torch.Tensor) for v in raw.values()):
        return {"state": {"model": raw}}  # a plain model state_dict
    if not (isinstance(raw, dict) and isinstance(raw.get("state"), dict)):
        found = sorted(map(str, raw))[:10] if isinstance(raw, dict) else type(raw).__name__
        raise CheckpointError(
            f"{where} is not a Composer checkpoint: expected a dict {{'state': {{'model': ..., "
            f"...}}, 'rng': [...]}} (or a model state_dict), found {found}"
        )
    # Composer before 0.4.1 wrote private attribute names ("_optimizers").
    state = {k.removeprefix("_"): v for k, v in raw["state"].items()}
    if "is_model_ddp_wrapped" in state:
        state["is_model_ddp"] = state.pop("is_model_ddp_wrapped")
    return {**raw, "state": state}


def _plan(
    raw: dict[str, Any],
    state: State,
    where: str,
    weights_only: bool,
    strict: bool,
    ignore_keys: IgnoreKeys,
    exclude_algorithms: Sequence[str],
) -> ModelPlan:
    before = set(raw["state"].get("model") or {})
    if callable(ignore_keys):
        ignore_keys(raw)
        raw["state"] = raw.get("state") or {}
    else:
        drop_matching(raw, ignore_keys, into_lists=True)
    saved = raw["state"]
    if not isinstance(saved.get("model", {}), dict):
        raise CheckpointError(f"{where}: state/model is not a dict of tensors")
    ignored = before - set(saved.get("model") or {})
    holds_weights_only = "timestamp" not in saved and "optimizers" not in saved
    if holds_weights_only and not weights_only and "model" in saved:
        raise CheckpointError(
            f"{where} holds model weights only (no timestamp, no optimizer state); load it "
            "with weights_only=True"
        )
    names = _algorithm_names(saved.get("algorithms"))
    required = _required_on_load(names)
    check_required_algorithms(
        required, state, strict=strict, where=where, exclude=exclude_algorithms
    )
    plan = plan_model(raw, state, where, strict=strict, weights_only=weights_only, ignored=ignored)
    plan.manifest.required_algorithms = required
    return plan


def _algorithm_names(algorithms: Any) -> list[str]:
    if isinstance(algorithms, dict):
        return [str(name) for name in algorithms]
    if isinstance(algorithms, list | tuple):  # [(name, state), ...] since Composer 0.13
        return [str(item[0]) for item in algorithms if isinstance(item, list | tuple) and item]
    return []


def _required_on_load(names: Sequence[str]) -> list[str]:
    """Those of ``names`` that are trainkit algorithms (same class name, found through the
    ``trainkit.algorithms`` entry points) with ``required_on_load``."""
    required = []
    for info in plugins.describe("trainkit.algorithms"):
        class_name = info.value.rpartition(":")[2].rpartition(".")[2]
        if class_name not in names:
            continue
        try:
            cls = plugins.load("trainkit.algorithms", info.name)
        except Exception:  # a broken plugin must not block loading; its class is unknown
            continue
        if isinstance(cls, type) and issubclass(cls, Algorithm) and cls.required_on_load:
            required.append(class_name)
    return sorted(set(required))


@contextlib.contextmanager
def _local_copy(
    path: str, storage_options: Mapping[str, Any] | None, local_dir: str | os.PathLike[str] | None
) -> Iterator[Path]:
    """``path`` as a file on this machine (a URL is downloaded by the first rank of each)."""
    if not is_url(path):
        if storage_options:
            raise ValueError(
                f"storage_options were given for the local file {path}; they apply to URLs only"
            )
        yield Path(path)
        return
    root, name = split_location(path)
    storage = open_storage(root, storage_options)
    token = dist.broadcast_object(secrets.token_hex(4) if dist.get_rank() == 0 else None)
    folder = Path(local_dir or default_local_dir()) / f".download-{token}"
    leader = is_node_leader()
    error: Exception | None = None
    if leader:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            storage.download(name, folder / name)
        except FileNotFoundError:
            error = CheckpointError(f"checkpoint file {path} does not exist")
        except Exception as err:  # the other ranks wait for the outcome, whatever it is
            error = shareable(err)
    errors = [e for e in dist.all_gather_object(error) if e is not None]
    try:
        if errors:
            raise errors[0]
        yield folder / name
        dist.barrier()  # every rank has read the file
    finally:
        if leader:
            shutil.rmtree(folder, ignore_errors=True)
