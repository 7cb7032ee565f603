"""The seven distributions install and import as one PEP 420 namespace."""

import importlib
from importlib import metadata
from pathlib import Path

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
    # Each package is a portion of the namespace: its own folder in the workspace (editable),
    # or one folder shared by all where they are installed together (pip install --target).
    portions = {Path(portion).resolve() for portion in trainkit.__path__}
    for name in PACKAGES:
        module = importlib.import_module(f"trainkit.{name}")
        assert Path(module.__file__).resolve().parent.parent in portions, name
    for dist in (metadata.distribution(f"trainkit-{name}") for name in PACKAGES):
        assert not any(str(f) == "trainkit/__init__.py" for f in dist.files or []), dist
