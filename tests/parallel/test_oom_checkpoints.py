"""Auto-microbatching on 2 ranks when only one rank runs out of memory, part-way through
its forward or its backward: every rank retries together, none is left in a collective.

Before the out-of-memory checkpoints (trainkit.trainer._oom), the rank that kept going met
the failed rank's vote with an FSDP all-gather or reduce-scatter, or a DDP bucket
all-reduce: gloo aborted the process (NCCL hangs). And under DDP, an out-of-memory error
in backward on every rank left DDP's reducer refusing the retry ("Expected to have
finished reduction in the prior iteration").
"""

import warnings

import pytest
import torch
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import fp16_compress_hook
from torch.distributed.fsdp import FSDPModule
from torch.utils.data import DataLoader, DistributedSampler

from multirank import run_ranks
from parallel.helpers import (
    GLOBAL_BATCH,
    Block,
    Blocks,
    OOMBlock,
    assert_close,
    full_weights,
    make_trainer,
    to_bytes,
    train,
)
from toy import blobs
from trainkit.core import Evaluator
from trainkit.parallel import DDP, FSDP
from trainkit.trainer._oom import QUIET_BATCHES
from trainkit.trainer.metrics import CrossEntropy

STRATEGIES = {
    "ddp": DDP,
    "ddp_forced": lambda: DDP(sync="forced"),
    "fsdp": FSDP,
    # Recomputed blocks, and blocks compiled (Dynamo's eager backend: no C++ compiler).
    "fsdp_checkpointed_compiled": lambda: FSDP(
        activation_checkpointing=True, compile={"backend": "eager"}
    ),
}
WHO = {"rank 1 only": (1,), "both": (0, 1)}
# Each strategy with one rank out of memory; with both, where that failed before (DDP's
# reducer after an interrupted backward). Runs cost seconds each: the rest was checked once.
CASES = {
    "forward": [(name, "rank 1 only") for name in STRATEGIES if name != "ddp_forced"],
    "backward": [(name, "rank 1 only") for name in STRATEGIES] + [("ddp", "both")],
}
BATCHES = 5


class _OOMInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, limit):
        ctx.limit = limit
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        if grad.shape[0] > ctx.limit:
            raise torch.OutOfMemoryError(f"fake out-of-memory in backward: {grad.shape[0]}")
        return grad, None


class BackwardOOMBlock(Block):
    """Runs out of memory in backward on inputs of more than ``limit`` samples."""

    limit = 2

    def forward(self, x):
        return super().forward(_OOMInBackward.apply(x, self.limit))


def _model(rank, ranks, where):
    # Every block of one class (FSDP's wrap="auto" gives each its own group, on every rank
    # alike); only the middle block's limit differs between ranks.
    def build():
        model = Blocks()
        for block in model.blocks:
            block.__class__ = OOMBlock if where == "forward" else BackwardOOMBlock
            block.limit = GLOBAL_BATCH
        if rank in ranks:
            model.blocks[1].limit = 2
        return model

    return build


def _hooks(model):
    return sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in model.modules())


def _runs(rank, world, where):
    results = {}
    for strategy, who in CASES[where]:
        trainer = make_trainer(
            STRATEGIES[strategy](),
            rank,
            world,
            model=_model(rank, WHO[who], where),
            device_train_microbatch_size="auto",
            optimizer="sgd",
            batches=BATCHES,
        )
        groups = sum(isinstance(m, FSDPModule) for m in trainer.state.model.modules())
        assert groups in (0, 1 + len(Blocks().blocks)), "FSDP gave each block its group"
        hooks = _hooks(trainer.state.model)
        trainer.fit()
        assert _hooks(trainer.state.model) == hooks  # checkpoints only during a batch
        state = trainer.state
        results[strategy, who] = (
            state.device_train_microbatch_size,
            state.loop_private.oom_checkpoints.searching,
            to_bytes(full_weights(state.model)),
        )
    return results


@pytest.mark.parametrize("where", ["forward", "backward"])
def test_one_rank_out_of_memory_part_way_retries_on_every_rank(where):
    ranks = run_ranks(_runs, 2, where, timeout=240)
    # Every rank lands on the size that fits the rank that ran out of memory.
    for results in ranks:
        assert {key: size for key, (size, _, _) in results.items()} == dict.fromkeys(results, 2)
    # The search ends after QUIET_BATCHES batches without out-of-memory errors.
    assert BATCHES > QUIET_BATCHES
    assert not any(searching for results in ranks for _, searching, _ in results.values())
    # The run trains as one process does on the whole batch.
    reference = train(None, 0, 1, optimizer="sgd", batches=BATCHES)
    weights = {f"{s} / {w}": value for (s, w), (_, _, value) in ranks[0].items()}
    assert_close(weights, dict.fromkeys(weights, reference), 1e-5)


class _Scored(Blocks):
    def get_metrics(self, is_train=False):
        return {} if is_train else {"cross_entropy": CrossEntropy()}


