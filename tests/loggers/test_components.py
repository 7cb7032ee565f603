"""Every component trainkit-loggers registers follows the component model.

The components are found by entry point (the distribution that registered them), not from
a hand list: a new one is checked as soon as it is registered.
"""

import pytest

from component_checks import (
    check_entry_point,
    check_fields_are_documented_plain_values,
    check_keywords_build_the_config,
    check_unknown_options_are_rejected,
    ids,
    modules_after,
    registered,
)
from trainkit.core import Callback, LoggerDestination, plugins

PACKAGE = "trainkit.loggers"
REGISTERED = registered("trainkit-loggers", ("trainkit.loggers", "trainkit.callbacks"))
CONFIGURED = [i for i in REGISTERED if plugins.load(i.group, i.name).config_class is not None]
HEAVY = (
    "wandb",
    "mlflow",
    "tensorboard",
    "matplotlib",
    "torch.utils.tensorboard",
    "neptune",
    "comet_ml",
    "pandas",
    "transformers",
)


@pytest.fixture(autouse=True)
def offline_clients(tmp_path, monkeypatch):
    """Building the wandb and MLflow destinations reaches no server and writes in tmp_path."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", (tmp_path / "mlruns").as_uri())
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")


def test_the_components_are_found_by_entry_point():
    assert {(i.group, i.name) for i in REGISTERED} >= {
        ("trainkit.loggers", "console"),
        ("trainkit.loggers", "file"),
        ("trainkit.callbacks", "lr_monitor"),
    }


@pytest.mark.parametrize("info", REGISTERED, ids=ids(REGISTERED))
def test_entry_point_names_the_defining_module(info):
    check_entry_point(info, LoggerDestination if info.group == "trainkit.loggers" else Callback)


@pytest.mark.parametrize("info", REGISTERED, ids=ids(REGISTERED))
def test_keywords_build_the_same_config_as_the_config_object(info):
    check_keywords_build_the_config(plugins.load(info.group, info.name))


@pytest.mark.parametrize("info", CONFIGURED, ids=ids(CONFIGURED))
def test_unknown_keywords_and_positional_values_are_rejected(info):
    check_unknown_options_are_rejected(plugins.load(info.group, info.name))


@pytest.mark.parametrize("info", CONFIGURED, ids=ids(CONFIGURED))
def test_every_config_field_is_a_documented_plain_value(info):
    check_fields_are_documented_plain_values(plugins.load(info.group, info.name))


def test_loading_one_entry_point_imports_its_module_only():
    code = "from trainkit.core import plugins\nplugins.load('trainkit.loggers', 'file')"
    assert modules_after(code, PACKAGE) == [PACKAGE, f"{PACKAGE}._common", f"{PACKAGE}._file"]


def test_the_public_names_import_no_optional_client():
    # Compared with what trainkit.core (torch) imports by itself: torch.cuda imports pynvml
    # when it is installed.
    code = f"import {PACKAGE} as package\nfor name in package.__all__:\n    getattr(package, name)"
    new = modules_after(code, "", baseline="import trainkit.core")
    assert [m for m in new if m in HEAVY] == []
