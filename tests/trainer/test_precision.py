"""Precision as a component: one object owns autocast, loss scaling, the step and its state."""

import pytest
import torch

from toy import blobs, loader, mlp
from trainkit.core import MixedPrecision, ParallelStrategy, Precision
from trainkit.core.precision import make_precision
from trainkit.trainer import Trainer


def test_names_build_the_matching_precision():
    cpu = torch.device("cpu")
    assert type(make_precision("fp32", cpu)) is Precision
    bf16 = make_precision("amp_bf16", cpu)
    assert bf16.name == "amp_bf16" and bf16.autocast_dtype == torch.bfloat16
    assert not bf16.scales_loss and bf16.state_dict() == {}


def test_bf16_autocast_computes_matmuls_in_bf16_on_cpu():
    precision = make_precision("amp_bf16", torch.device("cpu"))
    with precision.autocast():
        out = torch.nn.Linear(4, 4)(torch.randn(2, 4))
    assert out.dtype == torch.bfloat16
    with make_precision("fp32", torch.device("cpu")).autocast():
        assert torch.nn.Linear(4, 4)(torch.randn(2, 4)).dtype == torch.float32


def test_an_fp16_scaler_is_reset_after_oom_keeping_its_scale(monkeypatch):
    # GradScaler on CPU is supported by torch.amp; the fp16 precision is built directly here
    # (the Trainer refuses amp_fp16 without CUDA).
    precision = MixedPrecision("cpu", torch.float16)
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    precision.backward(model(torch.randn(4, 3)).sum())
    precision.step([optimizer])
    scale = precision.scaler.get_scale()
    precision.backward(model(torch.randn(4, 3)).sum())
    precision.unscale_gradients(optimizer)  # a half-done step, then an OOM
    old = precision.scaler
    precision.reset_after_oom()
    assert precision.scaler is not old
    assert precision.scaler.get_scale() == scale
    precision.backward(model(torch.randn(4, 3)).sum())  # the retry
    precision.unscale_gradients(optimizer)  # allowed again: the per-step record is gone
    precision.step([optimizer])
    assert precision.scaler.get_scale() == scale


def test_fp16_state_round_trips():
    precision = MixedPrecision("cpu", torch.float16)
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    precision.backward(model(torch.randn(4, 3)).sum())
    precision.step([optimizer])
    other = MixedPrecision("cpu", torch.float16)
    other.load_state_dict(precision.state_dict())
    assert other.scaler.get_scale() == precision.scaler.get_scale()


def test_a_strategy_can_supply_the_precision():
    class Custom(Precision):
        name = "custom"

    class WithOwnPrecision(ParallelStrategy):
        def prepare(self, state):
            pass

        @property
        def data_parallel_size(self):
            return 1

        def precision_for(self, precision):
            return Custom(precision.device)

    trainer = Trainer(
        model=mlp(),
        train_dataloader=loader(blobs(32)),
        max_duration="1ba",
        parallelism=WithOwnPrecision(),
        progress_bar=False,
        device="cpu",
    )
    assert isinstance(trainer.state.precision, Custom)
    trainer.fit()


def test_a_precision_object_is_accepted_by_the_trainer():
    precision = MixedPrecision("cpu", torch.bfloat16)
    trainer = Trainer(
        model=mlp(),
        train_dataloader=loader(blobs(32)),
        max_duration="1ba",
        precision=precision,
        progress_bar=False,
        device="cpu",
    )
    assert trainer.state.precision is precision


def test_unknown_dtype_for_mixed_precision_is_refused():
    with pytest.raises(ValueError, match="bfloat16 or float16"):
        MixedPrecision("cpu", torch.float64)
