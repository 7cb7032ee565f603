"""stochastic_depth: blocks are skipped only in training, at the configured rates."""

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from trainkit.algorithms import (
    StochasticBlock,
    StochasticDepth,
    StochasticDepthConfig,
    apply_stochastic_depth,
)
from trainkit.core import Callback, Classifier, Trainer, plugins


class Residual(nn.Module):
    def __init__(self, width=8):
        super().__init__()
        self.f = nn.Linear(width, width)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return x + self.f(x)


def net(blocks=4):
    torch.manual_seed(0)
    return nn.Sequential(*[Residual() for _ in range(blocks)], nn.Linear(8, 2))


def test_linear_rates_and_eval_is_the_plain_model():
    model = net()
    x = torch.randn(5, 8)
    expected = model(x)
    replaced = apply_stochastic_depth(model, target=Residual, drop_rate=0.4)
    assert sorted(replaced) == ["0", "1", "2", "3"]
    assert [model[i].drop_rate for i in range(4)] == pytest.approx([0.1, 0.2, 0.3, 0.4])
    model.eval()
    for _ in range(20):
        torch.testing.assert_close(model(x), expected)  # never dropped in eval


def test_block_mode_skips_the_computation_at_the_rate_in_training():
    torch.manual_seed(1)
    block = StochasticBlock(Residual(), drop_rate=0.5)
    x = torch.randn(3, 8)
    outputs = [block(x) for _ in range(400)]
    skipped = sum(torch.equal(out, x) for out in outputs)
    assert block.block.calls == 400 - skipped
    assert 150 < skipped < 250
    kept = next(out for out in outputs if not torch.equal(out, x))
    torch.testing.assert_close(kept, x + block.block.f(x) / 0.5)  # inverted scaling


def test_sample_mode_drops_per_sample():
    torch.manual_seed(0)
    block = StochasticBlock(Residual(), drop_rate=0.5, mode="sample")
    x = torch.randn(64, 8)
    out = block(x)
    dropped = (out == x).all(dim=1)
    assert 10 < int(dropped.sum()) < 54


def test_shape_changing_blocks_raise_clearly():
    block = StochasticBlock(nn.Linear(8, 4), drop_rate=0.1)
    torch.manual_seed(0)
    with pytest.raises(ValueError, match="only blocks that keep the shape"):
        for _ in range(50):
            block(torch.randn(2, 8))


def test_through_the_trainer_drops_in_fit_and_not_in_eval():
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
    counts = {}

    class Count(Callback):
        def eval_before_all(self, state, logger):
            counts["train"] = [m.block.calls for m in state.model.module[:4]]

        def eval_after_all(self, state, logger):
            counts["eval"] = [m.block.calls for m in state.model.module[:4]]

    trainer = Trainer(
        model=Classifier(net(), num_classes=2),
        train_dataloader=DataLoader(data, batch_size=8),
        eval_dataloader=DataLoader(data, batch_size=8),
        max_duration="1ep",
        algorithms=[StochasticDepth(target=Residual, drop_rate=0.75, drop_distribution="uniform")],
        callbacks=[Count()],
        progress_bar=False,
        device="cpu",
        seed=0,
    )
    trainer.fit()
    assert all(c < 8 for c in counts["train"])  # some of the 8 batches skipped each block
    assert [e - t for e, t in zip(counts["eval"], counts["train"], strict=True)] == [8] * 4


def test_warns_when_nothing_matches():
    with pytest.warns(UserWarning, match="stochastic_depth matched no module"):
        apply_stochastic_depth(nn.Sequential(nn.Linear(2, 2)), target=Residual)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"drop_rate": 1.0}, "drop_rate"),
        ({"drop_distribution": "cubic"}, "drop_distribution"),
        ({"mode": "layer"}, "mode"),
        ({"target": 3}, "target"),
        ({"target": ""}, "target"),
    ],
)
def test_bad_config(kwargs, match):
    with pytest.raises(ValueError, match=match):
        StochasticDepthConfig(**{"target": Residual, **kwargs})


def test_a_class_name_or_full_name_selects_the_blocks_like_the_class():
    by_class = apply_stochastic_depth(net(), target=Residual)
    by_name = apply_stochastic_depth(net(), target="Residual")
    by_full_name = apply_stochastic_depth(net(), target=f"{__name__}.Residual")
    assert sorted(by_name) == sorted(by_class) == sorted(by_full_name)
    assert by_class


def test_entry_point():
    assert plugins.load("trainkit.algorithms", "stochastic_depth") is StochasticDepth
