"""sam: a Trainer step equals a hand-computed SAM step, with the other methods' effects in both
passes (as Composer's closure), the same random draws, and fp16 loss scaling (on CPU)."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from trainkit.algorithms import (
    SAM,
    GradientClipping,
    LabelSmoothing,
    MixUp,
    SAMConfig,
    sam_gradient,
)
from trainkit.core import Callback, Event, Logger, MixedPrecision, State, plugins
from trainkit.trainer import Classifier, Trainer


def data(n=8):
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(n, 4, generator=g), torch.randint(0, 3, (n,), generator=g))


def model():
    torch.manual_seed(0)
    return Classifier(nn.Linear(4, 3), num_classes=3)


def hand_sam_step(net, x, y, *, rho, lr, loss_fn=F.cross_entropy, clip=None):
    """The paper's step, written out: ascend along g / ||g||, take the gradient there."""
    w, b = net.weight.detach().clone(), net.bias.detach().clone()

    def grads(w, b):
        w, b = w.clone().requires_grad_(), b.clone().requires_grad_()
        loss_fn(x @ w.T + b, y).backward()
        gw, gb = w.grad, b.grad
        if clip is not None:  # clipping by global norm, as GradientClipping does
            norm = torch.sqrt(gw.pow(2).sum() + gb.pow(2).sum())
            factor = min(1.0, clip / (float(norm) + 1e-6))
            gw, gb = gw * factor, gb * factor
        return gw, gb

    gw, gb = grads(w, b)
    norm = torch.sqrt(gw.pow(2).sum() + gb.pow(2).sum())
    gw2, gb2 = grads(w + rho * gw / norm, b + rho * gb / norm)
    return w - lr * gw2, b - lr * gb2


def fit_one_step(net, algorithms, microbatch=None, precision="fp32", callbacks=()):
    trainer = Trainer(
        model=net,
        train_dataloader=DataLoader(data(), batch_size=8),
        max_duration="1ba",
        optimizers=torch.optim.SGD(net.parameters(), lr=0.1),
        algorithms=algorithms,
        callbacks=list(callbacks),
        device_train_microbatch_size=microbatch,
        precision=precision,
        progress_bar=False,
        device="cpu",
        seed=0,
    )
    trainer.fit()
    return trainer


def assert_weights(net, expected, **tolerance):
    torch.testing.assert_close(net.module.weight.detach(), expected[0], **tolerance)
    torch.testing.assert_close(net.module.bias.detach(), expected[1], **tolerance)


@pytest.mark.parametrize("microbatch", [None, 4])
def test_trainer_step_equals_a_hand_computed_sam_step(microbatch):
    x, y = data()[:]
    expected = hand_sam_step(model().module, x, y, rho=0.5, lr=0.1)
    net = model()
    fit_one_step(net, [SAM(rho=0.5)], microbatch)
    assert_weights(net, expected)


def test_the_replay_applies_the_loss_methods():
    x, y = data()[:]

    def smoothed(logits, target):
        return F.cross_entropy(logits, target, label_smoothing=0.2)

    expected = hand_sam_step(model().module, x, y, rho=0.5, lr=0.1, loss_fn=smoothed)
    net = model()
    fit_one_step(net, [SAM(rho=0.5), LabelSmoothing(smoothing=0.2)])
    assert_weights(net, expected)


@pytest.mark.parametrize("order", ["clip_first", "sam_first"])
def test_both_gradients_go_through_gradient_clipping(order):
    x, y = data()[:]
    expected = hand_sam_step(model().module, x, y, rho=0.5, lr=0.1, clip=0.05)
    algorithms = [GradientClipping(clipping_type="norm", clipping_threshold=0.05), SAM(rho=0.5)]
    net = model()
    fit_one_step(net, algorithms if order == "clip_first" else algorithms[::-1])
    assert_weights(net, expected)


def test_mixup_mixes_the_same_pair_with_the_same_weight_in_both_passes():
    mixup = MixUp(alpha=1.0)
    draws = []

    class Draws(Callback):
        def before_forward(self, state, logger):
            draws.append((mixup.mixing, mixup.indices.clone(), state.batch[0].clone()))

    net = model()
    fit_one_step(net, [SAM(rho=0.5), mixup], callbacks=[Draws()])
    assert len(draws) == 2  # the step and its replay
    (m1, i1, x1), (m2, i2, x2) = draws
    assert m1 == m2 and torch.equal(i1, i2) and torch.equal(x1, x2)
    x, y = data()[:]
    x_mixed = (1 - m1) * x + m1 * x[i1]
    soft = (1 - m1) * F.one_hot(y, 3).float() + m1 * F.one_hot(y[i1], 3).float()
    expected = hand_sam_step(model().module, x_mixed, soft, rho=0.5, lr=0.1)
    assert_weights(net, expected)


