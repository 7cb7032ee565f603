"""A non-finite loss on one of two ranks that train one model (DDP from trainkit-parallel,
the default at world size 2): both stop with the error at the same batch. The one-rank
cases are in tests/trainer/test_nonfinite.py, whose helpers this uses."""

from __future__ import annotations

import math

import torch

from multirank import run_ranks
from trainer.test_nonfinite import BadLossAt, _trainer
from trainkit.trainer import NonFiniteLossError


def _two_ranks(rank, world):
    torch.manual_seed(0)
    run = _trainer(BadLossAt(4, math.nan, rank=1))
    try:
        run.fit()
    except NonFiniteLossError as err:
        return err.batch, str(err), run.state.timestamp.batch
    return None


def test_on_two_ranks_both_stop_at_the_same_batch_when_one_sees_nan():
    (batch0, message0, at0), (batch1, message1, at1) = run_ranks(_two_ranks, 2)
    assert batch0 == batch1 == 4
    assert at0 == at1  # no rank is left waiting in a collective
    assert "is nan on another rank" in message0 and "is nan:" in message1
