"""`upload_folder` on the local destinations: the file logger copies the folder into the
run's folder (and leaves one already there in place), the in-memory one records each file.
wandb and MLflow, read back with their own tools, are in test_remote.py."""

import pytest

from trainkit.core import Logger
from trainkit.loggers import FileLogger, InMemoryLogger


def _folder(root):
    files = {".metadata": b"meta", "__0_0.distcp": b"shard", "hf/config.json": b"{}"}
    for relative, data in files.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_bytes(data)
    return files


def _read(root):
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_file_logger_copies_a_folder_into_the_run_folder(tmp_path):
    files = _folder(tmp_path / "elsewhere" / "ep1-ba4")
    file = FileLogger(folder=tmp_path / "run")
    file.upload_folder("checkpoints/ep1-ba4", tmp_path / "elsewhere" / "ep1-ba4")
    assert _read(tmp_path / "run" / "checkpoints" / "ep1-ba4") == files
    with pytest.raises(FileExistsError, match="overwrite=True"):
        file.upload_folder("checkpoints/ep1-ba4", tmp_path / "elsewhere" / "ep1-ba4")
    (tmp_path / "elsewhere" / "ep1-ba4" / ".metadata").write_bytes(b"new")
    file.upload_folder("checkpoints/ep1-ba4", tmp_path / "elsewhere" / "ep1-ba4", overwrite=True)
    assert _read(tmp_path / "run" / "checkpoints" / "ep1-ba4")[".metadata"] == b"new"
    file.close()


def test_file_logger_leaves_a_folder_already_in_the_run_folder_in_place(tmp_path):
    # The CLI's layout: checkpoints are saved in <run>/checkpoints, the metrics file in <run>.
    checkpoint = tmp_path / "run" / "checkpoints" / "ep1-ba4"
    files = _folder(checkpoint)
    file = FileLogger(folder=tmp_path / "run")
    Logger([file]).upload_folder("checkpoints/ep1-ba4", checkpoint)  # no FileExistsError
    file.upload_file("checkpoints/ep1-ba4/.metadata", checkpoint / ".metadata")
    assert _read(checkpoint) == files
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["checkpoints"]
    file.close()


def test_in_memory_logger_records_each_file_of_the_folder(tmp_path):
    files = _folder(tmp_path / "ep1-ba4")
    memory = InMemoryLogger()
    Logger([memory]).upload_folder("checkpoints/ep1-ba4", tmp_path / "ep1-ba4")
    assert memory.files == [
        (f"checkpoints/ep1-ba4/{relative}", tmp_path / "ep1-ba4" / relative)
        for relative in sorted(files)
    ]
