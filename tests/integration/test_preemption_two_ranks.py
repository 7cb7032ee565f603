"""Preemption on two ranks that train one model (DDP from trainkit-parallel, the default at
world size 2): both stop after the same batch, save, exit 75 and resume bitwise. The
one-rank cases are in tests/checkpoint/test_preemption.py, whose helpers these use."""

from __future__ import annotations

import signal

import pytest
import torch

from checkpoint.test_preemption import BATCHES, LAG, SignalAt, _batch, _name, _trainer
from multirank import run_ranks
from toy import flat_params
from trainkit.core import PREEMPTED_EXIT_CODE, TrainingPreempted


def _ranks_preempted(rank, world, folder, batch, sig, async_save):
    run = _trainer(
        folder,
        callbacks=[SignalAt(batch, sig, rank=1)],  # rank 0 is never signalled itself
        interval="5ba",
        async_save=async_save,
    )
    try:
        run.fit()
    except TrainingPreempted as err:
        return err.code, err.request.signal, err.request.batch, err.request.checkpoint
    return "not preempted"


def _ranks_resumed(rank, world, folder):
    resumed = _trainer(folder, interval="5ba", autoresume=True)
    at = resumed.state.timestamp.batch
    resumed.fit()
    return at, flat_params(resumed.state.model)


def _ranks_reference(rank, world):
    run = _trainer(None)
    run.fit()
    return flat_params(run.state.model)


@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_two_ranks_stop_after_the_same_batch_when_one_is_signalled(tmp_path, sig, async_save):
    batch = _batch(sig, async_save, 2, last=BATCHES - 1 - LAG)
    results = run_ranks(_ranks_preempted, 2, tmp_path, batch, sig, async_save)
    (code0, sig0, stop0, saved0), (code1, sig1, stop1, saved1) = results
    assert code0 == code1 == PREEMPTED_EXIT_CODE
    assert (sig0, sig1) == ("", sig.name)  # rank 0 learnt of it from rank 1
    assert stop0 == stop1 == batch + LAG
    name = _name(stop0)
    assert saved0 == saved1 == str(tmp_path / name)
    assert (tmp_path / "latest").read_text() == f"{name}\n"
    resumed = run_ranks(_ranks_resumed, 2, tmp_path)
    reference = run_ranks(_ranks_reference, 2)
    for (at, params), expected in zip(resumed, reference, strict=True):
        assert at == stop0
        assert torch.equal(params, expected)
