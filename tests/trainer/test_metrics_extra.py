"""LossMetric and MaskedAccuracy, and torchmetrics' metrics (BinaryF1, IoU, Dice) used by the
Trainer as they are: every value is checked against a reference computed here by hand."""

import math

import pytest
import torch
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from multirank import run_ranks
from trainkit.core import TrainModel
from trainkit.trainer import Trainer
from trainkit.trainer.metrics import BitsPerToken, CrossEntropy, LossMetric, MaskedAccuracy

torchmetrics = pytest.importorskip("torchmetrics")


class Scores(TrainModel):
    """A 'model' whose outputs are the batch's first element: the metrics see known scores."""

    def __init__(self, metrics):
        super().__init__()
        self.metrics = metrics
        self.weight = torch.nn.Parameter(torch.zeros(()))  # something to optimise

    def forward(self, batch):
        return batch[0]

    def loss(self, outputs, batch):
        return self.weight * 0

    def get_metrics(self, is_train=False):
        import copy

        return copy.deepcopy(self.metrics)


def _evaluate(metrics, scores, targets, batch_size=8, **kwargs):
    data = DataLoader(TensorDataset(scores, targets), batch_size=batch_size)
    trainer = Trainer(
        model=Scores(metrics), eval_dataloader=data, device="cpu", progress_bar=False, **kwargs
    )
    first = trainer.eval()
    second = trainer.eval()  # metrics are reset between evaluations
    for key in first:
        assert torch.equal(torch.as_tensor(first[key]), torch.as_tensor(second[key]))
    return {key.split("/")[-1]: value for key, value in first.items()}


def test_loss_metric_is_the_mean_over_samples_with_a_smaller_last_batch():
    generator = torch.Generator().manual_seed(0)
    preds, targets = (
        torch.randn(21, 3, generator=generator),
        torch.randn(21, 3, generator=generator),
    )
    results = _evaluate({"mse": LossMetric(F.mse_loss)}, preds, targets, batch_size=8)
    # 8 + 8 + 5 samples: the result is the mean over all of them.
    assert results["mse"].item() == pytest.approx(F.mse_loss(preds, targets).item(), rel=1e-6)
    batch_means = [F.mse_loss(preds[i : i + 8], targets[i : i + 8]) for i in (0, 8, 16)]
    assert results["mse"].item() != pytest.approx(torch.stack(batch_means).mean().item())


def test_masked_accuracy_counts_only_the_unmasked_positions():
    generator = torch.Generator().manual_seed(1)
    logits = torch.randn(12, 7, 5, generator=generator)  # (N, S, V)
    labels = torch.randint(0, 5, (12, 7), generator=generator)
    labels[torch.rand(12, 7, generator=generator) < 0.4] = -100
    results = _evaluate({"acc": MaskedAccuracy()}, logits, labels, batch_size=5)
    kept = labels != -100
    expected = (logits.argmax(-1)[kept] == labels[kept]).float().mean()
    assert results["acc"].item() == pytest.approx(expected.item())
    plain = (logits.argmax(-1) == labels).float().mean()  # what an unmasked accuracy gives
    assert results["acc"].item() != pytest.approx(plain.item())


def test_bad_metric_arguments():
    with pytest.raises(TypeError, match="LossMetric needs a loss function"):
        LossMetric("mse")
    metric = LossMetric(lambda p, t: F.mse_loss(p, t, reduction="none"))
    with pytest.raises(ValueError, match="must return one value, the mean over the batch"):
        metric.update(torch.zeros(2, 3), torch.ones(2, 3))
    with pytest.raises(ValueError, match=r"MaskedAccuracy got predictions of shape \(2, 3\)"):
        MaskedAccuracy().update(torch.zeros(2, 3), torch.zeros(3, dtype=torch.long))


def test_torchmetrics_binary_f1_iou_and_dice_work_as_they_are():
    """Composer's BinaryF1, MIoU and Dice, as torchmetrics objects (see trainkit.trainer.metrics)."""
    from torchmetrics.classification import BinaryF1Score, MulticlassJaccardIndex
    from torchmetrics.segmentation import DiceScore

    generator = torch.Generator().manual_seed(2)
    # Binary scores and labels for F1.
    probs = torch.rand(30, generator=generator)
    labels = (torch.rand(30, generator=generator) < 0.5).long()
    f1 = _evaluate({"f1": BinaryF1Score()}, probs, labels)["f1"]
    predicted = probs > 0.5
    tp = (predicted & (labels == 1)).sum()
    fp = (predicted & (labels == 0)).sum()
    fn = (~predicted & (labels == 1)).sum()
    assert f1.item() == pytest.approx((2 * tp / (2 * tp + fp + fn)).item())

    # Segmentation class indices (N, H, W), -1 ignored, for IoU and Dice over the whole set.
    classes = 3
    masks = torch.randint(-1, classes, (10, 6, 6), generator=generator)
    guesses = torch.where(
        torch.rand(10, 6, 6, generator=generator) < 0.6,
        masks.clamp_min(0),
        torch.randint(0, classes, (10, 6, 6), generator=generator),
    )
    miou = MulticlassJaccardIndex(num_classes=classes, ignore_index=-1)  # Composer's MIoU
    results = _evaluate({"miou": miou}, guesses, masks, batch_size=4)
    # DiceScore has no ignore index: the masked pixels count as class 0 for it.
    dice = DiceScore(num_classes=classes, input_format="index", aggregation_level="global")
    results.update(_evaluate({"dice": dice}, guesses, masks.clamp_min(0), batch_size=4))
    valid = masks != -1
    ious, dices = [], []
    for c in range(classes):
        p, t = (guesses == c) & valid, (masks == c) & valid
        ious.append(((p & t).sum() / (p | t).sum()).item())
        p, t = guesses == c, masks.clamp_min(0) == c
        dices.append((2 * (p & t).sum() / (p.sum() + t.sum())).item())
    assert results["miou"].item() == pytest.approx(sum(ious) / classes, rel=1e-5)
    assert results["dice"].item() == pytest.approx(sum(dices) / classes, rel=1e-5)


