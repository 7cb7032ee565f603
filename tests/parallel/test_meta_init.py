"""A model built on the meta device, sharded by FSDP on 2 and 4 forked gloo ranks: each
block is allocated and initialised just before it is sharded, so no rank ever holds the
whole model, and the weights are those one process initialises with the same seed."""

import pytest
import torch
from torch import nn
from torch.distributed.tensor import DTensor

from multirank import run_ranks
from parallel.helpers import (
    Block,
    Blocks,
    Tokens,
    from_bytes,
    full_weights,
    gpt2,
    import_transformers,
    make_trainer,
    max_difference,
    to_bytes,
)
from trainkit.parallel import FSDP

WIDTH, DEPTH = 16, 4
LIVE: list[int] = []  # whole (unsharded, allocated) parameters at each init, this process
MODEL: list[nn.Module] = []


def _live() -> int:
    return sum(
        p.numel() for p in MODEL[0].parameters() if not p.is_meta and not isinstance(p, DTensor)
    )


class RecordingBlock(Block):
    def reset_parameters(self) -> None:  # called once its own layers are initialised
        LIVE.append(_live())


class RecordingBlocks(Blocks):
    def __init__(self):
        super().__init__(width=WIDTH, depth=DEPTH)
        self.blocks = nn.ModuleList(RecordingBlock(WIDTH) for _ in range(DEPTH))

    def reset_parameters(self) -> None:  # the root's turn: the embedding and the head
        LIVE.append(_live())


def on_meta(build):
    def built():
        with torch.device("meta"):
            model = build()
        MODEL[:] = [model]
        return model

    return built


def sizes() -> tuple[int, int]:
    """(parameters of the whole model, of the largest part initialised at once)."""
    model = RecordingBlocks()
    block = sum(p.numel() for p in model.blocks[0].parameters())
    root = sum(p.numel() for p in model.parameters()) - DEPTH * block
    return DEPTH * block + root, max(block, root)


def _meta_fsdp(rank, world):
    LIVE.clear()
    trainer = make_trainer(FSDP(), rank, world, model=on_meta(RecordingBlocks))
    initial = full_weights(trainer.state.model)
    local = sum(p.to_local().numel() for p in trainer.state.model.parameters())
    trainer.fit()
    return to_bytes(initial), to_bytes(full_weights(trainer.state.model)), max(LIVE), local


def one_process(build):
    LIVE.clear()
    trainer = make_trainer(None, 0, 1, model=on_meta(build))
    initial = full_weights(trainer.state.model)
    trainer.fit()
    return initial, full_weights(trainer.state.model)


@pytest.mark.parametrize("world", [2, 4])
def test_a_meta_model_is_initialised_block_by_block_to_the_weights_of_one_process(world):
    total, part = sizes()
    initial, trained = one_process(RecordingBlocks)
    assert max(LIVE) == total  # one process allocates it all on its device (no CPU copy)
    results = run_ranks(_meta_fsdp, world)
    # The same seed: bitwise the weights one process initialises, then the same training.
    assert max_difference(from_bytes(results[0][0]), initial) == 0.0
    assert max_difference(from_bytes(results[0][1]), trained) < 1e-5
    for _, _, most, local in results:
        # Never the whole model: one whole block at a time beside the shards done.
        assert most <= part < total // 2
        assert local <= total // world + DEPTH * 8  # its shards (rows rounded up per tensor)


def _meta_gpt2(rank, world):
    trainer = make_trainer(FSDP(), rank, world, model=on_meta(gpt2), data=Tokens())
    model = trainer.state.model.model
    tied = model.lm_head.weight is model.transformer.wte.weight
    initial = full_weights(trainer.state.model)
    trainer.fit()
    return to_bytes(initial), tied, float(trainer.state.loss)


def test_a_huggingface_model_built_on_the_meta_device_trains_under_fsdp():
    import_transformers()
    initial, _ = one_process(gpt2)
    results = run_ranks(_meta_gpt2, 2)
    weights, tied, loss = results[0]
    # transformers' own init (GPT-2's scaled residual projections, its rotary or causal
    # buffers), the same on 2 ranks as in one process; the embedding and head stay tied.
    assert max_difference(from_bytes(weights), initial) == 0.0
    assert tied and all(result[1] for result in results)
    assert 3.0 < loss < 5.0  # ln(64) = 4.16 at the start: a working language model


def _pretrained_fsdp(rank, world, folder):
    from trainkit.trainer import HuggingFaceModel

    def build():
        model = HuggingFaceModel.from_pretrained(folder, meta=True, tokenizer=None)
        MODEL[:] = [model]
        return model

    trainer = make_trainer(FSDP(), rank, world, model=build, data=Tokens())
    local = {name: p.to_local().numel() for name, p in trainer.state.model.named_parameters()}
    loaded = full_weights(trainer.state.model)
    trainer.fit()
    return to_bytes(loaded), local, float(trainer.state.loss.detach())


def test_a_safetensors_folder_loads_straight_into_the_shards_and_trains_on(tmp_path):
    import_transformers()
    saved = gpt2()  # the helpers' GPT-2, its weights saved as transformers saves them
    saved.model.save_pretrained(tmp_path / "gpt2")
    expected = {f"model.{k}": v for k, v in saved.model.state_dict().items()}
    results = run_ranks(_pretrained_fsdp, 2, str(tmp_path / "gpt2"))
    loaded, _, loss = results[0]
    assert max_difference(from_bytes(loaded), expected) == 0.0
    whole = {f"model.{k}": v.numel() for k, v in saved.model.named_parameters()}
    # Each rank holds half of every (sharded) tensor: it read its slices, not the file.
    for _, shards, _ in results:
        assert all(shards[name] <= (whole[name] + 1) // 2 + 64 for name in whole)
        assert sum(shards.values()) <= sum(whole.values()) // 2 + 64 * len(whole)
    assert 3.0 < loss < 5.0
