"""float8_training: eligible linears become torchao Float8Linear at INIT, the rest stays,
training still learns, and hardware or installs that cannot do
fp8 are refused with what to do instead. Runs on CPU (torchao emulates the fp8 casts);
tests/algorithms/test_gpu_float8.py runs it on a GPU, and
tests/integration/test_float8_with_siblings.py with checkpoints and FSDP2."""

import functools
import importlib.util

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torchao.float8.float8_linear import Float8Linear

from toy import blobs, loader
from trainkit.algorithms import (
    Float8Training,
    Float8TrainingConfig,
    apply_float8_training,
    check_float8_device,
    float8_eligible,
)
from trainkit.algorithms import float8_training as float8_module
from trainkit.core import Callback, TrainModel, plugins
from trainkit.trainer import Classifier, Trainer


def net(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(16, 64),  # 0: converted
        nn.ReLU(),
        nn.Linear(64, 40),  # 2: 40 is not a multiple of 16
        nn.ReLU(),
        nn.Linear(40, 64),  # 4: 40 again
        nn.ReLU(),
        nn.Linear(64, 32),  # 6: converted
        nn.ReLU(),
        nn.Linear(32, 16),  # 8: the output head
    )


class TinyTransformer(TrainModel):
    """Embedding, one encoder layer, a head; learns to name each position's token."""

    def __init__(self, vocab=32, width=32, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.embed = nn.Embedding(vocab, width)
        self.block = nn.TransformerEncoderLayer(
            width, nhead=2, dim_feedforward=64, dropout=0.0, batch_first=True
        )
        self.head = nn.Linear(width, vocab)

    def forward(self, batch):
        return self.head(self.block(self.embed(batch[0])))

    def loss(self, outputs, batch):
        return F.cross_entropy(outputs.flatten(0, 1).float(), batch[1].flatten())


class Losses(Callback):
    def __init__(self):
        self.losses = []

    def after_loss(self, state, logger):
        self.losses.append(float(state.loss.detach()))


def test_converts_eligible_linears_and_leaves_the_rest():
    model = net()
    x = torch.randn(4, 16)
    expected = model(x)
    params = dict(model.named_parameters())
    keys = list(model.state_dict())
    assert apply_float8_training(model) == ["0", "6"]
    assert [type(model[i]) for i in (0, 2, 4, 6, 8)] == [
        Float8Linear,
        nn.Linear,
        nn.Linear,
        Float8Linear,
        nn.Linear,
    ]
    # Same Parameter objects, same state-dict names: optimizers and checkpoints see one model.
    assert all(p is params[n] for n, p in model.named_parameters())
    assert list(model.state_dict()) == keys
    out = model(x)
    assert not torch.equal(out, expected)  # the fp8 casts round
    torch.testing.assert_close(out, expected, atol=0.1, rtol=0.1)


def test_module_globs_exclude_and_the_output_head():
    assert float8_eligible(net(), Float8TrainingConfig(modules=["6"])) == ["6"]
    assert float8_eligible(net(), Float8TrainingConfig(exclude=["0"])) == ["6"]
    assert float8_eligible(net(), Float8TrainingConfig(keep_output_head=False)) == ["0", "6", "8"]
    model = TinyTransformer()
    # The encoder's out_proj is a Linear subclass that MultiheadAttention uses without its
    # forward: not converted. The head (32 -> 32) is kept in high precision by default.
    assert float8_eligible(model) == ["block.linear1", "block.linear2"]
    assert float8_eligible(model, Float8TrainingConfig(modules=["block.*1"])) == ["block.linear1"]


def test_output_head_is_the_models_output_embeddings_where_it_says_so():
    class HeadFirst(nn.Module):
        def __init__(self):
            super().__init__()
            self.lm_head = nn.Linear(32, 64)
            self.body = nn.Linear(16, 32)

        def get_output_embeddings(self):
            return self.lm_head

    assert float8_eligible(HeadFirst()) == ["body"]


def test_no_eligible_layer_warns():
    with pytest.warns(UserWarning, match="float8_training matched no module"):
        assert apply_float8_training(nn.Sequential(nn.Linear(10, 20), nn.Linear(20, 3))) == []


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_training_a_tiny_transformer_lowers_the_loss(recipe):
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 32, (128, 8), generator=generator)
    model = TinyTransformer()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = Losses()
    make = functools.partial(
        Trainer,
        model=model,
        optimizers=optimizer,
        train_dataloader=DataLoader(TensorDataset(tokens, tokens), batch_size=16, shuffle=True),
        max_duration="3ep",
        algorithms=[Float8Training(recipe=recipe)],
        precision="amp_bf16",
        callbacks=[losses],
        progress_bar=False,
        device="cpu",
        seed=0,
    )
    if recipe == "rowwise" and not float8_module._cpu_rowwise_scales():
        # A torch whose CPU fp8 matmul takes per-tensor scales only (2.11): refused at INIT.
        with pytest.raises(RuntimeError, match="'rowwise' recipe on CPU"):
            make()
        assert type(model.block.linear1) is nn.Linear
        return
    trainer = make()
    assert isinstance(model.block.linear1, Float8Linear)
    assert not isinstance(model.block.self_attn.out_proj, Float8Linear)
    assert type(model.head) is nn.Linear
    held = {id(p) for g in optimizer.param_groups for p in g["params"]}
    assert held == {id(p) for p in model.parameters()}
    before = model.block.linear1.weight.detach().clone()
    trainer.fit()
    assert not torch.equal(model.block.linear1.weight, before)  # fp8 layers get gradients
    first, last = sum(losses.losses[:4]) / 4, sum(losses.losses[-4:]) / 4
    assert last < 0.5 * first, losses.losses


