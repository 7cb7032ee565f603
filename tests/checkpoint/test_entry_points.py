"""trainkit-checkpoint's entry points resolve, as third-party ones would."""

import pytest

from trainkit.checkpoint import Checkpointer, LocalStorage, S3Storage, Storage, open_storage
from trainkit.checkpoint._cli import main
from trainkit.checkpoint._fsspec import fsspec_storage
from trainkit.core import plugins


def test_entry_points_resolve():
    assert plugins.load("trainkit.callbacks", "checkpointer") is Checkpointer
    assert plugins.load("trainkit.commands", "checkpoint") is main
    assert plugins.load("trainkit.storage", "s3") is S3Storage
    assert plugins.load("trainkit.storage", "file") is LocalStorage
    for scheme in ("gs", "gcs", "az", "abfs", "abfss", "hf", "memory"):
        assert plugins.load("trainkit.storage", scheme) is fsspec_storage


def test_storage_by_url(tmp_path):
    assert isinstance(open_storage(tmp_path), LocalStorage)
    local = open_storage(f"file://{tmp_path}")
    assert isinstance(local, Storage) and local.local_path("x") == tmp_path / "x"
    s3 = open_storage("s3://bucket/prefix", {"endpoint_url": "http://127.0.0.1:9"})
    assert isinstance(s3, Storage) and s3.url == "s3://bucket/prefix"
    with pytest.raises(
        Exception, match=r"no storage back end for nope:// URLs .*available: abfs, .*file, .*s3"
    ):
        open_storage("nope://bucket/prefix")
    with pytest.raises(
        ValueError, match=r"storage_options \['endpoint_url'\] were given for the local"
    ):
        open_storage(tmp_path, {"endpoint_url": "http://x"})
    with pytest.raises(ValueError, match=r"'s3://' is not an S3 URL"):
        S3Storage("s3://")
