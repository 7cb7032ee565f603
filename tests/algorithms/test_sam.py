"""sam: one Trainer step equals a hand-computed SAM step on a tiny model."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from trainkit.algorithms import SAM, MixUp, SAMConfig, sam_gradient
from trainkit.core import Classifier, Trainer, plugins


def data(n=8):
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(n, 4, generator=g), torch.randint(0, 3, (n,), generator=g))


def model():
    torch.manual_seed(0)
    return Classifier(nn.Linear(4, 3), num_classes=3)


def hand_sam_step(net, x, y, *, rho, lr):
    w, b = net.weight.detach().clone(), net.bias.detach().clone()

    def grads(w, b):
        w, b = w.clone().requires_grad_(), b.clone().requires_grad_()
        F.cross_entropy(x @ w.T + b, y).backward()
        return w.grad, b.grad

    gw, gb = grads(w, b)
    norm = torch.sqrt(gw.pow(2).sum() + gb.pow(2).sum())
    gw2, gb2 = grads(w + rho * gw / norm, b + rho * gb / norm)
    return w - lr * gw2, b - lr * gb2


@pytest.mark.parametrize("microbatch", [None, 4])
def test_trainer_step_equals_a_hand_computed_sam_step(microbatch):
    x, y = data()[:]
    expected_w, expected_b = hand_sam_step(model().module, x, y, rho=0.5, lr=0.1)
    net = model()
    Trainer(
        model=net,
        train_dataloader=DataLoader(data(), batch_size=8),
        max_duration="1ba",
        optimizers=torch.optim.SGD(net.parameters(), lr=0.1),
        algorithms=[SAM(rho=0.5)],
        device_train_microbatch_size=microbatch,
        progress_bar=False,
        device="cpu",
    ).fit()
    torch.testing.assert_close(net.module.weight.detach(), expected_w)
    torch.testing.assert_close(net.module.bias.detach(), expected_b)


def test_interval_leaves_plain_steps_in_between():
    x, y = data()[:]
    net = model()
    Trainer(
        model=net,
        train_dataloader=DataLoader(data(), batch_size=8),
        max_duration="1ba",
        optimizers=torch.optim.SGD(net.parameters(), lr=0.1),
        algorithms=[SAM(rho=0.5, interval=2)],
        progress_bar=False,
        device="cpu",
    ).fit()
    plain = model().module
    F.cross_entropy(plain(x), y).backward()
    torch.testing.assert_close(
        net.module.weight.detach(), plain.weight.detach() - 0.1 * plain.weight.grad
    )


def test_functional_form_restores_the_weights_exactly():
    net = model().module
    x, y = data()[:]
    F.cross_entropy(net(x), y).backward()
    before = net.weight.detach().clone()
    seen = []

    def loss_at():
        seen.append(net.weight.detach().clone())
        F.cross_entropy(net(x), y).backward()

    sam_gradient(net, loss_at, rho=0.1)
    assert torch.equal(net.weight.detach(), before)
    assert torch.linalg.vector_norm(seen[0] - before) <= 0.1 + 1e-6  # perturbed within rho


def test_guards():
    with pytest.raises(ValueError, match="SAM found no gradients"):
        sam_gradient(nn.Linear(2, 2), lambda: None)
    with pytest.warns(UserWarning, match="without what MixUp do to the loss"):
        Trainer(
            model=model(),
            train_dataloader=DataLoader(data(), batch_size=8),
            max_duration="1ba",
            algorithms=[MixUp(), SAM()],
            progress_bar=False,
            device="cpu",
        ).fit()


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
