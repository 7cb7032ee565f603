"""LoRA adapters through the peft library: a `HuggingFaceModel` wrapping
``peft.get_peft_model(GPT-2, LoraConfig(...))`` trains only its adapters, checkpoints,
resumes bitwise after kill -9, and its adapter exports as a folder peft loads."""

import pytest
import torch
from torch.utils.data import DataLoader

from ckpt_runs import KillAt, in_child, takes_over_the_dead_run
from trainkit.checkpoint import (
    Checkpointer,
    export_checkpoint,
    inspect_checkpoint,
    list_checkpoints,
    load_checkpoint,
)
from trainkit.core import Callback
from trainkit.trainer import HuggingFaceModel, Trainer

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

VOCAB = 48


@pytest.fixture(autouse=True)
def one_thread():
    # Forked children run single-threaded; the parent matches them for bitwise comparisons.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _base(seed=0):
    torch.manual_seed(seed)
    config = transformers.GPT2Config(
        n_layer=2, n_head=2, n_embd=32, vocab_size=VOCAB, n_positions=32,
        bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1, loss_type="ForCausalLM",
    )  # fmt: skip
    return transformers.GPT2LMHeadModel(config)


def _lora(seed=0):
    config = peft.LoraConfig(
        r=4, lora_alpha=8, lora_dropout=0.1, target_modules=["c_attn", "c_proj"],
        fan_in_fan_out=True, task_type="CAUSAL_LM",
    )  # fmt: skip
    base = _base(seed)
    torch.manual_seed(seed + 1)
    return HuggingFaceModel(peft.get_peft_model(base, config))


def _sequences(count=32, seed=0):
    generator = torch.Generator().manual_seed(seed)
    start = torch.randint(0, 16, (count, 1), generator=generator)
    ids = (start + torch.arange(12)) % 16
    return [{"input_ids": i, "attention_mask": torch.ones_like(i), "labels": i} for i in ids]


def _trainer(folder=None, *, callbacks=(), max_duration="3ep", **checkpointer):
    model = _lora()
    adapters = [p for p in model.parameters() if p.requires_grad]
    extra = [Checkpointer(folder=folder, **checkpointer)] if folder is not None else []
    return Trainer(
        model=model,
        train_dataloader=DataLoader(_sequences(), batch_size=4, shuffle=True),
        optimizers=torch.optim.AdamW(adapters, lr=1e-2),
        max_duration=max_duration,
        callbacks=[*extra, *callbacks],
        progress_bar=False,
        device="cpu",
        seed=5,
    )


def _state(model):
    return {name: value.detach().clone() for name, value in model.state_dict().items()}


def _assert_equal(a, b):
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


class Gradients(Callback):
    """The names of the parameters that have a gradient after each backward."""

    def __init__(self):
        self.seen = []

    def after_backward(self, state, logger):
        model = state.model
        self.seen.append({n for n, p in model.named_parameters() if p.grad is not None})


def test_only_the_adapters_train():
    gradients = Gradients()
    run = _trainer(max_duration="4ba", callbacks=[gradients])
    assert run.state.model.shift_labels  # PeftModelForCausalLM is taken for a causal LM
    before = _state(run.state.model)
    trainable = {n for n, p in run.state.model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    optimized = {id(p) for group in run.state.optimizers[0].param_groups for p in group["params"]}
    named = dict(run.state.model.named_parameters())
    assert optimized == {id(named[n]) for n in trainable}
    run.fit()
    after = _state(run.state.model)
    changed = {n for n in before if not torch.equal(before[n], after[n])}
    # lora_B starts at zero, so both A and B move once B is no longer zero.
    assert changed == trainable
    assert len(gradients.seen) == 4 and all(seen == trainable for seen in gradients.seen)


def test_a_lora_checkpoint_round_trips_by_name(tmp_path):
    run = _trainer(tmp_path, max_duration="5ba")
    run.fit()
    fresh = _trainer()
    manifest = load_checkpoint(fresh.state, tmp_path / "ep0-ba5")
    assert manifest.timestamp["batch"] == 5
    _assert_equal(_state(fresh.state.model), _state(run.state.model))
    saved = run.state.optimizers[0].state_dict()["state"]
    loaded = fresh.state.optimizers[0].state_dict()["state"]
    assert saved.keys() == loaded.keys() and len(saved) == len(
        [p for p in run.state.model.parameters() if p.requires_grad]
    )
    for index in saved:
        assert torch.equal(saved[index]["exp_avg_sq"], loaded[index]["exp_avg_sq"])
    # The checkpoint names every weight as the model does (peft's names kept).
    saved_names = set(inspect_checkpoint(tmp_path / "ep0-ba5")["model"])
    assert saved_names == set(_state(run.state.model))
    assert any(name.endswith("lora_A.default.weight") for name in saved_names)


@pytest.mark.parametrize("async_save", [False, True])
def test_lora_resume_after_kill_9_is_bitwise_equal(tmp_path, async_save):
    options = dict(interval="4ba", autoresume=True, async_save=async_save)
    assert in_child(lambda: _trainer(tmp_path, callbacks=[KillAt(14)], **options).fit()) == -9
    names = [p.name for p in list_checkpoints(tmp_path)]
    assert names[0] in {"ep1-ba12", "ep0-ba8"}  # an async save of batch 12 may be lost
    # Autoresume takes the complete checkpoint `latest` names: batch 8's when the kill came
    # after batch 12's async save was published and before it rewrote `latest`.
    latest = (tmp_path / "latest").read_text().strip()
    assert latest == names[0] or (async_save and (latest, names[0]) == ("ep0-ba8", "ep1-ba12"))

    resumed = _trainer(tmp_path, **options)
    assert resumed.state.timestamp.batch == int(latest.rsplit("ba", 1)[1])
    with takes_over_the_dead_run():
        resumed.fit()
    reference = _trainer()
    reference.fit()
    _assert_equal(_state(resumed.state.model), _state(reference.state.model))


def test_the_adapter_exported_from_a_lora_checkpoint_loads_with_peft(tmp_path):
    run = _trainer(tmp_path / "run", max_duration="6ba")
    run.fit()
    run.close()
    out = tmp_path / "adapter"
    export_checkpoint(tmp_path / "run" / "ep0-ba6", out, format="hf")
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {p.name for p in out.iterdir()}

    # The frozen base is the one the run started from: the same config and seed.
    loaded = peft.PeftModel.from_pretrained(_base(), out).eval()
    trained, base = run.state.model.model.eval(), _base().eval()
    ids = (torch.arange(10)[None] + torch.arange(3)[:, None]) % 16
    with torch.no_grad():
        expected = trained(input_ids=ids).logits
        assert torch.equal(loaded(input_ids=ids).logits, expected)
        assert not torch.allclose(base(input_ids=ids).logits, expected)  # the adapter trained
