"""DecoupledSGDW / DecoupledAdamW: decay scaled by lr / initial_lr, checked against hand maths."""

from __future__ import annotations

import copy
import io
import math
import warnings

import pytest
import torch

from trainkit.core import plugins
from trainkit.trainer.optim import DecoupledAdamW, DecoupledSGDW

F64 = torch.float64


def _param(values) -> torch.nn.Parameter:
    return torch.nn.Parameter(torch.tensor(values, dtype=F64))


def _constant_grad_steps(optimizer, param, grad, steps, scheduler=None):
    for _ in range(steps):
        optimizer.zero_grad()
        param.grad = grad.clone()
        optimizer.step()
        if scheduler is not None:
            scheduler.step()


# --- DecoupledSGDW ---------------------------------------------------------------------------


def test_sgdw_closed_form_constant_gradient():
    """p_n = a^n p_0 - lr g (1 - a^n) / (1 - a), a = 1 - weight_decay (not 1 - lr * wd)."""
    lr, wd, n = 0.1, 0.01, 7
    p0, g = torch.tensor([1.0, -2.0, 0.5], dtype=F64), torch.tensor([0.3, 0.1, -0.2], dtype=F64)
    param = torch.nn.Parameter(p0.clone())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # wd >= 1e-3 warns
        opt = DecoupledSGDW([param], lr=lr, weight_decay=wd)
    _constant_grad_steps(opt, param, g, n)
    a = 1 - wd
    expected = a**n * p0 - lr * g * (1 - a**n) / (1 - a)
    torch.testing.assert_close(param.detach(), expected, rtol=1e-13, atol=1e-15)


def test_sgdw_momentum_decay_stays_out_of_the_buffer():
    """With momentum m and a constant gradient, buf_t = g (1 - m^t) / (1 - m); the decay is
    applied to the weights only."""
    lr, wd, m, n = 0.05, 1e-4, 0.9, 6
    p0, g = torch.tensor([2.0, -1.0], dtype=F64), torch.tensor([0.5, 0.25], dtype=F64)
    param = torch.nn.Parameter(p0.clone())
    opt = DecoupledSGDW([param], lr=lr, momentum=m, weight_decay=wd)
    _constant_grad_steps(opt, param, g, n)
    expected = p0.clone()
    for t in range(1, n + 1):
        buf = g * (1 - m**t) / (1 - m)
        expected = expected * (1 - wd) - lr * buf
    torch.testing.assert_close(param.detach(), expected, rtol=1e-13, atol=1e-15)
    torch.testing.assert_close(opt.state[param]["momentum_buffer"], g * (1 - m**n) / (1 - m))


def test_sgdw_scheduler_halving_lr_halves_decay():
    lr, wd, n = 0.2, 1e-4, 5
    p0, g = torch.tensor([1.5, -0.5], dtype=F64), torch.tensor([0.2, -0.4], dtype=F64)
    param = torch.nn.Parameter(p0.clone())
    opt = DecoupledSGDW([param], lr=lr, weight_decay=wd)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    _constant_grad_steps(opt, param, g, n, sched)
    expected = p0.clone()
    for t in range(n):
        lr_t = lr * 0.5**t
        expected = expected * (1 - wd * lr_t / lr) - lr_t * g
    torch.testing.assert_close(param.detach(), expected, rtol=1e-13, atol=1e-15)
    assert opt.param_groups[0]["initial_lr"] == lr
    assert opt.param_groups[0]["lr"] == pytest.approx(lr * 0.5**n)


# --- DecoupledAdamW --------------------------------------------------------------------------


def _reference_adamw(p0, grads_of, lrs, initial_lr, betas, eps, wd, follow_schedule=True):
    """Adam with the decay applied the decoupled way: p *= 1 - wd * lr_t / initial_lr first."""
    b1, b2 = betas
    p = p0.clone()
    m = torch.zeros_like(p)
    v = torch.zeros_like(p)
    for t, lr in enumerate(lrs, start=1):
        g = grads_of(p)
        p = p * (1 - wd * (lr / initial_lr if follow_schedule else 1.0))
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        m_hat_step = lr / (1 - b1**t)
        denom = v.sqrt() / math.sqrt(1 - b2**t) + eps
        p = p - m_hat_step * m / denom
    return p


def _quadratic_grad(p):  # loss = sum(c * p^2 + d * p)
    c = torch.tensor([1.0, 3.0, 0.5], dtype=F64)
    d = torch.tensor([0.1, -0.2, 0.3], dtype=F64)
    return 2 * c * p + d


def _adam_run(opt, param, steps, scheduler=None):
    lrs = []
    for _ in range(steps):
        lrs.append(opt.param_groups[0]["lr"])
        opt.zero_grad()
        param.grad = _quadratic_grad(param.detach())
        opt.step()
        if scheduler is not None:
            scheduler.step()
    return lrs


