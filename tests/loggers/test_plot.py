"""``trainkit plot RUN_DIR``: PNG curves from a FileLogger run."""

import runpy
import sys

import pytest

from toy import blobs, loader, mlp
from trainkit.core import Callback
from trainkit.loggers import FileLogger, LRMonitor
from trainkit.loggers._file import read_jsonl
from trainkit.loggers.plot import _restarts, main, plot_run
from trainkit.trainer import Trainer
from trainkit.trainer.schedulers import LinearScheduler

PNG = b"\x89PNG\r\n\x1a\n"


class FakeThroughput(Callback):
    """Logs throughput as trainkit-profiler's SpeedMonitor does (same keys)."""

    def batch_end(self, state, logger):
        logger.log_metrics({"throughput/samples_per_sec": 100.0 + state.timestamp.batch})


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("runs") / "plotted"
    trainer = Trainer(
        model=mlp(),
        train_dataloader=loader(blobs(64)),
        eval_dataloader=loader(blobs(32), shuffle=False),
        max_duration="3ep",
        schedulers=LinearScheduler(),
        device="cpu",
        progress_bar=False,
        loggers=[FileLogger(folder=folder)],
        callbacks=[LRMonitor(), FakeThroughput()],
    )
    trainer.fit()
    trainer.close()
    return folder


def test_plot_writes_loss_lr_throughput_and_goodput_pngs(run_dir, capsys):
    assert main([str(run_dir)]) == 0
    for name in ("loss.png", "lr.png", "throughput.png", "goodput.png"):
        data = (run_dir / name).read_bytes()
        assert data.startswith(PNG) and len(data) > 5000
    assert capsys.readouterr().out.splitlines() == [
        f"plot of loss: {run_dir / 'loss.png'}",
        f"plot of lr: {run_dir / 'lr.png'}",
        f"plot of throughput: {run_dir / 'throughput.png'}",
        f"plot of goodput: {run_dir / 'goodput.png'}",  # every Trainer run logs goodput
    ]


def test_plot_paths_are_said_so_that_they_open_from_here(run_dir, capsys, monkeypatch):
    # Issue 52.9: "loss.png" alone when plotting "." (or a name without its folder).
    monkeypatch.chdir(run_dir)
    assert main(["."]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "plot of loss: loss.png"
    monkeypatch.chdir(run_dir.parent)
    assert main([run_dir.name]) == 0
    assert capsys.readouterr().out.splitlines()[0] == f"plot of loss: {run_dir.name}/loss.png"


def test_plot_to_another_folder_and_only_what_was_logged(tmp_path):
    source = tmp_path / "run"
    logger = FileLogger(folder=source, flush_interval=0)
    for step in range(1, 4):
        logger.log_metrics({"loss/train/total": 1.0 / step}, step)
    logger.close()
    assert plot_run(source, out_dir=tmp_path / "pngs") == [tmp_path / "pngs" / "loss.png"]


def test_goodput_restarts_are_drawn_from_the_metrics_without_a_ledger(tmp_path):
    source = tmp_path / "run"
    logger = FileLogger(folder=source, flush_interval=0)
    for step, fraction in ((1, 0.2), (5, 0.6), (6, 0.5), (9, 0.7)):
        logger.log_metrics({"goodput/fraction": fraction}, step)
    for step, load in ((1, 0.5), (6, 2.0)):  # two process starts, as the Trainer logs them
        logger.log_metrics(
            {"goodput/restart_s/load": load, "goodput/restart_s/first_step": 0.3,
             "goodput/restart_s/total": load + 0.3}, step)  # fmt: skip
    logger.close()
    assert _restarts(read_jsonl(source / "metrics.jsonl")) == [
        ("ba 1", {"load": 0.5, "first_step": 0.3}),
        ("ba 6", {"load": 2.0, "first_step": 0.3}),
    ]
    assert plot_run(source) == [source / "goodput.png"]
    assert (source / "goodput.png").read_bytes().startswith(PNG)


def test_plot_says_what_is_wrong(tmp_path, capsys):
    assert main([str(tmp_path / "missing")]) == 1
    assert "no metrics file" in capsys.readouterr().err
    logger = FileLogger(folder=tmp_path / "other", flush_interval=0)
    logger.log_metrics({"accuracy": 0.5}, 1)
    logger.close()
    assert main([str(tmp_path / "other")]) == 1
    err = capsys.readouterr().err
    assert "no loss ('loss/...'), learning rate" in err and "it has: ['accuracy']" in err
    assert main([str(tmp_path / "other"), "--ledger", str(tmp_path / "none.jsonl")]) == 1
    err = capsys.readouterr().err
    assert "no goodput ledger" in err and "none.jsonl" in err


def test_runs_as_a_module(run_dir, monkeypatch):
    monkeypatch.delitem(sys.modules, "trainkit.loggers.plot")  # as in a fresh `python -m`
    monkeypatch.setattr(sys, "argv", ["plot", str(run_dir), "--out", str(run_dir / "again")])
    with pytest.raises(SystemExit) as exit_:
        runpy.run_module("trainkit.loggers.plot", run_name="__main__")
    assert exit_.value.code == 0
    assert (run_dir / "again" / "loss.png").read_bytes().startswith(PNG)
