"""`load_checkpoint`: a checkpoint from any `Storage` into a `State`, never running code from it."""

from __future__ import annotations

import copy
import fnmatch
import os
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint._nested_dict import flatten_state_dict  # DCP's own key naming

from trainkit.checkpoint._common import on_rank0, plain_errors, single_process_is_intended
from trainkit.checkpoint._errors import CheckpointError, MissingAlgorithmError
from trainkit.checkpoint._fetch import fetched, resolve
from trainkit.checkpoint._manifest import Manifest
from trainkit.checkpoint._safe import SafeLoadPlanner, SafeReader
from trainkit.checkpoint._storage import Storage, location, open_storage, split_location
from trainkit.core import State, dist

__all__ = ["load_checkpoint", "load_from", "resolve_checkpoint"]


def resolve_checkpoint(
    path: str | os.PathLike[str], *, storage_options: Mapping[str, Any] | None = None
) -> Path | str:
    """A checkpoint folder, a ``latest`` file, or a folder with ``latest`` -> the checkpoint folder."""
    root, name = split_location(path)
    storage = open_storage(root, storage_options)
    return location(storage, resolve(storage, name))


def load_checkpoint(
    state: State,
    path: str | os.PathLike[str],
    *,
    weights_only: bool = False,
    strict: bool = True,
    ignore_keys: Sequence[str] = (),
    verify: bool = True,
    storage_options: Mapping[str, Any] | None = None,
    local_dir: str | os.PathLike[str] | None = None,
) -> Manifest:
    """Load a checkpoint into ``state``. Collective: every rank calls it.

    Args:
        path: a checkpoint folder, a ``latest`` file, or a folder with a ``latest`` file;
            local, or a URL (``"s3://bucket/prefix/latest"``).
        weights_only: load only the model weights (e.g. to fine-tune from another run).
        strict: the model's parameter names must match the checkpoint's exactly.
        ignore_keys: glob patterns of entries not to load, e.g. ``"model/head.*"``, ``"rng"``.
        verify: check every file's sha256 against the manifest first (sizes always).
        storage_options: for a URL, options of its storage back end (see `S3Storage`).
        local_dir: for a URL, where the checkpoint is downloaded before it is loaded
            (default: a folder in the system's temporary directory; removed after loading).
    """
    root, name = split_location(path)
    return load_from(
        open_storage(root, storage_options),
        name,
        state,
        weights_only=weights_only,
        strict=strict,
        ignore_keys=ignore_keys,
        verify=verify,
        local_dir=local_dir,
    )


def load_from(
    storage: Storage,
    name: str,
    state: State,
    *,
    weights_only: bool = False,
    strict: bool = True,
    ignore_keys: Sequence[str] = (),
    verify: bool = True,
    local_dir: str | os.PathLike[str] | None = None,
) -> Manifest:
    """Load the checkpoint ``name`` of ``storage`` into ``state`` (see `load_checkpoint`)."""
    key = on_rank0(lambda: resolve(storage, name))
    with fetched(storage, key, verify=verify, local_dir=local_dir) as folder:
        where = location(storage, key)
        return _load_folder(state, folder, where, weights_only, strict, ignore_keys)


