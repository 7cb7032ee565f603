"""A checkpoint written before trainkit-core and trainkit-trainer were split loads and resumes.

``data/pre_split`` was written by the code of commit 4c3b3f8, when the Trainer, its
schedules and metrics lived in trainkit-core: a classifier trained 4 batches with AdamW, a
cosine schedule with warm-up, EMA and label smoothing, checkpointed at batch 4
(``checkpoints/ep0-ba4``), then resumed from there to batch 12. The weights at both points
are beside it (``weights_at_4.safetensors``, ``weights_at_12.safetensors``).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file

from toy import blobs, loader, mlp
from trainkit.algorithms import EMA, LabelSmoothing
from trainkit.checkpoint import Checkpointer
from trainkit.core import Callback
from trainkit.trainer import Trainer
from trainkit.trainer.schedulers import CosineAnnealingWithWarmupScheduler

DATA = Path(__file__).parent / "data" / "pre_split"


class WeightsAfterLoad(Callback):
    def __init__(self) -> None:
        self.weights: dict[str, torch.Tensor] = {}
        self.batch = -1

    def after_load(self, state, logger) -> None:
        self.batch = state.timestamp.batch
        self.weights = {k: v.detach().clone() for k, v in state.model.state_dict().items()}


def test_a_checkpoint_from_before_the_split_resumes_to_the_same_weights(tmp_path):
    folder = tmp_path / "pre_split"
    shutil.copytree(DATA / "checkpoints", folder)
    model = mlp(dropout=0.2)
    seen = WeightsAfterLoad()
    trainer = Trainer(
        model=model,
        train_dataloader=loader(blobs(128)),
        optimizers=torch.optim.AdamW(model.parameters(), lr=0.01),
        schedulers=CosineAnnealingWithWarmupScheduler(t_warmup="2ba"),
        max_duration="12ba",
        algorithms=[EMA(half_life="2ba"), LabelSmoothing(smoothing=0.1)],
        callbacks=[
            Checkpointer(folder=str(tmp_path / "continued"), load_path=str(folder / "ep0-ba4")),
            seen,
        ],
        device_train_microbatch_size=8,
        progress_bar=False,
        device="cpu",
        seed=11,
    )
    assert seen.batch == 4
    at_4 = load_file(DATA / "weights_at_4.safetensors")
    assert at_4.keys() == seen.weights.keys()
    for name, value in at_4.items():
        assert torch.equal(seen.weights[name], value), name
    trainer.fit()
    assert trainer.state.timestamp.batch == 12
    at_12 = load_file(DATA / "weights_at_12.safetensors")
    weights = trainer.state.model.state_dict()
    for name, value in at_12.items():
        # The same arithmetic as the run that wrote them; a tolerance only for another CPU.
        torch.testing.assert_close(weights[name], value, rtol=1e-5, atol=1e-6)
    trainer.close()
