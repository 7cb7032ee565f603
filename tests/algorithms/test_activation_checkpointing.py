"""ActivationCheckpointing: full, selective and offloaded activations give the gradients of
a run without them, and move work where they say (recomputed matmuls, CPU copies)."""

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from toy import blobs, loader
from trainkit.algorithms import ActivationCheckpointing, apply_activation_checkpointing
from trainkit.core import TrainModel
from trainkit.trainer import Trainer


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)
        self.drop = nn.Dropout(0.2)  # recomputed with the same mask, or the gradients differ

    def forward(self, x):
        return x + self.drop(self.down(F.gelu(self.up(self.norm(x)))))


class Net(TrainModel):
    def __init__(self, width=16, depth=3):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Linear(8, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = nn.Linear(width, 2)

    def forward(self, batch):
        hidden = self.embed(batch[0])
        for block in self.blocks:
            hidden = block(hidden)
        return self.head(hidden)

    def loss(self, outputs, batch):
        return F.cross_entropy(outputs, batch[1])


class CountMatmuls(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default):
            self.count += 1
        return func(*args, **(kwargs or {}))


def gradients_and_backward_matmuls(mode):
    model = Net()
    if mode is not None:
        assert apply_activation_checkpointing(model, mode) == 3  # the repeated blocks
    x, y = torch.randn(32, 8, generator=torch.Generator().manual_seed(1)), torch.arange(32) % 2
    torch.manual_seed(2)
    loss = model.loss(model((x, y)), (x, y))
    with CountMatmuls() as counted:
        loss.backward()
    return {n: p.grad for n, p in model.named_parameters()}, counted.count


@pytest.mark.parametrize("mode", ["full", "selective", "offload"])
def test_each_mode_gives_the_gradients_of_a_run_without_it(mode):
    expected, plain = gradients_and_backward_matmuls(None)
    grads, matmuls = gradients_and_backward_matmuls(mode)
    assert grads.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(grads[name], expected[name], rtol=0, atol=0, msg=name)
    # Backward recomputes the blocks' two matmuls each under "full"; "selective" kept their
    # outputs; "offload" recomputes nothing.
    recomputed = {"full": 2 * 3, "selective": 0, "offload": 0}[mode]
    assert matmuls == plain + recomputed


def test_offload_moves_what_each_block_saves_through_cpu_memory(monkeypatch):
    packed = []
    original = torch.autograd.graph.save_on_cpu.__init__

    def spy(self, pin_memory=False, device_type="cuda"):
        original(self, pin_memory, device_type)
        pack = self.pack_hook

        def counting(tensor):
            packed.append(tensor.numel())
            return pack(tensor)

        self.pack_hook = counting

    monkeypatch.setattr(torch.autograd.graph.save_on_cpu, "__init__", spy)
    gradients_and_backward_matmuls("offload")
    assert len(packed) >= 3 * 4  # each block's saved tensors (norm, matmuls, gelu, mask)


def test_it_trains_under_the_trainer_by_name_and_keeps_parameter_names():
    from trainkit.core import plugins

    assert (
        plugins.load("trainkit.algorithms", "activation_checkpointing") is ActivationCheckpointing
    )
    runs = {}
    for mode in (None, "selective"):
        model = Net()
        names = [n for n, _ in model.named_parameters()]
        trainer = Trainer(
            model=model,
            train_dataloader=loader(blobs(64, seed=1), batch_size=16),
            max_duration="4ba",
            algorithms=[ActivationCheckpointing(mode)] if mode else [],
            device="cpu",
            seed=3,
            progress_bar=False,
        )
        trainer.fit()
        assert [n for n, _ in trainer.state.model.named_parameters()] == names
        runs[mode] = [p.detach().clone() for p in trainer.state.model.parameters()]
    for a, b in zip(runs[None], runs["selective"], strict=True):
        torch.testing.assert_close(a, b)


def test_bad_options_are_refused_with_what_is_accepted():
    with pytest.raises(ValueError, match=r"mode 'partial' is not known; use one of \['full'"):
        ActivationCheckpointing("partial")
    with pytest.warns(UserWarning, match="matched no module in Sequential .no ModuleList of"):
        assert apply_activation_checkpointing(nn.Sequential(nn.Linear(2, 2)), "full") == 0
    with pytest.warns(UserWarning, match="no module matches the classes or predicate given"):
        assert apply_activation_checkpointing(Net(), "full", modules=[nn.Conv2d]) == 0
    assert apply_activation_checkpointing(Net(), "full", modules=[nn.Linear]) == 8
