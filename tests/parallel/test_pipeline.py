"""Pipeline parallel on 2 gloo ranks (and with FSDP on 4) against one process."""

import pytest
import torch
import torch.distributed.pipelining  # once here, not in each forked rank

from multirank import run_ranks
from parallel.helpers import (
    Blocks,
    LossLog,
    Tokens,
    from_bytes,
    full_weights,
    gpt2,
    import_transformers,
    llama,
    loader,
    make_trainer,
    pipeline_with_fsdp,
    stage_weights,
    to_bytes,
)
from trainkit.core import Algorithm, Event
from trainkit.parallel import (
    FSDP,
    ParallelDims,
    PipelineParallel,
    PipelinePlan,
)

MICROBATCH = {"device_train_microbatch_size": 4}  # 16 samples a batch: 4 microbatches
BLOCKS_PLAN = PipelinePlan(
    blocks="blocks",
    inputs=lambda batch: (batch[0],),
    first=lambda model, x: model.embed(x),
    last=lambda model, hidden: model.head(hidden),
)


def four_blocks() -> Blocks:
    return Blocks(depth=4)


def untied_gpt2():
    model = gpt2()
    model.model.lm_head.weight = torch.nn.Parameter(model.model.lm_head.weight.detach().clone())
    model.model.config.tie_word_embeddings = False
    return model


def _pipeline_run(rank, world, strategy, make_model, data_world=1, **kwargs):
    log = LossLog()
    trainer = make_trainer(
        strategy, rank, world, model=make_model, tensor=world // data_world,
        callbacks=[log], **MICROBATCH, **kwargs,
    )  # fmt: skip
    trainer.fit()
    counted = (trainer.state.data_parallel_size, int(trainer.state.timestamp.sample))
    return to_bytes(stage_weights(trainer.state.model)), log.losses, counted, trainer


def _reference(rank, world, make_model):
    log = LossLog()
    trainer = make_trainer(None, 0, 1, model=make_model, callbacks=[log], batches=2, **MICROBATCH)
    trainer.fit()
    return to_bytes(full_weights(trainer.state.model)), log.losses


def _merged(results):
    weights = {}
    for blob in results:
        weights.update(from_bytes(blob))
    return weights


def _assert_matches(weights, losses, reference, tolerance=1e-5):
    ref_weights, ref_losses = reference[0], reference[1]
    if isinstance(ref_weights, bytes):
        ref_weights = from_bytes(ref_weights)
    assert weights.keys() == ref_weights.keys()
    far = {k: (weights[k] - ref_weights[k]).abs().max().item() for k in weights}
    assert max(far.values()) < tolerance, far
    assert losses == pytest.approx(ref_losses, abs=tolerance)


CASES = {
    "blocks, gpipe, split points": (
        lambda: PipelineParallel(plan=BLOCKS_PLAN, schedule="gpipe", split_points=["blocks.2"]),
        Blocks,
    ),
    "blocks, interleaved 1f1b": (
        lambda: PipelineParallel(plan=BLOCKS_PLAN, schedule="interleaved_1f1b", stages_per_rank=2),
        four_blocks,
    ),
    "llama, 1f1b": (lambda: PipelineParallel(plan="llama"), llama),
    "gpt2, 1f1b": (lambda: PipelineParallel(plan="gpt2"), untied_gpt2),
}


def _runs(rank, world):
    """Every case on ``world`` ranks: 2 stages, or (world 1) one process without a strategy.

    The references run in a forked rank too: one thread there, as in the stages (this
    process's many threads make the same small run ~50 times slower on busy cores).
    """
    results = {}
    for name, (strategy, make_model) in CASES.items():
        weights, losses, counted, trainer = _pipeline_run(
            rank, world, strategy() if world > 1 else None, make_model, batches=2
        )
        results[name] = (weights, losses, counted)
    # Evaluation and prediction run the pipeline forward; every rank gets the outputs.
    evaluated = trainer.eval(eval_dataloader=loader(Tokens(16), 0, 1))  # gpt2
    evaluated = {k: float(v) for k, v in evaluated.items()}
    (predicted,) = trainer.predict(loader(Tokens(16), 0, 1))
    evaluated["logits"] = to_bytes(predicted.logits)
    names = {n for n, _ in trainer.state.model.named_parameters()}
    return results, evaluated, sorted(names)


def test_two_stages_train_like_one_process():
    import_transformers()
    ranks = run_ranks(_runs, 2)
    ((references, expected, _),) = run_ranks(_runs, 1)
    for name in CASES:
        reference = (from_bytes(references[name][0]), references[name][1])
        weights = _merged(result[name][0] for result, _, _ in ranks)
        for result, _, _ in ranks:  # the loss is reported on both stages
            _assert_matches(weights, result[name][1], reference)
            assert result[name][2] == (1, 32), name  # one pipeline reads 2 batches of 16
    logits = from_bytes(expected.pop("logits"))
    for _, evaluated, _ in ranks:  # every rank of the pipeline gets the outputs
        assert (from_bytes(evaluated.pop("logits")) - logits).abs().max() < 1e-5
        assert len(evaluated) == 2  # cross-entropy and perplexity
        assert evaluated == pytest.approx(expected, abs=1e-5)
    # Stage 0 keeps the embeddings and block 0, stage 1 block 1, the final norm and the head.
    first, last = ranks[0][2], ranks[1][2]
    assert "model.transformer.wte.weight" in first and "model.lm_head.weight" in last
    assert "model.transformer.ln_f.weight" in last and "model.transformer.wpe.weight" in first
    assert not any(".h.1." in n for n in first) and not any(".h.0." in n for n in last)


