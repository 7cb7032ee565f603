"""Checks across sections: values each section accepts on its own but that do not fit
together, found before anything is built or written.

- the data's sequence length against the positions the model has (``data.seq_len`` vs
  ``model.n_positions`` or a transformers config's ``max_position_embeddings``; with ALiBi,
  against its ``max_sequence_length``); an export callback's ``seq_len`` and the text a
  callback generates (``max_new_tokens``) likewise;
- the token ids the data holds against the model's vocabulary;
- ``trainer.device_train_microbatch_size`` against the data's ``batch_size``;
- intervals (evaluation, checkpoints) longer than ``trainer.max_duration`` in the same unit,
  which never fire before the end: a note, not an error.

A value is read from the file or, where the file leaves it out, from the component's own
default (its config dataclass or factory signature), so a model's default ``n_positions``
is checked against a data ``seq_len`` the file sets.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from trainkit.cli._component import Component, Slot
from trainkit.cli._default import VOCAB
from trainkit.cli._schema import Problem
from trainkit.core import Time, TimeUnit

__all__ = ["check_across"]

MODEL_POSITIONS = ("n_positions", "max_position_embeddings", "n_ctx", "max_seq_len")
"""Fields (of a model factory, or of its transformers ``config``) that bound the length."""
SEQUENCE_LENGTHS = ("seq_len", "max_seq_len", "sequence_length", "max_seq_length")
"""Fields (of a data factory, or a callback) that set the length of the sequences."""
DATA_VOCABULARIES = {"stdlib_text": VOCAB}
"""Data whose token ids are known without building it: ``stdlib_text`` holds bytes."""


class Value(NamedTuple):
    """A field's value and where it comes from, for messages."""

    path: str
    value: Any
    default_of: str | None = None
    """Whose default it is, e.g. ``"tiny_gpt2's default"`` (None: the file sets it)."""

    def text(self) -> str:
        return f"{self.path} {self.value}{self.origin()}"

    def origin(self) -> str:
        return f" ({self.default_of})" if self.default_of else ""


def check_across(
    trainer: Mapping[str, Any], components: Mapping[str, Slot], checkpoint: Component | None
) -> tuple[list[Problem], list[str]]:
    """The problems (and notes) of values that do not fit together across sections."""
    model, data = components.get("model"), components.get("data")
    problems: list[Problem] = []
    if isinstance(model, Component):
        limit = _position_limit(model, _listed(components, "algorithms"))
        problems += _sequence_lengths(limit, data)
        problems += _callback_lengths(limit, _listed(components, "callbacks"))
        problems += _vocabulary(model, data)
    if isinstance(data, Component):
        problems += _microbatch(trainer, data)
    return problems, _interval_notes(trainer, checkpoint)


def _listed(components: Mapping[str, Slot], key: str) -> list[Component]:
    value = components.get(key)
    return value if isinstance(value, list) else [value] if value is not None else []


def _field(component: Component, names: tuple[str, ...], nested: bool = False) -> Value | None:
    """The first of ``names`` among ``component``'s fields (defaults filled in); ``nested``:
    also inside a transformers ``config`` mapping (the ``huggingface`` model)."""
    rows = {name: value for name, value, _ in component.fields()}
    for name in names:
        if name in rows and isinstance(rows[name], int) and not isinstance(rows[name], bool):
            given = name in component.options
            return Value(
                f"{component.path}.{name}",
                rows[name],
                None if given else f"{component.name}'s default",
            )
    inner = rows.get("config")
    if nested and isinstance(inner, Mapping):
        for name in names:
            if isinstance(inner.get(name), int):
                return Value(f"{component.path}.config.{name}", inner[name])
        default = _transformers_default(inner, names)
        if default is not None:
            name, value = default
            owner = f"the default of transformers' {inner['model_type']} config"
            return Value(f"{component.path}.config.{name}", value, owner)
    return None


