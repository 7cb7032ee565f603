"""label_smoothing: the loss is taken against exactly (1 - s) * one_hot + s / K."""

import pytest
import torch
import torch.nn.functional as F

from toy import blobs, loader, mlp
from trainkit.algorithms import LabelSmoothing, LabelSmoothingConfig, smooth_labels
from trainkit.core import Callback, plugins
from trainkit.trainer import Trainer


def test_smooth_labels_of_indices_and_of_probabilities():
    logits = torch.zeros(2, 4)
    smoothed = smooth_labels(logits, torch.tensor([1, 3]), smoothing=0.2)
    assert torch.allclose(
        smoothed, torch.tensor([[0.05, 0.85, 0.05, 0.05], [0.05, 0.05, 0.05, 0.85]])
    )
    probs = torch.tensor([[0.5, 0.5, 0.0, 0.0]])
    assert torch.allclose(
        smooth_labels(logits[:1], probs, smoothing=0.2), torch.tensor([[0.45, 0.45, 0.05, 0.05]])
    )
    # Classes along dim 1 for dense targets (segmentation).
    dense = smooth_labels(
        torch.zeros(1, 3, 2, 2), torch.zeros(1, 2, 2, dtype=torch.long), smoothing=0.3
    )
    assert dense.shape == (1, 3, 2, 2) and torch.allclose(dense[:, 0], torch.full((1, 2, 2), 0.8))


class Check(Callback):
    def __init__(self):
        self.targets, self.losses = [], []

    def before_loss(self, state, logger):
        self.targets.append(state.batch[1])

    def after_loss(self, state, logger):
        # Targets are restored after the loss; the loss equals torch's label-smoothed CE.
        assert state.batch[1].dtype == torch.int64
        expected = F.cross_entropy(state.outputs, state.batch[1], label_smoothing=0.1)
        self.losses.append((state.loss, expected))


def test_trainer_loss_equals_label_smoothed_cross_entropy():
    check = Check()
    Trainer(
        model=mlp(dropout=0.0),
        train_dataloader=loader(blobs(64)),
        max_duration="3ba",
        algorithms=[LabelSmoothing(smoothing=0.1)],
        callbacks=[check],
        progress_bar=False,
        device="cpu",
    ).fit()
    assert len(check.losses) == 3
    for loss, expected in check.losses:
        torch.testing.assert_close(loss, expected)


def test_smoothed_targets_follow_the_formula_for_every_target_form():
    g = torch.Generator().manual_seed(0)
    s, k = 0.2, 5
    # Class indices, classes along dim 1 for (N, K, H, W) outputs, and probabilities.
    cases = [
        (torch.randn(4, k, generator=g), torch.randint(0, k, (4,), generator=g)),
        (torch.randn(2, k, 3, 3, generator=g), torch.randint(0, k, (2, 3, 3), generator=g)),
        (torch.randn(4, k, generator=g), torch.rand(4, k, generator=g).softmax(1)),
    ]
    for logits, target in cases:
        if target.is_floating_point():
            probabilities = target
        else:
            probabilities = torch.zeros_like(logits).scatter_(1, target.unsqueeze(1), 1.0)
        expected = (1 - s) * probabilities + s / k  # Szegedy et al., eq. for q'(k)
        smoothed = smooth_labels(logits, target, smoothing=s)
        torch.testing.assert_close(smoothed, expected)
        torch.testing.assert_close(smoothed.sum(1), torch.ones_like(smoothed.sum(1)))
        # The cross-entropy against it is -sum_k q'(k) log p(k).
        reference = -(expected * logits.log_softmax(1)).sum(1).mean()
        torch.testing.assert_close(F.cross_entropy(logits, smoothed), reference)
    # Low-precision logits (autocast) still get float32 targets.
    assert smooth_labels(torch.zeros(2, 3, dtype=torch.bfloat16), torch.tensor([0, 1])).dtype == (
        torch.float32
    )


def test_combined_with_mixup_warns():
    from trainkit.algorithms import MixUp

    with pytest.warns(UserWarning, match="LabelSmoothing, MixUp all interpolate"):
        Trainer(
            model=mlp(),
            train_dataloader=loader(blobs(32)),
            max_duration="1ba",
            algorithms=[MixUp(), LabelSmoothing()],
            progress_bar=False,
            device="cpu",
        ).fit()


def test_bad_config():
    for smoothing in (-0.1, 1.0):
        with pytest.raises(ValueError, match=r"smoothing must be in \[0, 1\)"):
            LabelSmoothingConfig(smoothing=smoothing)
    with pytest.raises(
        ValueError,
        match=r"label_smoothing needs class indices shaped \(2,\) or probabilities shaped \(2, 3\)",
    ):
        smooth_labels(torch.zeros(2, 3), torch.zeros(2, 5))


def test_entry_point():
    assert plugins.load("trainkit.algorithms", "label_smoothing") is LabelSmoothing
