"""The seven distributions install and import as one PEP 420 namespace."""

import importlib
from importlib import metadata

import pytest

PACKAGES = ["core", "algorithms", "parallel", "checkpoint", "loggers", "profiler", "cli"]


@pytest.mark.parametrize("name", PACKAGES)
def test_each_package_is_installed_and_imports(name):
    module = importlib.import_module(f"trainkit.{name}")
    assert isinstance(module.__all__, list)
    dist = metadata.distribution(f"trainkit-{name}")
    assert dist.version == "0.1.0"
    requires = dist.requires or []
    if name != "core":
        assert any(r.startswith("trainkit-core") for r in requires)


def test_trainkit_is_a_namespace_shared_by_all_distributions():
    import trainkit

    assert getattr(trainkit, "__file__", None) is None  # no src/trainkit/__init__.py anywhere
    assert len(list(trainkit.__path__)) == len(PACKAGES)
