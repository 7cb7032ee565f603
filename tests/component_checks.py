"""Checks that a registered component follows the component model (docs/architecture.md).

Shared by the packages' own tests (they import only trainkit.core from here, so they run
in each package's own environment); each package finds its components by entry point.
"""

import dataclasses
import json
import subprocess
import sys

import pytest

from trainkit.core import plugins
from trainkit.core.config import field_docs, to_plain


def registered(distribution, groups):
    """The entry points ``distribution`` registers in ``groups``."""
    return [
        info
        for group in groups
        for info in plugins.describe(group)
        if info.distribution == distribution
    ]


def ids(infos):
    return [f"{info.group}:{info.name}" for info in infos]


def other_value(value):
    """A valid value other than ``value`` where one follows from its type; else ``value``."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value * 2 + 1
    return value


def is_plain(value):
    if value is None or isinstance(value, bool | int | float | str):
        return True
    if isinstance(value, list):
        return all(is_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and is_plain(v) for k, v in value.items())
    return False


def check_entry_point(info, base):
    cls = plugins.load(info.group, info.name)
    assert info.value == f"{cls.__module__}:{cls.__qualname__}"
    assert issubclass(cls, base)


def check_keywords_build_the_config(cls):
    """Keywords, the config object, and a config plus keyword overrides agree; it logs them."""
    config_class = cls.config_class
    if config_class is None:  # nothing to configure
        assert cls().config is None
        with pytest.raises(TypeError, match="takes no options"):
            cls(no_such_option=1)
        return
    defaults = config_class()
    options = {
        f.name: other_value(getattr(defaults, f.name)) for f in dataclasses.fields(config_class)
    }
    from_config = cls(config_class(**options))
    from_keywords = cls(**options)
    assert isinstance(from_keywords.config, config_class)
    assert from_keywords.config == from_config.config
    assert cls(config_class(), **options).config == from_config.config  # keywords override
    assert cls().config == defaults
    assert to_plain(from_keywords) == {"name": cls.__name__, **to_plain(from_config.config)}


def check_unknown_options_are_rejected(cls):
    config_class = cls.config_class
    with pytest.raises(TypeError, match="has no field 'no_such_option'; its fields: ") as err:
        cls(no_such_option=1)
    for field in dataclasses.fields(config_class):
        assert field.name in str(err.value)
    with pytest.raises(TypeError, match=f"expected a {config_class.__name__}, got str"):
        cls("a positional value")


def check_fields_are_documented(config_class):
    assert all(f.kw_only for f in dataclasses.fields(config_class))
    docs = field_docs(config_class)
    assert docs, f"{config_class.__name__} has no fields"
    assert [name for name, doc in docs.items() if not doc.strip()] == []


def check_fields_are_documented_plain_values(cls):
    check_fields_are_documented(cls.config_class)
    config = cls.config_class()
    for field in dataclasses.fields(config):
        assert is_plain(getattr(config, field.name)), field.name


def modules_after(code, prefix, baseline=""):
    """The modules under ``prefix`` that ``code`` imports in a fresh interpreter, beyond
    those ``baseline`` (run first) imported."""
    script = (
        f"import json, sys\n{baseline}\nbefore = set(sys.modules)\n{code}\n"
        "new = set(sys.modules) - before\n"
        f"print(json.dumps(sorted(m for m in new if m.startswith({prefix!r}))))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])
