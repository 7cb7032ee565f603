"""Fixtures of the checkpoint tests: a local S3 server, and an FSDP2-sharded run."""

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


@pytest.fixture(scope="session")
def sharded_trainer():
    """``make(world, sharded=True)``: a 3-batch run, FSDP2-sharded over ``world`` ranks."""
    return ckpt_runs.sharded_trainer
