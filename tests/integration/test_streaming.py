"""Streaming from object storage with exact mid-epoch resume, elastic across world sizes.

MDS shards are written to a local S3 server (moto on 127.0.0.1); two gloo ranks train from
them with DDP and trainkit-checkpoint, are SIGKILLed mid-epoch, and the run is resumed on
two ranks and on one. Every epoch of each resumed history trains on every sample exactly
once, as the uninterrupted run does; on the same world size the weights are bitwise equal.
"""

import logging
import os
import shutil
import signal
import uuid
from pathlib import Path

import boto3
import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import Dataset

from multirank import run_ranks
from toy import flat_params
from trainkit.core import Callback, TrainModel
from trainkit.trainer import Trainer
from trainkit.trainer.streaming import write_mds

SAMPLES, BATCH = 96, 4  # 12 steps an epoch on two ranks, 24 on one
SAVE_EVERY, KILL_AT = 4, 18  # the last checkpoint before the kill: step 16, epoch 1 step 4


class Indexed(Dataset):
    def __init__(self, n):
        self.x = torch.randn(n, 8, generator=torch.Generator().manual_seed(0))

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"x": self.x[i], "y": int(self.x[i, 0] > 0), "index": i}


class Net(TrainModel):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 2))

    def forward(self, batch):
        return self.net(batch["x"])

    def loss(self, outputs, batch):
        return F.cross_entropy(outputs, batch["y"])


class Record(Callback):
    """Appends each trained batch's samples to a file (flushed: a SIGKILL loses none)."""

    def __init__(self, path):
        self.path = path

    def batch_end(self, state, logger):
        ts = state.timestamp
        with open(self.path, "a") as file:
            indices = ",".join(map(str, state.batch["index"].tolist()))
            file.write(f"{ts.epoch} {ts.batch} {indices}\n")


class KillAt(Callback):
    def __init__(self, batch):
        self.batch = batch

    def batch_checkpoint(self, state, logger):
        if state.timestamp.batch == self.batch:
            os.kill(os.getpid(), signal.SIGKILL)


def _train(rank, world, remote, work, tag, kill_at=None):
    from trainkit.trainer.streaming import streaming_loader

    torch.set_num_threads(1)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                      LOCAL_WORLD_SIZE=str(world))  # fmt: skip
    # A cache of its own: the killed run's shared memory still names its cache.
    loader = streaming_loader(remote=remote, local=work / f"cache-{tag}", batch_size=BATCH)
    callbacks = [Record(work / f"{tag}-rank{rank}.txt")]
    if kill_at is not None:
        callbacks.append(KillAt(kill_at))
    model = Net()
    trainer = Trainer(model=model, train_dataloader=loader, max_duration="2ep",
                      optimizers=torch.optim.AdamW(model.parameters(), lr=0.01),
                      callbacks=callbacks, save_folder=str(work / f"ckpt-{tag.split('-')[0]}"),
                      save_interval=f"{SAVE_EVERY}ba", autoresume=True, run_name="stream",
                      progress_bar=False, device="cpu", seed=3)  # fmt: skip
    resumed_at = trainer.state.timestamp.batch
    trainer.fit()
    return resumed_at, flat_params(trainer.state.parallelism.unwrap(trainer.state.model))


def _history(work, *tags_and_limits):
    """Samples per epoch of a history made of runs, each counted up to its global batch."""
    epochs: dict[int, list[int]] = {}
    for tag, upto in tags_and_limits:
        for path in sorted(work.glob(f"{tag}-rank*.txt")):
            for line in path.read_text().splitlines():
                epoch, batch, indices = line.split()
                if int(batch) <= upto:
                    epochs.setdefault(int(epoch), []).extend(map(int, indices.split(",")))
    return epochs


@pytest.fixture(scope="module")
def s3_data(tmp_path_factory):
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AWS_ACCESS_KEY_ID", "testing")
        patch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        patch.setenv("AWS_DEFAULT_REGION", "us-east-1")
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        endpoint = f"http://127.0.0.1:{server.get_host_and_port()[1]}"
        patch.setenv("S3_ENDPOINT_URL", endpoint)  # where streaming sends its S3 requests
        try:
            bucket = f"data-{uuid.uuid4().hex[:8]}"
            client = boto3.client("s3", endpoint_url=endpoint)
            client.create_bucket(Bucket=bucket)
            remote = f"s3://{bucket}/indexed"
            assert write_mds(Indexed(SAMPLES), remote, size_limit=1 << 10) == SAMPLES
            keys = [o["Key"] for o in client.list_objects_v2(Bucket=bucket)["Contents"]]
            assert "indexed/index.json" in keys and len(keys) > 4  # several shards
            yield remote
        finally:
            server.stop()


def test_kill_9_mid_epoch_then_resume_on_two_ranks_and_on_one(s3_data, tmp_path):
    work: Path = tmp_path
    full = run_ranks(_train, 2, s3_data, work, "full")
    assert [r[0] for r in full] == [0, 0]
    reference = _history(work, ("full", 10**9))
    assert sorted(reference) == [0, 1]
    for epoch in reference.values():
        assert sorted(epoch) == list(range(SAMPLES))  # each sample exactly once

    with pytest.raises(AssertionError, match="rank 0: exited without a result"):
        run_ranks(_train, 2, s3_data, work, "killed", KILL_AT)
    last_saved = KILL_AT // SAVE_EVERY * SAVE_EVERY
    shutil.copytree(work / "ckpt-killed", work / "ckpt-single")  # for the one-rank resume

    # Two ranks: the same samples, in the same batches, and bitwise the same weights.
    again = run_ranks(_train, 2, s3_data, work, "killed-on2")
    assert [r[0] for r in again] == [last_saved] * 2
    history = _history(work, ("killed", last_saved), ("killed-on2", 10**9))
    assert {e: sorted(s) for e, s in history.items()} == {
        e: sorted(s) for e, s in reference.items()
    }
    assert torch.equal(again[0][1], full[0][1]) and torch.equal(again[1][1], full[0][1])

    # One rank, from the same two-rank checkpoint: the rest of epoch 1 exactly, then epoch 2.
    assert run_ranks(_train_single, 1, s3_data, work) == [last_saved]
    history = _history(work, ("killed", last_saved), ("single", 10**9))
    for epoch in (0, 1):
        assert sorted(history[epoch]) == list(range(SAMPLES)), epoch
    trained_before = set(_history(work, ("killed", last_saved))[1])
    assert set(_history(work, ("single", 10**9))[1]) == set(range(SAMPLES)) - trained_before


def _train_single(rank, world, remote, work):
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resumed_at, _ = _train(rank, world, remote, work, "single")
    messages = [str(w.message) for w in caught]
    assert any("saved run had 2 ranks" in m for m in messages), messages  # the RNG streams
    return resumed_at
