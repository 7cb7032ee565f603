"""replace_modules: by type or predicate, counted, placed, optimizers re-bound."""

import pytest
import torch
from torch import nn

from trainkit.algorithms import replace_modules


class Doubler(nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner
        self.gain = nn.Parameter(torch.ones(1))

    def forward(self, x):
        return self.inner(x) * 2 * self.gain


def net():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4), nn.Sequential(nn.Linear(4, 2))
    )


def test_replace_by_type_counts_and_keeps_shared_parameters():
    model = net()
    first_weight = model[0].weight
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    replaced = replace_modules(
        model, {nn.Linear: lambda m, i: Doubler(m) if i < 2 else None}, optimizers=optimizer
    )
    assert sorted(replaced) == ["0", "2"]
    assert isinstance(model[0], Doubler) and isinstance(model[3][0], nn.Linear)
    assert model[0].inner.weight is first_weight
    held = {id(p) for g in optimizer.param_groups for p in g["params"]}
    assert held == {id(p) for p in model.parameters()}  # the new gains were added


def test_replace_by_predicate_and_drop_removed_parameters():
    model = net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    replace_modules(
        model,
        {lambda m: isinstance(m, nn.Linear) and m.out_features == 2: lambda m, i: nn.Identity()},
        optimizers=optimizer,
    )
    assert isinstance(model[3][0], nn.Identity)
    held = {id(p) for g in optimizer.param_groups for p in g["params"]}
    assert held == {id(p) for p in model.parameters()}


def test_new_modules_follow_the_replaced_modules_dtype():
    model = net().to(torch.float64)
    replace_modules(
        model,
        {
            nn.ReLU: lambda m, i: None,
            nn.Linear: lambda m, i: Doubler(nn.Linear(4, 4)) if i == 0 else None,
        },
    )
    assert model[0].gain.dtype == torch.float64 and model[0].inner.weight.dtype == torch.float64


def test_warns_when_nothing_matches():
    with pytest.warns(UserWarning, match="blurpool matched no module in Sequential"):
        replace_modules(net(), {nn.Conv2d: lambda m, i: nn.Identity()}, method="blurpool")


def test_refuses_once_the_optimizer_has_state():
    model = net()
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    with pytest.raises(ValueError, match=r"already holds state .*apply it before the first step"):
        replace_modules(
            model,
            {nn.Linear: lambda m, i: Doubler(m)},
            optimizers=optimizer,
            method="squeeze_excite",
        )


def test_tuple_of_types_as_a_key():
    model = net()
    replaced = replace_modules(model, {(nn.ReLU, nn.Sequential): lambda m, i: nn.Identity()})
    assert sorted(replaced) == ["1", "3"]


def test_nested_matches_are_replaced_once_at_the_outermost_level():
    model = nn.Sequential(nn.Sequential(nn.Sequential(nn.Linear(2, 2))))
    replaced = replace_modules(model, {nn.Sequential: lambda m, i: Doubler(m)})
    assert list(replaced) == ["0"]
    assert [n for n, _ in model.named_children()] == ["0"]  # no dangling children
    assert isinstance(model[0].inner[0], nn.Sequential)


def test_replacements_follow_each_modules_device_in_a_model_on_several_devices():
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4, device="meta"))
    replace_modules(model, {nn.Linear: lambda m, i: Doubler(nn.Linear(4, 4))})
    assert model[0].gain.device.type == "cpu" and model[0].inner.weight.device.type == "cpu"
    assert model[1].gain.device.type == "meta" and model[1].inner.weight.device.type == "meta"


def ids(params):
    return [id(p) for p in params]


def test_new_parameters_join_the_first_group_of_the_first_optimizer_and_vanished_ones_leave():
    model = net()
    first = torch.optim.SGD(
        [{"params": model[0].parameters()}, {"params": model[2].parameters(), "lr": 0.01}], lr=0.1
    )
    second = torch.optim.SGD(model[3].parameters(), lr=0.1)
    kept = ids(model[2].parameters())
    replace_modules(
        model,
        # Linear matches in order: "0" (kept), "2" (wrapped, gains a parameter), "3.0" (removed).
        {nn.Linear: lambda m, i: [None, Doubler(m), nn.Identity()][i]},
        optimizers=[first, second],
    )
    assert ids(first.param_groups[0]["params"]) == [*ids(model[0].parameters()), id(model[2].gain)]
    assert ids(first.param_groups[1]["params"]) == kept  # the wrapped Linear's, same objects
    assert second.param_groups[0]["params"] == []  # its Linear left the model


def test_a_parameter_replaced_under_the_same_name_takes_its_predecessors_place():
    model = net()
    optimizer = torch.optim.SGD(
        [{"params": model[0].parameters()}, {"params": model[2].parameters(), "lr": 0.01}], lr=0.1
    )
    old = model[2]
    replace_modules(
        model, {(lambda m: m is old): lambda m, i: nn.Linear(4, 4)}, optimizers=optimizer
    )
    assert model[2] is not old
    assert ids(optimizer.param_groups[0]["params"]) == ids(model[0].parameters())
    assert ids(optimizer.param_groups[1]["params"]) == ids(model[2].parameters())


def test_replacements_take_the_training_mode_of_the_module_they_replace():
    model = net().eval()
    model[3].train()  # a submodule left in training mode keeps its own mode
    replaced = replace_modules(model, {nn.Linear: lambda m, i: Doubler(m)})
    assert not replaced["0"].training and not replaced["2"].training
    assert replaced["3.0"].training
