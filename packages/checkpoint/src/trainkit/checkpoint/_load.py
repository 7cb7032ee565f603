"""`load_checkpoint`: a checkpoint from any `Storage` into a `State`, never running code from it."""

from __future__ import annotations

import copy
import os
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint._nested_dict import flatten_state_dict  # DCP's own key naming

from trainkit.checkpoint._blocks import split_blocks
from trainkit.checkpoint._common import on_rank0, plain_errors, single_process_is_intended
from trainkit.checkpoint._composer import is_torch_file, load_torch_file
from trainkit.checkpoint._errors import CheckpointError
from trainkit.checkpoint._fetch import fetched, resolve
from trainkit.checkpoint._manifest import Manifest
from trainkit.checkpoint._read import SafeReader
from trainkit.checkpoint._safe import SafeLoadPlanner
from trainkit.checkpoint._select import (
    IgnoreKeys,
    check_required_algorithms,
    drop_excluded_algorithms,
    drop_matching,
)
from trainkit.checkpoint._storage import Storage, location, open_storage, split_location
from trainkit.core import State, dist
from trainkit.core.messages import warn

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
    ignore_keys: IgnoreKeys = (),
    exclude_algorithms: Sequence[str] = (),
    verify: bool = True,
    storage_options: Mapping[str, Any] | None = None,
    local_dir: str | os.PathLike[str] | None = None,
) -> Manifest:
    """Load a checkpoint into ``state``. Collective: every rank calls it.

    Args:
        path: a checkpoint folder, a ``latest`` file, or a folder with a ``latest`` file;
            local, or a URL (``"s3://bucket/prefix/latest"``). Or a file Composer saved
            (``"ep3-ba1500-rank0.pt"``, local or a URL): see `load_torch_file`.
        weights_only: load only the model weights (e.g. to fine-tune from another run).
        strict: the model's parameter names must match the checkpoint's exactly, and the
            run must have every algorithm the checkpoint needs (``required_on_load``).
        ignore_keys: glob patterns of entries not to load, e.g. ``"model/head.*"``, ``"rng"``
            (a leading ``state/``, as Composer writes them, is optional); or a callable
            ``(state_dict) -> None`` that edits the loaded state in place before it is put
            into the run: it gets ``{"state": {"model": ..., "optimizers": [...], ...}}``
            (a loaded copy), and what it deletes keeps the run's own values.
        exclude_algorithms: algorithm class names (``"BlurPool"``) whose saved state is not
            loaded and which the run need not have even if the checkpoint requires them.
        verify: check every file's checksum against the manifest first (sizes always).
        storage_options: for a URL, options of its storage back end (see `S3Storage`).
        local_dir: for a URL, where the checkpoint is downloaded before it is loaded
            (default: a folder in the system's temporary directory; removed after loading).
    """
    if is_torch_file(path):
        return load_torch_file(
            state,
            path,
            weights_only=weights_only,
            strict=strict,
            ignore_keys=ignore_keys,
            exclude_algorithms=exclude_algorithms,
            storage_options=storage_options,
            local_dir=local_dir,
        )
    root, name = split_location(path)
    return load_from(
        open_storage(root, storage_options),
        name,
        state,
        weights_only=weights_only,
        strict=strict,
        ignore_keys=ignore_keys,
        exclude_algorithms=exclude_algorithms,
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
    ignore_keys: IgnoreKeys = (),
    exclude_algorithms: Sequence[str] = (),
    verify: bool = True,
    local_dir: str | os.PathLike[str] | None = None,
) -> Manifest:
    """Load the checkpoint ``name`` of ``storage`` into ``state`` (see `load_checkpoint`)."""
    key = on_rank0(lambda: resolve(storage, name))
    with fetched(storage, key, verify=verify, local_dir=local_dir) as folder:
        where = location(storage, key)
        options = {"weights_only": weights_only, "strict": strict, "ignore_keys": ignore_keys}
        return _load_folder(state, folder, where, exclude_algorithms=exclude_algorithms, **options)