def test_adamw_matches_reference_with_decoupled_decay():
    p0 = torch.tensor([1.0, -2.0, 0.7], dtype=F64)
    param = torch.nn.Parameter(p0.clone())
    opt = DecoupledAdamW([param], lr=1e-2, weight_decay=5e-4)  # default betas (0.9, 0.95)
    lrs = _adam_run(opt, param, 6)
    expected = _reference_adamw(p0, _quadratic_grad, lrs, 1e-2, (0.9, 0.95), 1e-8, 5e-4)
    torch.testing.assert_close(param.detach(), expected, rtol=1e-12, atol=1e-14)


def test_adamw_scheduler_halving_lr_halves_decay():
    p0 = torch.tensor([0.4, -1.2, 2.0], dtype=F64)
    param = torch.nn.Parameter(p0.clone())
    opt = DecoupledAdamW([param], lr=1e-2, betas=(0.8, 0.99), eps=1e-6, weight_decay=2e-4)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    lrs = _adam_run(opt, param, 5, sched)
    assert lrs == pytest.approx([1e-2 * 0.5**t for t in range(5)])
    expected = _reference_adamw(p0, _quadratic_grad, lrs, 1e-2, (0.8, 0.99), 1e-6, 2e-4)
    torch.testing.assert_close(param.detach(), expected, rtol=1e-12, atol=1e-14)
    # ... and the decay really did follow the schedule: a constant-decay reference differs.
    wrong = _reference_adamw(p0, _quadratic_grad, lrs, 1e-2, (0.8, 0.99), 1e-6, 2e-4, False)
    assert not torch.allclose(param.detach(), wrong, rtol=1e-9, atol=0)


def test_composer_figures_decay_not_multiplied_by_lr():
    """Composer's DecoupledAdamW(lr=1e-3, weight_decay=1e-5): with a zero gradient one step
    multiplies the weights by exactly 1 - 1e-5; torch's AdamW by 1 - 1e-3 * 1e-5."""
    p0 = torch.tensor([1.0, -3.0], dtype=F64)
    ours, theirs = torch.nn.Parameter(p0.clone()), torch.nn.Parameter(p0.clone())
    opt = DecoupledAdamW([ours], lr=1e-3, weight_decay=1e-5)
    ref = torch.optim.AdamW([theirs], lr=1e-3, weight_decay=1e-5)
    for p, o in ((ours, opt), (theirs, ref)):
        p.grad = torch.zeros_like(p)
        o.step()
    assert torch.equal(ours.detach(), p0 * (1 - 1e-5))
    assert torch.equal(theirs.detach(), p0 * (1 - 1e-3 * 1e-5))


# --- equal to torch without decay, resume, plumbing ------------------------------------------


def _model_and_batches(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2))
    batches = [(torch.randn(8, 6), torch.randn(8, 2)) for _ in range(8)]
    return model, batches


def _train(model, opt, batches, scheduler=None):
    for x, y in batches:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        if scheduler is not None:
            scheduler.step()


@pytest.mark.parametrize(
    ("ours", "theirs", "kwargs"),
    [
        (DecoupledAdamW, torch.optim.AdamW, {"lr": 1e-2, "betas": (0.9, 0.95)}),
        (DecoupledAdamW, torch.optim.AdamW, {"lr": 1e-2, "betas": (0.8, 0.99), "amsgrad": True}),
        (DecoupledSGDW, torch.optim.SGD, {"lr": 0.1, "momentum": 0.9, "nesterov": True}),
        (DecoupledSGDW, torch.optim.SGD, {"lr": 0.1, "momentum": 0.5, "dampening": 0.1}),
    ],
)
def test_zero_weight_decay_is_bitwise_torch(ours, theirs, kwargs):
    model_a, batches = _model_and_batches()
    model_b = copy.deepcopy(model_a)
    _train(model_a, ours(model_a.parameters(), weight_decay=0.0, **kwargs), batches)
    _train(model_b, theirs(model_b.parameters(), weight_decay=0.0, **kwargs), batches)
    for a, b in zip(model_a.parameters(), model_b.parameters(), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize(
    ("cls", "kwargs"),
    [
        (DecoupledAdamW, {"lr": 1e-2, "weight_decay": 1e-4}),
        (DecoupledSGDW, {"lr": 0.1, "momentum": 0.9, "weight_decay": 1e-4}),
    ],
)
def test_state_dict_resume_is_bitwise(cls, kwargs):
    def build(model):
        opt = cls(model.parameters(), **kwargs)
        return opt, torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)

    model, batches = _model_and_batches()
    initial = copy.deepcopy(model.state_dict())
    opt, sched = build(model)
    _train(model, opt, batches[:4], sched)
    buffer = io.BytesIO()  # through torch.save / weights_only load, as a checkpoint would go
    torch.save(
        {"model": model.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict()}, buffer
    )
    _train(model, opt, batches[4:], sched)

    resumed, _ = _model_and_batches()
    resumed.load_state_dict(initial)  # wrong weights on purpose: loading must overwrite them
    opt2, sched2 = build(resumed)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    resumed.load_state_dict(saved["model"])
    opt2.load_state_dict(saved["opt"])
    sched2.load_state_dict(saved["sched"])
    assert opt2.param_groups[0]["initial_lr"] == kwargs["lr"]
    assert opt2.param_groups[0]["lr"] == pytest.approx(kwargs["lr"] * 0.25)
    _train(resumed, opt2, batches[4:], sched2)
    for a, b in zip(model.parameters(), resumed.parameters(), strict=True):
        assert torch.equal(a, b)


