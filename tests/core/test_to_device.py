"""`to_device`: every tensor of a (nested) batch reaches the device, values that are not
tensors are kept, and a batch already there costs no copy of what cannot change."""

from typing import NamedTuple

import torch
from torch import nn

from trainkit.core.data import default_num_samples, to_device

CPU, META = torch.device("cpu"), torch.device("meta")


def test_a_tuple_already_on_the_device_is_returned_as_it_is():
    batch = (torch.zeros(4, 3), torch.ones(4))
    assert to_device(batch, CPU) is batch


def test_a_list_already_on_the_device_is_a_new_list_of_the_same_tensors():
    # A list can be changed in place by whoever holds state.batch: the loader's list (a
    # batch list that is iterated again next epoch) must not change with it.
    x, y = torch.zeros(4, 3), torch.ones(4)
    batch = [x, y]
    moved = to_device(batch, CPU)
    assert moved is not batch and type(moved) is list
    assert moved[0] is x and moved[1] is y
    moved[0] = torch.full((4, 3), 7.0)
    assert batch[0] is x


def test_every_tensor_is_moved_and_other_values_are_kept():
    class Pair(NamedTuple):
        image: torch.Tensor
        label: int

    batch = (
        torch.zeros(2, 3),
        [torch.ones(2), "a caption"],
        {"mask": torch.ones(2, 5), "k": 3},
        Pair(torch.zeros(2), 1),
    )
    moved = to_device(batch, META)
    assert type(moved) is tuple and moved[0].device == META
    assert type(moved[1]) is list and moved[1][0].device == META and moved[1][1] == "a caption"
    assert moved[2]["mask"].device == META and moved[2]["k"] == 3
    assert type(moved[3]) is Pair and moved[3].image.device == META and moved[3].label == 1
    assert batch[0].device == CPU  # the input batch is not changed


def test_a_tuple_with_a_value_that_is_not_a_plain_tensor_is_rebuilt_with_it():
    weight = nn.Parameter(torch.zeros(3))  # a tensor subclass: taken through the general walk
    batch = (torch.zeros(2), weight, None)
    moved = to_device(batch, CPU)
    assert type(moved) is tuple and all(a is b for a, b in zip(moved, batch, strict=True))
    moved = to_device(batch, META)
    assert moved[0].device == META and moved[1].device == META and moved[2] is None


def test_samples_are_counted_from_the_first_tensor_with_a_batch_dimension():
    assert default_num_samples((torch.zeros(5, 3), torch.zeros(5))) == 5
    assert default_num_samples([torch.zeros(6), torch.zeros(6)]) == 6
    # A 0-d tensor first is a setting, not samples: the next tensor counts.
    assert default_num_samples((torch.tensor(0.5), torch.zeros(7, 2))) == 7
    # A tensor subclass first counts like a tensor.
    assert default_num_samples((nn.Parameter(torch.zeros(3, 2)), torch.zeros(3))) == 3
