"""ema: the average equals a hand-computed EMA, is used for eval, and resumes exactly."""

import copy

import pytest
import torch

from toy import blobs, flat_params, loader, mlp
from trainkit.algorithms import EMA, EMAConfig
from trainkit.core import Callback, Trainer


class Snapshots(Callback):
    """Weights after every optimizer step (BATCH_END runs after the EMA update)."""

    def __init__(self):
        self.weights = []

    def batch_end(self, state, logger):
        self.weights.append({n: p.detach().clone() for n, p in state.model.named_parameters()})


def make(ema, callbacks=(), **kwargs):
    model = mlp(dropout=0.0)
    return Trainer(
        model=model,
        train_dataloader=loader(blobs(64)),
        optimizers=torch.optim.SGD(model.parameters(), lr=0.5),
        max_duration=kwargs.pop("max_duration", "6ba"),
        algorithms=[ema],
        callbacks=list(callbacks),
        progress_bar=False,
        device="cpu",
        seed=1,
        **kwargs,
    )


def test_average_equals_a_hand_computed_ema_and_ends_in_the_model():
    ema, snaps = EMA(half_life="2ba"), Snapshots()
    trainer = make(ema, [snaps])
    initial = {n: p.detach().clone() for n, p in trainer.state.model.named_parameters()}
    trainer.fit()
    smoothing = 0.5 ** (1 / 2)
    expected = initial
    for weights in snaps.weights:
        expected = {n: smoothing * expected[n] + (1 - smoothing) * weights[n] for n in expected}
    for name, param in trainer.state.model.named_parameters():
        torch.testing.assert_close(param.detach(), expected[name], rtol=1e-5, atol=1e-6)
    # The training weights wait in the algorithm's state.
    assert torch.equal(ema.stash["module.0.weight"], snaps.weights[-1]["module.0.weight"])


def test_eval_runs_on_the_average_and_training_goes_on_with_its_own_weights():
    seen = {}

    class Probe(Callback):
        def eval_start(self, state, logger):
            seen["eval"] = state.model.module[0].weight.detach().clone()

        def batch_end(self, state, logger):
            if state.timestamp.batch == 3:
                seen["train"] = state.model.module[0].weight.detach().clone()

    ema = EMA(half_life="1ba")
    trainer = make(
        ema, [Probe()], eval_dataloader=loader(blobs(16), shuffle=False), eval_interval="3ba"
    )
    trainer.fit(duration="3ba")
    assert not torch.equal(seen["eval"], seen["train"])
    torch.testing.assert_close(seen["eval"], ema.average["module.0.weight"])


def test_resume_is_exact_with_the_average_in_the_state():
    full = make(EMA(half_life="3ba"))
    full.fit()
    first = make(EMA(half_life="3ba"), max_duration="6ba")
    first.fit(duration="3ba")
    saved = copy.deepcopy(first.state.state_dict())
    resumed = make(EMA(half_life="3ba"))
    resumed.state.load_state_dict(saved)
    resumed.fit()
    assert torch.equal(flat_params(resumed.state.model), flat_params(full.state.model))


@pytest.mark.parametrize("half_life", ["1ep", "0ba", "soon"])
def test_bad_half_life(half_life):
    with pytest.raises(ValueError, match="half_life"):
        EMAConfig(half_life=half_life)
