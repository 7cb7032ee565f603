"""MuonWithAdamW: torch's Muon on hidden matrices and AdamW on the rest (references computed
here), the split on GPT-2 and Llama, checkpoint resume, by name from YAML, and bad input."""

import copy
import io

import pytest
import torch
from torch import nn

from trainkit.core import plugins
from trainkit.trainer.optim import MuonWithAdamW, split_for_muon


class TinyLM(nn.Module):
    """Embedding, two hidden blocks (linear + bias, a norm gain), an untied head."""

    def __init__(self, vocab: int = 17, width: int = 12):
        super().__init__()
        torch.manual_seed(0)
        self.embed_tokens = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(
            nn.ModuleDict(
                {
                    "norm": nn.LayerNorm(width),
                    "up": nn.Linear(width, 2 * width),
                    "down": nn.Linear(2 * width, width, bias=False),
                }
            )
            for _ in range(2)
        )
        self.lm_head = nn.Linear(width, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(tokens)
        for block in self.blocks:
            x = x + block["down"](torch.relu(block["up"](block["norm"](x))))
        return self.lm_head(x)


def loss_of(model: nn.Module, step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(step)
    tokens = torch.randint(0, 17, (4, 8), generator=g)
    logits = model(tokens[:, :-1])
    return nn.functional.cross_entropy(logits.reshape(-1, 17), tokens[:, 1:].reshape(-1))


def train(model: nn.Module, optimizer: torch.optim.Optimizer, steps: range) -> None:
    for step in steps:
        optimizer.zero_grad()
        loss_of(model, step).backward()
        optimizer.step()


HIDDEN = {f"blocks.{i}.{m}.weight" for i in range(2) for m in ("up", "down")}


def test_split_puts_hidden_matrices_on_muon_and_the_rest_on_adamw():
    muon, adamw = split_for_muon(TinyLM().named_parameters())
    assert {n for n, _ in muon} == HIDDEN
    assert {n for n, _ in adamw} == {
        "embed_tokens.weight",
        "lm_head.weight",
        "blocks.0.up.bias",
        "blocks.1.up.bias",
        *(f"blocks.{i}.norm.{k}" for i in range(2) for k in ("weight", "bias")),
    }


def test_update_equals_torch_muon_on_matrices_and_adamw_on_the_rest():
    model, reference = TinyLM(), TinyLM()
    options = {"lr": 0.05, "momentum": 0.9, "weight_decay": 0.1}
    adamw_options = {"lr": 1e-2, "betas": (0.8, 0.9), "eps": 1e-6, "weight_decay": 0.2}
    ours = MuonWithAdamW(
        model.named_parameters(),
        **options,
        **{f"adamw_{k}": v for k, v in adamw_options.items()},
    )
    named = dict(reference.named_parameters())
    muon = torch.optim.Muon([named[n] for n in sorted(HIDDEN)], **options)
    adamw = torch.optim.AdamW([p for n, p in named.items() if n not in HIDDEN], **adamw_options)
    for step in range(3):
        train(model, ours, range(step, step + 1))
        muon.zero_grad(), adamw.zero_grad()
        loss_of(reference, step).backward()
        muon.step(), adamw.step()
        for name, param in model.named_parameters():
            assert torch.equal(param, named[name]), (step, name)
    assert all(p.grad is not None for p in model.parameters())
    ours.zero_grad()
    assert all(p.grad is None for p in model.parameters())


def test_lr_schedules_scale_both_groups():
    model = TinyLM()
    optimizer = MuonWithAdamW(model, lr=0.02, adamw_lr=3e-4)
    assert [g["use_muon"] for g in optimizer.param_groups] == [False, True]
    torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5)
    assert [g["lr"] for g in optimizer.param_groups] == pytest.approx([1.5e-4, 0.01])


def test_checkpoint_round_trip_continues_as_the_uninterrupted_run():
    straight = TinyLM()
    optimizer = MuonWithAdamW(straight.named_parameters(), lr=0.05, adamw_lr=1e-2)
    train(straight, optimizer, range(6))

    first = TinyLM()
    optimizer = MuonWithAdamW(first.named_parameters(), lr=0.05, adamw_lr=1e-2)
    train(first, optimizer, range(3))
    buffer = io.BytesIO()
    torch.save({"model": first.state_dict(), "optimizer": optimizer.state_dict()}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)

    resumed = TinyLM()
    resumed.load_state_dict(saved["model"])
    optimizer = MuonWithAdamW(resumed.named_parameters(), lr=0.05, adamw_lr=1e-2)
    optimizer.load_state_dict(saved["optimizer"])
    assert optimizer.state[resumed.blocks[0].up.weight]["momentum_buffer"].abs().sum() > 0
    train(resumed, optimizer, range(3, 6))
    for (name, a), b in zip(straight.named_parameters(), resumed.parameters(), strict=True):
        assert torch.equal(a, b), name


def test_rebinding_to_replaced_parameters_keeps_training_them():
    from trainkit.core import rebind_optimizers

    model = TinyLM()
    optimizer = MuonWithAdamW(model.named_parameters())
    names = {id(p): n for n, p in model.named_parameters()}
    train(model, optimizer, range(1))
    replaced = copy.deepcopy(model)  # a strategy swapping every parameter under its name
    rebind_optimizers([optimizer], replaced, names)
    before = replaced.blocks[0].up.weight.detach().clone()
    train(replaced, optimizer, range(1, 2))
    assert not torch.equal(before, replaced.blocks[0].up.weight)


def test_split_on_hf_gpt2_and_llama():
    import transformers  # in the trainer package's test dependencies

    gpt2 = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=2, n_head=2)
    )
    muon, adamw = split_for_muon(gpt2)
    assert sorted(n for n, _ in muon) == sorted(
        f"transformer.h.{i}.{m}.weight"
        for i in range(2)
        for m in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")
    )
    # lm_head is tied to wte, so named_parameters() lists it once, as wte.
    assert {"transformer.wte.weight", "transformer.wpe.weight"} <= {n for n, _ in adamw}
    assert all(p.ndim == 1 for n, p in adamw if "wte" not in n and "wpe" not in n)

    llama = transformers.LlamaForCausalLM(
        transformers.LlamaConfig(
            vocab_size=64,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            max_position_embeddings=16,
        )
    )
    muon, adamw = split_for_muon(llama)
    projections = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    assert len(muon) == 2 * len(projections)
    assert all(n.split(".")[-2] in projections for n, _ in muon)
    assert {"model.embed_tokens.weight", "lm_head.weight"} <= {n for n, _ in adamw}
    assert all(
        p.ndim == 1 for n, p in adamw if n not in {"model.embed_tokens.weight", "lm_head.weight"}
    )
    MuonWithAdamW(llama).step()  # no gradients yet: nothing moves, nothing fails