def _load_folder(
    state: State,
    folder: Path,
    where: Path | str,
    weights_only: bool,
    strict: bool,
    ignore_keys: Sequence[str],
) -> Manifest:
    manifest = Manifest.read(folder)
    if manifest.weights_only and not weights_only:
        raise CheckpointError(f"{where} holds model weights only; load it with weights_only=True")
    _check_required_algorithms(manifest, state, strict, where)
    live = state.state_dict()
    template: dict[str, Any] = {"model": live["model"]} if weights_only else live
    if "rng" in template:
        # One entry per rank of the run that saved, whatever this run's world size.
        # DCP loads into the template's tensors in place, so each entry needs its own.
        mine = live["rng"][dist.get_rank()]
        template["rng"] = [copy.deepcopy(mine) for _ in range(manifest.world_size)]
    ignored = _drop_ignored(template, ignore_keys)
    reader = SafeReader(folder)
    _check_model_keys(
        template, reader, strict and not any(k.startswith("model/") for k in ignored), where
    )
    full = {"state": template}
    with single_process_is_intended(), plain_errors(f"loading {where}"):
        dcp.load(
            full,
            storage_reader=reader,
            planner=SafeLoadPlanner(allow_partial_load=True),
            no_dist=not dist.is_initialized(),
        )
    with warnings.catch_warnings():
        if weights_only:
            warnings.simplefilter("ignore")
        state.load_state_dict(full["state"], strict=strict and not ignored)
    return manifest


def _check_required_algorithms(
    manifest: Manifest, state: State, strict: bool, where: Path | str
) -> None:
    """Refuse (warn with ``strict=False``) a checkpoint whose run had a structure-changing
    algorithm that this run lacks: its weights would not fit, or fit silently wrong."""
    present = {type(a).__qualname__ for a in state.algorithms}
    missing = [name for name in manifest.required_algorithms if name not in present]
    if not missing:
        return
    names = ", ".join(missing)
    example = ", ".join(f"{name}()" for name in missing)
    plural = "s" if len(missing) > 1 else ""
    message = (
        f"checkpoint {where} was saved by a run with the algorithm{plural} {names}, which "
        f"change{'' if plural else 's'} the model's structure (required_on_load), but this run "
        f"does not have {'them' if plural else 'it'}: add {'them' if plural else 'it'} to the run "
        f"(e.g. algorithms=[{example}]) to load this checkpoint"
    )
    if strict:
        raise MissingAlgorithmError(f"{message}, or load with strict=False to try anyway")
    warnings.warn(f"{message}; loading anyway (strict=False)", stacklevel=5)


def _drop_ignored(template: dict[str, Any], patterns: Sequence[str]) -> list[str]:
    dropped: list[str] = []
    if not patterns:
        return dropped

    def walk(node: dict[str, Any], prefix: str) -> None:
        for key in list(node):
            path = f"{prefix}{key}"
            if any(
                fnmatch.fnmatchcase(path, p) or fnmatch.fnmatchcase(f"state/{path}", p)
                for p in patterns
            ):
                del node[key]
                dropped.append(path)
            elif isinstance(node[key], dict):
                walk(node[key], f"{path}/")

    walk(template, "")
    unused = [
        p
        for p in patterns
        if not any(
            fnmatch.fnmatchcase(d, p) or fnmatch.fnmatchcase(f"state/{d}", p) for d in dropped
        )
    ]
    if unused:
        warnings.warn(
            f"ignore_keys patterns {unused} matched nothing in the run's state", stacklevel=5
        )
    return dropped


def _check_model_keys(
    template: dict[str, Any], reader: SafeReader, strict: bool, where: Path | str
) -> None:
    saved = {
        k.removeprefix("state.model.")
        for k in reader.read_metadata().state_dict_metadata
        if k.startswith("state.model.")
    }
    flat, _ = flatten_state_dict({"state": {"model": template.get("model", {})}})
    wanted = {k.removeprefix("state.model.") for k in flat}
    missing, unexpected = sorted(wanted - saved), sorted(saved - wanted)
    if (missing and strict) or (unexpected and strict):
        raise CheckpointError(
            f"checkpoint {where} does not fit this model: missing from the checkpoint {missing[:20]}"
            f"{' ...' if len(missing) > 20 else ''}; not in the model {unexpected[:20]}"
            f"{' ...' if len(unexpected) > 20 else ''}. Load with strict=False to skip them, or "
            "ignore_keys=['model/<name pattern>'] to keep the model's own values for some"
        )
    if missing:
        warnings.warn(f"not in checkpoint {where}, left as they are: {missing[:20]}", stacklevel=5)
