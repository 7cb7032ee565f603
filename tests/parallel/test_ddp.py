"""DDP on 2 and 4 forked gloo ranks against the same training in one process."""

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

from multirank import run_ranks
from parallel.helpers import (
    Blocks,
    ClipGrad,
    LossLog,
    MaskedTokens,
    UnlabelledOdd,
    assert_close,
    bert,
    gpt2,
    import_transformers,
    make_trainer,
    max_difference,
    train,
)
from trainkit.core import Callback, ParallelStrategy, State, TrainModel
from trainkit.parallel import DDP, FSDP


class GradsAgree(Callback):
    """After each microbatch's backward: do all ranks hold the same gradient already?"""

    def __init__(self) -> None:
        self.agree: list[bool] = []

    def after_backward(self, state, logger) -> None:
        grad = state.parallelism.unwrap(state.model).head.weight.grad
        gathered = [torch.empty_like(grad) for _ in range(dist.get_world_size())]
        dist.all_gather(gathered, grad)
        self.agree.append(all(torch.equal(gathered[0], g) for g in gathered))


def _ddp_runs(rank, world):
    sgd = {"optimizer": "sgd"}
    runs = {
        "plain": train(DDP(), rank, world),
        "accumulate": train(DDP(), rank, world, device_train_microbatch_size=2, **sgd),
        "multi_auto": train(
            DDP(sync="multi_auto"), rank, world, device_train_microbatch_size=2, **sgd
        ),
        "forced": train(DDP(sync="forced"), rank, world, device_train_microbatch_size=2, **sgd),
        "clipped": train(DDP(), rank, world, callbacks=[ClipGrad(0.05)], **sgd),
    }
    probes = {}
    for sync in ("single_auto", "multi_auto", "forced"):
        probe = GradsAgree()
        trainer = make_trainer(
            DDP(sync=sync), rank, world, batches=1, device_train_microbatch_size=2,
            callbacks=[probe],
        )  # fmt: skip
        trainer.fit()
        probes[sync] = probe.agree
    return runs, probes


@pytest.mark.parametrize("world", [2, 4])
def test_ddp_trains_like_one_process(world):
    results = run_ranks(_ddp_runs, world)
    references = {
        "plain": train(None, 0, 1),
        "sgd": train(None, 0, 1, optimizer="sgd"),
        "clipped": train(None, 0, 1, optimizer="sgd", callbacks=[ClipGrad(0.05)]),
    }
    runs = results[0][0]
    expected = {"plain": "plain", "clipped": "clipped"}
    expected |= {name: "sgd" for name in ("accumulate", "multi_auto", "forced")}
    assert_close(runs, {name: references[ref] for name, ref in expected.items()}, 1e-5)
    # The clip changed the run, so the check above is not vacuous.
    assert max_difference(references["clipped"], references["sgd"]) > 1e-3

    microbatches = 16 // world // 2
    last_only = [False] * (microbatches - 1) + [True]
    for _, rank_probes in results:
        assert rank_probes["single_auto"] == last_only  # no_sync for all but the last
        assert rank_probes["forced"] == last_only  # one all-reduce after the last backward
        assert rank_probes["multi_auto"] == [True] * microbatches


def _losses(strategy, rank, world, **options):
    log = LossLog()
    trainer = make_trainer(strategy, rank, world, callbacks=[log], **options)
    trainer.fit()
    return log.losses


TOKEN_WEIGHTED = {
    # Rank 0 reads the even samples (7 label tokens each), rank 1 the odd ones (1 each). A
    # plain average of the ranks' gradients would weigh rank 1's tokens 7 times as much.
    "gpt2, 7 and 1 label tokens a sample": (gpt2, MaskedTokens),
    # BERT's loss takes no count of label tokens: rank 1 reads only unlabelled samples, so
    # its token mean is 0/0 (NaN) while its gradient is zero. The step must not stop as
    # non-finite on rank 1.
    "bert, none on rank 1": (bert, UnlabelledOdd),
}


