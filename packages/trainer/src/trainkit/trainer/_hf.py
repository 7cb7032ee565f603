"""`HuggingFaceModel`: a transformers model as a `TrainModel`.

transformers is imported only by `HuggingFaceModel.from_pretrained`: the wrapper itself
only calls the model, so it works with any module that takes ``**batch`` and returns an
output with ``loss`` and ``logits`` (and, for evaluation by generation, has ``generate``).
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import os
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainkit.core import TrainModel, dist
from trainkit.trainer.metrics import CrossEntropy, Perplexity

__all__ = ["HuggingFaceModel"]


class HuggingFaceModel(TrainModel):
    """Wraps a transformers model; batches are dicts of model inputs.

    The loss is the model's own (``outputs.loss``, computed when the batch has ``labels``).
    For causal language models, eval metrics default to token cross-entropy and perplexity
    on the shifted labels.

    Evaluation by generation (as Composer's): an eval batch with ``"mode": "generate"``
    holds left-padded prompts (``input_ids``, optional ``attention_mask``), the reference
    answers under ``"answers"`` (one string, or list of accepted strings, per prompt) and
    optionally ``"generation_kwargs"`` for ``model.generate`` (e.g. ``max_new_tokens``).
    ``eval_forward`` then returns the decoded new text of each prompt (a list of str; needs
    the tokenizer), and ``update_metric`` passes it with the answers to the metrics that
    take text (``takes_text = True``, e.g. `trainkit.trainer.metrics.ExactMatch`, or
    torchmetrics' text metrics). Give such an evaluator only text metrics
    (``Evaluator(metric_names=[...])``). The pad token is the tokenizer's, else its EOS.

    Args:
        model: e.g. ``GPT2LMHeadModel(GPT2Config(...))``.
        tokenizer: kept for callbacks that generate text or save the run (optional).
        metrics: training metrics, by name, or a list (named by class, as Composer's
            ``metrics``); none by default.
        eval_metrics: eval metrics, by name or a list; ``update(logits, labels)`` is called
            on each. Default: cross-entropy and perplexity.
        shift_labels: compare logits at position t with labels at t+1 (causal LMs). By
            default true for models whose config says they are not encoder-decoder and
            whose class name ends in ``ForCausalLM`` / ``LMHeadModel``.
        use_logits: accepted for Composer scripts; metrics always receive the logits (what
            Composer passes with ``use_logits=True``).
        eval_generation_kwargs: defaults for ``model.generate`` in generate-mode eval
            batches; a batch's own ``generation_kwargs`` override them key by key.
            (Composer takes them only from the batch.)
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        tokenizer: Any = None,
        metrics: Mapping[str, Any] | Sequence[Any] | None = None,
        eval_metrics: Mapping[str, Any] | Sequence[Any] | None = None,
        shift_labels: bool | None = None,
        use_logits: bool = True,
        eval_generation_kwargs: Mapping[str, Any] | None = None,
    ):
        super().__init__()
        self.model = model
        self.tokenizer = tokenizer
        self._train_metrics = _by_name(metrics) if metrics is not None else {}
        if shift_labels is None:
            causal_name = type(model).__name__.endswith(("ForCausalLM", "LMHeadModel"))
            encoder_decoder = getattr(self.config, "is_encoder_decoder", False)
            shift_labels = causal_name and not encoder_decoder
        self.shift_labels = shift_labels
        # transformers' causal-LM loss divides by a given num_items_in_batch instead of
        # averaging: given the label-token count, a batch with none has loss 0, not 0/0.
        self._counts_items = shift_labels and _takes_loss_kwargs(model)
        self._eval_metrics = (
            _by_name(eval_metrics)
            if eval_metrics is not None
            else {"cross_entropy": CrossEntropy(), "perplexity": Perplexity()}
        )
        if eval_generation_kwargs is not None and not isinstance(eval_generation_kwargs, Mapping):
            raise TypeError(
                "eval_generation_kwargs must be a dict of model.generate arguments (e.g. "
                f"{{'max_new_tokens': 16}}), got {type(eval_generation_kwargs).__name__}"
            )
        self.eval_generation_kwargs = dict(eval_generation_kwargs or {})

    @classmethod
    def from_pretrained(
        cls,
        path: str | os.PathLike[str],
        *,
        task: str | None = None,
        tokenizer: Any = "auto",
        meta: bool = False,
        **options: Any,
    ) -> HuggingFaceModel:
        """A model (and its tokenizer) from a ``save_pretrained`` folder, ready to train on.

        E.g. the folder ``trainkit checkpoint export --format hf`` writes. Never runs code
        from the folder: the config is JSON, the class one of transformers' own
        (``trust_remote_code`` is refused).

        Args:
            path: the folder (or a name transformers resolves, e.g. from its cache).
            task: ``"causal-lm"``, ``"sequence-classification"``, ``"masked-lm"`` or
                ``"seq2seq-lm"`` (the matching ``AutoModelFor...``); None: the class the
                config's ``architectures`` names.
            tokenizer: ``"auto"``: the folder's tokenizer when it has one; None: none; or a
                tokenizer object to keep.
            meta: build the model on the meta device and read the weights only once the
                Trainer has placed it (`load_weights`): under FSDP each rank reads just its
                shards from the folder's safetensors files, so a model larger than one
                process's memory loads (a local folder of ``*.safetensors`` files).
            options: passed to the wrapper (``metrics``, ``eval_metrics``,
                ``shift_labels``, ``use_logits``, ``eval_generation_kwargs``).
        """
        import transformers  # only here: the wrapper itself never needs it

        if not isinstance(meta, bool):
            raise TypeError(f"meta must be True or False, got {meta!r}")
        if meta and not any(Path(path).glob("*.safetensors")):
            raise ValueError(
                f"{path}: from_pretrained(meta=True) reads the weights from the folder's "
                "*.safetensors files, and it has none; save it with save_pretrained("
                "safe_serialization=True), or load it with meta=False"
            )
        with torch.device("meta") if meta else contextlib.nullcontext():
            model = _pretrained_model(transformers, path, task, meta)
        if isinstance(tokenizer, str) and tokenizer == "auto":
            tokenizer = _pretrained_tokenizer(transformers, path)
        wrapped = cls(model, tokenizer=tokenizer, **options)
        wrapped._weights_folder = Path(path) if meta else None
        return wrapped

    def load_weights(self) -> None:
        """Read the weights of ``from_pretrained(..., meta=True)``'s folder into the model as
        it is placed now: each rank only the slices of its shards (torch.distributed.
        checkpoint's safetensors reader). The Trainer calls it once the strategy has
        prepared the model, before a checkpoint resumes; nothing to do otherwise."""
        folder = getattr(self, "_weights_folder", None)
        if folder is None:
            return
        from torch.distributed.checkpoint import HuggingFaceStorageReader, load
        from torch.distributed.checkpoint.state_dict import (
            get_model_state_dict,
            set_model_state_dict,
        )

        reader = HuggingFaceStorageReader(str(folder))
        stored = set(reader.read_metadata().state_dict_metadata)
        state = get_model_state_dict(self.model)
        # save_pretrained keeps one name of tied weights (GPT-2's head is its embedding).
        names: dict[int, set[str]] = {}
        for name, parameter in self.model.named_parameters(remove_duplicate=False):
            names.setdefault(id(parameter), set()).add(name)
        covered = set(stored).union(*(same for same in names.values() if same & stored))
        missing = [name for name in state if name not in covered]
        if missing:
            raise ValueError(
                f"{folder}: its safetensors files lack {missing[:5]} "
                f"({len(missing)} of the model's {len(state)} tensors); it holds e.g. "
                f"{sorted(stored)[:3]}: save the model with save_pretrained, or load it with "
                "meta=False"
            )
        one_process = not torch.distributed.is_initialized()
        with warnings.catch_warnings():  # one process: DCP says so on every load
            warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
            load(
                {k: v for k, v in state.items() if k in stored},
                storage_reader=reader,
                no_dist=one_process,
            )
        set_model_state_dict(self.model, state)
        self._weights_folder = None

    @classmethod
    def from_config(
        cls,
        config: Any,
        *,
        task: str = "causal-lm",
        tokenizer: Any = None,
        metrics: Mapping[str, Any] | Sequence[Any] | None = None,
        eval_metrics: Mapping[str, Any] | Sequence[Any] | None = None,
        meta: bool = False,
    ) -> HuggingFaceModel:
        """A randomly initialised transformers model built from its config, wrapped.

        Nothing is downloaded and no code is run but transformers' own. Config files name it
        as the ``huggingface`` model: ``model: {name: huggingface, config: {model_type:
        llama, hidden_size: 256, num_hidden_layers: 4, ...}}``.

        Args:
            config: a transformers ``PretrainedConfig``, or its fields as a mapping that
                names the architecture under ``model_type`` (``"gpt2"``, ``"llama"``,
                ``"bert"``, ...).
            task: ``"causal-lm"``, ``"sequence-classification"``, ``"masked-lm"`` or
                ``"seq2seq-lm"``: the ``AutoModelFor...`` that builds the model.
            tokenizer: kept for callbacks that generate text (optional).
            metrics: training metrics (see the constructor).
            eval_metrics: eval metrics (see the constructor).
            meta: build it on the meta device (nothing allocated): the Trainer allocates
                and initialises it on its device, or FSDP block by block on each rank's
                shards, with transformers' own init (``trainkit.core.meta``).
        """
        import transformers  # only here: the wrapper itself never needs it

        if task not in _TASKS:
            raise ValueError(f"task {task!r} is not known; use one of {sorted(_TASKS)}")
        if isinstance(config, Mapping):
            fields = dict(config)
            model_type = fields.pop("model_type", None)
            if not isinstance(model_type, str):
                raise ValueError(
                    "a model config given as a mapping needs 'model_type', the architecture "
                    f"(e.g. 'gpt2', 'llama', 'bert'), beside its fields; got keys {sorted(config)}"
                )
            config = transformers.AutoConfig.for_model(model_type, **fields)
        if not isinstance(meta, bool):
            raise TypeError(f"meta must be True or False, got {meta!r}")
        with torch.device("meta") if meta else contextlib.nullcontext():
            model = getattr(transformers, _TASKS[task]).from_config(config)
        return cls(model, tokenizer=tokenizer, metrics=metrics, eval_metrics=eval_metrics)

    @property
    def config(self) -> Any:
        return getattr(self.model, "config", None)

    def forward(self, batch: Mapping[str, Any]) -> Any:
        if not isinstance(batch, Mapping):
            raise TypeError(
                f"HuggingFaceModel expects dict batches of model inputs (input_ids, "
                f"attention_mask, labels, ...), got {type(batch).__name__}"
            )
        if self._counts_items and "labels" in batch and "num_items_in_batch" not in batch:
            # The same mean over label tokens, except that a (micro)batch with none (a
            # prompt-only sample) has loss 0 and no gradient: NaN would spoil the step.
            return self.model(**batch, num_items_in_batch=self.loss_weight(batch).clamp(min=1))
        return self.model(**batch)

    def loss(self, outputs: Any, batch: Mapping[str, Any]) -> torch.Tensor:
        loss = (
            outputs.get("loss") if isinstance(outputs, Mapping) else getattr(outputs, "loss", None)
        )
        if loss is None:
            raise ValueError(
                f"{type(self.model).__name__} returned no loss; include 'labels' in the batch "
                "or subclass HuggingFaceModel and override loss()"
            )
        return loss

    def eval_forward(self, batch: Any, outputs: Any | None = None) -> Any:
        """The forward's outputs; for a batch with ``"mode": "generate"``, the generated text."""
        if isinstance(batch, Mapping) and batch.get("mode") == "generate":
            return self._generate_text(batch)
        return outputs if outputs is not None else self(batch)

    def _generate_text(self, batch: Mapping[str, Any]) -> list[str]:
        if self.tokenizer is None:
            raise ValueError(
                "a batch with 'mode': 'generate' needs a tokenizer to decode the generated "
                "tokens; pass HuggingFaceModel(model, tokenizer=...)"
            )
        if not callable(getattr(self.model, "generate", None)):
            raise TypeError(
                f"{type(self.model).__name__} has no generate(); evaluation by generation "
                "needs a transformers generative model (e.g. a ...ForCausalLM)"
            )
        input_ids = batch.get("input_ids")
        if not isinstance(input_ids, torch.Tensor) or input_ids.ndim != 2:
            raise ValueError(
                "a generate-mode batch needs 'input_ids', the prompts as a (batch, length) "
                f"tensor, got {type(input_ids).__name__}"
            )
        attention_mask = batch.get("attention_mask")
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        elif not bool(attention_mask[:, -1].all()):
            raise ValueError(
                "generate-mode prompts must be left-padded (every row's last attention_mask "
                "entry 1): a decoder continues from the last position; set "
                "tokenizer.padding_side = 'left'"
            )
        extra = batch.get("generation_kwargs") or {}
        if not isinstance(extra, Mapping):
            raise TypeError(
                f"the batch's 'generation_kwargs' must be a dict, got {type(extra).__name__}"
            )
        kwargs = {**self.eval_generation_kwargs, **extra}
        if kwargs.get("pad_token_id") is None:
            pad = getattr(self.tokenizer, "pad_token_id", None)
            kwargs["pad_token_id"] = (
                pad if pad is not None else getattr(self.tokenizer, "eos_token_id", None)
            )
        if dist.get_world_size() > 1:
            kwargs.setdefault("synced_gpus", True)  # ranks may stop at different lengths
        generated = self.model.generate(
            input_ids=input_ids, attention_mask=attention_mask, **kwargs
        )
        new_tokens = generated[:, input_ids.shape[1] :]
        return list(self.tokenizer.batch_decode(new_tokens, skip_special_tokens=True))

    def get_metrics(self, is_train: bool = False) -> dict[str, Any]:
        return copy.deepcopy(self._train_metrics if is_train else self._eval_metrics)

    def update_metric(self, batch: Mapping[str, Any], outputs: Any, metric: Any) -> None:
        generate = isinstance(batch, Mapping) and batch.get("mode") == "generate"
        if generate or _takes_text(metric):
            self._update_text_metric(batch, outputs, metric, generate)
            return
        logits = outputs["logits"] if isinstance(outputs, Mapping) else outputs.logits
        labels = batch.get("labels")
        if labels is None:
            raise ValueError(
                f"the eval batch has no 'labels' (keys: {sorted(batch)}); eval metrics compare "
                "logits with labels, so include them in eval batches"
            )
        if self.shift_labels:
            logits, labels = logits[..., :-1, :], labels[..., 1:]
        metric.update(logits, labels)

    def _update_text_metric(
        self, batch: Mapping[str, Any], outputs: Any, metric: Any, generate: bool
    ) -> None:
        name = type(metric).__name__
        if not generate:
            raise ValueError(
                f"{name} compares generated text; evaluate it on batches with "
                "'mode': 'generate' (and 'answers'), or leave it out of this evaluator "
                "with Evaluator(metric_names=[...])"
            )
        if not _takes_text(metric):
            raise ValueError(
                f"{name} does not take text, but this batch has 'mode': 'generate' (its "
                "outputs are generated strings); give this evaluator only text metrics, e.g. "
                "Evaluator(metric_names=['ExactMatch']), or mark the metric takes_text = True"
            )
        answers = batch.get("answers")
        if answers is None:
            raise ValueError(
                f"the generate-mode batch has no 'answers' (keys: {sorted(batch)}); text "
                "metrics compare each generation with its reference answer(s)"
            )
        metric.update(outputs, answers)

    def loss_weight(self, batch: Mapping[str, Any]) -> torch.Tensor:
        """Label tokens that count in the loss: the model's loss is a mean over them."""
        labels = batch["labels"]
        if self.shift_labels:
            labels = labels[..., 1:]
        return (labels != -100).sum()

    def flops_per_batch(self, batch: Mapping[str, Any]) -> float:
        """6 * parameters * tokens: forward and backward of a dense transformer."""
        params = sum(p.numel() for p in self.model.parameters())
        return 6.0 * params * batch["input_ids"].numel()


def _takes_loss_kwargs(model: nn.Module) -> bool:
    # As transformers' Trainer decides whether to pass num_items_in_batch: the model says
    # so, or its forward takes **kwargs (which transformers models hand to their loss).
    accepts = getattr(model, "accepts_loss_kwargs", None)
    if accepts is not None:
        return bool(accepts)
    try:
        parameters = inspect.signature(model.forward).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(
        p.kind is inspect.Parameter.VAR_KEYWORD or p.name == "num_items_in_batch"
        for p in parameters
    )


_TASKS = {
    "causal-lm": "AutoModelForCausalLM",
    "sequence-classification": "AutoModelForSequenceClassification",
    "masked-lm": "AutoModelForMaskedLM",
    "seq2seq-lm": "AutoModelForSeq2SeqLM",
}


def _pretrained_model(
    transformers: Any, path: str | os.PathLike[str], task: str | None, meta: bool = False
) -> Any:
    # meta: the model its config describes, weights not read (HuggingFaceModel.load_weights).
    if task is not None and task not in _TASKS:
        raise ValueError(f"task {task!r} is not known; use one of {sorted(_TASKS)} or None")
    config = transformers.AutoConfig.from_pretrained(path, trust_remote_code=False)
    if task is not None:
        found = getattr(transformers, _TASKS[task])
        if meta:
            return found.from_config(config)
        return found.from_pretrained(path, trust_remote_code=False)
    names = config.architectures or []
    found = getattr(transformers, names[0], None) if len(names) == 1 else None
    if not (isinstance(found, type) and issubclass(found, transformers.PreTrainedModel)):
        raise ValueError(
            f"{path}: its config names the model class(es) {names!r}, not one class of "
            f"transformers; pass task= one of {sorted(_TASKS)}"
        )
    if meta:
        return found(config)
    return found.from_pretrained(path, trust_remote_code=False)


def _pretrained_tokenizer(transformers: Any, path: str | os.PathLike[str]) -> Any:
    folder = Path(path)
    if folder.is_dir() and not any(
        (folder / name).is_file() for name in ("tokenizer_config.json", "tokenizer.json")
    ):
        return None
    return transformers.AutoTokenizer.from_pretrained(path, trust_remote_code=False)


def _takes_text(metric: Any) -> bool:
    """Metrics that compare strings: ``takes_text = True``, or torchmetrics' text metrics."""
    declared = getattr(metric, "takes_text", None)
    if declared is not None:
        return bool(declared)
    return type(metric).__module__.startswith("torchmetrics.text")


def _by_name(metrics: Mapping[str, Any] | Sequence[Any]) -> dict[str, Any]:
    if isinstance(metrics, Mapping):
        return dict(metrics)
    named = {type(m).__name__: m for m in metrics}
    if len(named) != len(metrics):
        raise ValueError(
            "two metrics of the same class in a list would share a name; pass a dict "
            "{name: metric} instead"
        )
    return named
