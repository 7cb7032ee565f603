"""mixup: inputs and targets are mixed exactly, through the Trainer and as a function."""

import pytest
import torch
import torch.nn.functional as F

from toy import blobs, loader, mlp
from trainkit.algorithms import MixUp, MixUpConfig, mixup_batch
from trainkit.core import Callback, Event, Trainer, plugins


def test_mixup_batch_mixes_inputs_and_permutes_targets():
    x, y = torch.randn(4, 3), torch.tensor([0, 1, 2, 3])
    indices = torch.tensor([2, 0, 3, 1])
    mixed, y_perm, mixing = mixup_batch(x, y, mixing=0.25, indices=indices)
    torch.testing.assert_close(mixed, 0.75 * x + 0.25 * x[indices])
    assert y_perm.tolist() == [2, 0, 3, 1] and mixing == 0.25


def test_drawn_mixing_is_a_beta_sample_and_indices_a_permutation():
    torch.manual_seed(0)
    x, y = torch.arange(8.0).unsqueeze(1), torch.arange(8)
    mixed, y_perm, mixing = mixup_batch(x, y, alpha=1.0)
    assert 0.0 <= mixing <= 1.0
    assert sorted(y_perm.tolist()) == list(range(8))
    torch.testing.assert_close(mixed, (1 - mixing) * x + mixing * y_perm.unsqueeze(1).float())


class Record(Callback):
    """Callbacks run after the algorithms at each event: they see what MixUp did."""

    def __init__(self, mixup):
        self.mixup, self.raw, self.checks = mixup, None, []

    def batch_start(self, state, logger):
        self.raw = state.batch

    def after_loss(self, state, logger):
        m = self.mixup
        x, y = self.raw
        inputs, _ = state.batch
        torch.testing.assert_close(inputs, torch.lerp(x, x[m.indices], m.mixing))
        # Loss against the mixed one-hot targets: the targets interpolate.
        soft = torch.lerp(F.one_hot(y, 2).float(), F.one_hot(y[m.indices], 2).float(), m.mixing)
        torch.testing.assert_close(state.loss, F.cross_entropy(state.outputs, soft))
        self.checks.append(m.mixing)


def test_trainer_trains_on_mixed_inputs_with_interpolated_loss():
    mixup = MixUp(alpha=1.0)
    record = Record(mixup)
    model = mlp(dropout=0.0)
    trainer = Trainer(
        model=model,
        train_dataloader=loader(blobs(64)),
        max_duration="4ba",
        algorithms=[mixup],
        callbacks=[record],
        progress_bar=False,
        device="cpu",
        seed=0,
    )
    trainer.fit()
    assert len(record.checks) == 4
    assert len(set(record.checks)) == 4  # a fresh mixing weight every step


def test_input_only_mixing_leaves_the_loss_alone():
    mixup = MixUp(alpha=1.0, interpolate_loss=False)
    assert mixup.match(Event.BEFORE_FORWARD, None)
    assert not mixup.match(Event.AFTER_LOSS, None)


@pytest.mark.parametrize("alpha", [0, -1.0])
def test_bad_alpha(alpha):
    with pytest.raises(ValueError, match="alpha must be positive"):
        MixUpConfig(alpha=alpha)


def test_bad_mixing_and_missing_key():
    with pytest.raises(ValueError, match=r"mixing must be in \[0, 1\], got 1.5"):
        mixup_batch(torch.zeros(2, 1), torch.zeros(2), mixing=1.5)
    with pytest.raises(ValueError, match=r"mixup mixes float inputs, got torch\.int64"):
        mixup_batch(torch.zeros(2, 4, dtype=torch.long), torch.zeros(2), mixing=0.5)
    mixup = MixUp(input_key="image")
    trainer = Trainer(
        model=mlp(),
        train_dataloader=loader(blobs(32)),
        max_duration="1ba",
        algorithms=[mixup],
        progress_bar=False,
        device="cpu",
    )
    with pytest.raises(Exception, match="mixup looks for item 'image' in the batch"):
        trainer.fit()


def test_entry_point():
    assert plugins.load("trainkit.algorithms", "mixup") is MixUp
