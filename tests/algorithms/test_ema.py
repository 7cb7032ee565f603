"""ema: the average equals a hand-computed EMA, evaluation and checkpoints hold it (the
training weights wait in the algorithm's state), and a resumed run is exact."""

import copy

import pytest
import torch

from toy import blobs, flat_params, loader, mlp
from trainkit.algorithms import EMA, EMAConfig
from trainkit.core import Callback
from trainkit.trainer import Trainer


class Snapshots(Callback):
    """The training weights after every optimizer step, seen at BEFORE_FORWARD of the next
    step (after a checkpoint event the model holds the average until the batch begins)."""

    def __init__(self):
        self.weights, self.at_checkpoint = [], []

    def before_forward(self, state, logger):
        self.weights.append({n: p.detach().clone() for n, p in state.model.named_parameters()})

    def batch_checkpoint(self, state, logger):
        self.at_checkpoint.append(copy.deepcopy(state.state_dict()))


def make(ema, callbacks=(), **kwargs):
    model = mlp(dropout=0.0)
    return Trainer(
        model=model,
        train_dataloader=loader(blobs(64)),
        optimizers=torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.5),
        max_duration=kwargs.pop("max_duration", "6ba"),
        algorithms=[ema],
        callbacks=list(callbacks),
        progress_bar=False,
        device="cpu",
        seed=1,
        **kwargs,
    )


def hand_ema(initial, weights, smoothing):
    expected = initial
    for w in weights:
        expected = {n: smoothing * expected[n] + (1 - smoothing) * w[n] for n in expected}
    return expected


def test_average_equals_a_hand_computed_ema_and_checkpoints_hold_it():
    ema, snaps = EMA(half_life="2ba"), Snapshots()
    trainer = make(ema, [snaps])
    initial = {n: p.detach().clone() for n, p in trainer.state.model.named_parameters()}
    trainer.fit()
    smoothing = 0.5 ** (1 / 2)
    # The weights each step trained from: the initial ones, then those after steps 1..5.
    trained = snaps.weights[1:]
    for step, saved in enumerate(snaps.at_checkpoint[:-1]):
        expected = hand_ema(initial, trained[: step + 1], smoothing)
        for name, tensor in saved["model"].items():  # the checkpoint's model is the average
            torch.testing.assert_close(tensor, expected[name], rtol=1e-5, atol=1e-6)
        held = saved["algorithms"]["EMA"]
        assert held["average_in_model"]
        for name, tensor in trained[step].items():  # the training weights wait in EMA's state
            assert torch.equal(held["held"][name], tensor)
    # The model ends on the average of all six steps.
    final = {n: p.detach() for n, p in trainer.state.model.named_parameters()}
    last = hand_ema(
        initial, [*trained, snaps.at_checkpoint[-1]["algorithms"]["EMA"]["held"]], smoothing
    )
    for name, tensor in final.items():
        torch.testing.assert_close(tensor, last[name], rtol=1e-5, atol=1e-6)


def test_steps_run_on_the_training_weights():
    ema, snaps = EMA(half_life="1ba"), Snapshots()
    plain, plain_snaps = make(EMA(half_life="1000000ba")), Snapshots()
    make(ema, [snaps]).fit()
    plain.state.callbacks.append(plain_snaps)
    plain.fit()
    # The training trajectory is the same as with (almost) no averaging at all.
    for a, b in zip(snaps.weights, plain_snaps.weights, strict=True):
        for name in a:
            torch.testing.assert_close(a[name], b[name])


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
    # Trainer.eval() (EVAL_STANDALONE_*) evaluates the average too, and leaves it in place.
    seen.clear()
    trainer.eval()
    torch.testing.assert_close(seen["eval"], ema.average["module.0.weight"])
    assert ema.average_in_model


def test_resume_from_a_mid_run_checkpoint_is_exact():
    full = make(EMA(half_life="3ba"))
    full.fit()
    snaps = Snapshots()
    first = make(EMA(half_life="3ba"), [snaps])
    first.fit()
    saved = snaps.at_checkpoint[2]  # taken after batch 3, with the average in the model
    resumed = make(EMA(half_life="3ba"))
    resumed.state.load_state_dict(copy.deepcopy(saved))
    resumed.fit()
    assert torch.equal(flat_params(resumed.state.model), flat_params(full.state.model))
    assert torch.equal(flat_params(first.state.model), flat_params(full.state.model))


def test_exchange_keeps_the_tensor_objects_and_copies_views():
    class WithView(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(3))
            self.base = torch.zeros(2, 3)
            self.register_buffer("row", self.base[0])  # a view: exchanged by copy

    module = WithView()
    ema = EMA()
    ema.held = {"weight": torch.full((3,), 2.0), "row": torch.full((3,), 5.0)}
    weight, row = module.weight, module.row
    ema._swap(module)
    assert module.weight is weight and module.row is row  # same objects (optimizer state)
    assert module.weight.tolist() == [2.0] * 3 and module.base[0].tolist() == [5.0] * 3
    ema._swap(module)
    assert module.weight.tolist() == [1.0] * 3 and module.base[0].tolist() == [0.0] * 3
    assert ema.held["weight"].tolist() == [2.0] * 3 and ema.held["row"].tolist() == [5.0] * 3


def test_loads_the_earlier_state_format():
    ema = EMA()
    average, stash = {"w": torch.ones(1)}, {"w": torch.zeros(1)}
    ema.load_state_dict({"average": average, "stash": stash})
    assert ema.held is stash and ema.average_in_model
    ema.load_state_dict({"average": average})
    assert ema.held is average and not ema.average_in_model


@pytest.mark.parametrize("half_life", ["1ep", "0ba", "soon"])
def test_bad_half_life(half_life):
    with pytest.raises(ValueError, match="half_life"):
        EMAConfig(half_life=half_life)