def _token_weighted(rank, world, case):
    model, data = TOKEN_WEIGHTED[case]
    options = {"model": model, "data": data(), "optimizer": "sgd"}
    weights = {
        "ddp": train(DDP(), rank, world, **options),
        "ddp, microbatches": train(DDP(), rank, world, device_train_microbatch_size=3, **options),
        "fsdp": train(FSDP(), rank, world, **options),
    }
    return weights, _losses(DDP(), rank, world, **options)


@pytest.mark.parametrize("case", TOKEN_WEIGHTED)
def test_ranks_weigh_by_their_label_tokens_as_in_one_process(case):
    import_transformers()
    results = run_ranks(_token_weighted, 2, case)
    model, data = TOKEN_WEIGHTED[case]
    options = {"model": model, "data": data(), "optimizer": "sgd"}
    alone = train(None, 0, 1, **options)
    assert_close(results[0][0], dict.fromkeys(results[0][0], alone), 1e-5)
    # Every rank's loss is the step's: one process's loss on the whole batch.
    expected = _losses(None, 0, 1, **options)
    for _, losses in results:
        assert losses == pytest.approx(expected, abs=1e-5)


def _wrapping(rank, world):
    model = Blocks()
    trainer = make_trainer(DDP(), rank, world, model=lambda: model)
    state = trainer.state
    live = {id(p) for p in model.parameters()}
    optimized = [p for g in state.optimizers[0].param_groups for p in g["params"]]
    return {
        "wrapped": type(state.model).__name__,
        "unwrapped_is_user_model": state.parallelism.unwrap(state.model) is model,
        "protocol": isinstance(state.parallelism, ParallelStrategy),
        "optimizer_on_model": len(optimized) == len(live) and all(id(p) in live for p in optimized),
        "data_parallel_size": state.data_parallel_size,
    }


def test_ddp_wraps_and_unwraps_the_users_model():
    for result in run_ranks(_wrapping, 2):
        assert result == {
            "wrapped": "DistributedDataParallel",
            "unwrapped_is_user_model": True,
            "protocol": True,
            "optimizer_on_model": True,
            "data_parallel_size": 2,
        }


class RankHeads(TrainModel):
    """Rank 0 uses one head, the others another: some parameters get no gradient per rank."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Linear(8, 16)
        self.head_a = nn.Linear(16, 2)
        self.head_b = nn.Linear(16, 2)

    def forward(self, batch):
        head = self.head_a if dist.get_rank() == 0 else self.head_b
        return head(torch.relu(self.body(batch[0])))

    def loss(self, outputs, batch):
        return F.cross_entropy(outputs, batch[1])


def _rank_dependent(rank, world):
    forced = train(DDP(sync="forced"), rank, world, model=RankHeads, optimizer="sgd")
    unused = train(DDP(find_unused_parameters=True), rank, world, model=RankHeads, optimizer="sgd")
    return forced, unused


def test_forced_sync_handles_parameters_unused_on_some_ranks():
    forced, unused = run_ranks(_rank_dependent, 2)[0]
    assert max_difference(forced, unused) < 1e-6


def _already_wrapped(rank, world):
    model = Blocks()
    model.blocks[0] = nn.parallel.DistributedDataParallel(model.blocks[0])
    try:
        make_trainer(DDP(), rank, world, model=lambda: model)
    except TypeError as err:
        return str(err)
    return "no error"


def test_ddp_rejects_a_model_already_wrapped():
    message = run_ranks(_already_wrapped, 2)[0]
    assert "already distributed" in message
    assert "'blocks.0'" in message and "DistributedDataParallel" in message


def test_ddp_bad_input():
    with pytest.raises(ValueError, match=r"sync 'sometimes' is not known; use one of"):
        DDP(sync="sometimes")
    with pytest.raises(TypeError, match="find_unused_parameters must be a bool"):
        DDP(find_unused_parameters="yes")
    # No process group in the test process itself.
    with pytest.raises(RuntimeError, match=r"init_distributed\(\)"):
        DDP().prepare(State(model=Blocks()))
