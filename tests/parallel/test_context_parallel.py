"""Context parallel on forked gloo ranks: what runs on CPU.

Batches are split along the sequence (torch's load-balanced order) and gathered back, the
loss and its gradients equal one process's, FSDP over shard x context trains like one
process and counts every sample once, and bad input is refused. Attention itself (ring
attention) needs CUDA in torch 2.15: a model that calls scaled_dot_product_attention under
context parallel on CPU gets a clear error here, and test_context_parallel_gpu.py trains a
Llama model on 2 GPUs. The CPU model has no attention: each position's logits depend on its
own token and position only, so splitting the sequence changes only where it is computed.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from multirank import run_ranks
from parallel.helpers import (
    LENGTH,
    LossLog,
    PartlyLabelled,
    PositionwiseLM,
    from_bytes,
    full_weights,
    make_trainer,
    max_difference,
    positionwise_lm,
    to_bytes,
)
from trainkit.parallel import (
    FSDP,
    ContextParallel,
    ContextParallelConfig,
    ParallelDims,
    TensorParallel,
    apply_context_parallel,
)
from trainkit.trainer import HuggingFaceModel
from trainkit.trainer.metrics import CrossEntropy

ORIGINAL_ATTENTION = F.scaled_dot_product_attention


def _batch() -> dict[str, torch.Tensor]:
    data = PartlyLabelled()
    samples = [data[i] for i in range(4)]
    return {key: torch.stack([s[key] for s in samples]) for key in samples[0]}


def _context_mesh(world):
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", (world,), mesh_dim_names=("context",))


def _split_and_gradients(rank, world):
    from torch.distributed.tensor.experimental._attention import context_parallel_unshard

    mesh = _context_mesh(world)
    reference, model = positionwise_lm(), positionwise_lm()
    apply_context_parallel(model, mesh)
    seen = {}

    def record(module, args, kwargs):
        if not module.training:
            return  # the evaluation below
        seen.update(args[0])
        seen["attention patched"] = F.scaled_dot_product_attention is not original

    original = F.scaled_dot_product_attention
    model.register_forward_pre_hook(record, with_kwargs=True)  # runs after the split
    batch = _batch()
    loss = model(batch)["loss"]
    loss.backward()
    expected = reference(batch)["loss"]
    expected.backward()
    restored = F.scaled_dot_product_attention is original
    gathered = context_parallel_unshard(
        mesh, [seen["input_ids"], seen["position_ids"], seen["labels"]], [1, 1, 1]
    )
    gradients = {}
    for name, param in model.named_parameters():
        summed = param.grad.clone()
        torch.distributed.all_reduce(summed)  # FSDP averages over the group: sum / degree
        gradients[name] = (summed / world - reference.get_parameter(name).grad).abs().max().item()
    model.eval()
    with torch.no_grad():
        evaluated = model(batch)["logits"].shape
    return {
        "shapes": {k: tuple(v.shape) for k, v in seen.items() if isinstance(v, torch.Tensor)},
        "positions": seen["position_ids"][0].tolist(),
        "gathered": [torch.equal(g, e) for g, e in zip(gathered, _full(batch), strict=True)],
        "shift_labels is labels": seen["shift_labels"] is seen["labels"],
        "label tokens": int((seen["labels"] != -100).sum()),
        "num_items_in_batch": float(seen["num_items_in_batch"]),
        "loss": (float(loss), float(expected)),
        "gradients": max(gradients.values()),
        "patched, restored": (seen["attention patched"], restored),
        "evaluated": tuple(evaluated),
    }


def _full(batch):
    positions = torch.arange(LENGTH).repeat(len(batch["input_ids"]), 1)
    return batch["input_ids"], positions, F.pad(batch["labels"][:, 1:], (0, 1), value=-100)


def test_sequences_split_in_load_balanced_order_and_gather_back():
    first, second = run_ranks(_split_and_gradients, 2)
    for result in (first, second):
        assert result["shapes"] == {
            "input_ids": (4, 8), "labels": (4, 8), "position_ids": (4, 8),
            "shift_labels": (4, 8), "num_items_in_batch": (),
        }  # fmt: skip
        assert result["gathered"] == [True, True, True]  # ids, positions, shifted labels
        assert result["shift_labels is labels"]
        assert result["patched, restored"] == (True, True)  # open in forward, closed after
        assert result["evaluated"] == (4, LENGTH, 64)  # evaluation: whole sequences
    # Head and tail: rank 0 computes positions 0-3 and 12-15, rank 1 positions 4-11.
    assert first["positions"] == [0, 1, 2, 3, 12, 13, 14, 15]
    assert second["positions"] == list(range(4, 12))
    # Shifted labels: sequences 0 and 2 have 15 (the last position has none), 1 and 3 only
    # 6 (positions 9-14). Rank 0 holds 7 + 3 + 7 + 3 of them, rank 1 8 + 3 + 8 + 3.
    assert (first["label tokens"], second["label tokens"]) == (20, 22)
    assert first["num_items_in_batch"] == second["num_items_in_batch"] == 42 / 2


def test_loss_and_gradients_equal_one_process():
    for result in run_ranks(_split_and_gradients, 2):
        loss, expected = result["loss"]
        assert loss == pytest.approx(expected, abs=1e-6)  # the group's, on every rank
        assert result["gradients"] < 1e-6


def _options(rank, world):
    seen = {}
    batch = {**_batch(), "token_type_ids": torch.arange(4 * LENGTH).view(4, LENGTH)}
    for name, options in {
        "default": {},
        "keys": {"sequence_keys": ["labels"]},
        "aligned": {"shift_labels": False},
    }.items():
        model = positionwise_lm()
        apply_context_parallel(model, _context_mesh(world), **options)
        model.register_forward_pre_hook(
            lambda module, args, kwargs, name=name: seen.update({name: args[0]}), with_kwargs=True
        )
        model(batch)["loss"].backward()
    mine = seen["default"]["position_ids"][0]  # this rank's positions
    return {
        "token_type_ids split": torch.equal(seen["default"]["token_type_ids"][0], mine),
        "token_type_ids whole": seen["keys"]["token_type_ids"].shape,
        "aligned labels": torch.equal(seen["aligned"]["labels"], batch["labels"][:, mine]),
        "aligned shift_labels": "shift_labels" in seen["aligned"],
    }


def test_options_choose_what_is_split_and_shifted():
    for result in run_ranks(_options, 2):
        assert result["token_type_ids split"]  # shaped like input_ids: split by default
        assert result["token_type_ids whole"] == (4, LENGTH)  # not among sequence_keys
        assert result["aligned labels"]  # shift_labels=False: split as they are
        assert not result["aligned shift_labels"]


LAYERS_TP_PLAN = {"model.layers.*.up": "colwise", "model.layers.*.down": "rowwise"}


def _strategies(world):
    """name -> (strategy, tensor-parallel degree, the weights' mesh); context degree 2."""
    context = ContextParallel(degree=2)
    flat = (("shard_context",), (world,))  # shard x context, one flattened dim
    if world == 2:
        return {
            "fsdp": (FSDP(context_parallel=context), 1, flat),
            "alone": (ContextParallel(), 1, flat),
            "accumulate": (FSDP(context_parallel=context), 1, flat),
        }
    tensor = TensorParallel(plan=LAYERS_TP_PLAN, degree=2)
    return {
        "fsdp": (FSDP(context_parallel=context), 1, flat),
        # 2 replicas, each sharded over its 2 context ranks (HSDP).
        "hybrid": (
            FSDP(sharding="hybrid", replicate_degree=2, context_parallel=context),
            1,
            (("replicate", "shard_context"), (2, 2)),
        ),
        # context 2 x tensor 2: every rank reads the one batch.
        "tensor": (
            FSDP(context_parallel=context, tensor_parallel=tensor),
            2,
            (("shard_context", "tensor"), (2, 2)),
        ),
    }


def _fsdp_runs(rank, world):
    data = {"data": PartlyLabelled(), "model": positionwise_lm, "optimizer": "sgd"}
    runs = {}
    for name, (strategy, tensor, _) in _strategies(world).items():
        losses = LossLog()
        extra = {"device_train_microbatch_size": 2} if name == "accumulate" else {}
        trainer = make_trainer(
            strategy, rank, world, context=2, tensor=tensor, callbacks=[losses], **data, **extra
        )
        trainer.fit()
        weight = trainer.state.model.model.layers[0].up.weight
        runs[name] = {
            "weights": to_bytes(full_weights(trainer.state.model)),
            "losses": losses.losses,
            "counted": (
                trainer.state.data_parallel_size,
                int(trainer.state.timestamp.sample),
                int(trainer.state.timestamp.token),
            ),
            "mesh": (weight.device_mesh.mesh_dim_names, tuple(weight.device_mesh.shape)),
        }
    return runs


def _reference():
    losses = LossLog()
    trainer = make_trainer(
        None, 0, 1, model=positionwise_lm, data=PartlyLabelled(), optimizer="sgd",
        callbacks=[losses],
    )  # fmt: skip
    trainer.fit()
    counted = (int(trainer.state.timestamp.sample), int(trainer.state.timestamp.token))
    return full_weights(trainer.state.model), losses.losses, counted


@pytest.mark.parametrize("world", [2, 4])
def test_fsdp_over_shard_and_context_trains_like_one_process(world):
    weights, losses, (samples, tokens) = _reference()
    runs = run_ranks(_fsdp_runs, world)
    expected = _strategies(world)
    for rank_runs in runs:
        for name, run in rank_runs.items():
            _, tensor, mesh = expected[name]
            assert run["losses"] == pytest.approx(losses, abs=1e-5), name
            # Each sample and token once, though 2 ranks compute parts of each sequence.
            assert run["counted"] == (world // (2 * tensor), samples, tokens), name
            assert run["mesh"] == mesh, name
    assert (samples, tokens) == (48, 48 * LENGTH)
    for name, run in runs[0].items():
        assert max_difference(from_bytes(run["weights"]), weights) < 1e-5, name


def test_mesh_layout_and_data_slices():
    # Rank r's coordinate in the row-major mesh, outermost first, as build_mesh lays it out.
    dims = ParallelDims(replicate=2, shard=2, context=2, tensor=2)
    grid = torch.arange(16).view(2, 2, 2, 2)
    for rank in range(16):
        r, s, c, _ = (int(i) for i in (grid == rank).nonzero()[0])
        assert dims.data_parallel_rank(rank) == r * 2 + s
        assert dims.context_parallel_rank(rank) == c
    assert dims.data_parallel == 4
    with pytest.raises(ValueError, match=r"needs every degree, but \['shard'\] is -1"):
        ParallelDims(context=2).data_parallel_rank(0)


def test_degrees_and_options_that_do_not_fit():
    with pytest.raises(ValueError) as caught:
        ParallelDims(replicate=1, shard=2, context=2, tensor=1).resolve(8)
    assert str(caught.value) == (
        "ParallelDims pipeline=1 x replicate=1 x shard=2 x context=2 x tensor=1 = 4 ranks, but "
        "the world size is 8; the degrees must multiply to the world size (each degree must be one of "
        "[1, 2, 4, 8])"
    )
    with pytest.raises(ValueError, match=r"degree 3 x tensor-parallel degree 1 = 3 does not"):
        FSDP(context_parallel=ContextParallel(degree=3)).dims(8)
    with pytest.raises(ValueError, match=r"shard_degree=3 does not fit 2 data-parallel ranks "):
        FSDP(sharding="hybrid", shard_degree=3, context_parallel=ContextParallel(degree=2)).dims(4)
    with pytest.raises(ValueError, match=r"needs the context-parallel degree"):
        FSDP(context_parallel=ContextParallel()).dims(4)
    with pytest.raises(TypeError, match="context_parallel must be a ContextParallel"):
        FSDP(context_parallel=2)
    with pytest.raises(ValueError, match="degree must be a positive int, got 0"):
        ContextParallelConfig(degree=0)
    with pytest.raises(TypeError, match="sequence_keys must be a list of batch keys"):
        ContextParallelConfig(sequence_keys="labels")
    dims = FSDP(context_parallel=ContextParallel(degree=2)).dims(8)
    assert dims == ParallelDims(replicate=1, shard=4, context=2, tensor=1)


class Attention(nn.Module):
    def forward(self, batch):
        x = batch["input_ids"].float()[:, None, :, None].requires_grad_()
        return {"loss": F.scaled_dot_product_attention(x, x, x, is_causal=True).sum()}


class NoLoss(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(64, 4)

    def forward(self, batch):
        return {"logits": self.embed(batch["input_ids"])}


def _refused(rank, world):
    messages = {}
    batch = _batch()
    cases = {
        "other batch": {**batch, "input_ids": batch["input_ids"] + rank},
        "attention_mask": {**batch, "attention_mask": torch.ones(4, LENGTH)},
        "length": {k: v[:, :15] for k, v in batch.items()},
        "tuple": (batch["input_ids"], batch["labels"]),
        "no labels": {"input_ids": batch["input_ids"]},
    }
    for name, case in cases.items():
        model = positionwise_lm()
        apply_context_parallel(model, _context_mesh(world))
        if name != "other batch":
            model(batch)  # the first batch is checked across the group
        with pytest.raises((ValueError, TypeError)) as caught:
            model(case)
        messages[name] = str(caught.value)
    model = NoLoss()
    apply_context_parallel(model, _context_mesh(world))
    with pytest.raises(ValueError) as caught:
        model(batch)
    messages["no loss"] = str(caught.value)
    model = Attention()
    apply_context_parallel(model, _context_mesh(world))
    with pytest.raises(NotImplementedError) as caught:
        model(batch)
    messages["attention"] = str(caught.value)
    messages["attention restored"] = F.scaled_dot_product_attention is ORIGINAL_ATTENTION
    with pytest.raises(ValueError) as caught:
        make_trainer(ContextParallel(degree=1), rank, world, model=positionwise_lm)
    messages["alone"] = str(caught.value)
    with_metrics = ContextParallel()

    def measured():
        return HuggingFaceModel(PositionwiseLM(), metrics=[CrossEntropy()])

    with pytest.raises(ValueError) as caught:
        make_trainer(with_metrics, rank, world, context=2, model=measured)
    messages["train metrics"] = str(caught.value)
    return messages


def test_input_context_parallel_cannot_split_is_refused():
    messages = run_ranks(_refused, 2)[0]
    assert "ranks of a context-parallel group read different batches" in messages["other batch"]
    assert "DistributedSampler(ds, num_replicas=dims.data_parallel" in messages["other batch"]
    assert "cannot apply the batch's 'attention_mask'" in messages["attention_mask"]
    assert messages["length"].startswith(
        "sequence length 15 does not split over context-parallel degree 2: use sequences "
        "whose length is a multiple of 2 (of 4 to balance causal attention)"
    )
    assert "splits dict batches with an 'input_ids' tensor" in messages["tuple"]
    assert "got a tuple" in messages["tuple"]
    assert "needs the batch's 'labels' (or 'shift_labels')" in messages["no labels"]
    assert "needs the model's forward to compute the loss" in messages["no loss"]
    assert messages["attention restored"]  # a forward that raised closed the context
    assert messages["attention"].startswith("context parallel attention needs CUDA: torch ")
    assert "and this model called it on cpu" in messages["attention"]
    assert messages["train metrics"].startswith(
        "FSDP(context_parallel=...) cannot update training metrics ['CrossEntropy']"
    )
    assert messages["alone"].startswith(
        "ContextParallel(degree=1) alone must span the world size 2"
    )
