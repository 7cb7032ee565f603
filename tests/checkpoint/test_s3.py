"""Checkpoints in S3, against a real S3 endpoint: a moto server on 127.0.0.1 (see conftest.py)."""

import logging
import traceback

import pytest
import torch
from botocore.exceptions import EndpointConnectionError
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from ckpt_runs import KillAt, in_child, trainer
from multirank import run_ranks
from toy import flat_params
from trainkit.checkpoint import (
    Checkpointer,
    CheckpointError,
    S3Storage,
    StorageError,
    inspect_checkpoint,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
    verify_checkpoint,
)


@pytest.fixture(autouse=True)
def one_thread():
    # Forked children run single-threaded; the parent matches them for bitwise comparisons.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _corrupt(s3, key):
    data = bytearray(s3.client.get_object(Bucket=s3.bucket, Key=key)["Body"].read())
    data[len(data) // 2] ^= 0xFF
    s3.client.put_object(Bucket=s3.bucket, Key=key, Body=bytes(data))


def test_save_and_load_round_trip_is_bitwise(s3, tmp_path):
    run = trainer(max_duration="5ba")
    run.fit()
    url = f"{s3.url}/runs/ckpt"
    scratch = tmp_path / "scratch"
    published = save_checkpoint(run.state, url, storage_options=s3.options, local_dir=scratch)
    assert published.wait() == url
    assert s3.objects() == [
        "runs/ckpt/.metadata",
        "runs/ckpt/__0_0.distcp",
        "runs/ckpt/trainkit-manifest.json",
        "runs/latest",
    ]
    assert list(scratch.iterdir()) == []  # the local staging copy is gone

    for path in (url, f"{s3.url}/runs", f"{s3.url}/runs/latest"):
        fresh = trainer()
        manifest = load_checkpoint(fresh.state, path, storage_options=s3.options, local_dir=scratch)
        assert manifest.timestamp["batch"] == 5
        assert fresh.state.timestamp == run.state.timestamp
        assert torch.equal(flat_params(fresh.state.model), flat_params(run.state.model))
        before = run.state.optimizers[0].state_dict()["state"]
        after = fresh.state.optimizers[0].state_dict()["state"]
        for index, values in before.items():
            assert torch.equal(values["exp_avg"], after[index]["exp_avg"])
    assert list(scratch.iterdir()) == []  # downloads are removed after loading

    assert list_checkpoints(f"{s3.url}/runs", storage_options=s3.options) == [url]
    assert verify_checkpoint(url, storage_options=s3.options).timestamp["batch"] == 5
    info = inspect_checkpoint(f"{s3.url}/runs", storage_options=s3.options)
    assert info["path"] == url and info["model"]["module.0.weight"]["shape"] == [16, 8]


def test_interval_and_keep_apply_remotely(s3, tmp_path):
    url = f"{s3.url}/run"
    trainer(url, interval="2ba", keep=2, max_duration="10ba",
            storage_options=s3.options, local_dir=tmp_path).fit()  # fmt: skip
    folders = {key.split("/")[1] for key in s3.objects("run/") if key.count("/") == 2}
    assert folders == {"ep1-ba10", "ep0-ba8"}  # every object of the rotated ones is gone
    assert list_checkpoints(url, storage_options=s3.options) == [
        f"{url}/ep1-ba10",
        f"{url}/ep0-ba8",
    ]
    assert s3.client.get_object(Bucket=s3.bucket, Key="run/latest")["Body"].read() == b"ep1-ba10\n"


@pytest.mark.parametrize("async_save", [False, True])
def test_autoresume_from_s3_after_kill_9_is_bitwise_equal(s3, tmp_path, async_save):
    url = f"{s3.url}/run"
    options = dict(interval="4ba", autoresume=True, async_save=async_save,
                   storage_options=s3.options, local_dir=tmp_path)  # fmt: skip

    assert in_child(lambda: trainer(url, callbacks=[KillAt(14)], **options).fit()) == -9
    names = [str(p).rsplit("/", 1)[1] for p in list_checkpoints(url, storage_options=s3.options)]
    expected = [["ep1-ba12", "ep0-ba8", "ep0-ba4"]]
    if async_save:  # the kill may come before batch 12's upload was committed
        expected.append(["ep0-ba8", "ep0-ba4"])
    assert names in expected

    resumed = trainer(url, **options)
    assert resumed.state.timestamp.batch == (12 if names[0] == "ep1-ba12" else 8)
    resumed.fit()
    reference = trainer()
    reference.fit()
    assert torch.equal(flat_params(resumed.state.model), flat_params(reference.state.model))
    assert not [
        key for key in s3.objects() if key.endswith(".incomplete")
    ]  # cleared by the next save


def test_corrupted_remote_shard_is_detected_and_autoresume_falls_back(s3, tmp_path):
    url = f"{s3.url}/run"
    trainer(url, interval="2ba", max_duration="4ba", storage_options=s3.options).fit()
    _corrupt(s3, "run/ep0-ba4/__0_0.distcp")
    with pytest.raises(
        CheckpointError, match=rf"{url}/ep0-ba4/__0_0\.distcp does not match its xxh3_128"
    ):
        load_checkpoint(trainer().state, f"{url}/ep0-ba4", storage_options=s3.options)
    with pytest.warns(
        UserWarning, match=rf"cannot resume from {url}/ep0-ba4 .*trying the previous"
    ):
        resumed = trainer(url, autoresume=True, storage_options=s3.options, local_dir=tmp_path)
    assert resumed.state.timestamp.batch == 2
    assert list(tmp_path.iterdir()) == []


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


def _full_model(state):
    # Gathered on rank 0 only (the other ranks get empty dicts).
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_model_state_dict(state.model, options=options)


def _save_sharded(rank, world, url, endpoint, make, scratch):
    run = make(world)
    run.fit()
    save_checkpoint(run.state, url, storage_options={"endpoint_url": endpoint}, local_dir=scratch)
    return _full_model(run.state)


def _load_sharded(rank, world, url, endpoint, make, scratch):
    run = make(world)
    load_checkpoint(run.state, url, storage_options={"endpoint_url": endpoint}, local_dir=scratch)
    return _full_model(run.state), run.state.timestamp.batch


def _assert_equal(a, b):
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_two_ranks_save_sharded_to_s3_then_load_on_two_and_on_one(s3, tmp_path, sharded_trainer):
    url, scratch = f"{s3.url}/run/ckpt", tmp_path / "scratch"
    saved = run_ranks(_save_sharded, 2, url, s3.endpoint, sharded_trainer, scratch)[0]
    shards = [key for key in s3.objects() if key.endswith(".distcp")]
    assert shards == [
        "run/ckpt/__0_0.distcp",
        "run/ckpt/__1_0.distcp",
    ]  # each rank uploaded its own

    (loaded, batch), (_, other_batch) = run_ranks(
        _load_sharded, 2, url, s3.endpoint, sharded_trainer, scratch
    )
    _assert_equal(loaded, saved)
    assert batch == other_batch == 3

    single = sharded_trainer(1, sharded=False)
    with pytest.warns(UserWarning, match="saved run had 2 ranks"):
        load_checkpoint(single.state, url, storage_options=s3.options, local_dir=scratch)
    _assert_equal(get_model_state_dict(single.state.model), saved)
    assert list(scratch.iterdir()) == []
