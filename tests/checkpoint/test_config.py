"""The callbacks trainkit-checkpoint registers are built from one documented config dataclass.

They are found through this package's ``trainkit.callbacks`` entry points, so a new one is
checked without editing this file (except to give ``EXAMPLES`` a value for it).
"""

import dataclasses
from pathlib import Path

import pytest

from component_checks import check_entry_point, check_fields_are_documented
from trainkit.checkpoint import Checkpointer, CheckpointerConfig
from trainkit.core import Callback, plugins
from trainkit.core.config import settings, to_plain

CALLBACKS = sorted(
    (info.name, plugins.load("trainkit.callbacks", info.name))
    for info in plugins.describe("trainkit.callbacks")
    if info.distribution == "trainkit-checkpoint"
)
NAMES = [name for name, _ in CALLBACKS]

EXAMPLES = {
    "interval": "500ba",
    "keep": 3,
    "autoresume": True,
    "load_path": "latest",
    "load_weights_only": True,
    "save_weights_only": True,
    "overwrite": True,
    "exclude_algorithms": ["BlurPool"],
    "strict": False,
    "ignore_keys": ["rng", "model/head.*"],
    "async_save": True,
    "name_format": "step{batch}",
    "verify": False,
    "local_dir": "staging",
    "checksum": "xxh3_128",
    "lock": False,
    "lock_wait": 30.0,
    "lease": 120.0,
    "upload_to_loggers": True,
    # ExportOnFitEnd
    "formats": ["onnx", "hf"],
    "filename": "final",
    "seq_len": 16,
    "batch_size": 4,
    "merge_adapter": True,
}
"""A valid value, other than the default, for each field a config file may set."""


@pytest.fixture
def required(tmp_path):
    return {"folder": str(tmp_path / "checkpoints")}


def test_the_package_registers_its_callbacks():
    assert NAMES == ["checkpointer", "export_on_fit_end"]


@pytest.mark.parametrize(("name", "cls"), CALLBACKS, ids=NAMES)
def test_entry_point_names_the_defining_module(name, cls):
    info = next(i for i in plugins.describe("trainkit.callbacks") if i.name == name)
    check_entry_point(info, Callback)


@pytest.mark.parametrize(("name", "cls"), CALLBACKS, ids=NAMES)
def test_every_config_field_is_documented(name, cls):
    check_fields_are_documented(cls.config_class)


@pytest.mark.parametrize(("name", "cls"), CALLBACKS, ids=NAMES)
def test_config_and_keyword_arguments_build_the_same_callback(name, cls, required):
    config_class = cls.config_class
    fields = [f.name for f in settings(config_class) if f.name not in required]
    missing = [f for f in fields if f not in EXAMPLES and f != "storage_options"]
    assert not missing, f"give EXAMPLES a value for {missing}"
    examples = {f: EXAMPLES[f] for f in fields if f in EXAMPLES}

    assert cls(**required).config == config_class(**required)
    assert cls(config_class(**required)).config == config_class(**required)
    assert cls(**required, **examples).config == config_class(**required, **examples)
    for field, value in examples.items():  # each field alone, as an override of a config
        built = cls(config_class(**required), **{field: value})
        assert built.config == dataclasses.replace(config_class(**required), **{field: value})
    # Every value a config file gives comes back as plain data (logged, printed).
    plain = to_plain(cls(**required, **examples).config)
    assert plain == {**to_plain(config_class(**required)), **required, **examples}


def test_paths_are_accepted_and_stored_as_text(tmp_path):
    checkpointer = Checkpointer(folder=tmp_path, load_path=tmp_path / "a", local_dir=tmp_path)
    assert checkpointer.config.folder == str(tmp_path)
    assert checkpointer.config.load_path == str(tmp_path / "a")
    assert checkpointer.config.local_dir == str(tmp_path)
    assert checkpointer.folder == Path(tmp_path)


def test_unknown_options_and_a_wrong_positional_folder_are_refused(tmp_path):
    with pytest.raises(TypeError, match=r"has no field 'intervall'; did you mean 'interval'\?"):
        Checkpointer(folder=tmp_path, intervall="1ep")
    assert Checkpointer(tmp_path).config.folder == str(tmp_path)  # the primary field
    with pytest.raises(TypeError, match=r"Checkpointer\(folder=3\), given by position: folder"):
        Checkpointer(3)
    with pytest.raises(TypeError, match="folder"):
        CheckpointerConfig()
    with pytest.raises(TypeError, match="ignore_keys must be a list of patterns"):
        CheckpointerConfig(folder=str(tmp_path), ignore_keys="rng")
    with pytest.raises(TypeError, match="folder must be a path or a URL, got int 3"):
        CheckpointerConfig(folder=3)