def _scored(rank, ranks):
    def build():
        model = _Scored()
        for block in model.blocks:
            block.__class__ = OOMBlock
            block.limit = GLOBAL_BATCH
        if rank in ranks:
            model.blocks[1].limit = 2
        return model

    return build


def _evaluations(rank, world):
    results = {}
    for who, ranks in WHO.items():
        trainer = make_trainer(FSDP(), rank, world, model=_scored(rank, ranks))
        data = blobs(64, seed=4)
        sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=False)
        evaluator = Evaluator(
            label="eval",
            data=DataLoader(data, batch_size=GLOBAL_BATCH // world, sampler=sampler),
            device_eval_microbatch_size="auto",
        )
        metrics = trainer.eval(evaluator)
        results[who] = (
            evaluator.device_eval_microbatch_size,
            trainer.state.loop_private.evaluator_checkpoints(evaluator).searching,
            float(metrics["metrics/eval/cross_entropy"]),
        )
    return results


def test_evaluation_when_one_rank_runs_out_of_memory_part_way_retries_on_every_rank():
    ranks = run_ranks(_evaluations, 2, timeout=120)
    single = make_trainer(None, 0, 1, model=_Scored)
    data = blobs(64, seed=4)
    expected = single.eval(DataLoader(data, batch_size=GLOBAL_BATCH))["metrics/eval/cross_entropy"]
    for results in ranks:
        for size, searching, cross_entropy in results.values():
            assert size == 2
            assert not searching  # 4 batches a rank: 3 in a row without out-of-memory
            assert abs(cross_entropy - float(expected)) < 1e-5


def _with_users_comm_hook(rank, world):
    trainer = make_trainer(DDP(), rank, world, device_train_microbatch_size="auto", optimizer="sgd")
    trainer.state.model.register_comm_hook(None, fp16_compress_hook)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit()
    return [str(w.message) for w in caught if "communication hook" in str(w.message)]


def test_a_users_ddp_communication_hook_stays_and_is_said_to_go_unchecked():
    # DDP takes one communication hook: the user's (here fp16 compression) is kept, and
    # the run says what that means for auto-microbatching rather than failing.
    for messages in run_ranks(_with_users_comm_hook, 2):
        assert len(messages) == 1
        assert "Set device_train_microbatch_size to a number" in messages[0]


def _fit_auto(strategy, rank, world, model):
    # Auto-microbatching from whole batches: the size it lands on, and the weights.
    trainer = make_trainer(
        strategy,
        rank,
        world,
        model=model,
        device_train_microbatch_size="auto",
        optimizer="sgd",
        batches=BATCHES,
    )
    trainer.fit()
    return trainer.state.device_train_microbatch_size, to_bytes(full_weights(trainer.state.model))


def _one_rank_ddp(rank, world):
    return _fit_auto(DDP(), rank, world, _model(rank, (0,), "backward"))


def test_ddp_on_one_rank_retries_a_backward_that_ran_out_of_memory():
    # No checkpoints on one rank, but DDP's reducer must still forget the interrupted
    # backward ("Expected to have finished reduction in the prior iteration" before).
    [(size, weights)] = run_ranks(_one_rank_ddp, 1)
    assert size == 2
    reference = train(None, 0, 1, optimizer="sgd", batches=BATCHES)
    assert_close({"ddp": weights}, {"ddp": reference}, 1e-5)


def _head_runs_out_of_memory_in_backward(rank, world):
    # The head is the first thing backward computes; the other rank then goes on to the
    # last block's backward all-gather, which its pre-backward checkpoint must precede.
    def build():
        model = _model(rank, (), "forward")()
        limit = 2 if rank == 1 else GLOBAL_BATCH
        model.head.register_forward_pre_hook(
            lambda _module, args: (_OOMInBackward.apply(args[0], limit),)
        )
        return model

    return _fit_auto(FSDP(), rank, world, build)


def test_fsdp_rank_out_of_memory_at_the_start_of_backward_stops_the_others_before_a_gather():
    ranks = run_ranks(_head_runs_out_of_memory_in_backward, 2)
    assert [size for size, _ in ranks] == [2, 2]
    reference = train(None, 0, 1, optimizer="sgd", batches=BATCHES)
    assert_close({"fsdp": ranks[0][1]}, {"fsdp": reference}, 1e-5)


def _reset_on_an_unknown_torch(rank, world):
    # A torch whose FSDP2 has no reset_iter_state, and state laid out unlike torch 2.11's
    # (changed here, in this forked rank only).
    trainer = make_trainer(FSDP(), rank, world)
    model = trainer.state.model
    if hasattr(FSDPModule, "reset_iter_state"):
        del FSDPModule.reset_iter_state
    del model._get_fsdp_state()._state_ctx
    try:
        trainer.state.parallelism.reset_after_oom(model)
    except RuntimeError as error:
        return str(error)
    return None


def test_fsdp_that_cannot_be_reset_after_out_of_memory_says_what_to_do():
    [message] = run_ranks(_reset_on_an_unknown_torch, 1)
    assert message is not None
    assert "reset_iter_state" in message
    assert "upgrade torch, or set device_train_microbatch_size" in message
