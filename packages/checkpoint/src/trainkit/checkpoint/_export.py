"""Export for inference: safetensors, ``torch.export`` programs, ONNX and HuggingFace folders.

Two ways in:

- `export_checkpoint(path, out, format=...)`: from a checkpoint alone. ``safetensors``
  works for any checkpoint; the other formats need the model to be rebuilt, which a
  checkpoint of a `HuggingFaceModel` allows (its config travels with it, `_hf_files`).
- `export(model, checkpoint, format=..., example_inputs=..., out=...)`: any ``nn.Module``
  the caller builds, with the checkpoint's weights loaded into it (or as it is).

Nothing in a checkpoint is executed: weights are read through the restricted reader, the
model is rebuilt from JSON configs and transformers' own classes.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch import nn

from trainkit.checkpoint._common import plain_errors, single_process_is_intended
from trainkit.checkpoint._errors import CheckpointError
from trainkit.checkpoint._fetch import fetched
from trainkit.checkpoint._hf_files import build_hf_model, find_hf_model, hf_folder
from trainkit.checkpoint._manifest import Manifest
from trainkit.checkpoint._read import SafeReader
from trainkit.checkpoint._safe import SafeLoadPlanner
from trainkit.checkpoint._storage import location
from trainkit.checkpoint._tools import MODEL_PREFIX, empty_model_tensors, open_checkpoint

__all__ = [
    "FORMATS",
    "check_format",
    "export",
    "export_checkpoint",
    "load_weights",
    "write_export",
]

FORMATS = ("safetensors", "torch-export", "onnx", "hf")
_EXTRA = "pip install 'trainkit-checkpoint[export]'"


def check_format(format: object) -> str:
    """``format`` when it is one `export` writes; `ValueError` naming them otherwise."""
    if format not in FORMATS:
        raise ValueError(f"export format {format!r} is not known; use one of {list(FORMATS)}")
    return format  # type: ignore[return-value]


def export_checkpoint(
    path: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    format: str = "safetensors",
    seq_len: int = 8,
    batch_size: int = 2,
    merge_adapter: bool = False,
    storage_options: Mapping[str, Any] | None = None,
    local_dir: str | os.PathLike[str] | None = None,
) -> dict[str, torch.Size]:
    """Export the checkpoint ``path`` as ``format`` to ``out``; returns each weight's shape.

    Works for any layout the checkpoint was saved with (sharded over many ranks or not), in
    one process without a process group; the checkpoint is verified first.

    Args:
        format: ``"safetensors"``: the full model weights as one file, loadable with
            nothing but safetensors (names are the model's parameter names); any checkpoint.
            ``"hf"``: a folder ``from_pretrained`` loads (config, weights, tokenizer when
            the run had one; a peft adapter folder for a peft model). ``"torch-export"``:
            a ``torch.export`` program (``.pt2``, `torch.export.load`); ``"onnx"``: an ONNX
            file. The last three rebuild the model from the HuggingFace config saved with
            the checkpoint; for another model use `export` with the model.
        seq_len, batch_size: the example ``input_ids`` a torch-export / ONNX export traces
            with; both dimensions stay dynamic in the exported program.
        merge_adapter: for a peft model, merge the adapter into the base weights first
            (``merge_and_unload``) and export a plain model.
    """
    check_format(format)
    storage, key = open_checkpoint(path, storage_options)
    where = location(storage, key)
    with fetched(storage, key, verify=True, local_dir=local_dir) as folder:
        manifest = Manifest.read(folder)
        weights = _read_weights(folder, manifest, where)
        if format == "safetensors":
            _write_safetensors(weights, Path(out), _metadata(manifest, where))
            return {name: tensor.shape for name, tensor in weights.items()}
        with hf_folder(folder, manifest.files) as hf_dir:
            if hf_dir is None:
                raise CheckpointError(
                    f"{where} carries no model config (it was not saved from a "
                    "HuggingFaceModel), so the model cannot be rebuilt for a "
                    f"{format!r} export; export 'safetensors' here, or call "
                    "trainkit.checkpoint.export(model, checkpoint, format=..., "
                    "example_inputs=..., out=...) with the model built in Python"
                )
            model = build_hf_model(hf_dir, _strip(weights, "model.", where), where)
            tokenizer = _saved_tokenizer(hf_dir)
            write_export(
                model,
                format,
                Path(out),
                seq_len=seq_len,
                batch_size=batch_size,
                merge_adapter=merge_adapter,
                tokenizer=tokenizer,
                copy_model=False,
            )
    return {name: tensor.shape for name, tensor in weights.items()}


def export(
    model: nn.Module,
    checkpoint: str | os.PathLike[str] | None = None,
    *,
    format: str,
    out: str | os.PathLike[str],
    example_inputs: Any = None,
    dynamic_shapes: Any = None,
    seq_len: int = 8,
    batch_size: int = 2,
    merge_adapter: bool = False,
    tokenizer: Any = None,
    storage_options: Mapping[str, Any] | None = None,
) -> Path:
    """Export ``model`` (with the weights of ``checkpoint`` when given) as ``format`` to ``out``.

    Args:
        model: any ``nn.Module``; a `HuggingFaceModel`, a transformers model or a peft model
            is exported as its ``input_ids -> logits`` function (and is what ``"hf"`` needs).
        checkpoint: a checkpoint folder (or ``latest``, or a URL) whose model weights are
            loaded into ``model`` first: names as saved, or below the one attribute of the
            trained `TrainModel` that held ``model`` (a `HuggingFaceModel`'s ``model``, a
            ``Classifier``'s ``module``). None: export as it is.
        format: one of ``"safetensors"``, ``"torch-export"``, ``"onnx"``, ``"hf"``.
        out: the file to write (a folder for ``"hf"``).
        example_inputs: what ``model`` is called with while tracing (torch-export, ONNX): a
            tensor, a tuple of positional inputs, or a dict of keyword inputs. Default for a
            HuggingFace model: ``batch_size`` x ``seq_len`` token ids.
        dynamic_shapes: ``torch.export``'s ``dynamic_shapes`` for ``example_inputs``
            (HuggingFace default: batch and sequence dynamic).
        merge_adapter: for a peft model, merge the adapter into the weights first.
        tokenizer: written into an ``"hf"`` folder (default: the `HuggingFaceModel`'s).
    """
    check_format(format)
    if checkpoint is not None:
        load_weights(model, checkpoint, storage_options=storage_options)
    return write_export(
        model,
        format,
        Path(out),
        example_inputs=example_inputs,
        dynamic_shapes=dynamic_shapes,
        seq_len=seq_len,
        batch_size=batch_size,
        merge_adapter=merge_adapter,
        tokenizer=tokenizer,
    )


def load_weights(
    model: nn.Module,
    checkpoint: str | os.PathLike[str],
    *,
    storage_options: Mapping[str, Any] | None = None,
) -> None:
    """Load the checkpoint's model weights into ``model`` (strict: every name must match)."""
    storage, key = open_checkpoint(checkpoint, storage_options)
    where = location(storage, key)
    with fetched(storage, key, verify=True) as folder:
        weights = _read_weights(folder, Manifest.read(folder), where)
    wanted = set(model.state_dict())
    heads = {name.split(".", 1)[0] for name in weights}
    if wanted != set(weights) and len(heads) == 1 and "." in next(iter(weights)):
        # Saved from a TrainModel holding ``model`` as one attribute (a HuggingFaceModel's
        # ``model``, a Classifier's ``module``): the names below it.
        weights = _strip(weights, f"{heads.pop()}.", where)
    missing, unexpected = sorted(wanted - set(weights)), sorted(set(weights) - wanted)
    if missing or unexpected:
        raise CheckpointError(
            f"the weights of {where} do not fit {type(model).__name__}: missing from the "
            f"checkpoint {missing[:10]}, not in the model {unexpected[:10]}"
        )
    model.load_state_dict(weights)


def write_export(
    model: nn.Module,
    format: str,
    out: Path,
    *,
    example_inputs: Any = None,
    dynamic_shapes: Any = None,
    seq_len: int = 8,
    batch_size: int = 2,
    merge_adapter: bool = False,
    tokenizer: Any = None,
    copy_model: bool = True,
) -> Path:
    """Write ``model`` as ``format`` to ``out`` (see `export`); returns ``out``.

    ``copy_model``: trace a copy of ``model`` (torch-export, onnx), so that what tracing
    leaves in its Python attributes (a tensor a module caches in ``forward`` becomes a
    fake tensor) never reaches the live model; False for a model built only to export.
    """
    check_format(format)
    wrapper = find_hf_model(model)
    if wrapper is not None:
        tokenizer = tokenizer if tokenizer is not None else wrapper.tokenizer
        model = wrapper.model
    hf = _is_hf(model)
    if hf and merge_adapter and _is_peft(model):
        model = copy.deepcopy(model).merge_and_unload()
    elif merge_adapter and not _is_peft(model):
        raise ValueError(f"merge_adapter=True needs a peft model; got {type(model).__name__}")
    if format == "safetensors":
        _write_safetensors(_plain_state(model), out, {"format": "pt"})
    elif format == "hf":
        _write_hf(model, out, tokenizer)
    else:
        if hf and example_inputs is None:
            example_inputs, dynamic_shapes = _token_inputs(model, seq_len, batch_size)
            model = _Logits(model)
        if example_inputs is None:
            raise ValueError(
                f"exporting {type(model).__name__} as {format!r} needs example_inputs (a "
                "tensor, a tuple of inputs or a dict of keyword inputs the model is traced "
                "with); only HuggingFace models have a default (token ids)"
            )
        if copy_model:
            model = copy.deepcopy(model)
        with _eval(model):
            _trace_and_write(model, format, out, example_inputs, dynamic_shapes)
    return out


# --- the formats ---------------------------------------------------------------------------


def _trace_and_write(
    model: nn.Module, format: str, out: Path, example_inputs: Any, dynamic_shapes: Any
) -> None:
    if format == "onnx":
        for package in ("onnx", "onnxscript"):
            if _missing(package):
                raise ImportError(f"ONNX export needs {package!r}; install it with {_EXTRA}")
    args, kwargs = _as_args(example_inputs)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(f".partial-{out.name}")  # same suffix: torch.export wants .pt2
    try:
        if format == "torch-export":
            program = torch.export.export(model, args, kwargs, dynamic_shapes=dynamic_shapes)
            torch.export.save(program, partial)
        else:
            torch.onnx.export(
                model,
                args,
                str(partial),
                kwargs=kwargs or None,
                dynamo=True,
                input_names=_input_names(model, args, kwargs),
                output_names=["logits"] if isinstance(model, _Logits) else None,
                dynamic_shapes=dynamic_shapes,
                external_data=False,
                verbose=False,
            )
        os.replace(partial, out)
    finally:
        partial.unlink(missing_ok=True)


def _write_safetensors(
    weights: Mapping[str, torch.Tensor], out: Path, meta: dict[str, str]
) -> None:
    if _missing("safetensors"):
        raise ImportError(f"safetensors export needs 'safetensors'; install it with {_EXTRA}")
    from safetensors.torch import save_file

    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(f".partial-{out.name}")  # same suffix: torch.export wants .pt2
    save_file(dict(weights), str(partial), metadata=meta)
    os.replace(partial, out)


def _write_hf(model: nn.Module, out: Path, tokenizer: Any) -> None:
    if not _is_hf(model):
        raise ValueError(
            f"the 'hf' format needs a HuggingFace model (a HuggingFaceModel, a transformers "
            f"PreTrainedModel or a peft PeftModel); got {type(model).__name__}"
        )
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"{out} already exists and is not an empty folder; choose a new one")
    partial = out.with_name(f".partial-{out.name}")  # same suffix: torch.export wants .pt2
    shutil.rmtree(partial, ignore_errors=True)
    try:
        model.save_pretrained(partial)  # a PeftModel writes its adapter folder
        if tokenizer is not None:
            tokenizer.save_pretrained(partial)
        if out.exists():
            out.rmdir()
        os.replace(partial, out)
    finally:
        shutil.rmtree(partial, ignore_errors=True)


# --- HuggingFace models as functions of token ids --------------------------------------------


class _Logits(nn.Module):
    """``input_ids -> logits`` of a HuggingFace model: what inference runs."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, use_cache=False).logits


def _token_inputs(model: nn.Module, seq_len: int, batch_size: int) -> tuple[Any, Any]:
    for name, value in (("seq_len", seq_len), ("batch_size", batch_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 2:
            # torch.export specialises a dimension of size 1, so it would not stay dynamic.
            raise ValueError(f"{name} must be an int of at least 2, got {value!r}")
    vocab = int(getattr(_config(model), "vocab_size", 2))
    device = next(model.parameters()).device
    ids = (torch.arange(batch_size * seq_len, device=device) % vocab).reshape(batch_size, seq_len)
    dims = {0: torch.export.Dim.DYNAMIC, 1: torch.export.Dim.DYNAMIC}
    return (ids,), {"input_ids": dims}


def _config(model: nn.Module) -> Any:
    return getattr(model, "config", None)


def _is_hf(model: nn.Module) -> bool:
    transformers = sys.modules.get("transformers")
    return _is_peft(model) or (
        transformers is not None and isinstance(model, transformers.PreTrainedModel)
    )


def _is_peft(model: nn.Module) -> bool:
    peft = sys.modules.get("peft")
    return peft is not None and isinstance(model, peft.PeftModel)


def _saved_tokenizer(hf_dir: Path) -> Any:
    if not (hf_dir / "tokenizer_config.json").is_file():
        return None
    import transformers

    return transformers.AutoTokenizer.from_pretrained(
        hf_dir, trust_remote_code=False, local_files_only=True
    )


# --- small pieces ----------------------------------------------------------------------------


def _read_weights(folder: Path, manifest: Manifest, where: object) -> dict[str, torch.Tensor]:
    reader = SafeReader(folder, manifest.files)
    tensors = empty_model_tensors(reader.read_metadata(), where)
    with single_process_is_intended(), plain_errors(f"exporting {where}"):
        dcp.load(tensors, storage_reader=reader, planner=SafeLoadPlanner(), no_dist=True)
    return {fqn.removeprefix(MODEL_PREFIX): tensor for fqn, tensor in tensors.items()}


def _strip(weights: Mapping[str, torch.Tensor], prefix: str, where: object) -> dict[str, Any]:
    outside = [name for name in weights if not name.startswith(prefix)]
    if outside:
        raise CheckpointError(
            f"{where}: expected the weights of a HuggingFaceModel (names starting {prefix!r}), "
            f"found {outside[:5]}"
        )
    return {name.removeprefix(prefix): tensor for name, tensor in weights.items()}


def _metadata(manifest: Manifest, where: object) -> dict[str, str]:
    return {
        "format": "pt",
        "source": str(where),
        "run_name": manifest.run_name,
        "timestamp": json.dumps(manifest.timestamp, sort_keys=True),
        "trainkit_version": manifest.trainkit_version,
        "torch_version": manifest.torch_version,
    }


def _plain_state(model: nn.Module) -> dict[str, torch.Tensor]:
    # safetensors refuses tensors that share memory (tied weights): each gets its own copy.
    return {
        name: tensor.detach().to("cpu", copy=True).contiguous()
        for name, tensor in model.state_dict().items()
    }


def _as_args(example_inputs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if isinstance(example_inputs, Mapping):
        return (), dict(example_inputs)
    if isinstance(example_inputs, tuple):
        return example_inputs, {}
    return (example_inputs,), {}


def _input_names(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[str]:
    if kwargs or not all(isinstance(a, torch.Tensor) for a in args):
        return []
    import inspect

    params = list(inspect.signature(model.forward).parameters)
    return params[: len(args)] if len(params) >= len(args) else []


def _missing(package: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(package) is None


class _eval:
    """Eval mode while tracing; the model's own mode afterwards."""

    def __init__(self, model: nn.Module):
        self.model, self.modes = model, {m: m.training for m in model.modules()}

    def __enter__(self) -> None:
        self.model.eval()

    def __exit__(self, *exc: object) -> None:
        for module, training in self.modes.items():
            module.train(training)
