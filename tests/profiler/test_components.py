"""Every component trainkit-profiler registers follows the component model.

The components are found by entry point (the distribution that registered them), not from
a hand list: a new monitor is checked as soon as it is registered.
"""

import dataclasses
import json
import subprocess
import sys

import pytest

from trainkit.core import Callback, plugins
from trainkit.core.config import field_docs, to_plain

DISTRIBUTION = "trainkit-profiler"
PACKAGE = "trainkit.profiler"
GROUPS = ("trainkit.callbacks",)
REGISTERED = [
    info
    for group in GROUPS
    for info in plugins.describe(group)
    if info.distribution == DISTRIBUTION
]
IDS = [f"{info.group}:{info.name}" for info in REGISTERED]
CONFIGURED = [i for i in REGISTERED if plugins.load(i.group, i.name).config_class is not None]
CONFIGURED_IDS = [f"{info.group}:{info.name}" for info in CONFIGURED]
HEAVY = ("pynvml",)


def _other_value(value):
    """A valid value other than ``value`` where one follows from its type; else ``value``."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value * 2 + 1
    return value


def _is_plain(value):
    if value is None or isinstance(value, bool | int | float | str):
        return True
    if isinstance(value, list):
        return all(_is_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _is_plain(v) for k, v in value.items())
    return False


def test_the_components_are_found_by_entry_point():
    assert {(i.group, i.name) for i in REGISTERED} >= {
        ("trainkit.callbacks", "profiler"),
        ("trainkit.callbacks", "speed_monitor"),
    }


@pytest.mark.parametrize("info", REGISTERED, ids=IDS)
def test_entry_point_names_the_defining_module(info):
    cls = plugins.load(info.group, info.name)
    assert info.value == f"{cls.__module__}:{cls.__qualname__}"
    assert issubclass(cls, Callback)


@pytest.mark.parametrize("info", REGISTERED, ids=IDS)
def test_keywords_build_the_same_config_as_the_config_object(info):
    cls = plugins.load(info.group, info.name)
    config_class = cls.config_class
    if config_class is None:  # nothing to configure
        assert cls().config is None
        with pytest.raises(TypeError, match="takes no options"):
            cls(no_such_option=1)
        return
    defaults = config_class()
    options = {
        f.name: _other_value(getattr(defaults, f.name)) for f in dataclasses.fields(config_class)
    }
    from_config = cls(config_class(**options))
    from_keywords = cls(**options)
    assert isinstance(from_keywords.config, config_class)
    assert from_keywords.config == from_config.config
    assert cls(config_class(), **options).config == from_config.config  # keywords override
    assert cls().config == defaults
    # What the Trainer logs for it.
    assert to_plain(from_keywords) == {"name": cls.__name__, **to_plain(from_config.config)}


@pytest.mark.parametrize("info", CONFIGURED, ids=CONFIGURED_IDS)
def test_unknown_keywords_and_positional_values_are_rejected(info):
    cls = plugins.load(info.group, info.name)
    config_class = cls.config_class
    with pytest.raises(TypeError, match="has no field 'no_such_option'; its fields: ") as err:
        cls(no_such_option=1)
    for field in dataclasses.fields(config_class):
        assert field.name in str(err.value)
    with pytest.raises(TypeError, match=f"expected a {config_class.__name__}, got str"):
        cls("a positional value")


@pytest.mark.parametrize("info", CONFIGURED, ids=CONFIGURED_IDS)
def test_every_config_field_has_a_docstring(info):
    cls = plugins.load(info.group, info.name)
    docs = field_docs(cls.config_class)
    assert docs, f"{cls.config_class.__name__} has no fields"
    assert [name for name, doc in docs.items() if not doc] == []


@pytest.mark.parametrize("info", CONFIGURED, ids=CONFIGURED_IDS)
def test_defaults_are_what_a_config_file_can_hold(info):
    cls = plugins.load(info.group, info.name)
    config = cls.config_class()
    for field in dataclasses.fields(config):
        assert _is_plain(getattr(config, field.name)), field.name
    # In config files and logged hyperparameters, "name" is the component's own.
    assert "name" not in {field.name for field in dataclasses.fields(config)}


def _run(code):
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_loading_one_entry_point_imports_its_module_only():
    modules = _run(
        "import json, sys\n"
        "from trainkit.core import plugins\n"
        "plugins.load('trainkit.callbacks', 'memory_monitor')\n"
        f"print(json.dumps(sorted(m for m in sys.modules if m.startswith('{PACKAGE}'))))"
    )
    assert modules == [PACKAGE, f"{PACKAGE}._memory_monitor"]


def test_the_public_names_import_no_optional_client():
    # Compared with what trainkit.core (torch) imports by itself: torch.cuda imports pynvml
    # when it is installed.
    loaded = _run(
        "import json, sys\n"
        "import trainkit.core\n"
        "before = set(sys.modules)\n"
        f"import {PACKAGE} as package\n"
        "for name in package.__all__:\n"
        "    getattr(package, name)\n"
        f"print(json.dumps(sorted(m for m in {list(HEAVY)!r} if m in set(sys.modules) - before)))"
    )
    assert loaded == []


@pytest.mark.parametrize(
    "info",
    [i for i in REGISTERED if i not in CONFIGURED] or [None],
    ids=lambda i: str(i and i.name),
)
def test_components_without_a_config_refuse_options(info):
    if info is None:  # every component of this package has a config
        assert CONFIGURED == REGISTERED
        return
    cls = plugins.load(info.group, info.name)
    assert cls().config is None
    with pytest.raises(TypeError, match="takes no options"):
        cls(anything=1)