def test_muon_is_registered_by_name():
    assert plugins.load("trainkit.optimizers", "muon") is MuonWithAdamW


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda m: MuonWithAdamW(m.parameters()), r"needs names: pass model.named_parameters\(\)"),
        (lambda m: MuonWithAdamW(m, lr=-1.0), r"Learning rate should be >= 0"),
        (lambda m: MuonWithAdamW(m, adjust_lr_fn="wide"), r"wide is not supported"),
        (lambda m: MuonWithAdamW(m, adamw_betas=(0.9,)), r"adamw_betas must be two numbers"),
        (lambda m: MuonWithAdamW(m, adamw_modules="lm_head"), r"adamw_modules must be a list"),
        (lambda m: MuonWithAdamW(m, adamw_modules=["*"]), r"found no hidden 2-D weight matrix"),
        (lambda m: MuonWithAdamW(nn.LayerNorm(4)), r"found no hidden 2-D weight matrix"),
    ],
)
def test_bad_arguments_are_refused_with_what_is_accepted(build, message):
    with pytest.raises(ValueError, match=message):
        build(TinyLM())


def test_a_muon_group_of_vectors_is_refused():
    model = TinyLM()
    optimizer = MuonWithAdamW(model)
    with pytest.raises(ValueError, match=r"Muon updates 2-D matrices only; this group has shapes"):
        optimizer.add_param_group(
            {"params": [torch.zeros(3, requires_grad=True)], "use_muon": True}
        )


def test_distributed_checkpoint_state_dict_round_trip_keeps_groups_and_state():
    # trainkit-checkpoint saves optimizers through these functions (parameters by name).
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    straight = TinyLM()
    optimizer = MuonWithAdamW(straight, lr=0.05, adamw_lr=1e-2)
    train(straight, optimizer, range(2))
    model_state, optim_state = copy.deepcopy(get_state_dict(straight, optimizer))
    assert [g["use_muon"] for g in optim_state["param_groups"]] == [False, True]

    resumed = TinyLM(vocab=17)
    with torch.no_grad():
        resumed.lm_head.weight.zero_()  # differs from the saved model until loaded
    optimizer_resumed = MuonWithAdamW(resumed, lr=0.05, adamw_lr=1e-2)
    set_state_dict(
        resumed, optimizer_resumed, model_state_dict=model_state, optim_state_dict=optim_state
    )
    train(straight, optimizer, range(2, 4))
    train(resumed, optimizer_resumed, range(2, 4))
    for (name, a), b in zip(straight.named_parameters(), resumed.parameters(), strict=True):
        assert torch.equal(a, b), name