# A restored torchmetrics metric has seen no update() in this process, and says so once.
@pytest.mark.filterwarnings("ignore:The ``compute`` method of metric BinaryF1Score")
def test_torchmetrics_training_metrics_are_saved_and_restored_with_the_run():
    from torchmetrics.classification import BinaryF1Score

    generator = torch.Generator().manual_seed(3)
    probs = torch.rand(24, generator=generator)
    labels = (torch.rand(24, generator=generator) < 0.5).long()
    data = DataLoader(TensorDataset(probs, labels), batch_size=8)

    class Trained(Scores):
        def get_metrics(self, is_train=False):
            return {"f1": BinaryF1Score()} if is_train else {}

    def trainer():
        return Trainer(
            model=Trained({}), train_dataloader=data, max_duration="2ba", device="cpu",
            progress_bar=False, seed=0,
        )  # fmt: skip

    first = trainer()
    first.fit()
    saved = first.state.state_dict()["train_metrics"]["f1"]
    assert {"tp", "fp", "fn", "tn"} <= set(saved)  # torchmetrics' states, made persistent
    second = trainer()
    second.state.load_state_dict({"train_metrics": {"f1": saved}})
    assert second.state.train_metrics["f1"].compute() == first.state.train_metrics["f1"].compute()
    seen = probs[:16] > 0.5
    tp = (seen & (labels[:16] == 1)).sum()
    expected = (
        2 * tp / (2 * tp + (seen & (labels[:16] == 0)).sum() + (~seen & (labels[:16] == 1)).sum())
    )
    assert second.state.train_metrics["f1"].compute().item() == pytest.approx(expected.item())


def _half_each(rank, world_size):
    from torchmetrics.classification import BinaryF1Score

    generator = torch.Generator().manual_seed(4)
    preds, targets = (
        torch.randn(20, 4, generator=generator),
        torch.randn(20, 4, generator=generator),
    )
    logits, labels = torch.randn(20, 6, 3, generator=generator), torch.randint(0, 3, (20, 6))
    labels[torch.rand(20, 6, generator=generator) < 0.3] = -100
    probs, binary = (
        torch.rand(20, generator=generator),
        torch.randint(0, 2, (20,), generator=generator),
    )
    mine = slice(rank * 10, rank * 10 + 10)
    metrics = {"loss": LossMetric(F.mse_loss), "acc": MaskedAccuracy(), "f1": BinaryF1Score()}
    metrics["loss"].update(preds[mine], targets[mine])
    metrics["acc"].update(logits[mine], labels[mine])
    metrics["f1"].update(probs[mine], binary[mine])
    ranks = {name: metric.compute().item() for name, metric in metrics.items()}
    alone = {"loss": LossMetric(F.mse_loss), "acc": MaskedAccuracy(), "f1": BinaryF1Score()}
    alone["loss"].update(preds, targets)
    alone["acc"].update(logits, labels)
    alone["f1"].update(probs, binary)
    return ranks, alone


def test_compute_gives_the_result_over_every_ranks_data():
    results = run_ranks(_half_each, 2)
    # Each rank saw half the data; compute() on either gives the result over all of it,
    # for trainkit's metrics and torchmetrics' alike (computed outside a process group).
    (_, alone), _ = results
    expected = {name: metric.compute().item() for name, metric in alone.items()}
    for ranks, _ in results:
        assert ranks == pytest.approx(expected, rel=1e-6)


def test_bits_per_token_is_the_cross_entropy_in_bits():
    logits, target = torch.randn(2, 5, 256), torch.randint(0, 256, (2, 5))
    target[0, 0] = -100
    bits, nats = BitsPerToken(), CrossEntropy()
    bits.update(logits, target)
    nats.update(logits, target)
    assert bits.compute() == pytest.approx(nats.compute() / math.log(2))
