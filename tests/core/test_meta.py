"""A model built on the meta device, allocated and initialised by its own init
(`trainkit.core.meta.materialize`), whole or part by part."""

import pytest
import torch
from torch import nn

from trainkit.core.meta import materialize, on_meta


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.norm = nn.BatchNorm1d(width)
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)


class Net(nn.Module):
    def __init__(self, width=4, depth=3):
        super().__init__()
        self.embed = nn.Embedding(10, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = nn.Linear(width, 10, bias=False)
        self.head.weight = self.embed.weight  # tied


def on_meta_device(build=Net):
    with torch.device("meta"):
        return build()


def values(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_a_meta_model_is_allocated_and_initialised_by_its_modules_own_init():
    model = on_meta_device()
    assert on_meta(model)
    materialize(model, torch.device("cpu"), seed=3)
    assert not on_meta(model)
    assert model.head.weight is model.embed.weight  # still tied
    # Each module's reset_parameters ran: BatchNorm's statistics and weights, Linear's
    # uniform bounds, Embedding's normal values.
    block = model.blocks[0]
    assert torch.equal(block.norm.running_var, torch.ones(4))
    assert torch.equal(block.norm.weight.detach(), torch.ones(4))
    bound = 1 / 4**0.5
    assert block.up.weight.abs().max() <= bound and block.up.weight.std() > 0.1 * bound
    # Tied: the module initialised last (the head, a Linear) sets the shared weight.
    assert model.embed.weight.abs().max() <= bound and model.embed.weight.std() > 0.1 * bound
    # The same seed gives the same model; the blocks differ from each other.
    again = on_meta_device()
    materialize(again, torch.device("cpu"), seed=3)
    assert all(
        torch.equal(a, b)
        for a, b in zip(values(model).values(), values(again).values(), strict=True)
    )
    assert not torch.equal(model.blocks[0].up.weight, model.blocks[1].up.weight)
    other = on_meta_device()
    materialize(other, torch.device("cpu"), seed=4)
    assert not torch.equal(model.blocks[0].up.weight, other.blocks[0].up.weight)


def test_part_by_part_gives_the_weights_of_the_whole_and_leaves_done_parts_alone():
    whole = on_meta_device()
    materialize(whole, torch.device("cpu"), seed=5)
    parts = on_meta_device()
    # As a sharding strategy does it: the last block first, then the others, then the rest.
    blocks = list(parts.blocks)[::-1]
    for i, block in enumerate(blocks):
        materialize(parts, torch.device("cpu"), 5, part=block, skip=blocks[:i])
        assert not on_meta(block) and on_meta(parts.embed)
        if i + 1 < len(blocks):
            assert on_meta(blocks[i + 1])
    done = values(blocks[0])
    with torch.no_grad():
        blocks[0].up.weight.add_(1.0)  # a done (sharded) block is not initialised again
    materialize(parts, torch.device("cpu"), 5, skip=blocks)
    assert torch.equal(blocks[0].up.weight, done["up.weight"] + 1.0)
    with torch.no_grad():
        blocks[0].up.weight.copy_(done["up.weight"])
    assert values(parts).keys() == values(whole).keys()
    assert all(torch.equal(values(parts)[k], v) for k, v in values(whole).items())


def test_the_model_init_wins_over_reset_parameters_as_in_huggingface_models():
    class Owned(Net):
        def _init_weights(self, module):
            for parameter in module.parameters(recurse=False):
                nn.init.constant_(parameter, 0.5)

    model = on_meta_device(Owned)
    materialize(model, torch.device("cpu"), seed=0)
    assert all(torch.all(p == 0.5) for p in model.parameters())
    assert torch.equal(model.blocks[0].norm.running_var, torch.ones(4))  # buffers: as built


def test_a_module_without_an_init_is_refused_by_name():
    class Scale(nn.Module):
        def __init__(self):
            super().__init__()
            self.factor = nn.Parameter(torch.ones(3))

    class WithScale(Net):
        def __init__(self):
            super().__init__()
            self.scale = Scale()

    model = on_meta_device(WithScale)
    with pytest.raises(TypeError, match=r"cannot initialise scale \(Scale\) built on the meta"):
        materialize(model, torch.device("cpu"), seed=0)


def test_the_global_generators_are_left_as_they_were():
    torch.manual_seed(11)
    expected = torch.rand(3)
    torch.manual_seed(11)
    materialize(on_meta_device(), torch.device("cpu"), seed=0)
    assert torch.equal(torch.rand(3), expected)
