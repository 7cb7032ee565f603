"""The HuggingFace files that travel with a checkpoint, and the model rebuilt from them.

A checkpoint of a `HuggingFaceModel` wrapping a transformers ``PreTrainedModel`` also holds
the model's config (``hf-config.json``, what ``save_pretrained`` writes as ``config.json``,
with ``architectures`` naming the model class), its generation config when it has one, the
tokenizer's files when the wrapper was given a tokenizer, and, for a peft ``PeftModel``,
the adapter's config (``hf-adapter_config.json``). They are listed in the manifest with
sizes and checksums like the shards, so they are verified, downloaded and deleted with them.

Rebuilding reads JSON only: the config goes through ``AutoConfig`` with
``trust_remote_code=False`` (a config that needs code of its own is refused by
transformers), the model class is looked up by name among transformers' own classes, and
the tokenizer files are loaded by ``AutoTokenizer`` with ``trust_remote_code=False``.
"""

from __future__ import annotations

import contextlib
import copy
import sys
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainkit.checkpoint._confine import read_below
from trainkit.checkpoint._errors import CheckpointError
from trainkit.core import PretrainedWrapper

__all__ = [
    "ADAPTER_CONFIG",
    "HF_PREFIX",
    "build_hf_model",
    "find_hf_model",
    "hf_files",
    "hf_folder",
    "install_hint",
]

HF_PREFIX = "hf-"
CONFIG = "config.json"
ADAPTER_CONFIG = "adapter_config.json"


def install_hint(package: str, extra: str) -> ImportError:
    return ImportError(
        f"this needs the {package!r} package, which is not installed; install it with "
        f"pip install 'trainkit-checkpoint[{extra}]'"
    )


def find_hf_model(model: nn.Module) -> PretrainedWrapper | None:
    """The model around a transformers model (a `PretrainedWrapper`, such as trainkit-trainer's
    `HuggingFaceModel`) that ``model`` is, or wraps (DDP, FSDP, ``torch.compile``), or None."""
    seen = 0
    while not isinstance(model, PretrainedWrapper) and seen < 4:
        inner = getattr(model, "_orig_mod", None)  # torch.compile
        if inner is None:
            inner = getattr(model, "module", None)  # DDP
        if not isinstance(inner, nn.Module):
            return None
        model, seen = inner, seen + 1
    return model if isinstance(model, PretrainedWrapper) else None


def _base_and_adapter(inner: nn.Module) -> tuple[nn.Module, Any]:
    """(the transformers model, the active peft config or None) of a wrapped module."""
    peft = sys.modules.get("peft")  # a PeftModel means peft is imported already
    if peft is not None and isinstance(inner, peft.PeftModel):
        return inner.get_base_model(), inner.peft_config[inner.active_adapter]
    return inner, None


def hf_files(model: nn.Module) -> dict[str, bytes]:
    """The files to save beside a checkpoint of ``model`` (name in the folder -> content).

    Empty unless ``model`` is (or wraps) a `HuggingFaceModel` around a transformers model.
    """
    wrapper = find_hf_model(model)
    transformers = sys.modules.get("transformers")
    if wrapper is None or transformers is None:
        return {}
    base, adapter = _base_and_adapter(wrapper.model)
    if not isinstance(base, transformers.PreTrainedModel):
        return {}
    with tempfile.TemporaryDirectory(prefix="trainkit-hf-") as tmp:
        config = copy.deepcopy(base.config)
        config.architectures = [type(base).__name__]
        config.save_pretrained(tmp)
        generation = getattr(base, "generation_config", None)
        if generation is not None and base.can_generate():
            generation.save_pretrained(tmp)
        if adapter is not None:
            adapter.save_pretrained(tmp)
        # A tokenizer that transformers cannot save (any object may be given) stays out.
        save_tokenizer = getattr(wrapper.tokenizer, "save_pretrained", None)
        if callable(save_tokenizer):
            save_tokenizer(tmp)
        return {
            f"{HF_PREFIX}{path.name}": path.read_bytes()
            for path in sorted(Path(tmp).iterdir())
            if path.is_file()
        }


@contextlib.contextmanager
def hf_folder(folder: Path, names: list[str] | Mapping[str, Any]) -> Iterator[Path | None]:
    """The checkpoint's HuggingFace files (``hf-*`` among ``names``, the manifest's) in a
    temporary folder under their own names; None when it has none. Each is read as a
    regular file inside ``folder`` (never through a link)."""
    wanted = sorted(name for name in names if name.startswith(HF_PREFIX))
    if not wanted:
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="trainkit-hf-") as tmp:
        for name in wanted:
            (Path(tmp) / name.removeprefix(HF_PREFIX)).write_bytes(read_below(folder, name))
        yield Path(tmp)


def build_hf_model(hf_dir: Path, weights: Mapping[str, torch.Tensor], where: object) -> nn.Module:
    """The transformers model (a peft ``PeftModel`` when the checkpoint has an adapter)
    described by the files in ``hf_dir``, holding ``weights`` (its own parameter names)."""
    try:
        import transformers
    except ImportError:
        raise install_hint("transformers", "export") from None
    if not (hf_dir / CONFIG).is_file():
        raise CheckpointError(f"{where} has no {HF_PREFIX}{CONFIG}; it cannot be rebuilt")
    try:
        config = transformers.AutoConfig.from_pretrained(
            hf_dir, trust_remote_code=False, local_files_only=True
        )
    except (ValueError, KeyError, OSError) as err:
        raise CheckpointError(
            f"{where}: transformers cannot read its {HF_PREFIX}{CONFIG} without running code "
            f"(trust_remote_code, which trainkit never allows) or at all: {err}"
        ) from None
    names = config.architectures or []
    cls = getattr(transformers, names[0], None) if len(names) == 1 else None
    if not (isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel)):
        raise CheckpointError(
            f"{where}: its config names the model class(es) {names!r}; trainkit rebuilds only "
            "one class of the transformers library itself (no code is run from a checkpoint)"
        )
    model: nn.Module = cls(config)
    if (hf_dir / ADAPTER_CONFIG).is_file():
        try:
            import peft
        except ImportError:
            raise install_hint("peft", "peft") from None
        adapter = peft.PeftConfig.from_pretrained(hf_dir)
        model = peft.get_peft_model(model, adapter)
    missing, unexpected = model.load_state_dict(dict(weights), strict=False)
    tied = _tied_names(model)
    missing = [name for name in missing if name not in tied]
    if missing or unexpected:
        raise CheckpointError(
            f"{where}: the weights do not fit the {type(model).__name__} its config describes: "
            f"missing {missing[:10]}, unexpected {unexpected[:10]}"
        )
    return model.eval()


def _tied_names(model: nn.Module) -> set[str]:
    """Parameter names that share their tensor with an earlier name (tied embeddings)."""
    seen: set[int] = set()
    tied: set[str] = set()
    for name, tensor in model.state_dict(keep_vars=True).items():
        if id(tensor) in seen:
            tied.add(name)
        seen.add(id(tensor))
    return tied
