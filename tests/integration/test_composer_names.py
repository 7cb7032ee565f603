"""A Composer port finds every name: in docs/coming-from-composer.md, or in the error a
wrong name raises (issue 52: Composer's names used to fail with bare Python errors)."""

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "coming-from-composer.md"
NAMES = Path(__file__).parent / "data" / "composer_names.txt"


def _composer_names() -> list[str]:
    lines = NAMES.read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def _every_name_table() -> dict[str, str]:
    """Composer name -> the trainkit cell of its row, from the guide's "Every name" table."""
    section = GUIDE.read_text().split("### Every name", 1)[1].split("\n### ", 1)[0]
    rows = {}
    for line in section.splitlines():
        if not line.startswith("| `composer"):
            continue
        composer, trainkit = line.strip("|").split(" | ", 1)
        for name in re.findall(r"`(composer[\w.]*)`", composer):
            rows[name] = trainkit.strip(" |")
    return rows


def _resolve(dotted: str) -> object:
    """The object a dotted trainkit name stands for (a module, or an attribute of one)."""
    parts = dotted.split(".")
    for split in range(len(parts), 1, -1):
        try:
            value = importlib.import_module(".".join(parts[:split]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[split:]:
            value = getattr(value, attribute)
        return value
    raise ModuleNotFoundError(dotted)


def test_the_name_list_says_where_it_came_from():
    header = [line for line in NAMES.read_text().splitlines() if line.startswith("#")]
    text = "\n".join(header)
    assert "github:mosaicml/composer at " in text and "github:mosaicml/llm-foundry at " in text
    assert len(_composer_names()) > 60


def test_every_composer_name_is_mapped_in_the_guide_to_a_name_that_exists():
    rows = _every_name_table()
    missing = [name for name in _composer_names() if name not in rows]
    assert not missing, f"not in the guide's 'Every name' table: {missing}"
    for composer, cell in rows.items():
        ours = re.findall(r"`(trainkit\.[\w.]+)`", cell)
        if not ours:  # no counterpart: the row must say so, and why
            assert re.match(r"(none|not needed): \S", cell), (composer, cell)
        for name in ours:
            _resolve(name)  # raises if the guide names something that does not exist


HINTS = [
    # (a Composer spelling in the trainkit module a port would try, the name it must give)
    ("trainkit.trainer.optim", "CosineAnnealingWithWarmupScheduler", "trainkit.trainer.schedulers"),
    ("trainkit.trainer.optim", "LinearWithWarmupScheduler", "trainkit.trainer.schedulers"),
    ("trainkit.trainer.optim", "ComposerScheduler", "trainkit.trainer.schedulers.Scheduler"),
    ("trainkit.loggers", "TensorboardLogger", "trainkit.loggers.TensorBoardLogger"),
    ("trainkit.loggers", "MLFlowLogger", "trainkit.loggers.MLflowLogger"),
    ("trainkit.loggers", "SpeedMonitor", "trainkit.profiler.SpeedMonitor"),
    ("trainkit.loggers", "EarlyStopper", "trainkit.algorithms.EarlyStopper"),
    ("trainkit.loggers", "CheckpointSaver", "trainkit.checkpoint.Checkpointer"),
    ("trainkit.core", "Trainer", "trainkit.trainer"),
    ("trainkit.core", "ComposerModel", "trainkit.core.TrainModel"),
    ("trainkit.core", "ComposerClassifier", "trainkit.trainer.Classifier"),
    ("trainkit.trainer", "Time", "trainkit.core"),
    ("trainkit.trainer", "Evaluator", "trainkit.core"),
    ("trainkit.trainer", "ComposerModel", "trainkit.core.TrainModel"),
    ("trainkit.trainer.metrics", "LanguageCrossEntropy", "trainkit.trainer.metrics.CrossEntropy"),
]


@pytest.mark.parametrize(("module", "name", "answer"), HINTS)
def test_a_composer_name_imported_from_trainkit_names_the_trainkit_one(module, name, answer):
    with pytest.raises(ImportError, match=re.escape(answer)) as raised:
        exec(f"from {module} import {name}", {})
    assert name in str(raised.value)
    _resolve(answer)  # the name given exists
    # Any other missing name stays a plain AttributeError (hasattr keeps working).
    assert not hasattr(importlib.import_module(module), name + "Nope")


def test_the_optim_hint_covers_every_schedule():
    from trainkit.trainer import optim, schedulers

    ours = {
        name for name in schedulers.__all__ if name.endswith("Scheduler") and name != "Scheduler"
    }
    assert set(optim._SCHEDULES) == ours


def test_evaluator_dataloader_is_answered_with_data():
    from trainkit.core import Evaluator

    with pytest.raises(TypeError, match=r"'val' needs data=\.\.\. \(Composer's dataloader="):
        Evaluator(label="val", dataloader=[[0]])
    with pytest.raises(TypeError, match=r"'val' needs data=\.\.\.: a DataSpec"):
        Evaluator(label="val")
    assert Evaluator(label="val", data=[[0]]).label == "val"


def test_checkpoint_saver_arguments_are_answered_with_the_checkpointer_names():
    from trainkit.checkpoint import Checkpointer

    with pytest.raises(TypeError) as raised:
        Checkpointer(
            folder="runs/x",
            save_interval="1ep",
            num_checkpoints_to_keep=2,
            filename="ep{epoch}-ba{batch}-rank{rank}.pt",
        )
    message = str(raised.value)
    for composer, ours in [
        ("save_interval", "interval="),
        ("num_checkpoints_to_keep", "keep="),
        ("filename", "name_format="),
    ]:
        assert re.search(rf"{composer}: use {ours}", message), message
