"""`ExportOnFitEnd`: the trained model, exported for inference when ``fit`` ends."""

from __future__ import annotations

import logging
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import nn
from torch.distributed.tensor import DTensor

from trainkit.checkpoint._blocks import full_model_state
from trainkit.checkpoint._export import check_format, write_export
from trainkit.checkpoint._hf_files import build_hf_model, find_hf_model, hf_files
from trainkit.checkpoint._names import fill_folder
from trainkit.core import Callback, Event, Logger, State, dist
from trainkit.core.config import primary

__all__ = ["ExportOnFitEnd", "ExportOnFitEndConfig"]

log = logging.getLogger(__name__)

_SUFFIX = {"safetensors": ".safetensors", "torch-export": ".pt2", "onnx": ".onnx", "hf": "-hf"}


@dataclass(kw_only=True)
class ExportOnFitEndConfig:
    """The options of `ExportOnFitEnd`."""

    folder: str = primary()
    """Where the exports go (a local folder; ``{run_name}`` and ``{world_size}`` are filled
    in), e.g. ``"runs/{run_name}/export"``."""
    formats: list[str] = field(default_factory=lambda: ["safetensors"])
    """Which to write, any of ``"safetensors"`` (``<filename>.safetensors``), ``"torch-export"``
    (``<filename>.pt2``), ``"onnx"`` (``<filename>.onnx``) and ``"hf"`` (the folder
    ``<filename>-hf``, for a `HuggingFaceModel`)."""
    filename: str = "model"
    """The exported files' name, before the format's suffix."""
    seq_len: int = 8
    """Tokens per row of the example ``input_ids`` a HuggingFace model is traced with
    (torch-export, onnx); the exported sequence length stays dynamic."""
    batch_size: int = 2
    """Rows of that example input; the exported batch size stays dynamic."""
    merge_adapter: bool = False
    """For a peft model: merge the adapter into the base weights first (otherwise ``"hf"``
    writes the adapter folder)."""

    def __post_init__(self) -> None:
        if isinstance(self.formats, str):
            self.formats = [self.formats]
        self.formats = [check_format(f) for f in self.formats]
        if not self.formats:
            raise ValueError("formats is empty; name at least one of the export formats")
        if not self.filename or "/" in self.filename or self.filename in {".", ".."}:
            raise ValueError(f"filename {self.filename!r} is not a plain file name, e.g. 'model'")


class ExportOnFitEnd(Callback, config=ExportOnFitEndConfig):
    """At ``FIT_END``, rank 0 writes the trained model in each of ``formats`` to ``folder``.

    A HuggingFace model (`HuggingFaceModel`) is exported as its ``input_ids -> logits``
    function (torch-export, onnx) and as a ``from_pretrained`` folder with its tokenizer
    (hf). Another model is traced with the last training batch as the example input of its
    ``forward(batch)``. A model sharded across ranks (FSDP) is gathered first (every rank
    takes part) and, for a HuggingFace model, rebuilt whole on rank 0; other sharded models
    are not exported by this callback (save a checkpoint and use `export`). Unlike
    Composer's ``ExportForInferenceCallback`` (TorchScript or ONNX, one format), several
    formats are written in one go.
    """

    config: ExportOnFitEndConfig
    required_events = (Event.FIT_END,)

    def __init__(self, config: ExportOnFitEndConfig | None = None, /, **options: Any) -> None:
        super().__init__(config, **options)
        self.written: list[Path] = []
        """What the last export wrote (rank 0)."""

    def fit_end(self, state: State, logger: Logger) -> None:
        config = self.config
        model = state.parallelism.unwrap(state.model)
        wrapper = find_hf_model(model)
        sharded = any(isinstance(p, DTensor) for p in model.parameters())
        if sharded:
            model = _gathered(state, model)  # collective; None on ranks other than 0
        if dist.get_rank() != 0 or model is None:
            return
        folder = Path(
            fill_folder(config.folder, run_name=state.run_name, world_size=dist.get_world_size())
        )
        folder.mkdir(parents=True, exist_ok=True)
        # A TrainModel's forward takes the batch as its one argument.
        example = None if wrapper is not None or state.batch is None else (state.batch,)
        self.written = []
        for format in config.formats:
            out = folder / f"{config.filename}{_SUFFIX[format]}"
            write_export(
                model,
                format,
                out,
                example_inputs=example,
                seq_len=config.seq_len,
                batch_size=config.batch_size,
                merge_adapter=config.merge_adapter,
                tokenizer=None if wrapper is None else wrapper.tokenizer,
                copy_model=not sharded,  # a gathered model is this export's own
            )
            self.written.append(out)
            log.info("exported the model as %s to %s", format, out)


def _gathered(state: State, model: nn.Module) -> nn.Module | None:
    weights = full_model_state(state.model)  # on rank 0 only
    if dist.get_rank() != 0:
        return None
    files = hf_files(model)
    if not files:
        raise ValueError(
            f"ExportOnFitEnd cannot rebuild the sharded {type(model).__name__} whole on one "
            "rank (only a HuggingFaceModel's config says how); save a checkpoint and call "
            "trainkit.checkpoint.export(model, checkpoint, ...) with an unsharded model"
        )
    with tempfile.TemporaryDirectory(prefix="trainkit-export-") as tmp:
        for name, data in files.items():
            (Path(tmp) / name.removeprefix("hf-")).write_bytes(data)
        inner = {k.removeprefix("model."): v for k, v in weights.items()}
        return build_hf_model(Path(tmp), inner, "the trained model")
