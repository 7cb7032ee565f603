"""Fixtures of the checkpoint tests: a local S3 server, storages by URL (S3 and fsspec's
in-memory and local file systems) for the shared storage tests, and an FSDP2-sharded run."""

from __future__ import annotations

import logging
import socket
import uuid
from types import SimpleNamespace

import pytest

import ckpt_runs

SECRET = "tEsT-sEcReT-kEy-0123456789abcdef"


@pytest.fixture(scope="module")
def s3_server():
    """A moto S3 server on 127.0.0.1 (``endpoint``), with dummy credentials in the
    environment (``secret``: the secret key). It binds port 0: the kernel picks the port."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AWS_ACCESS_KEY_ID", "testing-key-id")
        patch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
        patch.setenv("AWS_DEFAULT_REGION", "us-east-1")
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        port = server.get_host_and_port()[1]
        try:
            yield SimpleNamespace(endpoint=f"http://127.0.0.1:{port}", secret=SECRET)
        finally:
            server.stop()


@pytest.fixture
def refused_endpoint():
    """An http endpoint on 127.0.0.1 that refuses connections: its port stays bound by this
    fixture (so no other process can take it) and is never listened on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


@pytest.fixture
def s3(s3_server, monkeypatch):
    """A fresh bucket: ``url``, ``options`` (for storage_options), ``client``, ``objects()``."""
    import boto3

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing-key-id")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    bucket = f"ckpt-{uuid.uuid4().hex[:12]}"
    client = boto3.client("s3", endpoint_url=s3_server.endpoint)
    client.create_bucket(Bucket=bucket)

    def objects(prefix: str = "") -> list[str]:
        pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        return sorted(item["Key"] for page in pages for item in page.get("Contents", ()))

    return SimpleNamespace(
        url=f"s3://{bucket}",
        bucket=bucket,
        endpoint=s3_server.endpoint,
        options={"endpoint_url": s3_server.endpoint},
        client=client,
        objects=objects,
    )


def _fsspec_store(url):
    """``url``'s fsspec storage as the tests see it (see `remote`)."""
    from trainkit.checkpoint._fsspec import fsspec_storage

    storage = fsspec_storage(url)
    fs, root = storage.fs, storage.root

    def objects(prefix=""):
        found = (path[len(root) + 1 :] for path in fs.find(root))
        return sorted(key for key in found if key.startswith(prefix))

    return SimpleNamespace(
        url=url,
        options=None,
        objects=objects,
        read=lambda key: fs.cat_file(f"{root}/{key}"),
        write=lambda key, data: fs.pipe_file(f"{root}/{key}", data),
        storage=storage,
    )


def _s3_store(s3):
    def read(key):
        return s3.client.get_object(Bucket=s3.bucket, Key=key)["Body"].read()

    def write(key, data):
        s3.client.put_object(Bucket=s3.bucket, Key=key, Body=data)

    return SimpleNamespace(url=s3.url, options=s3.options, objects=s3.objects, read=read,
                           write=write, storage=None)  # fmt: skip


def _local_store(folder):
    def objects(prefix=""):
        found = (p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
        return sorted(key for key in found if key.startswith(prefix))

    return SimpleNamespace(
        url=str(folder),
        options=None,
        objects=objects,
        read=lambda key: (folder / key).read_bytes(),
        write=lambda key, data: (folder / key).write_bytes(data),
        storage=None,
    )


def _store(request):
    if request.param == "local":
        return _local_store(request.getfixturevalue("tmp_path_factory").mktemp("store"))
    if request.param == "s3":
        return _s3_store(request.getfixturevalue("s3"))
    if request.param == "fsspec-memory":
        url = f"memory://ckpt-{uuid.uuid4().hex[:12]}"
        store = _fsspec_store(url)
        fs, root = store.storage.fs, store.storage.root
        request.addfinalizer(lambda: fs.exists(root) and fs.rm(root, recursive=True))
        return store
    assert request.param == "fsspec-file", request.param
    folder = request.getfixturevalue("tmp_path_factory").mktemp("store")  # not in tmp_path
    return _fsspec_store(f"fsspec+file://{folder}")


@pytest.fixture(params=["s3", "fsspec-memory", "fsspec-file"])
def remote(request):
    """A storage reached by URL that the shared storage tests run on: S3 (moto), and
    `FsspecStorage` on fsspec's in-memory and local file systems. ``url`` (the root),
    ``options`` (storage_options), ``objects(prefix)`` (every key under the root, sorted),
    ``read(key)`` and ``write(key, data)`` behind the storage's back."""
    return _store(request)


@pytest.fixture(params=["local", "s3", "fsspec-memory", "fsspec-file"])
def store(request):
    """`remote`, and a local folder (``url`` its path): every kind of storage."""
    return _store(request)


@pytest.fixture(params=["local", "s3", "fsspec-file"])
def shared_store(request):
    """`store` without ``memory://``, for tests that fork (see `shared_remote`)."""
    return _store(request)


@pytest.fixture(params=["s3", "fsspec-file"])
def shared_remote(request):
    """`remote`, for tests that fork (a killed run, several ranks): ``memory://`` lives in one
    process, so only the storages other processes see."""
    return _store(request)


@pytest.fixture(scope="session")
def sharded_trainer():
    """``make(world, sharded=True)``: a 3-batch run, FSDP2-sharded over ``world`` ranks."""
    return ckpt_runs.sharded_trainer
