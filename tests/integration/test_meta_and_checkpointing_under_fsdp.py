"""Under FSDP on 2 forked gloo ranks: activation checkpointing (trainkit-algorithms) trains
as one process without it, and a model built on the meta device loads a trainkit checkpoint
into its shards."""

import pytest
import torch

from multirank import run_ranks
from parallel.helpers import Blocks, full_weights, make_trainer, max_difference, to_bytes, train
from trainkit.algorithms import ActivationCheckpointing
from trainkit.checkpoint import save_checkpoint
from trainkit.parallel import FSDP


def _checkpointed(rank, world):
    return {
        mode: train(FSDP(), rank, world, algorithms=[ActivationCheckpointing(mode)])
        for mode in ("full", "selective", "offload")
    }


def test_activation_checkpointing_under_fsdp_trains_as_one_process_without_it():
    runs = run_ranks(_checkpointed, 2)[0]
    reference = train(None, 0, 1)
    for mode, weights in runs.items():
        assert max_difference(weights, reference) < 1e-5, mode


def _meta_loads(rank, world, folder):
    def on_meta():
        with torch.device("meta"):
            return Blocks()

    trainer = make_trainer(FSDP(), rank, world, model=on_meta, load_path=folder)
    return to_bytes(full_weights(trainer.state.model))


def test_a_meta_model_under_fsdp_loads_a_trainkit_checkpoint_into_its_shards(tmp_path):
    trained = make_trainer(None, 0, 1)
    trained.fit()  # weights that no init gives
    save_checkpoint(trained.state, tmp_path / "ckpt").wait()
    expected = full_weights(trained.state.model)
    loaded = run_ranks(_meta_loads, 2, str(tmp_path / "ckpt"))[0]
    assert max_difference(loaded, expected) == pytest.approx(0.0, abs=0.0)
