"""MosaicML Streaming: MDS shards written from a data set or a folder, read back through a
StreamingDataset whose position is saved with the run and restored exactly."""

import copy
import os

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import Dataset, IterableDataset, TensorDataset

from multirank import run_ranks
from toy import flat_params
from trainkit.core import Callback, SingleProcess, TrainModel
from trainkit.core.data import StreamingPosition
from trainkit.trainer import Trainer
from trainkit.trainer.streaming import streaming_loader, write_mds


class Indexed(Dataset):
    """Samples ``{"x", "y", "index"}`` made from their index: any subset can be checked."""

    def __init__(self, n=64):
        generator = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 8, generator=generator)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"x": self.x[i], "y": int(self.x[i, 0] > 0), "index": i}


class IndexedModel(TrainModel):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 2))

    def forward(self, batch):
        return self.net(batch["x"])

    def loss(self, outputs, batch):
        return F.cross_entropy(outputs, batch["y"])


class Seen(Callback):
    """The samples each batch held, by (epoch, batch in epoch)."""

    def __init__(self):
        self.batches = {}

    def after_dataloader(self, state, logger):
        ts = state.timestamp
        self.batches[(ts.epoch, ts.batch_in_epoch)] = state.batch["index"].tolist()

    def batch_end(self, state, logger):
        if state.timestamp.batch == getattr(self, "stop_at", None):
            state.stop_training()


def _trainer(loader, seen, max_duration="2ep"):
    model = IndexedModel()
    return Trainer(model=model, train_dataloader=loader, callbacks=[seen],
                   optimizers=torch.optim.AdamW(model.parameters(), lr=0.01),
                   max_duration=max_duration, progress_bar=False, device="cpu", seed=3,
                   parallelism=SingleProcess())  # core alone: no trainkit-parallel  # fmt: skip


@pytest.fixture
def mds(tmp_path):
    out = tmp_path / "mds"
    assert write_mds(Indexed(64), out, size_limit=1 << 10) == 64
    return out


def test_a_streaming_run_resumes_mid_epoch_bitwise_reading_only_the_rest(mds):
    full_seen = Seen()
    full = _trainer(streaming_loader(local=mds, batch_size=8), full_seen)
    assert isinstance(full.state.train_data.position, StreamingPosition)
    full.fit()
    for epoch in (0, 1):  # every sample once per epoch, in a new order each epoch
        seen = [i for (e, _), b in full_seen.batches.items() if e == epoch for i in b]
        assert sorted(seen) == list(range(64))
    assert full_seen.batches[(0, 0)] != full_seen.batches[(1, 0)]

    first_seen = Seen()
    first_seen.stop_at = 11  # 8 batches an epoch: mid-epoch 1
    first = _trainer(streaming_loader(local=mds, batch_size=8), first_seen)
    first.fit()
    saved = copy.deepcopy(first.state.state_dict())

    seen = Seen()
    resumed = _trainer(streaming_loader(local=mds, batch_size=8), seen)
    resumed.state.load_state_dict(saved)
    resumed.fit()
    assert seen.batches == {k: v for k, v in full_seen.batches.items() if k >= (1, 3)}
    assert torch.equal(flat_params(resumed.state.model), flat_params(full.state.model))


def test_a_streaming_position_moves_to_another_number_of_workers(mds):
    first_seen = Seen()
    first_seen.stop_at = 3
    first = _trainer(streaming_loader(local=mds, batch_size=8), first_seen, max_duration="1ep")
    first.fit()
    saved = copy.deepcopy(first.state.state_dict())

    seen = Seen()
    loader = streaming_loader(local=mds, batch_size=8, num_workers=2)
    resumed = _trainer(loader, seen, max_duration="1ep")
    resumed.state.load_state_dict(saved)
    resumed.fit()
    before = [i for b in first_seen.batches.values() for i in b]
    after = [i for b in seen.batches.values() for i in b]
    assert len(before) == 24 and sorted(before + after) == list(range(64))


