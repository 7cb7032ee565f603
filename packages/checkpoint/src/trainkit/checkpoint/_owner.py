"""Whose checkpoints a folder holds: a run refuses a folder of another model's checkpoints.

Each manifest records the saving model's shape (`model_summary`: a fingerprint of its
state-dict entry names and shapes, global shapes for sharded tensors, so a run resharded
on another number of ranks matches). Before a run reads or writes its folder, the
`Checkpointer` compares the newest checkpoint's record with its own model
(`refuse_other_model`): a run of another model would otherwise fail to resume, start
afresh and write its checkpoints beside the other run's, moving ``latest`` to them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from trainkit.checkpoint._errors import FolderOfAnotherModelError
from trainkit.checkpoint._listing import complete, manifests
from trainkit.checkpoint._storage import Storage, location
from trainkit.core import State

__all__ = ["current_model_summary", "model_summary", "refuse_other_model"]


def model_summary(model_state: Mapping[str, Any]) -> dict[str, Any]:
    """``{"fingerprint", "tensors", "values"}`` of a model's state dict (names and shapes)."""
    digest, values = hashlib.sha256(), 0
    for name in sorted(model_state):
        shape = [int(size) for size in getattr(model_state[name], "shape", ())]
        digest.update(f"{name}:{shape}\n".encode())
        count = 1
        for size in shape:
            count *= size
        values += count
    return {"fingerprint": digest.hexdigest()[:16], "tensors": len(model_state), "values": values}


def current_model_summary(state: State) -> dict[str, Any]:
    """`model_summary` of the run's model, named as a checkpoint names it."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return model_summary(get_model_state_dict(state.model))


def refuse_other_model(storage: Storage, mine: dict[str, Any], run: str) -> None:
    """Raise `FolderOfAnotherModelError` if the newest checkpoint of ``storage`` (the one a
    resume would load) was saved from a model of another shape than ``mine``.

    Checkpoints saved before manifests recorded the model are not judged here (loading one
    that does not fit still fails with the names that differ).
    """
    names = complete(storage, newest_first=True, prefer_latest=True)
    if not names:
        return
    newest = names[0]
    manifest = dict(manifests(storage)).get(newest)
    theirs = manifest.model if manifest is not None else {}
    if not theirs or theirs.get("fingerprint") == mine["fingerprint"]:
        return
    assert manifest is not None
    folder = location(storage, "")
    raise FolderOfAnotherModelError(
        f"{folder} holds checkpoints of another model: {location(storage, newest)}, saved by run "
        f"{manifest.run_name!r}, has {_size(theirs)}; this run ({run!r}) has {_size(mine)}. "
        "Nothing was read or written there. To start fresh, give this run a folder of its "
        "own (trainkit train: another run_name, config file name or --run-dir; the Trainer: "
        "another save_folder); to resume that run, build its model; or set overwrite=True "
        "(the Trainer's save_overwrite=True) to train this model there anyway"
    )


def _size(summary: dict[str, Any]) -> str:
    return f"{summary['values']:,} values in {summary['tensors']} tensors"
