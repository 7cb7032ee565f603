"""What only S3 does, against a real S3 endpoint (a moto server on 127.0.0.1, see
conftest.py): boto3's retries, and its errors. What every storage does is tested on S3 too,
in test_remote_storage.py."""

import logging
import traceback

import pytest
from botocore.exceptions import EndpointConnectionError

from ckpt_runs import trainer
from trainkit.checkpoint import (
    Checkpointer,
    CheckpointError,
    S3Storage,
    StorageError,
    list_checkpoints,
    save_checkpoint,
)


class FlakyClient:
    """A boto3 client whose first ``failures`` uploads (of keys ending with ``only``) fail as
    if the network dropped."""

    def __init__(self, client, failures, only=""):
        self.client, self.failures, self.only, self.uploaded = client, failures, only, []

    def __getattr__(self, name):
        return getattr(self.client, name)

    def _upload(self, key, send):
        if self.failures and key.endswith(self.only):
            self.failures -= 1
            raise EndpointConnectionError(endpoint_url="http://127.0.0.1/flaky")
        result = send()
        self.uploaded.append(key)
        return result

    def upload_file(self, **kwargs):
        return self._upload(kwargs["Key"], lambda: self.client.upload_file(**kwargs))

    def put_object(self, **kwargs):
        return self._upload(kwargs["Key"], lambda: self.client.put_object(**kwargs))


def test_uploads_are_retried_and_the_manifest_goes_up_after_every_shard(s3):
    run = trainer(max_duration="2ba")
    run.fit()
    flaky = FlakyClient(s3.client, failures=3)
    options = {"client": flaky, "backoff": 0.001}
    save_checkpoint(run.state, f"{s3.url}/run/ckpt", storage_options=options)
    assert flaky.failures == 0
    files = [key for key in flaky.uploaded if key.endswith((".distcp", ".metadata"))]
    assert len(files) == 2
    manifest = flaky.uploaded.index("run/ckpt/trainkit-manifest.json")
    assert all(flaky.uploaded.index(key) < manifest for key in files)
    assert flaky.uploaded[-1] == "run/latest"
    assert "run/ckpt/.incomplete" not in s3.objects()

    # A failure that outlasts the retries: a clear error, and nothing is published.
    broken = FlakyClient(s3.client, failures=100, only="trainkit-manifest.json")
    with pytest.raises(StorageError, match=r"cannot reach .* \(tried 3 times\)"):
        save_checkpoint(run.state, f"{s3.url}/run/ep9-ba99",
                        storage_options={"client": broken, "attempts": 3, "backoff": 0.001})  # fmt: skip
    assert "run/ep9-ba99/__0_0.distcp" in s3.objects()  # the shards went up, the manifest not
    assert list_checkpoints(f"{s3.url}/run", storage_options=s3.options) == [f"{s3.url}/run/ckpt"]
    assert s3.client.get_object(Bucket=s3.bucket, Key="run/latest")["Body"].read() == b"ckpt\n"
    # The next Checkpointer to save there clears what the failed save left.
    Checkpointer(folder=f"{s3.url}/run", storage_options=s3.options).save(run.state)
    assert not [key for key in s3.objects() if key.startswith("run/ep9-ba99/")]


class Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def test_unreachable_endpoint_is_a_clear_error_without_secrets(s3_server, refused_endpoint):
    dead = refused_endpoint  # nothing listens there
    options = {
        "endpoint_url": dead,
        "aws_access_key_id": "AKIA-test",
        "aws_secret_access_key": s3_server.secret[::-1],
        "attempts": 2,
        "backoff": 0.001,
    }
    records, root = Records(), logging.getLogger()
    level = root.level
    root.addHandler(records)
    root.setLevel(logging.DEBUG)
    try:
        with pytest.raises(CheckpointError) as failed:
            save_checkpoint(trainer().state, "s3://nowhere/run/ckpt", storage_options=options)
        # The Trainer reports it as the Checkpointer's failure, with the message.
        with pytest.raises(RuntimeError, match="StorageError: cannot reach the S3 endpoint"):
            trainer("s3://nowhere/run", autoresume=True, storage_options=options)
    finally:
        root.removeHandler(records)
        root.setLevel(level)
    message = str(failed.value)
    assert f"cannot reach the S3 endpoint {dead} for bucket 'nowhere'" in message
    assert "Check endpoint_url" in message
    shown = "".join(traceback.format_exception(failed.value)) + "\n".join(records.messages)
    assert any("retrying" in m for m in records.messages)
    for secret in (s3_server.secret, s3_server.secret[::-1]):
        assert secret not in shown
        assert secret not in repr(S3Storage("s3://nowhere", **options))