def test_mds_round_trip_of_tuples_dicts_and_files(tmp_path):
    data = TensorDataset(torch.randn(20, 3), torch.arange(20))
    write_mds(data, tmp_path / "tuples")
    batches = list(streaming_loader(local=tmp_path / "tuples", batch_size=5, shuffle=False))
    xs, ys = zip(*batches, strict=True)
    assert torch.equal(torch.cat(xs), data.tensors[0]) and torch.equal(
        torch.cat(ys), data.tensors[1]
    )

    # Narrower storage on request; integer columns come back as int64 for embeddings.
    texts = [{"input_ids": torch.arange(i, i + 6), "text": f"doc {i}"} for i in range(10)]
    write_mds(texts, tmp_path / "text", columns={"input_ids": "ndarray:uint8:6", "text": "str"})
    loader = streaming_loader(local=tmp_path / "text", batch_size=10, shuffle=False)
    assert loader.dataset[3]["input_ids"].dtype == np.uint8
    (batch,) = list(loader)
    assert batch["input_ids"].dtype == torch.int64
    assert torch.equal(batch["input_ids"], torch.stack([t["input_ids"] for t in texts]))
    assert batch["text"] == [t["text"] for t in texts]

    folder = tmp_path / "files"
    (folder / "b").mkdir(parents=True)
    (folder / "a.txt").write_bytes(b"first")
    (folder / "b" / "c.bin").write_bytes(bytes(range(7)))
    assert write_mds(folder, tmp_path / "from-files") == 2
    read = streaming_loader(local=tmp_path / "from-files", batch_size=1, shuffle=False).dataset
    assert [(read[i]["path"], read[i]["data"]) for i in range(2)] == [
        ("a.txt", b"first"),
        ("b/c.bin", bytes(range(7))),
    ]


class Stream(IterableDataset):
    def __iter__(self):
        yield from range(3)


def test_bad_sources_and_outputs_are_clear_errors(tmp_path, mds):
    with pytest.raises(FileExistsError, match="is not empty; pass overwrite=True"):
        write_mds(Indexed(4), mds)
    assert write_mds(Indexed(4), mds, overwrite=True) == 4
    with pytest.raises(TypeError, match="needs a map-style data set"):
        write_mds(Stream(), tmp_path / "x")
    with pytest.raises(ValueError, match=r"column 'when' holds a object"):
        write_mds([{"when": object()}], tmp_path / "y")
    with pytest.raises(ValueError, match=r"columns \['label'\] are not in the samples"):
        write_mds(Indexed(4), tmp_path / "z", columns={"label": "int64"})
    with pytest.raises(ValueError, match="is not a folder"):
        write_mds(str(tmp_path / "missing"), tmp_path / "w")


def test_streaming_batch_size_must_match_the_loader(mds):
    loader = streaming_loader(local=mds, batch_size=8)
    loader.dataset.batch_size = 4
    with pytest.raises(ValueError, match=r"batch_size=4\) must equal the DataLoader's"):
        _trainer(loader, Seen())


def _ranks_swapped_in_the_environment(rank, world, mds):
    # A launcher that numbers the ranks otherwise than the process group does.
    other = str(world - 1 - rank)
    os.environ.update(RANK=other, LOCAL_RANK=other, WORLD_SIZE=str(world),
                      LOCAL_WORLD_SIZE=str(world))  # fmt: skip
    loader = streaming_loader(local=mds, batch_size=8)
    try:
        _trainer(loader, Seen())
    except ValueError as err:
        return str(err)
    return None


def test_a_streaming_dataset_that_sees_another_rank_is_refused(mds):
    errors = run_ranks(_ranks_swapped_in_the_environment, 2, mds)
    assert "sees rank 1 of 2 but this process is rank 0 of 2" in errors[0]
    assert "launch with torchrun" in errors[1]


def test_a_shared_memory_name_taken_meanwhile_is_retried(mds, monkeypatch):
    # Two processes starting at once can pick the same free shared-memory prefix; the one
    # that creates it second gets FileExistsError, and a new attempt finds another.
    import streaming

    real, attempts = streaming.StreamingDataset, []

    def taken_once(**options):
        attempts.append(options)
        if len(attempts) == 1:
            raise FileExistsError(17, "File exists", "/000433_locals")
        return real(**options)

    monkeypatch.setattr(streaming, "StreamingDataset", taken_once)
    loader = streaming_loader(local=mds, batch_size=8)
    assert len(attempts) == 2 and isinstance(loader.dataset, real)
    assert len(list(loader)) == 8
