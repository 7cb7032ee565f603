"""Entry-point discovery in trainkit-core against a real sibling's entry points (trainkit-loggers).

The rest of the plugin tests use a fake group and live in tests/trainer/test_plugins.py: these need
trainkit-loggers installed, so they run only in the full dev environment.
"""

import sys

import pytest

from trainkit.core import plugins


def test_available_lists_the_registered_loggers_without_importing_them(monkeypatch):
    for name in [
        m for m in sys.modules if m == "trainkit.loggers" or m.startswith("trainkit.loggers.")
    ]:
        monkeypatch.delitem(sys.modules, name)
    names = plugins.available("trainkit.loggers")
    assert "progress" in names
    assert names == sorted(names)
    info = plugins.describe("trainkit.loggers")
    assert "progress" in [i.name for i in info]
    assert not [m for m in sys.modules if m.startswith("trainkit.loggers")]


def test_describe_gives_the_distribution():
    (info,) = [i for i in plugins.describe("trainkit.loggers") if i.name == "progress"]
    assert info == plugins.PluginInfo(
        group="trainkit.loggers",
        name="progress",
        value="trainkit.loggers._progress:ProgressBar",
        distribution="trainkit-loggers",
    )


def test_load_returns_the_registered_object():
    from trainkit.loggers import ProgressBar

    assert plugins.load("trainkit.loggers", "progress") is ProgressBar


def test_unknown_name_in_a_real_group_lists_the_registered_ones():
    with pytest.raises(LookupError, match=r"available: .*progress"):
        plugins.load("trainkit.loggers", "wandb-typo")
