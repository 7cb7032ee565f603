"""`Logger.upload_folder`: a folder given to every destination as one artifact; by default
file by file, in sorted order, never following a link out of the folder."""

import os
import warnings

import pytest

from trainkit.core import Logger, LoggerDestination


class Files(LoggerDestination):
    """Records what the default `upload_folder` hands to `upload_file`."""

    def __init__(self):
        self.uploads = []

    def upload_file(self, name, path, overwrite=False):
        self.uploads.append((name, path.read_bytes(), overwrite))


class Folders(LoggerDestination):
    """Keeps a folder as one artifact (overrides upload_folder)."""

    def __init__(self):
        self.folders = []

    def upload_folder(self, name, path, overwrite=False):
        self.folders.append((name, sorted(self.folder_files(path))))


class Broken(LoggerDestination):
    def upload_folder(self, name, path, overwrite=False):
        raise OSError("quota exceeded")


def _checkpoint_like(root):
    files = {".metadata": b"meta", "__0_0.distcp": b"shard0", "sub/deeper/x.bin": b"xyz"}
    for relative, data in files.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_bytes(data)
    return files


def test_the_default_gives_every_regular_file_in_sorted_order(tmp_path):
    folder = tmp_path / "ep1-ba4"
    files = _checkpoint_like(folder)
    files_dest, folders_dest = Files(), Folders()
    Logger([files_dest, folders_dest]).upload_folder("checkpoints/ep1-ba4", folder)
    expected = sorted(files)
    assert files_dest.uploads == [
        (f"checkpoints/ep1-ba4/{relative}", files[relative], False) for relative in expected
    ]
    assert folders_dest.folders == [("checkpoints/ep1-ba4", expected)]


def test_links_are_never_followed_out_of_the_folder(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("not yours")
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "kept.txt").write_text("kept")
    os.symlink(outside / "secret.txt", folder / "linked-file.txt")
    os.symlink(outside, folder / "linked-folder")
    destination = Files()
    Logger([destination]).upload_folder("run", folder, overwrite=True)
    assert destination.uploads == [("run/kept.txt", b"kept", True)]
    assert LoggerDestination.folder_files(folder) == ["kept.txt"]


def test_a_failing_destination_warns_once_and_the_others_still_receive(tmp_path):
    folder = tmp_path / "f"
    _checkpoint_like(folder)
    received = Folders()
    logger = Logger([Broken(), received])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        logger.upload_folder("a", folder)
        logger.upload_folder("b", folder)
    (warning,) = caught
    assert "Broken.upload_folder failed" in str(warning.message)
    assert "quota exceeded" in str(warning.message)
    assert [name for name, _ in received.folders] == ["a", "b"]


def test_a_path_that_is_not_a_folder_is_refused(tmp_path):
    file = tmp_path / "model.pt"
    file.write_bytes(b"x")
    destination = Files()
    logger = Logger([destination])
    for path in (file, tmp_path / "missing"):
        with pytest.raises(NotADirectoryError, match="is not a folder; give a local folder"):
            logger.upload_folder("x", path)
    assert destination.uploads == []
