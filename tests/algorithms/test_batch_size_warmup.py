"""batch_size_warmup: a growing share of each batch is trained on, and counted."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

from trainkit.algorithms import (
    BatchSizeWarmup,
    BatchSizeWarmupConfig,
    set_batch_size,
    warmup_batch_size,
)
from trainkit.core import Callback, TrainModel
from trainkit.trainer import Trainer

LENGTH = 6


class Tokens(Dataset):
    def __init__(self, n=160):
        self.ids = torch.randint(0, 11, (n, LENGTH), generator=torch.Generator().manual_seed(0))

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i], "index": i}


class TinyLM(TrainModel):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed, self.head = nn.Embedding(11, 8), nn.Linear(8, 11)

    def forward(self, batch):
        return self.head(self.embed(batch["input_ids"]))

    def loss(self, outputs, batch):
        return F.cross_entropy(outputs.flatten(0, 1), batch["labels"].flatten())


def train(warmup, max_duration="8ba"):
    sizes = []

    class Probe(Callback):
        def before_forward(self, state, logger):
            batch = state.batch
            assert batch["labels"].shape == batch["input_ids"].shape == (len(batch["index"]), 6)
            sizes.append(batch["index"].tolist())

    trainer = Trainer(
        model=TinyLM(),
        train_dataloader=DataLoader(Tokens(), batch_size=16),
        max_duration=max_duration,
        algorithms=[warmup],
        callbacks=[Probe()],
        progress_bar=False,
        device="cpu",
    )
    trainer.fit()
    return sizes, trainer.state.timestamp


def test_trains_on_the_first_samples_of_each_batch_and_counts_only_those():
    warmup = BatchSizeWarmup(duration="0.5dur", initial_fraction=0.25, multiple_of=2)
    trained, timestamp = train(warmup)
    # batch b of 8: a warmup of 4 batches, 16 * (0.25 + 0.75 * b / 4) rounded down to even
    sizes = [len(indices) for indices in trained]
    assert sizes == [4, 6, 10, 12, 16, 16, 16, 16]
    assert [indices[0] for indices in trained] == [16 * b for b in range(8)]  # the first ones
    assert all(indices == list(range(indices[0], indices[0] + len(indices))) for indices in trained)
    assert timestamp.sample == sum(sizes) == 96
    assert timestamp.token == sum(sizes) * LENGTH
    assert timestamp.batch == 8


def test_a_warmup_in_samples_counts_the_samples_trained_on():
    trained, timestamp = train(BatchSizeWarmup(duration="40sp", initial_fraction=0.5))
    # samples trained on before each batch s: 0, 8, 17, 28, then 41 >= 40 (full batches);
    # 16 * (0.5 + 0.5 * s / 40) rounded down: 8, 9.6, 11.4, 13.6
    assert [len(i) for i in trained] == [8, 9, 11, 13, 16, 16, 16, 16]
    assert timestamp.sample == 105


def test_schedule_and_rounding():
    config = BatchSizeWarmupConfig(initial_fraction=0.125, multiple_of=4)
    progress = (0.0, 0.1, 0.5, 0.99, 1.0, 2.0)
    assert [warmup_batch_size(p, 64, config) for p in progress] == [8, 12, 36, 60, 64, 64]
    assert warmup_batch_size(0.0, 3, config) == 3  # smaller than one multiple: kept whole
    assert warmup_batch_size(0.0, 64, initial_fraction=0.01, multiple_of=4) == 4


def test_cuts_every_tensor_with_the_sample_dim_and_keeps_the_batch_type():
    batch = (torch.arange(8).view(4, 2), torch.arange(4), torch.zeros(3), "name")
    cut = set_batch_size(batch, 2)
    assert isinstance(cut, tuple) and cut[0].tolist() == [[0, 1], [2, 3]]
    assert cut[1].tolist() == [0, 1] and cut[2].shape == (3,) and cut[3] == "name"
    assert set_batch_size(batch, 4) is batch
    cut = set_batch_size([torch.ones(5, 2), torch.ones(5)], 3)
    assert isinstance(cut, list) and cut[1].shape == (3,)


def test_bad_config_and_batches_are_refused_with_what_is_accepted():
    with pytest.raises(ValueError, match="must be a positive fraction of training, batches"):
        BatchSizeWarmup(duration="2ep")
    with pytest.raises(ValueError, match=r"within \(0dur, 1dur\], got '1.5dur'"):
        BatchSizeWarmup(duration="1.5dur")
    with pytest.raises(ValueError, match=r"initial_fraction must be in \(0, 1\], got 0"):
        BatchSizeWarmup(initial_fraction=0)
    with pytest.raises(ValueError, match="multiple_of must be positive, got 0"):
        BatchSizeWarmup(multiple_of=0)
    with pytest.raises(ValueError, match="needs a dict, tuple or list batch holding tensors"):
        set_batch_size(torch.ones(4, 2), 2)
