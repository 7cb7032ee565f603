"""The progress bar: registered by entry point, chosen by the Trainer, readable in files."""

import io

import pytest

from toy import blobs, loader, mlp
from trainkit.core import plugins
from trainkit.loggers import ProgressBar
from trainkit.trainer import Trainer


class FakeTerminal(io.StringIO):
    def isatty(self):
        return True


def test_entry_point_resolves_to_the_progress_bar():
    assert plugins.load("trainkit.loggers", "progress") is ProgressBar


def test_trainer_uses_the_registered_progress_bar_by_default():
    trainer = Trainer(
        model=mlp(), train_dataloader=loader(blobs(32)), max_duration="1ba", device="cpu"
    )
    assert [type(d) for d in trainer.logger.destinations] == [ProgressBar]
    quiet = Trainer(
        model=mlp(),
        train_dataloader=loader(blobs(32)),
        max_duration="1ba",
        device="cpu",
        progress_bar=False,
    )
    assert quiet.logger.destinations == []


def test_plain_lines_when_not_a_terminal():
    out = io.StringIO()
    trainer = Trainer(
        model=mlp(),
        train_dataloader=loader(blobs(64)),
        eval_dataloader=loader(blobs(32), shuffle=False),
        max_duration="2ep",
        device="cpu",
        progress_bar=False,
        loggers=[ProgressBar(interval=2, stream=out)],
    )
    trainer.fit()
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue()
    assert lines[0].startswith("[epoch 0 batch 2/4] loss/train/total: ")
    assert sum(line.startswith("[eval at batch") for line in lines) == 2
    assert "metrics/eval/accuracy: " in lines[-1]


def test_redrawn_bar_with_eta_in_a_terminal():
    out = FakeTerminal()
    trainer = Trainer(
        model=mlp(),
        train_dataloader=loader(blobs(64)),
        max_duration="2ep",
        device="cpu",
        progress_bar=False,
        loggers=[ProgressBar(stream=out, refresh_per_second=1e9)],
    )
    trainer.fit()
    text = out.getvalue()
    assert text.count("\r") == 8  # one redraw per batch at this refresh rate
    assert "epoch 0 [" in text and "4/4" in text and "ETA " in text
    assert "loss/train/total: " in text


def test_bad_options_are_clear_errors():
    with pytest.raises(ValueError, match="refresh_per_second 0 is not valid"):
        ProgressBar(refresh_per_second=0)
    with pytest.raises(ValueError, match="interval 0 is not valid; use a number of batches >= 1"):
        ProgressBar(interval=0)


@pytest.mark.parametrize(("budget", "said"), [("3ba", "of 3ba"), ("0.3sec", "of 0.3 s")])
def test_a_run_on_a_budget_fills_the_bar_when_the_budget_ends(budget, said):
    # Issue 52.9: a run budgeted in batches or seconds ends inside its epoch; the bar
    # counted the epoch and ended part full at "ETA 00:00".
    out = FakeTerminal()
    Trainer(
        model=mlp(),
        train_dataloader=loader(blobs(1024)),  # 64 batches an epoch
        max_duration=budget,
        device="cpu",
        progress_bar=False,
        loggers=[ProgressBar(stream=out, refresh_per_second=1e9)],
    ).fit()
    last = out.getvalue().rstrip("\n").rsplit("\r", 1)[-1]
    assert last.startswith(f"[{'#' * 20}] 100% {said}, batch ")
    assert "/64" not in last and "ETA 00:00" in last


def test_plain_lines_of_a_run_on_a_budget_say_where_it_is_in_the_budget():
    out = io.StringIO()  # not a terminal: plain lines
    Trainer(
        model=mlp(),
        train_dataloader=loader(blobs(1024)),  # 64 batches an epoch
        max_duration="6ba",
        device="cpu",
        progress_bar=False,
        loggers=[ProgressBar(interval=3, stream=out)],
    ).fit()
    assert [line.split("]")[0] for line in out.getvalue().splitlines()] == [
        "[batch 3, 50% of 6ba",
        "[batch 6, 100% of 6ba",
    ]
