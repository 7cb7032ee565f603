"""low_precision_groupnorm: GroupNorm computed in bf16 (on CPU too), close to fp32, runs last."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from trainkit.algorithms import (
    BlurPool,
    LowPrecisionGroupNorm,
    LowPrecisionGroupNormConfig,
    LPGroupNorm,
    apply_low_precision_groupnorm,
)
from trainkit.core import Callback, Engine, Event, Logger, State, plugins
from trainkit.trainer import Classifier, Trainer


def net():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.GroupNorm(4, 32), nn.ReLU(), nn.Linear(32, 2))
    with torch.no_grad():  # non-trivial affine parameters
        model[1].weight.uniform_(0.5, 1.5)
        model[1].bias.uniform_(-0.5, 0.5)
    return model


def test_computes_in_bf16_and_matches_fp32_within_tolerance():
    model = net()
    norm, weight = model[1], model[1].weight
    x = torch.randn(16, 32) * 3 + 1
    expected = norm(x)
    replaced = apply_low_precision_groupnorm(model)
    new = model[1]
    assert list(replaced) == ["1"] and isinstance(new, LPGroupNorm)
    assert new.weight is weight  # same parameters, same names
    assert set(dict(model.named_parameters())) == {
        "0.weight", "0.bias", "1.weight", "1.bias", "3.weight", "3.bias"
    }  # fmt: skip
    out = new(x)
    assert out.dtype == torch.float32  # drop-in in an fp32 model
    in_bf16 = F.group_norm(x.bfloat16(), 4, weight.bfloat16(), norm.bias.bfloat16(), norm.eps)
    assert torch.equal(out, in_bf16.float())
    assert not torch.equal(out, expected)
    torch.testing.assert_close(out, expected, atol=5e-2, rtol=2e-2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert new(x).dtype == torch.bfloat16  # autocast would have given fp32


def test_through_the_trainer_in_amp_bf16():
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(16, 8), torch.randint(0, 2, (16,)))
    seen = []

    class Probe(Callback):
        def after_forward(self, state, logger):
            seen.append(type(state.model.module[1]))

    trainer = Trainer(
        model=Classifier(net(), num_classes=2),
        train_dataloader=DataLoader(data, batch_size=8),
        max_duration="2ba",
        precision="amp_bf16",
        algorithms=[LowPrecisionGroupNorm()],
        callbacks=[Probe()],
        progress_bar=False,
        device="cpu",
    )
    before = trainer.state.model.module[1].weight.detach().clone()
    trainer.fit()
    assert seen == [LPGroupNorm, LPGroupNorm]
    assert trainer.state.model.module[1].low_precision_dtype == torch.bfloat16
    assert not torch.equal(trainer.state.model.module[1].weight, before)


def test_does_nothing_in_an_fp32_run_and_says_so():
    with pytest.warns(UserWarning, match="does nothing in an fp32 run"):
        trainer = Trainer(
            model=Classifier(net(), num_classes=2),
            train_dataloader=[(torch.randn(4, 8), torch.zeros(4, dtype=torch.long))],
            max_duration="1ba",
            algorithms=[LowPrecisionGroupNorm()],
            progress_bar=False,
            device="cpu",
        )
    assert type(trainer.state.model.module[1]) is nn.GroupNorm


def test_runs_after_other_surgery():
    log = []

    class LoggedLowPrecisionGroupNorm(LowPrecisionGroupNorm):
        def apply(self, event, state, logger):
            log.append("low_precision")

    class LoggedBlurPool(BlurPool):
        def apply(self, event, state, logger):
            log.append("blurpool")

    assert LowPrecisionGroupNorm.order == "last"
    state = State(
        model=nn.Linear(1, 1), algorithms=[LoggedLowPrecisionGroupNorm(), LoggedBlurPool()]
    )
    Engine(state, Logger([], state)).run_event(Event.INIT)
    assert log == ["blurpool", "low_precision"]


def test_warns_when_nothing_matches():
    with pytest.warns(UserWarning, match="low_precision_groupnorm matched no module"):
        apply_low_precision_groupnorm(nn.Sequential(nn.Linear(2, 2)))


def test_bad_config():
    with pytest.raises(ValueError, match="dtype 'float8' is not a low precision"):
        LowPrecisionGroupNormConfig(dtype="float8")


def test_entry_point():
    assert plugins.load("trainkit.algorithms", "low_precision_groupnorm") is LowPrecisionGroupNorm