def test_loss_follows_the_high_precision_run():
    def run(algorithms):
        losses = Losses()
        model = Classifier(net(), num_classes=16)
        data = blobs(256, features=16)
        Trainer(
            model=model,
            optimizers=torch.optim.AdamW(model.parameters(), lr=3e-3),
            train_dataloader=loader(data, batch_size=32, shuffle=False),
            max_duration="3ep",
            algorithms=algorithms,
            callbacks=[losses],
            progress_bar=False,
            device="cpu",
            seed=0,
        ).fit()
        return torch.tensor(losses.losses)

    fp8, fp32 = run([Float8Training()]), run([])
    assert not torch.equal(fp8, fp32)
    torch.testing.assert_close(fp8, fp32, atol=0.05, rtol=0.05)
    assert fp8[-4:].mean() < 0.5 * fp8[:4].mean()


def make(tmp_path, **kwargs):
    model = Classifier(net(), num_classes=16)
    return Trainer(
        model=model,
        optimizers=torch.optim.AdamW(model.parameters(), lr=3e-3),
        train_dataloader=loader(blobs(64, features=16)),  # 4 batches an epoch
        max_duration="6ba",
        algorithms=[Float8Training()],
        progress_bar=False,
        device="cpu",
        seed=3,
        run_name="float8",
        **kwargs,
    )


def test_a_gpu_older_than_sm89_is_refused_by_name(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: "NVIDIA A100-SXM4-80GB")
    with pytest.raises(RuntimeError, match=r"NVIDIA A100-SXM4-80GB \(SM 8\.0\).*amp_bf16") as err:
        check_float8_device("cuda:0")
    assert "8.9" in str(err.value) and "Hopper" in str(err.value)
    model = net()
    with pytest.raises(RuntimeError, match="A100"):
        apply_float8_training(model, device="cuda:0")
    assert type(model[0]) is nn.Linear  # refused before any change
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (9, 0))
    check_float8_device("cuda:0")  # Hopper passes
    check_float8_device("cpu")


def test_rowwise_on_a_cpu_without_rowwise_scales_is_refused_before_any_change(monkeypatch):
    # torch 2.11's CPU _scaled_mm takes one scale per tensor: training stopped at the first
    # forward with "INTERNAL ASSERT FAILED ... please report a bug to PyTorch".
    monkeypatch.setattr(float8_module, "_cpu_rowwise_scales", lambda: False)
    model = net()
    with pytest.raises(RuntimeError, match=r"'rowwise' recipe on CPU.*recipe='tensorwise'"):
        apply_float8_training(model, recipe="rowwise", device="cpu")
    assert type(model[0]) is nn.Linear
    apply_float8_training(model, recipe="tensorwise", device="cpu")  # tensorwise still runs
    assert isinstance(model[0], Float8Linear)


def test_the_rowwise_probe_agrees_with_a_rowwise_cpu_matmul():
    float8_module._cpu_rowwise_scales.cache_clear()
    a = torch.ones(16, 16, dtype=torch.float8_e4m3fn)
    try:
        torch._scaled_mm(a, a.t(), scale_a=torch.ones(16, 1), scale_b=torch.full((1, 16), 2.0))
        works = True
    except RuntimeError:
        works = False
    assert float8_module._cpu_rowwise_scales() is works


def test_missing_torchao_names_the_extra_when_built(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "torchao" else real(name, *a)
    )
    with pytest.raises(ImportError, match=r"pip install \"trainkit-algorithms\[fp8\]\""):
        Float8Training()
    with pytest.raises(ImportError, match=r"trainkit-algorithms\[fp8\]"):
        apply_float8_training(net())
    assert "torchao" not in float8_module.__dict__  # the module itself never imports it


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"recipe": "delayed"}, "recipe 'delayed' is not a float8 recipe"),
        ({"modules": "blocks.*"}, "modules must be a list of glob patterns"),
        ({"exclude": [3]}, "exclude must be a list of glob patterns"),
    ],
)
def test_bad_config(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Float8TrainingConfig(**kwargs)


def test_entry_point():
    assert plugins.load("trainkit.algorithms", "float8_training") is Float8Training