def test_loading_a_torch_state_dict_keeps_initial_lr():
    model, batches = _model_and_batches()
    plain = torch.optim.AdamW(model.parameters(), lr=1e-2)
    _train(model, plain, batches[:2])
    plain.param_groups[0]["lr"] = 5e-3  # a decayed lr, saved without "initial_lr"
    opt = DecoupledAdamW(model.parameters(), lr=1e-2)
    opt.load_state_dict(plain.state_dict())
    assert opt.param_groups[0]["initial_lr"] == 1e-2
    assert opt.param_groups[0]["lr"] == 5e-3
    _train(model, opt, batches[2:4])


def test_param_groups_keep_their_own_initial_lr():
    a, b, c = _param([1.0]), _param([2.0]), _param([3.0])
    opt = DecoupledSGDW([{"params": [a]}, {"params": [b], "lr": 0.5}], lr=0.1, weight_decay=1e-4)
    opt.add_param_group({"params": [c], "lr": 0.02})
    assert [g["initial_lr"] for g in opt.param_groups] == [0.1, 0.5, 0.02]
    for group in opt.param_groups:
        group["lr"] /= 4  # as a scheduler would
    for p in (a, b, c):
        p.grad = torch.zeros_like(p)
    opt.step()
    expected = [1.0, 2.0, 3.0]
    assert [p.item() for p in (a, b, c)] == [v * (1 - 1e-4 / 4) for v in expected]


def test_only_parameters_with_gradients_decay():
    a, b = _param([1.0]), _param([1.0])
    opt = DecoupledAdamW([a, b], weight_decay=1e-5)
    a.grad = torch.zeros_like(a)
    opt.step()
    assert a.item() == 1 - 1e-5 and b.item() == 1.0
    assert opt.param_groups[0]["weight_decay"] == 1e-5  # restored after the step


def test_closure_runs_before_the_decay_and_its_loss_is_returned():
    param = _param([2.0])
    opt = DecoupledSGDW([param], lr=0.1, weight_decay=1e-4)
    seen = []

    def closure():
        seen.append(param.item())
        opt.zero_grad()
        loss = (param**2).sum()
        loss.backward()
        return loss

    loss = opt.step(closure)
    assert seen == [2.0] and loss.item() == 4.0
    assert param.item() == pytest.approx(2.0 * (1 - 1e-4) - 0.1 * 4.0, rel=1e-15)


@pytest.mark.parametrize("cls", [DecoupledAdamW, DecoupledSGDW])
def test_step_hooks_run_once(cls):
    torch.optim.AdamW([_param([0.0])])  # torch hooks the parent classes' step on first use
    torch.optim.SGD([_param([0.0])])
    param = _param([1.0])
    opt = cls([param], lr=0.1)
    calls = []
    opt.register_step_pre_hook(lambda *_: calls.append("pre"))
    opt.register_step_post_hook(lambda *_: calls.append("post"))
    param.grad = torch.ones_like(param)
    opt.step()
    assert calls == ["pre", "post"]


def test_large_weight_decay_warns():
    with pytest.warns(UserWarning, match="decoupled from the learning rate"):
        DecoupledAdamW([_param([1.0])], weight_decay=0.01)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        DecoupledAdamW([_param([1.0])])  # Composer's default 1e-5 is quiet


def test_composer_defaults():
    opt = DecoupledAdamW([_param([1.0])])
    group = opt.param_groups[0]
    assert (group["lr"], group["betas"], group["eps"], group["weight_decay"]) == (
        1e-3,
        (0.9, 0.95),
        1e-8,
        1e-5,
    )
    with pytest.raises(TypeError):
        DecoupledSGDW([_param([1.0])])  # lr is required, as in Composer


@pytest.mark.parametrize("name", ["DecoupledAdamW", "DecoupledSGDW"])
def test_registered_as_optimizer_entry_points(name):
    assert name in plugins.available("trainkit.optimizers")
    assert (
        plugins.load("trainkit.optimizers", name)
        is {
            "DecoupledAdamW": DecoupledAdamW,
            "DecoupledSGDW": DecoupledSGDW,
        }[name]
    )
