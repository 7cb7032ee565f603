"""Entry-point discovery: listing imports nothing, `load` imports one (cached), clear errors."""

from importlib import metadata

import pytest

from trainkit.core import plugins


class FakeEntryPoint:
    """Quacks like `importlib.metadata.EntryPoint` and counts its loads."""

    def __init__(self, name, value, target=None, fail=False):
        self.name, self.value, self.dist = name, value, None
        self.target, self.fail, self.loads = target, fail, 0

    def load(self):
        self.loads += 1
        if self.fail:
            raise AssertionError(f"entry point {self.name} must not be imported")
        return self.target


@pytest.fixture
def fake_group(monkeypatch):
    """Registers ``trainkit.test-fake`` with three entry points, on top of the real ones."""
    group = "trainkit.test-fake"
    points = [
        FakeEntryPoint("zeta", "fake_pkg:Zeta", target=object()),
        FakeEntryPoint("alpha", "fake_pkg:Alpha", target=object()),
        FakeEntryPoint("broken", "fake_pkg:Broken", fail=True),
    ]
    real = metadata.entry_points

    def entry_points(**params):
        if params.get("group") == group:
            return list(points)
        return real(**params)

    monkeypatch.setattr(metadata, "entry_points", entry_points)
    plugins.load.cache_clear()
    yield group, {p.name: p for p in points}
    plugins.load.cache_clear()


def test_available_sorts_and_never_loads(fake_group):
    group, points = fake_group
    assert plugins.available(group) == ["alpha", "broken", "zeta"]
    assert [i.name for i in plugins.describe(group)] == ["alpha", "broken", "zeta"]
    assert all(p.loads == 0 for p in points.values())


def test_available_of_an_unknown_group_is_empty():
    assert plugins.available("trainkit.no-such-group") == []
    assert plugins.describe("trainkit.no-such-group") == []


def test_load_is_cached_and_imports_only_that_entry_point(fake_group):
    group, points = fake_group
    first = plugins.load(group, "alpha")
    second = plugins.load(group, "alpha")
    assert first is points["alpha"].target
    assert second is first
    assert points["alpha"].loads == 1
    assert points["zeta"].loads == 0
    assert points["broken"].loads == 0


def test_unknown_name_raises_lookup_error_listing_the_available_ones(fake_group):
    group, _ = fake_group
    with pytest.raises(LookupError) as info:
        plugins.load(group, "beta")
    message = str(info.value)
    assert "'beta'" in message and group in message
    assert "alpha, broken, zeta" in message


def test_unknown_group_says_none_installed():
    with pytest.raises(LookupError, match="none installed"):
        plugins.load("trainkit.no-such-group", "anything")


def test_groups_are_the_documented_ones():
    assert set(plugins.GROUPS) == {
        "trainkit.algorithms",
        "trainkit.callbacks",
        "trainkit.loggers",
        "trainkit.parallel",
        "trainkit.schedulers",
        "trainkit.optimizers",
        "trainkit.storage",
        "trainkit.commands",
        "trainkit.models",
        "trainkit.data",
        "trainkit.metrics",
        "trainkit.trainers",
        "trainkit.recipes",
    }


def test_every_slot_of_the_trainer_config_names_a_documented_group():
    from trainkit.core.config import slot_group, slots
    from trainkit.trainer import TrainerConfig

    groups = {slot_group(f) for f in slots(TrainerConfig)}
    assert groups <= set(plugins.GROUPS)
    for group in plugins.GROUPS:
        assert f"``{group}``" in plugins.__doc__


def test_lazy_exports_import_a_name_from_its_module_on_first_use(tmp_path, monkeypatch):
    import sys

    package = tmp_path / "lazy_pkg"
    package.mkdir()
    (package / "__init__.py").write_text(
        "from trainkit.core.plugins import lazy_exports\n"
        "__getattr__, __dir__ = lazy_exports(__name__, {'VALUE': '_heavy'})\n"
    )
    (package / "_heavy.py").write_text("VALUE = 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import lazy_pkg

    assert "lazy_pkg._heavy" not in sys.modules
    assert "VALUE" in dir(lazy_pkg)
    assert lazy_pkg.VALUE == 42
    assert "lazy_pkg._heavy" in sys.modules
    with pytest.raises(AttributeError, match="module 'lazy_pkg' has no attribute 'OTHER'"):
        lazy_pkg.OTHER  # noqa: B018
    for name in [m for m in sys.modules if m.startswith("lazy_pkg")]:
        monkeypatch.delitem(sys.modules, name)