def _transformers_default(config: Mapping[str, Any], names: tuple[str, ...]) -> Any:
    """``(name, value)`` of the first of ``names`` in transformers' config for ``model_type``."""
    model_type = config.get("model_type")
    if not isinstance(model_type, str):
        return None
    try:
        import transformers

        verbosity = transformers.logging.get_verbosity()
        transformers.logging.set_verbosity_error()  # its checks warn again when it is built
        try:
            built = transformers.AutoConfig.for_model(
                model_type, **{k: v for k, v in config.items() if k != "model_type"}
            )
        finally:
            transformers.logging.set_verbosity(verbosity)
    except Exception:  # an unknown architecture or field: building the model will say so
        return None
    for name in names:
        value = getattr(built, name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return name, value
    return None


def _position_limit(model: Component, algorithms: list[Component]) -> Value | None:
    """The longest sequence the model takes: ALiBi's maximum when it replaces the position
    embeddings, else the model's positions."""
    alibi = next((a for a in algorithms if _is(a, "Alibi")), None)
    if alibi is not None:
        return _field(alibi, ("max_sequence_length",))
    return _field(model, MODEL_POSITIONS, nested=True)


def _sequence_lengths(limit: Value | None, data: Slot) -> list[Problem]:
    length = _field(data, SEQUENCE_LENGTHS) if isinstance(data, Component) else None
    if length is None:
        return []
    if limit is None or length.value <= limit.value:
        return []
    return [
        Problem(
            length.path,
            f"{length.value}{length.origin()} is longer than the model takes: "
            f"{limit.text()}. Set {limit.path} to at least {length.value}, or "
            f"{length.path} to at most {limit.value}",
        )
    ]


def _callback_lengths(limit: Value | None, callbacks: list[Component]) -> list[Problem]:
    """An export's ``seq_len``, and text generated after a prompt, within the positions."""
    problems = []
    for callback in callbacks if limit is not None else []:
        length = _field(callback, ("seq_len",))
        if length is not None and length.value > limit.value:
            problems.append(
                Problem(
                    length.path,
                    f"{length.value}{length.origin()} is longer than the model takes: "
                    f"{limit.text()}; use at most {limit.value}",
                )
            )
        new = _field(callback, ("max_new_tokens",))
        if new is not None and new.value >= limit.value:
            problems.append(
                Problem(
                    new.path,
                    f"{new.value}{new.origin()} tokens after a prompt do not fit in the "
                    f"model's positions: {limit.text()}; use at most {limit.value - 1} minus "
                    "the prompt's length",
                )
            )
    return problems


def _vocabulary(model: Component, data: Slot) -> list[Problem]:
    if not isinstance(data, Component):
        return []
    tokens = _field(data, ("vocab_size",))
    if tokens is None and data.name in DATA_VOCABULARIES:
        tokens = Value(data.path, DATA_VOCABULARIES[data.name], f"{data.name}'s bytes")
    vocab = _field(model, ("vocab_size",), nested=True)
    if tokens is None or vocab is None or vocab.value >= tokens.value:
        return []
    return [
        Problem(
            vocab.path,
            f"{vocab.value}{vocab.origin()} is smaller than the {tokens.value} token ids the "
            f"data ({data.name}) holds; set it to at least {tokens.value}",
        )
    ]


def _microbatch(trainer: Mapping[str, Any], data: Component) -> list[Problem]:
    size = trainer.get("device_train_microbatch_size")
    batch = _field(data, ("batch_size",))
    if not isinstance(size, int) or isinstance(size, bool) or batch is None:
        return []
    if size <= batch.value:
        return []
    return [
        Problem(
            "trainer.device_train_microbatch_size",
            f"{size} is larger than the batch it splits: {batch.text()}. Use a size "
            f"from 1 to {batch.value}, or 'auto'",
        )
    ]


def _interval_notes(trainer: Mapping[str, Any], checkpoint: Component | None) -> list[str]:
    duration = _time(trainer.get("max_duration"))
    if duration is None:
        return []
    intervals = [("trainer.eval_interval", trainer.get("eval_interval"), "evaluates")]
    if trainer.get("save_folder") is not None:
        intervals.append(("trainer.save_interval", trainer.get("save_interval"), "saves"))
    if checkpoint is not None:
        rows = {name: value for name, value, _ in checkpoint.fields()}
        intervals.append(("checkpoint.interval", rows.get("interval"), "saves"))
    notes = []
    for path, value, what in intervals:
        interval = _time(value)
        if interval is None:
            continue
        if (interval.unit == duration.unit and interval.value > duration.value) or (
            interval.unit == TimeUnit.DURATION and interval.value > 1
        ):
            notes.append(
                f"{path} {value} is longer than trainer.max_duration {trainer['max_duration']}, "
                f"so the run {what} only at its end"
            )
    return notes


def _time(value: Any) -> Time | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return Time(value, TimeUnit.EPOCH)
    if isinstance(value, str):
        try:
            return Time.from_timestring(value)
        except (TypeError, ValueError):
            return None
    return value if isinstance(value, Time) else None


def _is(component: Component, class_name: str) -> bool:
    return getattr(component.target, "__name__", None) == class_name