def test_the_replay_leaves_random_streams_and_batchnorm_statistics_as_one_pass_does():
    def bn_model():
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Dropout(0.5), nn.Linear(4, 3))
        return Classifier(net, num_classes=3)

    with_sam, plain = bn_model(), bn_model()
    fit_one_step(with_sam, [SAM(rho=0.5)])
    after_sam = torch.get_rng_state()
    fit_one_step(plain, [])
    assert torch.equal(after_sam, torch.get_rng_state())
    for a, b in zip(with_sam.module[1].buffers(), plain.module[1].buffers(), strict=True):
        assert torch.equal(a, b)


def test_interval_leaves_plain_steps_in_between():
    x, y = data()[:]
    net = model()
    fit_one_step(net, [SAM(rho=0.5, interval=2)])
    plain = model().module
    F.cross_entropy(plain(x), y).backward()
    torch.testing.assert_close(
        net.module.weight.detach(), plain.weight.detach() - 0.1 * plain.weight.grad
    )


def fp16(init_scale=2.0**16):
    """amp_fp16 with its grad scaler, on CPU (autocast supports float16 there)."""
    return MixedPrecision(
        torch.device("cpu"),
        torch.float16,
        scaler_factory=lambda: torch.amp.GradScaler("cpu", init_scale=init_scale),
    )


@pytest.mark.parametrize("clip", [False, True])
def test_fp16_with_loss_scaling_steps_with_the_unscaled_sam_gradient(clip):
    x, y = data()[:]
    kwargs = {"clip": 0.05} if clip else {}
    expected = hand_sam_step(model().module, x, y, rho=0.5, lr=0.1, **kwargs)
    precision = fp16()
    algorithms = [SAM(rho=0.5)]
    if clip:  # it unscales the first gradient, and the replay's: the scaler must allow both
        algorithms.insert(0, GradientClipping(clipping_type="norm", clipping_threshold=0.05))
    net = model()
    fit_one_step(net, algorithms, precision=precision)
    assert_weights(net, expected, rtol=0, atol=2e-3)  # fp16 forward and backward
    assert precision.scaler.get_scale() == 2.0**16  # no overflow: the step was taken


def test_fp16_overflow_in_the_first_pass_skips_the_step():
    precision = fp16(init_scale=2.0**60)  # the scaled backward overflows in float16
    net = model()
    before = [p.detach().clone() for p in net.parameters()]
    fit_one_step(net, [SAM(rho=0.5)], precision=precision)
    assert all(torch.equal(a, b) for a, b in zip(net.parameters(), before, strict=True))
    assert precision.scaler.get_scale() == 2.0**59  # backed off, as for any skipped step


def test_functional_form_restores_the_weights_exactly():
    net = model().module
    x, y = data()[:]
    F.cross_entropy(net(x), y).backward()
    before = net.weight.detach().clone()
    seen = []

    def loss_at():
        seen.append(net.weight.detach().clone())
        F.cross_entropy(net(x), y).backward()

    assert sam_gradient(net, loss_at, rho=0.1)
    assert torch.equal(net.weight.detach(), before)
    assert torch.linalg.vector_norm(seen[0] - before) <= 0.1 + 1e-6  # perturbed within rho
    net.weight.grad.fill_(float("inf"))
    assert not sam_gradient(net, loss_at, rho=0.1, skip_non_finite=True)
    assert len(seen) == 1


def test_guards():
    with pytest.raises(ValueError, match="SAM found no gradients"):
        sam_gradient(nn.Linear(2, 2), lambda: None)


def test_a_loop_that_offers_no_replay_is_told_what_sam_needs():
    net = model()
    x, y = data().tensors
    state = State(model=net, optimizers=[torch.optim.SGD(net.parameters(), lr=0.1)])
    state.batch = (x, y)
    F.cross_entropy(net(state.batch), y).backward()
    sam = SAM(rho=0.05)
    logger = Logger([], state)
    sam.apply(Event.BEFORE_TRAIN_BATCH, state, logger)
    assert state.replay_step is None  # a hand-written loop that did not set it
    with pytest.raises(ValueError, match=r"SAM replays the step through state\.replay_step"):
        sam.apply(Event.AFTER_TRAIN_BATCH, state, logger)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rho": 0}, "rho must be positive, got 0"),
        ({"epsilon": -1.0}, "epsilon must be non-negative"),
        ({"interval": 0}, "interval must be an int of at least 1, got 0"),
    ],
)
def test_bad_config(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SAMConfig(**kwargs)


def test_entry_point():
    assert plugins.load("trainkit.algorithms", "sam") is SAM