class ScaleLoss(Algorithm):
    match_events = frozenset({Event.AFTER_LOSS})

    def match(self, event, state):
        return True

    def apply(self, event, state, logger):
        state.loss = state.loss * 2


def _refusals(rank, world):
    messages = {}
    cases = {
        "algorithm": lambda: make_trainer(
            PipelineParallel(plan=BLOCKS_PLAN), rank, world, tensor=world,
            algorithms=[ScaleLoss()], **MICROBATCH,
        ).fit(),
        "microbatches": lambda: make_trainer(
            PipelineParallel(plan=BLOCKS_PLAN), rank, world, tensor=world
        ),
        "auto": lambda: make_trainer(
            PipelineParallel(plan=BLOCKS_PLAN), rank, world, tensor=world,
            device_train_microbatch_size="auto",
        ),
        "tied": lambda: make_trainer(
            PipelineParallel(plan="gpt2"), rank, world, model=gpt2, tensor=world, **MICROBATCH
        ),
    }  # fmt: skip
    for name, build in cases.items():
        try:
            build()
            messages[name] = "no error"
        except (TypeError, ValueError) as err:
            messages[name] = f"{type(err).__name__}: {err}"
    return messages


def test_what_cannot_work_under_pipeline_parallel_is_refused():
    import_transformers()
    messages = run_ranks(_refusals, 2)[0]
    assert "algorithm ScaleLoss runs at AFTER_LOSS" in messages["algorithm"]
    assert (
        "AFTER_FORWARD, BEFORE_LOSS, AFTER_LOSS and BEFORE_BACKWARD are not fired"
        in (messages["algorithm"])
    )
    assert "PipelineParallel needs device_train_microbatch_size" in messages["microbatches"]
    assert (
        "cannot search the microbatch size (device_train_microbatch_size='auto')"
        in (messages["auto"])
    )
    assert "are one tensor (tied weights) used by different pipeline stages" in messages["tied"]
    assert "'model.transformer.wte.weight'" in messages["tied"]


def test_pipeline_config_errors():
    with pytest.raises(ValueError, match=r"pipeline plan 'mamba' is not known; use one of"):
        PipelineParallel(plan="mamba")
    with pytest.raises(ValueError, match="interleaved_1f1b needs 2 or more stages per rank"):
        PipelineParallel(plan="llama", schedule="interleaved_1f1b")
    with pytest.raises(ValueError, match=r"PipelineParallel\(degree=1\) alone must span the"):
        PipelineParallel(plan="llama", degree=1).dims(2)
    with pytest.raises(ValueError, match="needs the pipeline degree"):
        PipelineParallel(plan="llama", fsdp=FSDP()).dims(4)
    with pytest.raises(ValueError, match="pipeline degree 3 does not divide the world size 4"):
        PipelineParallel(plan="llama", degree=3, fsdp=FSDP()).dims(4)
    dims = PipelineParallel(plan="llama", degree=2, fsdp=FSDP()).dims(8)
    assert (dims.pipeline, dims.replicate, dims.shard, dims.tensor) == (2, 1, 4, 1)
    with pytest.raises(ValueError, match=r"must match exactly one nn.ModuleList of Blocks"):
        PipelinePlan(blocks="layers", inputs=None, first=None, last=None).find_blocks(Blocks())


def test_pipeline_ranks_read_the_same_data():
    # rank = (((p * R + r) * S + s) * C + c) * T + t; the data slice is (r * S + s).
    dims = ParallelDims(pipeline=2, replicate=1, shard=2, tensor=2)
    assert [dims.data_parallel_rank(rank) for rank in range(8)] == [0, 0, 1, 1, 0, 0, 1, 1]
    dims = ParallelDims(pipeline=2, replicate=2, shard=1, tensor=1)
    assert [dims.data_parallel_rank(rank) for rank in range(4)] == [0, 1, 0, 1]
    with pytest.raises(ValueError, match="needs every degree"):
        ParallelDims(pipeline=2).data_parallel_rank(0)


def _with_fsdp(rank, world, tensor):
    log = LossLog()
    trainer = pipeline_with_fsdp(rank, tensor, callbacks=[log])
    trainer.fit()
    counted = (trainer.state.data_parallel_size, int(trainer.state.timestamp.sample))
    return to_bytes(stage_weights(trainer.state.model)), log.losses, counted


def test_two_stages_with_fsdp_train_like_one_process():
    # 4 ranks: 2 stages, each sharded over 2 ranks (FSDP x TP x PP: the checkpoint tests).
    import_transformers()
    ranks = run_ranks(_with_fsdp, 4, 1)
    reference = run_ranks(_reference, 1, llama)[0]
    weights = _merged(result[0] for result in ranks)
    for _, losses, counted in ranks:
        _assert_matches(weights, losses, reference)
        assert counted == (2, 32)  # 2 data-parallel slices of 8: 2 batches of 16
