"""stochastic_depth: residual branches are dropped only in training, at the configured rates;
eval scales each branch by its survival probability, as in the paper and Composer."""

import copy

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torchvision.models import resnet18, resnet50
from torchvision.models.resnet import BasicBlock, Bottleneck

from trainkit.algorithms import (
    StochasticBlock,
    StochasticDepth,
    StochasticDepthConfig,
    apply_stochastic_depth,
)
from trainkit.core import Callback, plugins
from trainkit.trainer import Classifier, Trainer


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


def test_linear_rates_and_eval_scales_each_branch_by_its_survival_probability():
    model = net()
    x = torch.randn(5, 8)
    reference = copy.deepcopy(model)
    replaced = apply_stochastic_depth(model, target=Residual, drop_rate=0.4)
    assert sorted(replaced) == ["0", "1", "2", "3"]
    rates = [0.1, 0.2, 0.3, 0.4]
    assert [model[i].drop_rate for i in range(4)] == pytest.approx(rates)
    expected = x
    for block, rate in zip(reference[:4], rates, strict=True):
        expected = expected + (1 - rate) * block.f(expected)
    expected = reference[4](expected)
    model.eval()
    for _ in range(5):
        torch.testing.assert_close(model(x), expected)  # deterministic in eval


def test_block_mode_skips_the_computation_at_the_rate_in_training():
    torch.manual_seed(1)
    block = StochasticBlock(Residual(), drop_rate=0.5)
    x = torch.randn(3, 8)
    outputs = [block(x) for _ in range(400)]
    skipped = sum(torch.equal(out, x) for out in outputs)
    assert block.block.calls == 400 - skipped
    assert 150 < skipped < 250
    kept = next(out for out in outputs if not torch.equal(out, x))
    torch.testing.assert_close(kept, x + block.block.f(x))  # not rescaled in training


def test_sample_mode_drops_per_sample():
    torch.manual_seed(0)
    block = StochasticBlock(Residual(), drop_rate=0.5, mode="sample")
    x = torch.randn(64, 8)
    out = block(x)
    dropped = (out == x).all(dim=1)
    assert 10 < int(dropped.sum()) < 54
    torch.testing.assert_close(out[~dropped], (x + block.block.f(x))[~dropped])


def test_shape_changing_blocks_raise_clearly():
    block = StochasticBlock(nn.Linear(8, 4), drop_rate=0.1)
    torch.manual_seed(0)
    with pytest.raises(ValueError, match="must keep the shape"):
        for _ in range(50):
            block(torch.randn(2, 8))


def _bottleneck_reference(block: Bottleneck, x: torch.Tensor, keep: float) -> torch.Tensor:
    """The paper's test-time block: relu(keep * branch(x) + shortcut(x))."""
    out = block.relu(block.bn1(block.conv1(x)))
    out = block.relu(block.bn2(block.conv2(out)))
    out = block.bn3(block.conv3(out))
    identity = x if block.downsample is None else block.downsample(x)
    return torch.relu(keep * out + identity)


def test_resnet50_every_bottleneck_trains_and_evaluates_deterministically():
    model = resnet50(num_classes=10)
    bottlenecks = [n for n, m in model.named_modules() if isinstance(m, Bottleneck)]
    reference = copy.deepcopy(model).eval()
    replaced = apply_stochastic_depth(model, drop_rate=0.5)
    assert sorted(replaced) == sorted(bottlenecks) and len(bottlenecks) == 16
    rates = [model.get_submodule(n).drop_rate for n in bottlenecks]
    assert rates == pytest.approx([0.5 * (i + 1) / 16 for i in range(16)])
    x = torch.randn(2, 3, 64, 64)
    # Training: a step on SGD changes the weights; the output is finite.
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    torch.manual_seed(0)
    model.train()
    loss = nn.functional.cross_entropy(model(x), torch.tensor([1, 2]))
    loss.backward()
    optimizer.step()
    assert torch.isfinite(loss)
    # Eval: the same output every time, equal to the paper's formula on the trained weights.
    reference.load_state_dict({k.replace(".block.", "."): v for k, v in model.state_dict().items()})
    model.eval()
    hooks = []
    for name, rate in zip(bottlenecks, rates, strict=True):
        block = reference.get_submodule(name)
        hooks.append(
            block.register_forward_hook(
                lambda m, args, out, keep=1 - rate: _bottleneck_reference(m, args[0], keep)
            )
        )
    with torch.no_grad():
        first, second, expected = model(x), model(x), reference(x)
    assert torch.equal(first, second)
    torch.testing.assert_close(first, expected)


def test_a_dropped_downsampling_block_keeps_its_shortcut_and_stays_non_negative():
    torch.manual_seed(0)
    block = Bottleneck(64, 32, stride=2, downsample=nn.Sequential(nn.Conv2d(64, 128, 1, 2)))
    wrapped = StochasticBlock(block, drop_rate=0.99)
    x = torch.randn(2, 64, 8, 8)  # negative inputs too: the output must still be >= 0
    outputs = [wrapped(x) for _ in range(20)]
    dropped = torch.relu(block.downsample(x))
    assert any(torch.equal(out, dropped) for out in outputs)
    assert all(out.shape == (2, 128, 4, 4) and out.min() >= 0 for out in outputs)
    wrapped.eval()
    assert wrapped(x).min() >= 0


def test_resnet18_basic_blocks_in_sample_mode():
    model = resnet18(num_classes=4)
    replaced = apply_stochastic_depth(
        model, target="BasicBlock", drop_rate=0.3, mode="sample", drop_distribution="uniform"
    )
    assert len(replaced) == sum(isinstance(m, BasicBlock) for m in resnet18().modules()) == 8
    assert all(model.get_submodule(n).drop_rate == 0.3 for n in replaced)
    x = torch.randn(2, 3, 32, 32)
    model(x).sum().backward()
    assert all(p.grad is not None for p in model.parameters())
    model.eval()
    assert torch.equal(model(x), model(x))


def test_composer_name_and_lists_of_targets():
    assert len(apply_stochastic_depth(resnet50(), target="ResNetBottleneck")) == 16
    both = apply_stochastic_depth(resnet18(), target=["BasicBlock", Bottleneck])
    assert len(both) == 8


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


@pytest.mark.parametrize("warmup", [0.5, "0.5dur", "5ba"])
def test_drop_warmup_ramps_the_rates_linearly(warmup):
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(80, 8), torch.randint(0, 2, (80,)))
    seen = []

    class Probe(Callback):
        def before_forward(self, state, logger):
            seen.append([m.drop_rate for m in state.model.module[:4]])

    Trainer(
        model=Classifier(net(), num_classes=2),
        train_dataloader=DataLoader(data, batch_size=8),
        max_duration="10ba",
        algorithms=[StochasticDepth(target=Residual, drop_rate=0.4, drop_warmup=warmup)],
        callbacks=[Probe()],
        progress_bar=False,
        device="cpu",
        seed=0,
    ).fit()
    final = [0.1, 0.2, 0.3, 0.4]
    expected = [[r * min(1.0, (b / 10) / 0.5) for r in final] for b in range(10)]
    assert seen == [pytest.approx(row) for row in expected]


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
        ({"target": []}, "target"),
        ({"drop_warmup": 1.5}, "drop_warmup"),
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
