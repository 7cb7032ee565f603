"""Mixed precision on a CUDA device (run with `uv run pytest -m gpu`; skipped without one)."""

import pytest
import torch

from toy import blobs, loader, mlp
from trainkit.core import Callback, MixedPrecision
from trainkit.trainer import Trainer

pytestmark = pytest.mark.gpu


class Losses(Callback):
    def __init__(self):
        self.losses = []

    def after_loss(self, state, logger):
        self.losses.append(float(state.loss.detach()))


def fit(precision, **kwargs):
    losses = Losses()
    model = mlp(dropout=0.0)
    trainer = Trainer(
        model=model,
        optimizers=torch.optim.AdamW(model.parameters(), lr=0.02),
        train_dataloader=loader(blobs(256), batch_size=32),
        max_duration="6ep",
        precision=precision,
        device="cuda",
        callbacks=[losses],
        progress_bar=False,
        seed=0,
        **kwargs,
    )
    trainer.fit()
    return trainer, losses.losses


@pytest.mark.parametrize("precision", ["amp_bf16", "amp_fp16"])
def test_mixed_precision_trains_on_cuda(precision):
    trainer, losses = fit(precision)
    assert isinstance(trainer.state.precision, MixedPrecision)
    assert trainer.state.precision.name == precision
    assert trainer.state.model.module[0].weight.dtype == torch.float32  # parameters stay fp32
    assert sum(losses[-8:]) / 8 < 0.5 * sum(losses[:8]) / 8


def test_fp16_scales_the_loss_and_saves_the_scaler():
    trainer, _ = fit("amp_fp16")
    precision = trainer.state.precision
    assert precision.scales_loss and precision.scaler is not None
    saved = trainer.state.state_dict()["precision"]["scaler"]
    assert saved["scale"] == precision.scaler.get_scale()
