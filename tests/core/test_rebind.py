"""The one optimizer re-binding utility, in its two modes."""

import pytest
import torch
from torch import nn

from trainkit.core import rebind_optimizers


def stepped(model):
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    return optimizer


def test_a_replaced_parameter_is_swapped_in_by_name_with_its_state():
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))
    optimizer = stepped(model)
    names = {id(p): n for n, p in model.named_parameters()}
    old = model[1].weight
    exp_avg = optimizer.state[old]["exp_avg"].clone()
    model[1].weight = nn.Parameter(old.detach().clone())
    assert rebind_optimizers([optimizer], model, names) == 1
    assert any(p is model[1].weight for p in optimizer.param_groups[0]["params"])
    assert torch.equal(optimizer.state[model[1].weight]["exp_avg"], exp_avg)
    assert old not in optimizer.state


def test_a_vanished_parameter_is_an_error_by_default():
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    names = {id(p): n for n, p in model.named_parameters()}
    model[1] = nn.Sequential(nn.Linear(4, 1))  # new names: 1.0.weight
    with pytest.raises(
        ValueError, match=r"holds parameter '1.weight'.*no replacement of the same name"
    ):
        rebind_optimizers([optimizer], model, names)


def test_surgery_mode_drops_vanished_and_adds_new_parameters_to_the_first_group():
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))
    first = torch.optim.SGD([model[0].weight, model[1].weight], lr=0.1)
    second = torch.optim.SGD([model[0].bias, model[1].bias], lr=0.2)
    names = {id(p): n for n, p in model.named_parameters()}
    model[1] = nn.Sequential(nn.Linear(4, 1))
    added = rebind_optimizers([first, second], model, names, new_parameters="add_to_first_group")
    held_first = first.param_groups[0]["params"]
    assert added == 2
    assert held_first[0] is model[0].weight
    assert {id(p) for p in held_first[1:]} == {id(model[1][0].weight), id(model[1][0].bias)}
    assert second.param_groups[0]["params"] == [model[0].bias]
