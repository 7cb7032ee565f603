"""gradient_clipping: norm, value and adaptive clipping, before the optimizer step."""

import pytest
import torch
from torch import nn

from toy import blobs, loader, mlp
from trainkit.algorithms import GradientClipping, apply_gradient_clipping
from trainkit.core import Callback
from trainkit.trainer import Trainer


def model_with_grads(scale=100.0):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 2))
    for p in model.parameters():
        p.grad = torch.randn_like(p) * scale
    return model


def test_norm_clipping_bounds_the_global_norm():
    model = model_with_grads()
    before = apply_gradient_clipping(model, clipping_type="norm", clipping_threshold=1.0)
    assert before > 1.0
    total = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters()]))
    assert total == pytest.approx(1.0, rel=1e-4)


def test_value_clipping_clamps_each_element():
    model = model_with_grads()
    apply_gradient_clipping(model, clipping_type="value", clipping_threshold=0.5)
    assert all(p.grad.abs().max() <= 0.5 for p in model.parameters())


def test_adaptive_clipping_bounds_each_row_relative_to_its_weights():
    model = model_with_grads()
    apply_gradient_clipping(model, clipping_type="adaptive", clipping_threshold=0.01)
    for p in model.parameters():
        if p.ndim == 2:
            ratio = p.grad.norm(dim=1) / p.detach().norm(dim=1).clamp(min=1e-3)
            assert torch.all(ratio <= 0.01 + 1e-5)


def test_small_gradients_are_untouched():
    model = model_with_grads(scale=1e-4)
    grads = [p.grad.clone() for p in model.parameters()]
    apply_gradient_clipping(model, clipping_type="norm", clipping_threshold=1.0)
    assert all(torch.equal(g, p.grad) for g, p in zip(grads, model.parameters(), strict=True))


def test_runs_after_backward_and_before_the_step():
    norms = []

    class GradNorm(Callback):
        def after_train_batch(self, state, logger):
            norms.append(
                torch.linalg.vector_norm(
                    torch.stack([p.grad.norm() for p in state.model.parameters()])
                )
            )

    class Explode(Callback):
        def after_backward(self, state, logger):
            for p in state.model.parameters():
                p.grad.mul_(1e4)

    model = mlp()
    trainer = Trainer(
        model=model,
        train_dataloader=loader(blobs()),
        max_duration="3ba",
        algorithms=[GradientClipping(clipping_type="norm", clipping_threshold=0.5)],
        callbacks=[Explode(), GradNorm()],  # GradNorm runs after the algorithm at AFTER_TRAIN_BATCH
        progress_bar=False,
        device="cpu",
    )
    trainer.fit()
    assert [float(n) for n in norms] == pytest.approx([0.5, 0.5, 0.5], rel=1e-4)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"clipping_type": "l2"}, "clipping_type 'l2' is not one of 'norm', 'value', 'adaptive'"),
        ({"clipping_threshold": 0}, "clipping_threshold must be positive, got 0"),
    ],
)
def test_bad_config(kwargs, message):
    with pytest.raises(ValueError, match=message):
        GradientClipping(**kwargs)


def test_norm_clipping_is_refused_where_each_rank_holds_one_pipeline_stage():
    from types import SimpleNamespace

    from trainkit.core import Event, SingleProcess

    class Staged(SingleProcess):  # a strategy whose ranks each run one stage's backward
        runs_forward_backward = True

    model = model_with_grads()
    state = SimpleNamespace(parallelism=Staged(), optimizers=[], model=model, precision=None)
    with pytest.raises(ValueError, match=r"clip each stage by its own norm.*'value' or"):
        GradientClipping(clipping_type="norm").apply(Event.AFTER_TRAIN_BATCH, state, None)
    before = [p.grad.clone() for p in model.parameters()]
    GradientClipping(clipping_type="value", clipping_threshold=1e9).apply(
        Event.AFTER_TRAIN_BATCH, state, None
    )
    assert all(torch.equal(a, p.grad) for a, p in zip(before, model.parameters(), strict=True))
