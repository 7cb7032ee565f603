"""``trainkit plan``: the memory per rank, traced on the meta device, against what a real
run holds on CPU, and the command's report."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from trainkit.cli._main import main
from trainkit.cli._memory import Layout, activation_bytes, estimate, parse_bytes

SIZE = {"n_layer": 4, "n_embd": 256, "n_head": 4, "vocab_size": 1024, "n_positions": 256}
BATCH, SEQ = 8, 256

# The same model and batch, really allocated: resident memory after the forward (the
# logits dropped, as the trace counts only what autograd keeps) and after a step.
MEASURE = textwrap.dedent(
    f"""
    import json, torch
    from transformers import GPT2Config, GPT2LMHeadModel
    from trainkit.trainer import HuggingFaceModel

    def resident():
        with open("/proc/self/statm") as f:
            import os
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = HuggingFaceModel(GPT2LMHeadModel(GPT2Config(**{SIZE!r}, attn_pdrop=0.0,
                                                        resid_pdrop=0.0, embd_pdrop=0.0)))
    ids = torch.randint(0, {SIZE["vocab_size"]}, ({BATCH}, {SEQ}))
    batch = {{"input_ids": ids, "labels": ids}}
    optimizer = torch.optim.AdamW(model.parameters())
    for step in range(2):  # the second step: every lazy allocation made by the first
        before = resident()
        outputs = model(batch)
        loss = model.loss(outputs, batch)
        del outputs
        forward = resident() - before
        loss.backward()
        del loss
        optimizer.step()
    grads_and_states = resident() - before
    print(json.dumps({{"activations": forward}}))
    """
)


def meta_model():
    from transformers import GPT2Config, GPT2LMHeadModel

    from trainkit.trainer import HuggingFaceModel

    with torch.device("meta"):
        return HuggingFaceModel(
            GPT2LMHeadModel(GPT2Config(**SIZE, attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0))
        )


def test_the_traced_activations_match_what_a_cpu_run_holds():
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}  # freed tensors leave at once
    done = subprocess.run(
        [sys.executable, "-c", MEASURE], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    measured = json.loads(done.stdout.strip().splitlines()[-1])["activations"]
    ids = torch.randint(0, SIZE["vocab_size"], (BATCH, SEQ), device="meta")
    traced = activation_bytes(meta_model(), {"input_ids": ids, "labels": ids}, mixed=False)
    assert traced == pytest.approx(measured, rel=0.15), (traced, measured)
    assert traced > 50 * 2**20  # large enough to measure: tens of MB


def test_sharding_divides_the_model_state_and_adam_keeps_two_copies():
    model = meta_model()
    count = sum(p.numel() for p in model.parameters())
    adam = torch.optim.AdamW(model.parameters())
    one = estimate(model, [adam], Layout(world_size=1), activations=0)
    assert one.parts["parameters"] == one.parts["gradients"] == 4 * count
    assert one.parts["optimizer state"] == 8 * count
    four = estimate(model, [adam], Layout(world_size=4, shard=4, fsdp=True), activations=0)
    assert four.parts["optimizer state"] == 8 * count // 4
    assert 0 < four.parts["gathered for compute"] < 4 * count  # blocks, not the model
    ddp = estimate(model, [adam], Layout(world_size=4), activations=0)
    assert ddp.parts["DDP gradient buckets"] == 4 * count
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    assert estimate(model, [sgd], Layout(world_size=1), 0).parts["optimizer state"] == 0


def test_the_command_reports_each_part_and_what_would_make_it_fit(tmp_path, capsys):
    config = tmp_path / "gpt.yaml"
    config.write_text(
        "model: {name: huggingface, config: {model_type: gpt2, n_layer: 4, n_embd: 256, "
        "n_head: 4, vocab_size: 1024, n_positions: 256}}\n"
        "data: {name: stdlib_text, seq_len: 256, batch_size: 32}\n"
        "trainer: {max_duration: 10ba}\n"
    )
    assert main(["plan", str(config), "--gpu-memory", "80GB"]) == 0
    out = capsys.readouterr().out
    assert "microbatch 32" in out and "total" in out and "fits" in out
    for part in ("parameters", "gradients", "optimizer state", "activations"):
        assert part in out
    # 1 GiB usable (3 less the 2 kept back) cannot hold it (about 1 GiB of activations
    # alone); a smaller microbatch or checkpointing can, on 2 GPUs with FSDP.
    assert main(["plan", str(config), "--gpus-per-node", "2", "--gpu-memory", "3GB"]) == 1
    out = capsys.readouterr().out
    assert "does not fit" in out and "fits with:" in out
    assert "full activation checkpointing" in out and "microbatch 16" in out


def test_bad_sizes_are_refused_with_what_is_accepted():
    assert parse_bytes("80GB") == 80 * 2**30 and parse_bytes("512MB") == 512 * 2**20
    with pytest.raises(ValueError, match=r"'lots' is not a memory size; use e\.g\. 80GB"):
        parse_bytes("lots")
