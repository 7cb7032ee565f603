"""Every config field of every component is settable from YAML, shown by ``--print-config``
and logged as a hyperparameter.

Derived from the code, not a hand list: the components are the entry points of the groups
below that are `Configurable` classes, and their fields are their config dataclasses'. A
sample value for each field is derived from its default and type annotation (a bool flipped,
a number changed, a duration doubled, a quoted example from the field's docstring, ...).
"""

from __future__ import annotations

import dataclasses
import re
import sys
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from torch.utils.data import DataLoader

from toy import blobs, loader, mlp
from trainkit.cli import main
from trainkit.cli._build import build_run
from trainkit.cli._config import ConfigError, load_config, sections
from trainkit.cli._print import is_yaml_value
from trainkit.cli._schema import field_default, field_types
from trainkit.core import Time, plugins
from trainkit.core.config import (
    Configurable,
    field_docs,
    is_slot,
    settings,
    slot_group,
    to_plain,
)
from trainkit.trainer import Trainer, TrainerConfig

GROUPS = (
    "trainkit.algorithms",
    "trainkit.callbacks",
    "trainkit.loggers",
    "trainkit.parallel",
    "trainkit.schedulers",
)
SECTION = {s.group: s for s in sections()}
MISSING: Any = dataclasses.MISSING

# Components a config file cannot build at all, with the reason. The test below checks
# that this is exactly the set of components with a required field no YAML value fits.
NOT_FROM_YAML: dict[str, str] = {}
# Components checked through `to_plain` (what `Trainer.hyperparameters` logs for them)
# instead of in a built Trainer, with the reason.
NO_TRAINER = {
    "trainkit.parallel:context_parallel": "preparing a strategy needs a process group",
    "trainkit.parallel:ddp": "preparing a strategy needs a process group",
    "trainkit.parallel:fault_tolerant": "preparing a strategy needs torchft's lighthouse",
    "trainkit.parallel:fsdp": "preparing a strategy needs a process group",
    "trainkit.parallel:tensor_parallel": "preparing a strategy needs a process group",
    "trainkit.parallel:pipeline_parallel": "preparing a strategy needs a process group",
}

# Components whose Trainer needs another model than the small classifier, with the reason.
MODEL_FOR = {
    "trainkit.algorithms:alibi": "it changes the attention of a GPT-2 or BERT model",
    "trainkit.algorithms:qk_norm": "it changes the attention of a GPT-2 or Llama-style model",
    "trainkit.algorithms:relu_squared": "it changes the MLP of a GPT-2 or Llama-style model",
    "trainkit.algorithms:rotary": "it changes the attention of a GPT-2 model",
}


def _tiny_gpt2() -> Any:
    from trainkit.cli._default import tiny_gpt2

    return tiny_gpt2(n_layer=1, n_head=2, n_embd=32, n_positions=32)


# A model and data for the configs, importable as "component_configs_fixtures:model".
FIXTURES = "component_configs_fixtures"


def _fixture_model() -> Any:
    return mlp(dropout=0.0)


def _fixture_data(batch_size: int = 16) -> dict[str, DataLoader]:
    return {"train": loader(blobs(32), batch_size), "eval": loader(blobs(16), batch_size)}


_module = types.ModuleType(FIXTURES)
_module.model, _module.data = _fixture_model, _fixture_data
sys.modules[FIXTURES] = _module
BASE = {
    "model": {"name": f"{FIXTURES}:model"},
    "data": {"name": f"{FIXTURES}:data"},
    "checkpoint": None,
    "trainer": {"max_duration": "1ba", "device": "cpu", "progress_bar": False},
}


# --- discovery -----------------------------------------------------------------------------


def _entry_points() -> list[tuple[str, str, Any]]:
    found = []
    for group in GROUPS:
        for name in plugins.available(group):
            try:
                target = plugins.load(group, name)
            except ImportError as err:  # an optional client that is not installed
                target = err
            found.append((group, name, target))
    return found


ENTRY_POINTS = _entry_points()
COMPONENTS = [
    (group, name, target)
    for group, name, target in ENTRY_POINTS
    if isinstance(target, type) and issubclass(target, Configurable)
]
CONFIGURED = [c for c in COMPONENTS if c[2].config_class is not None]


def key(group: str, name: str) -> str:
    return f"{group}:{name}"


