"""``trainkit data convert`` writes MDS shards, and the embedded default trains from a local
MDS copy with one config line (``data: {name: streaming, local: ...}``)."""

import numpy as np
import pytest
import torch

from trainkit.cli import main
from trainkit.cli._default import stdlib_text
from trainkit.core import plugins
from trainkit.trainer import _data_command
from trainkit.trainer.streaming import streaming_data, streaming_loader

SMALL = ["--set", "seq_len=32", "--set", "max_bytes=20000", "--set", "eval_bytes=2048"]
TINY = """\
model: {name: tiny_gpt2, n_layer: 1, n_head: 2, n_embd: 32, n_positions: 32}
data: {name: stdlib_text, seq_len: 32, batch_size: 8, max_bytes: 20000, eval_bytes: 2048}
checkpoint: null
trainer: {max_duration: 3ba, eval_interval: 3ba, device: cpu, progress_bar: false}
"""


def test_data_is_a_command_and_streaming_a_data_factory():
    # Both are trainkit-trainer's, beside the MDS helpers they use.
    assert plugins.load("trainkit.commands", "data") is _data_command.main
    assert plugins.load("trainkit.data", "streaming") is streaming_data


def test_convert_writes_each_split_of_a_data_factory(tmp_path, capsys):
    out = tmp_path / "mds"
    columns = ["--column", "input_ids=ndarray:uint8:32", "--column", "labels=ndarray:uint8:32"]
    assert main(["data", "convert", "stdlib_text", str(out), *SMALL, *columns]) == 0
    expected = stdlib_text(seq_len=32, max_bytes=20000, eval_bytes=2048)
    printed = capsys.readouterr().out
    for split in ("train", "eval"):
        dataset = expected[split].dataset
        assert f"wrote {len(dataset)} samples to {out}/{split}" in printed
        mds = streaming_loader(local=out, split=split, batch_size=1, shuffle=False).dataset
        assert len(mds) == len(dataset)
        for i in (0, len(dataset) - 1):
            assert mds[i]["input_ids"].dtype == np.uint8  # 1 byte a token, as asked
            assert torch.equal(
                torch.tensor(mds[i]["input_ids"], dtype=torch.long), dataset[i]["input_ids"]
            )


def test_the_default_trains_from_a_local_mds_copy_with_one_config_line(tmp_path, capsys):
    out = tmp_path / "mds"
    assert main(["data", "convert", "stdlib_text", str(out), *SMALL]) == 0
    config = tmp_path / "tiny.yaml"
    config.write_text(
        TINY.replace(
            TINY.splitlines()[1], f"data: {{name: streaming, local: {out}, batch_size: 8}}"
        )
    )
    assert main(["train", str(config), "--run-dir", str(tmp_path / "run")]) == 0
    printed = capsys.readouterr().out
    assert "final evaluation: metrics/eval/cross_entropy:" in printed
    assert "name: streaming" in (tmp_path / "run" / "config.yaml").read_text()


def test_convert_a_folder_of_files(tmp_path, capsys):
    folder = tmp_path / "files"
    folder.mkdir()
    for name in ("b.txt", "a.txt"):
        (folder / name).write_text(name)
    assert main(["data", "convert", str(folder), str(tmp_path / "out")]) == 0
    assert f"wrote 2 samples to {tmp_path / 'out'}" in capsys.readouterr().out
    data = streaming_loader(local=tmp_path / "out", batch_size=1, shuffle=False).dataset
    assert [data[0]["path"], data[1]["data"]] == ["a.txt", b"b.txt"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["nothing_here", "out"], "'nothing_here' is neither a folder nor a data factory; the "
                                  "data factories are stdlib_text, streaming"),
        (["stdlib_text", "out", "--set", "seq_len"], "--set 'seq_len' is not KEY=VALUE"),
        (["stdlib_text", "out", "--set", "seq_len=1"], "seq_len must be >= 2"),
    ],
)  # fmt: skip
def test_bad_convert_arguments_are_named(tmp_path, capsys, argv, message):
    argv[1] = str(tmp_path / argv[1])
    assert main(["data", "convert", *argv]) == 2
    assert message in capsys.readouterr().err


def test_convert_refuses_to_write_over_data(tmp_path, capsys):
    out = tmp_path / "mds"
    assert main(["data", "convert", "stdlib_text", str(out), *SMALL]) == 0
    assert main(["data", "convert", "stdlib_text", str(out), *SMALL]) == 2
    assert "is not empty; pass overwrite=True" in capsys.readouterr().err
    assert main(["data", "convert", "stdlib_text", str(out), *SMALL, "--overwrite"]) == 0
