"""mixup: inputs mixed exactly; dense targets mixed (interpolate_loss=False) or losses mixed (True)."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from toy import blobs, loader, mlp
from trainkit.algorithms import MixUp, MixUpConfig, mixup_batch
from trainkit.core import Callback, plugins
from trainkit.trainer import Classifier, Trainer


def test_mixup_batch_mixes_inputs_and_permutes_targets():
    x, y = torch.randn(4, 3), torch.tensor([0, 1, 2, 3])
    indices = torch.tensor([2, 0, 3, 1])
    mixed, y_perm, mixing = mixup_batch(x, y, mixing=0.25, indices=indices)
    torch.testing.assert_close(mixed, 0.75 * x + 0.25 * x[indices])
    assert y_perm.tolist() == [2, 0, 3, 1] and mixing == 0.25


def test_drawn_mixing_is_the_smaller_side_of_a_beta_sample():
    x, y = torch.arange(8.0).unsqueeze(1), torch.arange(8)
    for seed in range(20):
        torch.manual_seed(seed)
        z = float(torch.distributions.Beta(0.4, 0.4).sample())
        torch.manual_seed(seed)
        mixed, y_perm, mixing = mixup_batch(x, y, alpha=0.4)
        assert mixing == min(z, 1 - z) <= 0.5
        assert sorted(y_perm.tolist()) == list(range(8))
        torch.testing.assert_close(mixed, (1 - mixing) * x + mixing * y_perm.unsqueeze(1).float())


class Record(Callback):
    """Callbacks run after the algorithms at each event: they see what MixUp did."""

    def __init__(self, mixup, num_classes=2):
        self.mixup, self.k, self.raw, self.checks = mixup, num_classes, None, []

    def batch_start(self, state, logger):
        self.raw = state.batch

    def before_loss(self, state, logger):
        m, (_x, y) = self.mixup, self.raw
        targets = state.batch[1]
        if m.config.interpolate_loss:
            assert torch.equal(targets, y)
        else:  # the mixed one-hot targets, built here from the paper's formula
            one_hot = F.one_hot(y, self.k).float()
            torch.testing.assert_close(
                targets, (1 - m.mixing) * one_hot + m.mixing * one_hot[m.indices]
            )

    def after_loss(self, state, logger):
        m, (x, y) = self.mixup, self.raw
        inputs, targets = state.batch
        torch.testing.assert_close(inputs, (1 - m.mixing) * x + m.mixing * x[m.indices])
        assert torch.equal(targets, y)  # put back after the loss
        self.checks.append((m.mixing, state.loss.detach(), state.outputs.detach(), y, m.indices))


def train(mixup, model=None, num_classes=2, data=None):
    record = Record(mixup, num_classes)
    Trainer(
        model=model or mlp(dropout=0.0),
        train_dataloader=loader(data or blobs(64)),
        max_duration="4ba",
        algorithms=[mixup],
        callbacks=[record],
        progress_bar=False,
        device="cpu",
        seed=0,
    ).fit()
    assert len(record.checks) == 4
    assert len({m for m, *_ in record.checks}) == 4  # a fresh mixing weight every step
    return record.checks


@pytest.mark.parametrize("interpolate_loss", [False, True])
def test_cross_entropy_is_the_same_whether_targets_or_losses_are_mixed(interpolate_loss):
    for mixing, loss, outputs, y, perm in train(
        MixUp(alpha=1.0, interpolate_loss=interpolate_loss)
    ):
        mixed_losses = (1 - mixing) * F.cross_entropy(outputs, y) + mixing * F.cross_entropy(
            outputs, y[perm]
        )
        torch.testing.assert_close(loss, mixed_losses)


def brier(outputs, targets):
    """A loss that is not linear in the targets: mixing targets and mixing losses differ."""
    return (outputs.softmax(1) - targets).pow(2).sum(1).mean()


def test_dense_targets_reach_a_loss_that_is_not_linear_in_them():
    torch.manual_seed(0)
    model = Classifier(nn.Linear(8, 3), num_classes=3, loss_fn=brier)
    x = torch.randn(64, 8)
    data = torch.utils.data.TensorDataset(x, torch.randint(0, 3, (64,)))
    for mixing, loss, outputs, y, perm in train(MixUp(alpha=1.0), model, 3, data):
        one_hot = F.one_hot(y, 3).float()
        soft = (1 - mixing) * one_hot + mixing * one_hot[perm]
        torch.testing.assert_close(loss, brier(outputs, soft))
        interpolated = (1 - mixing) * brier(outputs, one_hot) + mixing * brier(
            outputs, one_hot[perm]
        )
        assert not torch.allclose(loss, interpolated)


def test_probability_targets_are_mixed_as_they_are():
    logits = torch.zeros(2, 3)
    from trainkit.algorithms._targets import mix_probabilities

    soft = torch.tensor([[0.5, 0.5, 0.0], [0.0, 0.2, 0.8]])
    mixed = mix_probabilities(logits, soft, soft.flip(0), 0.25, "mixup")
    torch.testing.assert_close(mixed, 0.75 * soft + 0.25 * soft.flip(0))
    with pytest.raises(
        ValueError, match=r"mixup needs class indices shaped \(2,\) or probabilities"
    ):
        mix_probabilities(logits, torch.zeros(2, 5), soft, 0.5, "mixup")
    with pytest.raises(ValueError, match="set interpolate_loss=True to mix the losses instead"):
        mix_probabilities({"logits": logits}, soft, soft, 0.5, "mixup")


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