def ids(components: list[tuple[str, str, Any]]) -> list[str]:
    return [key(group, name) for group, name, _ in components]


# --- sample values, derived from the default and the type ------------------------------------


def candidates(annotation: Any, default: Any, doc: str, name: str, tmp: Path) -> list[Any]:
    """Values a config file could give a field of this type, most telling first."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        members = typing.get_args(annotation)
        found = [
            c
            for m in members
            if m is not type(None)
            for c in candidates(m, default, doc, name, tmp)
        ]
        return found + ([None] if type(None) in members else [])
    if origin is typing.Literal:
        return list(typing.get_args(annotation))
    if annotation is bool:
        return [not default] if isinstance(default, bool) else [True, False]
    if annotation is int:
        if isinstance(default, int) and not isinstance(default, bool):
            return [default + 1, default + 2, default * 2, 1, 2]
        return [1, 2, 4]
    if annotation is float:
        if isinstance(default, int | float) and not isinstance(default, bool):
            return [default * 2, default / 2, default + 0.5, 0.5, 1.0]
        return [0.5, 1.0, 2.0]
    if annotation is str or annotation is Time or annotation is Path:
        found = []
        if isinstance(default, str):
            try:
                time = Time.from_timestring(default)
                found.append(str(Time(time.value * 2, time.unit)))
            except ValueError:
                pass
        found += re.findall(r"``[\"']([^\"'`]+)[\"']``", doc)
        if any(word in name for word in ("folder", "dir", "path")):
            found.append(str(tmp / name))
        return [*found, "x", "1ep"]
    if origin in (list, Sequence, tuple) or annotation in (list, tuple):
        (element, *_) = typing.get_args(annotation) or (str,)
        return [[c] for c in candidates(element, MISSING, doc, name, tmp)[:3]]
    if origin in (dict, Mapping) or annotation is dict:
        args = typing.get_args(annotation)
        value = args[1] if len(args) == 2 else str
        if value is Any:
            value = str
        return [{"x": c} for c in candidates(value, MISSING, doc, name, tmp)[:3]]
    return []  # an object: a config file cannot give it


def _builds(config_class: type, values: dict[str, Any]) -> bool:
    try:
        config_class(**values)
    except (ValueError, TypeError):
        return False
    return True


def required_values(config_class: type, tmp: Path) -> dict[str, Any] | None:
    """A valid value for every required field (None if one cannot come from YAML)."""
    hints, docs = field_types(config_class), field_docs(config_class)
    required = [f for f in settings(config_class) if field_default(f) is MISSING]
    options = {
        f.name: [
            c
            for c in candidates(hints[f.name], MISSING, docs[f.name], f.name, tmp)
            if is_yaml_value(c)
        ]
        for f in required
    }
    if any(not values for values in options.values()):
        return None
    chosen = {name: values[0] for name, values in options.items()}
    for name, values in options.items():
        for value in values:
            if _builds(config_class, {**chosen, name: value}):
                chosen[name] = value
                break
    return chosen if _builds(config_class, chosen) else None


def sample(
    config_class: type,
    field: dataclasses.Field,
    required: dict[str, Any],
    tmp: Path,
    loads: Any = None,
) -> Any:
    """A valid non-default value for ``field`` (its default when no other fits; MISSING for an
    object no config file can give). A slot's value is a component of its group, checked
    by ``loads(value)`` (through the CLI, which builds it)."""
    if field.name in required:
        return required[field.name]
    default = field_default(field)
    if is_slot(field) and slot_group(field) is not None and loads is not None:
        for value in nested_candidates(slot_group(field), tmp):
            if loads(value):
                return value
    else:
        hint = field_types(config_class)[field.name]
        doc = field_docs(config_class)[field.name]
        for value in candidates(hint, default, doc, field.name, tmp):
            if (
                is_yaml_value(value)
                and to_plain(value) != to_plain(default)
                and _builds(config_class, {**required, field.name: value})
            ):
                return value
    return default if is_yaml_value(default) else MISSING


def nested_candidates(group: str, tmp: Path) -> list[dict[str, Any]]:
    """Components of ``group`` as a config file gives them: each with its required fields,
    then with one optional field changed at a time."""
    found = []
    for g, name, target in CONFIGURED:
        required = required_values(target.config_class, tmp) if g == group else None
        if required is None:
            continue
        found.append({"name": name, **required})
        for field in settings(target.config_class):
            value = sample(target.config_class, field, required, tmp)
            if field.name not in required and value is not MISSING:
                found.append({"name": name, **required, field.name: value})
    return found


def same_value(built: Any, given: Any, field: dataclasses.Field) -> bool:
    """Whether ``built`` (a config's field) holds what the file ``given``."""
    if is_slot(field) and isinstance(given, dict):
        cls = plugins.load(slot_group(field), given["name"])
        fields = {k: v for k, v in given.items() if k != "name"}
        plain = to_plain(built.config)
        return isinstance(built, cls) and all(plain[k] == to_plain(v) for k, v in fields.items())
    return to_plain(built) == to_plain(given)


# --- configs through the CLI ----------------------------------------------------------------


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """A folder to run in; remote loggers kept offline and inside it."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"file:{tmp_path / 'mlruns'}")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.setenv("NEPTUNE_MODE", "offline")
    monkeypatch.setenv("COMET_OFFLINE", "true")
    monkeypatch.setenv("COMET_ERROR_TRACKING_ENABLE", "false")
    return tmp_path


def config_with(group: str, item: dict[str, Any], tmp: Path, name: str = "c") -> Path:
    section = SECTION[group]
    raw = {**BASE, section.key: item if section.many is False else [item]}
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def loaded(group: str, config: Any) -> Any:
    value = config.components[SECTION[group].key]
    return value[0] if isinstance(value, list) else value


def test_every_component_entry_point_is_a_configurable_class():
    not_converted = [
        key(group, name)
        for group, name, target in ENTRY_POINTS
        if isinstance(target, type) and not issubclass(target, Configurable)
    ]
    failed = [key(g, n) for g, n, t in ENTRY_POINTS if isinstance(t, ImportError)]
    assert not not_converted, f"classes that are not Configurable yet: {not_converted}"
    assert not failed, f"entry points that do not import: {failed}"
    assert len(CONFIGURED) > 30


def test_components_that_yaml_cannot_build_are_the_listed_ones(tmp_path):
    cannot = {
        key(group, name)
        for group, name, target in CONFIGURED
        if required_values(target.config_class, tmp_path) is None
    }
    assert cannot == set(NOT_FROM_YAML)


@pytest.mark.parametrize(("group", "name", "target"), CONFIGURED, ids=ids(CONFIGURED))
def test_every_field_is_settable_from_yaml(group, name, target, workdir):
    config_class = target.config_class
    required = required_values(config_class, workdir)
    assert required is not None, NOT_FROM_YAML[key(group, name)]
    base = {"name": name, **required}
    component = loaded(group, load_config(config_with(group, base, workdir), run_dir=workdir))
    built = component.build()
    assert isinstance(built, target) and built.config == component.config

    def load(field_name: str, value: Any) -> Any:
        item = {"name": name, **required, field_name: value}
        return load_config(config_with(group, item, workdir), run_dir=workdir / "run")

    def loads(field_name: str) -> Any:
        def check(value: Any) -> bool:
            try:
                load(field_name, value)
            except ConfigError:
                return False
            return True

        return check

    for field in dataclasses.fields(config_class):
        value = sample(config_class, field, required, workdir, loads(field.name))
        if value is MISSING:
            continue  # an object (the default), which a config file leaves alone
        try:
            component = loaded(group, load(field.name, value))
        except ConfigError as err:
            pytest.fail(f"{key(group, name)}.{field.name} = {value!r} from YAML: {err}")
        assert same_value(getattr(component.config, field.name), value, field), field.name


@pytest.mark.parametrize(("group", "name", "target"), CONFIGURED, ids=ids(CONFIGURED))
def test_every_field_is_in_print_config(group, name, target, workdir, capsys):
    config_class = target.config_class
    required = required_values(config_class, workdir)
    assert required is not None, NOT_FROM_YAML[key(group, name)]
    path = config_with(group, {"name": name, **required}, workdir)
    assert main(["train", str(path), "--print-config", "--run-dir", str(workdir / "run")]) == 0
    out = capsys.readouterr().out
    entry = yaml.safe_load(out)[SECTION[group].key]
    entry = entry[0] if isinstance(entry, list) else entry
    assert entry["name"] == name
    comments = " ".join(
        line.strip()[2:] for line in out.splitlines() if line.strip().startswith("# ")
    )
    docs = field_docs(config_class)
    for field in dataclasses.fields(config_class):
        assert field.name in entry or f"# {field.name}: " in out, field.name
        assert " ".join(docs[field.name].split()) in comments, field.name


def _trainer_with(group: str, name: str, component: Any) -> Trainer:
    slot = SECTION[group].fills[0]
    return Trainer(
        model=_tiny_gpt2() if key(group, name) in MODEL_FOR else mlp(dropout=0.0),
        train_dataloader=loader(blobs(32)),
        max_duration="1ba",
        device="cpu",
        progress_bar=False,
        **{slot: [component]},
    )


# What is checked is the logged config; the algorithms building on a small MLP classifier
# say, rightly, that they change nothing in it (no convolution, fp32): not what is tested.
@pytest.mark.filterwarnings(r"ignore:\w+ matched no (module|convolution) in Classifier:UserWarning")
@pytest.mark.filterwarnings(
    r"ignore:channels_last found no 4-D parameter in Classifier:UserWarning"
)
@pytest.mark.filterwarnings(r"ignore:\w+ does nothing in an fp32 run:UserWarning")
@pytest.mark.parametrize(("group", "name", "target"), CONFIGURED, ids=ids(CONFIGURED))
def test_every_field_is_logged_as_a_hyperparameter(group, name, target, workdir):
    required = required_values(target.config_class, workdir)
    assert required is not None, NOT_FROM_YAML[key(group, name)]
    config = load_config(
        config_with(group, {"name": name, **required}, workdir), run_dir=workdir / "run"
    )
    component = loaded(group, config).build()
    if key(group, name) in NO_TRAINER:
        logged = to_plain(component)
    else:
        trainer = _trainer_with(group, name, component)
        try:
            hyperparameters = trainer.hyperparameters()
        finally:
            trainer.close()
        entries = hyperparameters[SECTION[group].fills[0]]
        (logged,) = [e for e in entries if e["name"] == target.__name__]
    for field in dataclasses.fields(target.config_class):
        assert field.name in logged, field.name
        assert logged[field.name] == to_plain(getattr(component.config, field.name)), field.name


# --- TrainerConfig itself -------------------------------------------------------------------


def trainer_samples(tmp: Path) -> dict[str, Any]:
    return {
        field.name: sample(TrainerConfig, field, {"model": None}, tmp)
        for field in settings(TrainerConfig)
    }


def test_every_trainer_setting_is_settable_from_yaml(workdir):
    samples = trainer_samples(workdir)
    assert all(value is not MISSING for value in samples.values()), samples
    for name, value in samples.items():
        raw = {**BASE, "trainer": {**BASE["trainer"], name: value}}
        path = workdir / "trainer.yaml"
        path.write_text(yaml.safe_dump(raw, sort_keys=False))
        config = load_config(path, run_dir=workdir / "run")
        assert to_plain(config.trainer[name]) == to_plain(value), name
        built = build_run(config).config
        assert to_plain(getattr(built, name)) == to_plain(value), name


def test_every_trainer_setting_is_in_print_config(workdir, capsys):
    path = workdir / "trainer.yaml"
    path.write_text(yaml.safe_dump(BASE, sort_keys=False))
    assert main(["train", str(path), "--print-config", "--run-dir", str(workdir / "run")]) == 0
    out = capsys.readouterr().out
    printed = yaml.safe_load(out)
    comments = " ".join(
        line.strip()[2:] for line in out.splitlines() if line.strip().startswith("# ")
    )
    docs = field_docs(TrainerConfig)
    assert list(printed["trainer"]) == [f.name for f in settings(TrainerConfig)]
    for field in dataclasses.fields(TrainerConfig):
        assert " ".join(docs[field.name].split()) in comments, field.name
    sections_printed = {s.key for s in sections()}
    assert sections_printed <= set(printed)


def test_every_trainer_field_is_logged_as_a_hyperparameter(workdir):
    path = workdir / "trainer.yaml"
    path.write_text(yaml.safe_dump(BASE, sort_keys=False))
    trainer = Trainer(build_run(load_config(path, run_dir=workdir / "run")).config)
    try:
        hyperparameters = trainer.hyperparameters()
    finally:
        trainer.close()
    for field in dataclasses.fields(TrainerConfig):
        assert field.name in hyperparameters, field.name
    assert hyperparameters["max_duration"] == "1ba"
    assert hyperparameters["run_name"] == "run"
