"""Tables (e.g. generated samples), sent with core's `Logger.log_table`, reach every
destination that records them; the others ignore them, and a failing one does not stop the
rest."""

import json
import warnings

import pytest

from trainkit.core import Logger, LoggerDestination
from trainkit.loggers import (
    FileLogger,
    InMemoryLogger,
    MLflowLogger,
    WandBLogger,
    read_jsonl,
)
from trainkit.loggers._tensorboard import markdown_table

COLUMNS = ["prompt", "generation"]
ROWS = [["a | b", "line one\nline two"], ["c", "d"]]


class Broken(LoggerDestination):
    def log_table(self, name, columns, rows, step):
        raise OSError("disk full")


class Mutating(LoggerDestination):
    def log_table(self, name, columns, rows, step):
        columns.append("extra")
        rows[0][0] = "changed"


def test_a_table_reaches_the_destinations_that_record_tables(tmp_path):
    memory, file, metrics_only, broken = (
        InMemoryLogger(),
        FileLogger(folder=tmp_path),
        LoggerDestination(),
        Broken(),
    )
    # Core's protocol has the method: a destination that does not override it ignores tables.
    assert metrics_only.log_table("t", COLUMNS, ROWS, 1) is None
    logger = Logger([metrics_only, broken, Mutating(), memory, file])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        logger.log_table("generations", COLUMNS, ROWS, step=3)
        logger.log_table("generations", COLUMNS, ROWS[:1], step=4)
    reported = [str(w.message) for w in caught]
    assert len(reported) == 1 and "Broken.log_table failed (OSError('disk full'))" in reported[0]
    # Each destination got its own copy: Mutating's changes reached neither the caller's
    # lists nor the destinations after it.
    assert COLUMNS == ["prompt", "generation"] and ROWS[0][0] == "a | b"
    assert memory.tables == [
        ("generations", 3, COLUMNS, ROWS),
        ("generations", 4, COLUMNS, ROWS[:1]),
    ]
    file.close()
    assert [(r["step"], r["table"]) for r in read_jsonl(file.path)] == [
        (3, {"name": "generations", "columns": COLUMNS, "rows": ROWS}),
        (4, {"name": "generations", "columns": COLUMNS, "rows": ROWS[:1]}),
    ]


def test_the_step_defaults_to_the_runs_batch_count():
    from types import SimpleNamespace

    memory = InMemoryLogger()
    logger = Logger([memory])
    logger.log_table("t", COLUMNS, ROWS[1:])
    logger.state = SimpleNamespace(timestamp=SimpleNamespace(batch=12))
    logger.log_table("t", COLUMNS, ROWS[1:])
    assert [step for _, step, *_ in memory.tables] == [0, 12]


def test_rows_must_have_one_value_per_column():
    memory = InMemoryLogger()
    with pytest.raises(ValueError, match=r"table 't': row 1 has 1 values but there are 2 columns"):
        Logger([memory]).log_table("t", COLUMNS, [["a", "b"], ["c"]], step=1)
    assert memory.tables == []  # refused before any destination got it


def test_markdown_keeps_cells_apart():
    assert markdown_table(COLUMNS, ROWS).splitlines() == [
        "| prompt | generation |",
        "|---|---|",
        "| a \\| b | line one<br>line two |",
        "| c | d |",
    ]


def test_the_file_keeps_tables_in_order_with_the_buffered_metrics(tmp_path):
    file = FileLogger(folder=tmp_path, flush_interval=60)
    file.log_metrics({"loss": 1.0}, 1)
    file.log_table("generations", COLUMNS, ROWS, 2)
    file.log_metrics({"loss": 0.5}, 3)
    file.close()
    records = read_jsonl(file.path)
    assert [("table" if "table" in r else "metrics", r["step"]) for r in records] == [
        ("metrics", 1),
        ("table", 2),
        ("metrics", 3),
    ]


def test_mlflow_keeps_each_table_as_a_json_artifact(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    uri = (tmp_path / "mlruns").as_uri()
    logger = MLflowLogger(tracking_uri=uri)
    logger.log_table("generations", COLUMNS, ROWS, 7)
    run_id = logger.run_id
    logger.close()
    client = MlflowClient(uri)
    assert [a.path for a in client.list_artifacts(run_id, "tables/generations")] == [
        "tables/generations/step7.json"
    ]
    local = client.download_artifacts(run_id, "tables/generations/step7.json", str(tmp_path))
    with open(local) as file:
        assert json.load(file) == {"columns": COLUMNS, "rows": ROWS}


def test_wandb_gets_a_wandb_table_at_the_step(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    logged = []

    class Run:
        def log(self, values, step):
            logged.append((values, step))

        def finish(self):
            pass

    logger = WandBLogger()
    monkeypatch.setattr(logger._wandb, "init", lambda **kwargs: Run())
    logger.log_table("generations", COLUMNS, ROWS, 5)
    logger.close()
    ((values, step),) = logged
    table = values["generations"]
    assert step == 5 and isinstance(table, logger._wandb.Table)
    assert table.columns == COLUMNS and table.data == ROWS
