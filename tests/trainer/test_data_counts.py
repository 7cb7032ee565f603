"""Samples and tokens are counted over all data-parallel ranks, for packed and padded text:
``tok`` durations end at the same batch on every rank, and throughput sees every token."""

import pytest
import torch
from torch import nn

from multirank import run_ranks
from trainkit.core import DataSpec, SingleProcess, TrainModel
from trainkit.core.data import default_num_samples, default_num_tokens
from trainkit.trainer import Trainer


class TinyLM(TrainModel):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(32, 4)

    def forward(self, batch):
        return self.embed(batch["input_ids"]).sum(-1)

    def loss(self, outputs, batch):
        return outputs.pow(2).mean()


def padded_batches(lengths, rows=2, width=12):
    """Text batches of ``rows`` rows padded to ``width``; row i of batch b keeps lengths[b]."""
    batches = []
    for length in lengths:
        mask = torch.zeros(rows, width, dtype=torch.long)
        mask[:, :length] = 1
        batches.append({"input_ids": torch.randint(0, 32, (rows, width)), "attention_mask": mask})
    return batches


def test_packed_text_counts_sequences_and_every_token():
    # HF's flattening collator: one row, several sequences, each restarting position_ids.
    positions = torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2, 3]])
    packed = {"input_ids": torch.arange(9)[None], "labels": torch.arange(9)[None],
              "position_ids": positions}  # fmt: skip
    assert default_num_samples(packed) == 3
    assert default_num_tokens(packed) == 9
    padded = padded_batches([5])[0]
    assert default_num_samples(padded) == 2
    assert default_num_tokens(padded) == 2 * 5  # padding is not counted
    assert default_num_tokens((torch.zeros(4, 3), torch.zeros(4))) == 0


def _train_by_tokens(rank, world, sum_counts):
    # Rank 0's rows keep 2 tokens, rank 1's keep 5: 2 * 2 + 2 * 5 = 14 tokens a step.
    data = DataSpec(padded_batches([2 if rank == 0 else 5] * 6), sum_counts=sum_counts)
    trainer = Trainer(model=TinyLM(), train_dataloader=data, max_duration="30tok",
                      parallelism=SingleProcess(), progress_bar=False, device="cpu", seed=1)  # fmt: skip
    trainer.fit()
    ts = trainer.state.timestamp
    return ts.batch, ts.token, ts.sample, data.sum_counts


def test_token_durations_end_on_the_same_batch_on_every_rank():
    results = run_ranks(_train_by_tokens, 2, None)
    # 14 tokens a step on both ranks: 30 tokens are reached at batch 3 everywhere.
    assert results == [(3, 42, 12, True), (3, 42, 12, True)]


def test_counts_can_be_declared_equal_on_every_rank():
    # sum_counts=False trusts this rank's counts times the ranks (no collective): with
    # rank-dependent padding that is wrong, which is why it is not the default for text.
    results = run_ranks(_train_by_tokens, 2, False)
    assert [r[:2] for r in results] == [(4, 32), (2, 40)]


def _shared_batch_counts(rank, world):
    spec = DataSpec([], sum_counts=True)
    batch = padded_batches([3])[0]
    # Tensor parallel over both ranks: one data-parallel stream, its batch counted once.
    return spec.count_batch(batch, data_parallel_size=1), spec.count_batch(batch, 2)


def test_ranks_that_share_a_batch_count_it_once():
    assert run_ranks(_shared_batch_counts, 2) == [((2, 6), (4, 12))] * 2


def test_image_batches_need_no_collective():
    spec = DataSpec([(torch.zeros(4, 3), torch.zeros(4))])
    assert spec.count_batch((torch.zeros(4, 3), torch.zeros(4)), 1) == (4, 0)
    assert spec.sum_counts is None  # one process: nothing to decide


@pytest.mark.parametrize("batch", [{"input_ids": [1, 2]}, {"text": torch.zeros(2, 3)}])
def test_batches_without_token_tensors_count_no_tokens(batch):
    assert default_num_tokens(batch) == 0
