"""`Generate`: text from fixed prompts, every so often, to every destination that keeps tables."""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from trainkit.core import Callback, Event, Logger, PretrainedWrapper, State, Time, dist
from trainkit.core.interval import interval_trigger
from trainkit.loggers._common import check_interval

__all__ = ["Generate", "GenerateConfig"]

log = logging.getLogger("trainkit.loggers")

_DECODINGS = ("greedy", "sample")
COLUMNS = ["prompt", "decoding", "generation"]


@dataclass(kw_only=True)
class GenerateConfig:
    prompts: list[str] = field(default_factory=list)
    """The prompts, the same at every generation (at least one, checked when the run
    starts)."""
    interval: str | int | Time = "1ep"
    """How often to generate: ``"500ba"``, ``"1ep"``, ``"0.1dur"``, ... (and at the end
    of training)."""
    max_new_tokens: int = 32
    """Tokens generated after each prompt (fewer when the model emits its end token)."""
    decoding: list[Literal["greedy", "sample"]] = field(default_factory=lambda: ["greedy"])
    """How to pick tokens, one row per prompt and way: ``"greedy"`` (the most likely) and
    ``"sample"`` (drawn with ``temperature``, ``top_k``, ``top_p``)."""
    temperature: float = 1.0
    """Sampling temperature (``"sample"`` only); positive."""
    top_k: int | None = None
    """Sample among the k most likely tokens (None: the model's generation config)."""
    top_p: float | None = None
    """Sample from the smallest set of tokens whose probability reaches p (None: the
    model's generation config)."""
    seed: int = 0
    """Sampling draws from a generator seeded with ``seed`` plus the batch count, the same
    on every rank; the run's own random streams are left as they were."""
    batch_size: int | None = None
    """Prompts per ``generate`` call (None: all at once)."""
    table: str = "generations"
    """The name the table is logged under."""
    generate_kwargs: dict[str, Any] = field(default_factory=dict)
    """Anything else for transformers' ``generate`` (``repetition_penalty``, ...)."""

    def __post_init__(self) -> None:
        check_interval(self.interval)
        if isinstance(self.prompts, str) or not all(isinstance(p, str) for p in self.prompts):
            raise ValueError(f"prompts {self.prompts!r} is not valid; give a list of strings")
        self.prompts = list(self.prompts)
        self.decoding = list(self.decoding)
        unknown = [d for d in self.decoding if d not in _DECODINGS]
        if unknown or not self.decoding:
            raise ValueError(
                f"decoding {self.decoding!r} is not valid; give one or both of "
                f"{', '.join(map(repr, _DECODINGS))}"
            )
        for name in ("max_new_tokens", "batch_size", "top_k"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise ValueError(f"{name} {value!r} is not valid; use an int >= 1")
            if value is not None and value < 1:
                raise ValueError(f"{name} {value!r} is not valid; use an int >= 1")
        if not self.temperature > 0:
            raise ValueError(f"temperature {self.temperature!r} is not valid; use a number > 0")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ValueError(f"top_p {self.top_p!r} is not valid; use a number in (0, 1]")
        self.generate_kwargs = dict(self.generate_kwargs or {})


class Generate(Callback, config=GenerateConfig):
    """Generates text from ``prompts`` with the run's HuggingFace causal LM, every ``interval``.

    The model must be a `HuggingFaceModel` whose ``model`` has transformers' ``generate``
    and which keeps its ``tokenizer``. Each time, every prompt is continued by up to
    ``max_new_tokens`` tokens for each way in ``decoding``, in eval mode under the run's
    precision, and the table ``prompt | decoding | generation`` (the new text only) is
    logged as ``table`` at the batch count with `Logger.log_table`, which every destination
    that records tables keeps (the file, TensorBoard, wandb, MLflow, Neptune, Comet, console
    and in-memory destinations). Prompts are left-padded (the tokenizer's pad token, or its
    end token when it has none; the tokenizer is left as it was).

    Every rank generates (under FSDP each forward gathers parameters from all ranks, so
    all must take part: ``synced_gpus`` keeps the ranks stepping together until all are
    done, and an FSDP root's own parameters are gathered for the duration); rank 0 logs.
    Sampling uses its own seeded generator (``seed``), so a run with `Generate` trains
    exactly as one without. Options: `GenerateConfig`.
    """

    config: GenerateConfig

    def __init__(self, config: GenerateConfig | None = None, /, **options: Any) -> None:
        super().__init__(config, **options)
        self._trigger = interval_trigger(self.config.interval)
        self._last_batch: int | None = None
        self._inputs: dict[str, torch.Tensor] | None = None  # the tokenized prompts
        self._pad_id: int | None = None
        self.last_rows: list[list[str]] = []
        """The rows of the latest table (on rank 0; empty before the first generation)."""

    def fit_start(self, state: State, logger: Logger) -> None:
        self._model(state)  # a model that cannot generate fails before training

    def batch_end(self, state: State, logger: Logger) -> None:
        if self._trigger(state, Event.BATCH_END):
            self._run(state, logger)

    def epoch_end(self, state: State, logger: Logger) -> None:
        if self._trigger(state, Event.EPOCH_END):
            self._run(state, logger)

    def _run(self, state: State, logger: Logger) -> None:
        batch = state.timestamp.batch
        if batch == self._last_batch:  # at the end of an epoch that is also an interval
            return
        self._last_batch = batch
        started = time.perf_counter()
        rows = self.generate(state)
        self.last_rows = rows
        if dist.get_rank() == 0:
            logger.log_table(self.config.table, COLUMNS, rows, step=batch)
        log.info(
            "Generate: %d rows in %.2f s at batch %d",
            len(rows),
            time.perf_counter() - started,
            batch,
        )

    def _model(self, state: State) -> PretrainedWrapper:
        model = state.parallelism.unwrap(state.model)
        if not isinstance(model, PretrainedWrapper):
            raise ValueError(
                f"Generate needs a HuggingFaceModel wrapping a causal LM, got "
                f"{type(model).__name__}"
            )
        if not callable(getattr(model.model, "generate", None)):
            raise ValueError(
                f"Generate needs a model with transformers' generate(); "
                f"{type(model.model).__name__} has none (use e.g. a *ForCausalLM model)"
            )
        if model.tokenizer is None:
            raise ValueError(
                "Generate needs the tokenizer: build the model as "
                "HuggingFaceModel(model, tokenizer=tokenizer)"
            )
        if not self.config.prompts:
            raise ValueError("Generate has no prompts; give prompts=['...', ...]")
        return model

    def generate(self, state: State) -> list[list[str]]:
        """The table's rows now: ``[prompt, decoding, generation]`` for each prompt and way.

        Collective: every rank must call it (see the class's docstring).
        """
        model = self._model(state)
        inputs = self._tokenized(model.tokenizer, state.device)
        was_training = model.training
        model.eval()
        root = _fsdp_root(model)
        if root is not None:
            root.unshard()
        try:
            outputs = {
                way: self._generate(model, inputs, way, state) for way in self.config.decoding
            }
        finally:
            if root is not None:
                root.reshard()
            model.train(was_training)
        if dist.get_rank() != 0:
            return []
        start = inputs["input_ids"].shape[1]  # the prompts are left-padded to this length
        decode = model.tokenizer.decode
        return [
            [prompt, way, decode(outputs[way][i, start:], skip_special_tokens=True)]
            for i, prompt in enumerate(self.config.prompts)
            for way in self.config.decoding
        ]

    def _tokenized(self, tokenizer: Any, device: torch.device) -> dict[str, torch.Tensor]:
        if self._inputs is None:
            side, pad = tokenizer.padding_side, tokenizer.pad_token
            if pad is None and tokenizer.eos_token is None:
                raise ValueError(
                    "Generate pads prompts with the tokenizer's pad token, or its end token, "
                    "and this tokenizer has neither; set tokenizer.pad_token"
                )
            tokenizer.padding_side = "left"  # generation continues from the last position
            if pad is None:
                tokenizer.pad_token = tokenizer.eos_token
            try:
                encoded = tokenizer(self.config.prompts, return_tensors="pt", padding=True)
            finally:
                tokenizer.padding_side = side
                if pad is None:
                    tokenizer.pad_token = None
            self._inputs = {k: encoded[k] for k in ("input_ids", "attention_mask")}
            self._pad_id = tokenizer.pad_token_id if pad is not None else tokenizer.eos_token_id
        return {k: v.to(device) for k, v in self._inputs.items()}

    def _generate(
        self, model: PretrainedWrapper, inputs: dict[str, torch.Tensor], way: str, state: State
    ) -> torch.Tensor:
        config = self.config
        options: dict[str, Any] = {
            "max_new_tokens": config.max_new_tokens,
            "pad_token_id": self._pad_id,
            "synced_gpus": dist.get_world_size() > 1,
            "do_sample": way == "sample",
        }
        if way == "sample":
            options["temperature"] = config.temperature
            if config.top_k is not None:
                options["top_k"] = config.top_k
            if config.top_p is not None:
                options["top_p"] = config.top_p
        options.update(config.generate_kwargs)
        size = config.batch_size or len(config.prompts)
        cuda = [state.device] if state.device.type == "cuda" else []
        pieces = []
        with torch.random.fork_rng(devices=cuda), torch.no_grad(), state.precision.autocast():
            torch.manual_seed(config.seed + state.timestamp.batch)
            for start in range(0, len(config.prompts), size):
                chunk = {k: v[start : start + size] for k, v in inputs.items()}
                pieces.append(model.model.generate(**chunk, **options))
        width = max(p.shape[1] for p in pieces)  # chunks may stop at different lengths
        return torch.cat(
            [
                torch.nn.functional.pad(p, (0, width - p.shape[1]), value=self._pad_id)
                for p in pieces
            ]
        )


def _fsdp_root(model: torch.nn.Module) -> Any:
    """The model when FSDP2 sharded it (its own parameters must be gathered to call the
    inner model directly), else None. torch.distributed.fsdp is not imported for this."""
    fsdp = sys.modules.get("torch.distributed.fsdp")
    return model if fsdp is not None and isinstance(model, fsdp.FSDPModule) else None