def _load_folder(
    state: State,
    folder: Path,
    where: Path | str,
    *,
    weights_only: bool,
    strict: bool,
    ignore_keys: IgnoreKeys,
    exclude_algorithms: Sequence[str],
) -> Manifest:
    manifest = Manifest.read(folder)
    if manifest.weights_only and not weights_only:
        raise CheckpointError(f"{where} holds model weights only; load it with weights_only=True")
    check_required_algorithms(
        manifest.required_algorithms, state, strict=strict, where=where, exclude=exclude_algorithms
    )
    live = state.state_dict()
    template: dict[str, Any] = {"model": live["model"]} if weights_only else live
    if "rng" in template:
        # One entry per rank of the run that saved, whatever this run's world size.
        # DCP loads into the template's tensors in place, so each entry needs its own.
        mine = live["rng"][dist.get_rank()]
        template["rng"] = [copy.deepcopy(mine) for _ in range(manifest.world_size)]
    if exclude_algorithms:
        known = [*(type(a).__qualname__ for a in state.algorithms), *manifest.required_algorithms]
        drop_excluded_algorithms(template.get("algorithms", {}), exclude_algorithms, known)
    edit = ignore_keys if callable(ignore_keys) else None
    ignored = [] if edit else drop_matching(template, ignore_keys, into_lists=False)
    if edit is not None:
        # The callable edits loaded values: load into copies, so that the run's own tensors
        # change only through load_state_dict, after the edit.
        template = _copied(template)
    reader = SafeReader(folder, manifest.files)
    _check_model_keys(
        template, reader, strict and not any(k.startswith("model/") for k in ignored), where
    )
    wanted = set(template.get("model", {}))
    own_groups = _param_group_names(template)
    full = {"state": template}
    restore = split_blocks(full)
    with single_process_is_intended(), plain_errors(f"loading {where}"):
        try:
            dcp.load(
                full,
                storage_reader=reader,
                planner=SafeLoadPlanner(allow_partial_load=True),
                no_dist=not dist.is_initialized(),
            )
        finally:
            restore(full)  # the DTensors, now holding what their blocks loaded
    _restore_param_group_names(full["state"], own_groups)
    if edit is not None:
        edit(full)
        kept = full.get("state", {}).get("model", {})
        ignored = [f"model/{k}" for k in sorted(wanted - set(kept))]
    with warnings.catch_warnings():
        if weights_only:
            warnings.simplefilter("ignore")
        state.load_state_dict(full.get("state", {}), strict=strict and not ignored)
    return manifest


def _param_group_names(template: dict[str, Any]) -> list[list[list[str]]]:
    """This rank's parameter names in each optimizer's groups (``params``, by name)."""
    return [
        [list(group.get("params", ())) for group in optimizer.get("param_groups", ())]
        for optimizer in template.get("optimizers", ())
        if isinstance(optimizer, dict)
    ]


def _restore_param_group_names(state: dict[str, Any], names: list[list[list[str]]]) -> None:
    # A value every rank saves under one key is written once, by one rank: when the ranks
    # hold different parameters (pipeline stages), a group's ``params`` list is another
    # rank's. Each rank's groups name its own parameters; the hyperparameters are loaded.
    for optimizer, groups in zip(state.get("optimizers", ()), names, strict=False):
        loaded = optimizer.get("param_groups", ()) if isinstance(optimizer, dict) else ()
        if len(loaded) == len(groups):
            for group, params in zip(loaded, groups, strict=True):
                group["params"] = params


def _copied(tree: Any) -> Any:
    if isinstance(tree, torch.Tensor):
        return tree.detach().clone()
    if isinstance(tree, dict):
        return {key: _copied(value) for key, value in tree.items()}
    if isinstance(tree, list | tuple):
        return type(tree)(_copied(value) for value in tree)
    return copy.copy(tree)


def _check_model_keys(
    template: dict[str, Any], reader: SafeReader, strict: bool, where: Path | str
) -> None:
    saved = {
        k.removeprefix("state.model.")
        for k in reader.read_metadata().state_dict_metadata
        if k.startswith("state.model.")
    }
    flat, _ = flatten_state_dict({"state": {"model": template.get("model", {})}})
    # Pipeline stages hold different parameters: the run's names are every rank's.
    wanted = set().union(*dist.all_gather_object({k.removeprefix("state.model.") for k in flat}))
    missing, unexpected = sorted(wanted - saved), sorted(saved - wanted)
    if (missing and strict) or (unexpected and strict):
        raise CheckpointError(
            f"checkpoint {where} does not fit this model: missing from the checkpoint {missing[:20]}"
            f"{' ...' if len(missing) > 20 else ''}; not in the model {unexpected[:20]}"
            f"{' ...' if len(unexpected) > 20 else ''}. Load with strict=False to skip them, or "
            "ignore_keys=['model/<name pattern>'] to keep the model's own values for some"
        )
    if missing:
        warn(f"not in checkpoint {where}, left as they are: {missing[:20]}")
