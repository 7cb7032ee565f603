"""seq_length_warmup: the sequence grows on schedule, every (N, L) tensor follows, tokens count."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

from trainkit.algorithms import (
    SeqLengthWarmup,
    SeqLengthWarmupConfig,
    set_batch_sequence_length,
    warmup_sequence_length,
)
from trainkit.core import Callback, TrainModel, plugins
from trainkit.trainer import Trainer


class Tokens(Dataset):
    def __init__(self, n=64, length=32):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, 11, (n, length), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {
            "input_ids": self.ids[i],
            "attention_mask": torch.ones_like(self.ids[i]),
            "labels": self.ids[i],
        }


class TinyLM(TrainModel):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed, self.head = nn.Embedding(11, 8), nn.Linear(8, 11)

    def forward(self, batch):
        return self.head(self.embed(batch["input_ids"]))

    def loss(self, outputs, batch):
        return F.cross_entropy(outputs.flatten(0, 1), batch["labels"].flatten())


def test_schedule():
    cfg = SeqLengthWarmupConfig(duration=0.5, min_seq_length=8, max_seq_length=32, step_size=8)
    # 8 + (24 * elapsed / 0.5) rounded down to a multiple of 8, then 32 from half-way.
    elapsed = (0.0, 0.2, 0.25, 0.4, 0.5, 0.9)
    assert [warmup_sequence_length(e, cfg) for e in elapsed] == [8, 16, 16, 24, 32, 32]


def test_truncate_and_reshape():
    batch = {
        "input_ids": torch.arange(12).view(2, 6),
        "attention_mask": torch.ones(2, 6),
        "meta": torch.zeros(2),
    }
    cut = set_batch_sequence_length(batch, 4)
    assert cut["input_ids"].tolist() == [[0, 1, 2, 3], [6, 7, 8, 9]] and cut[
        "attention_mask"
    ].shape == (2, 4)
    assert cut["meta"] is batch["meta"]
    rows = set_batch_sequence_length(batch, 3, truncate=False)
    assert rows["input_ids"].tolist() == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, 11]]
    assert set_batch_sequence_length(batch, 8)["input_ids"] is batch["input_ids"]


def test_trainer_grows_the_sequence_on_schedule_and_counts_tokens():
    lengths = []

    class Probe(Callback):
        def before_forward(self, state, logger):
            assert state.batch["labels"].shape == state.batch["input_ids"].shape
            lengths.append(state.batch["input_ids"].shape[1])

    warmup = SeqLengthWarmup(duration=0.5, min_seq_length=8, max_seq_length=32, step_size=8)
    trainer = Trainer(
        model=TinyLM(),
        train_dataloader=DataLoader(Tokens(), batch_size=8),
        max_duration="8ba",
        algorithms=[warmup],
        callbacks=[Probe()],
        progress_bar=False,
        device="cpu",
    )
    trainer.fit()
    # elapsed b/8 over a warmup of 0.5: 8 + floor(24 * b/4 / 8) * 8 until b = 4.
    assert lengths == [8, 8, 16, 24, 32, 32, 32, 32]
    assert trainer.state.timestamp.token == 8 * sum(lengths)


def test_bad_config_and_batches():
    with pytest.raises(ValueError, match="min_seq_length 12 is not a multiple of step_size 8"):
        SeqLengthWarmupConfig(min_seq_length=12)
    with pytest.raises(ValueError, match="max_seq_length 8 is below min_seq_length 16"):
        SeqLengthWarmupConfig(min_seq_length=16, max_seq_length=8)
    with pytest.raises(ValueError, match=r"duration must be in \(0, 1\], got 0"):
        SeqLengthWarmupConfig(duration=0)
    with pytest.raises(ValueError, match="needs dict batches with an 'input_ids' tensor"):
        set_batch_sequence_length((torch.zeros(2, 4), torch.zeros(2)), 2)


def test_entry_point():
    assert plugins.load("trainkit.algorithms", "seq_length_warmup") is SeqLengthWarmup
