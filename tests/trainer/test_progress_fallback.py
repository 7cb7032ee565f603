"""Without trainkit-loggers, the Trainer prints plain progress lines."""

import io

from toy import blobs, loader, mlp
from trainkit.core import plugins
from trainkit.core.progress import ProgressLines
from trainkit.trainer import Trainer


def test_plain_lines_when_no_progress_entry_point(monkeypatch, capsys):
    real = plugins.available
    monkeypatch.setattr(
        plugins, "available", lambda group: [n for n in real(group) if n != "progress"]
    )
    trainer = Trainer(
        model=mlp(), train_dataloader=loader(blobs(160)), max_duration="1ep", device="cpu"
    )
    assert [type(d) for d in trainer.logger.destinations] == [ProgressLines]
    trainer.fit()
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("[epoch 0 batch 1/10] loss/train/total: ")
    assert len(lines) == 10


def test_lines_every_interval_and_after_eval():
    out = io.StringIO()
    trainer = Trainer(
        model=mlp(),
        train_dataloader=loader(blobs(160)),
        eval_dataloader=loader(blobs(32), shuffle=False),
        max_duration="1ep",
        device="cpu",
        progress_bar=False,
        loggers=[ProgressLines(interval=4, stream=out)],
    )
    trainer.fit()
    lines = out.getvalue().splitlines()
    assert [line.split("]")[0] for line in lines] == [
        "[epoch 0 batch 4/10",
        "[epoch 0 batch 8/10",
        "[epoch 0 batch 10/10",
        "[eval at batch 10",
    ]
    assert "metrics/eval/accuracy" in lines[-1] and "metrics/train" not in lines[-1]
