"""The Trainer loop: training, durations, accumulation, precision, eval, predict."""

import time

import pytest
import torch
from torch import nn

from toy import OOMAbove, blobs, flat_params, loader, mlp
from trainkit.core import Algorithm, Callback, Event, ParallelStrategy, Time, TimeUnit
from trainkit.trainer import Trainer


def make_trainer(model=None, data=None, **kwargs):
    model = model or mlp()
    kwargs.setdefault("max_duration", "2ep")
    kwargs.setdefault("progress_bar", False)
    kwargs.setdefault("device", "cpu")
    kwargs.setdefault("seed", 7)
    return Trainer(model=model, train_dataloader=data or loader(blobs()), **kwargs)


class Recorder(Callback):
    def __init__(self):
        self.events: list[Event] = []
        self.microbatch_sizes: list[int] = []

    def run_event(self, event, state, logger):
        self.events.append(event)
        if event == Event.BEFORE_FORWARD:
            self.microbatch_sizes.append(state.batch[0].shape[0])


def test_fit_learns_and_evaluates():
    data, model = blobs(256), mlp()
    trainer = make_trainer(
        model=model,
        data=loader(data),
        optimizers=torch.optim.AdamW(model.parameters(), lr=0.02),
        eval_dataloader=loader(data, 64, shuffle=False),
        max_duration="6ep",
    )
    before = trainer.eval()["metrics/eval/accuracy"]
    trainer.fit()
    after = trainer.eval()
    assert after["metrics/eval/accuracy"] > max(0.9, before)
    assert after["metrics/eval/cross_entropy"] < 0.5


@pytest.mark.parametrize(
    ("duration", "batches", "epochs"),
    [("5ba", 5, 0), ("2ep", 16, 2), (1, 8, 1), ("64sp", 4, 0), (Time(3, TimeUnit.BATCH), 3, 0)],
)
def test_durations_in_every_unit(duration, batches, epochs):
    trainer = make_trainer(max_duration=duration)
    trainer.fit()
    assert trainer.state.timestamp.batch == batches
    assert trainer.state.timestamp.epoch == epochs
    assert trainer.state.timestamp.sample == batches * 16


def test_token_duration_counts_input_ids():
    class TokenModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(10, 4)

        def forward(self, batch):
            return self.embed(batch["input_ids"]).mean()

        def loss(self, outputs, batch):
            return outputs**2

    batches = [{"input_ids": torch.randint(0, 10, (2, 5))} for _ in range(10)]
    trainer = make_trainer(model=TokenModel(), data=batches, max_duration="30tok")
    trainer.fit()
    assert trainer.state.timestamp.token == 30
    assert trainer.state.timestamp.batch == 3


class SecondPerBatch(Callback):
    """A fake ``time.perf_counter``: it stands still, except that each batch takes 1 s."""

    def __init__(self, monkeypatch):
        self.now = 1000.0
        # Patched on the time module, so the loop sees it whichever module measures batches.
        monkeypatch.setattr(time, "perf_counter", lambda: self.now)

    def batch_start(self, state, logger):
        self.now += 1.0


def test_wall_clock_duration_stops(monkeypatch):
    # 8 batches an epoch; the limit is crossed during batch 3 (3 s >= 2.5 s), not before.
    trainer = make_trainer(max_duration="2.5s", callbacks=[SecondPerBatch(monkeypatch)])
    trainer.fit()
    assert trainer.state.timestamp.batch == 3
    assert trainer.state.timestamp.total_wct == pytest.approx(3.0)


class Takes(torch.utils.data.Dataset):
    """A dataset each of whose samples takes ``seconds`` of the fake clock to load."""

    def __init__(self, base, clock, seconds):
        self.base, self.clock, self.seconds = base, clock, seconds

    def __len__(self):
        return len(self.base)

    def __getitem__(self, index):
        self.clock.now += self.seconds
        return self.base[index]


class SavesFor(Callback):
    """A checkpoint that takes ``seconds`` of the fake clock at every BATCH_CHECKPOINT."""

    def __init__(self, clock, seconds):
        self.clock, self.seconds = clock, seconds

    def batch_checkpoint(self, state, logger):
        self.clock.now += self.seconds


def test_a_batch_counts_its_loading_and_the_checkpoint_before_it_not_evaluation(monkeypatch):
    # As in Composer: wall-clock time runs from one batch's end to the next's, with
    # evaluation paused. Each batch: 2 s of loading (16 samples x 0.125 s) + 1 s of training,
    # then 4 s of checkpoint and 100 s of evaluation (16 eval samples x 6.25 s).
    clock = SecondPerBatch(monkeypatch)
    trainer = make_trainer(
        data=loader(Takes(blobs(), clock, 0.125)),
        eval_dataloader=loader(Takes(blobs(16), clock, 6.25)),
        eval_interval="1ba",
        callbacks=[clock, SavesFor(clock, 4.0)],
        max_duration="3ba",
    )
    trainer.fit()
    assert trainer.state.timestamp.batch_wct == pytest.approx(4 + 2 + 1)
    assert trainer.state.timestamp.total_wct == pytest.approx(3 + 7 + 7)
    assert trainer.state.wall_mark is None  # the time between fits counts for nothing
    clock.now += 1000.0
    trainer.fit(duration="1ba")
    assert trainer.state.timestamp.batch_wct == pytest.approx(2 + 1)


def test_a_wall_clock_duration_counts_loading_and_checkpoints(monkeypatch):
    # 3 s for the first batch, 7 s for each after it: "10s" is reached after batch 2 (the
    # in-batch time alone, 1 s a batch, would have trained 10).
    clock = SecondPerBatch(monkeypatch)
    trainer = make_trainer(
        data=loader(Takes(blobs(), clock, 0.125)),
        callbacks=[clock, SavesFor(clock, 4.0)],
        max_duration="10s",
    )
    trainer.fit()
    assert trainer.state.timestamp.batch == 2
    assert trainer.state.timestamp.total_wct == pytest.approx(10.0)


def test_fit_with_duration_continues_the_run():
    trainer = make_trainer(max_duration="3ba")
    trainer.fit()
    trainer.fit(duration="1ep")  # to the end of epoch 0: epochs count whole epochs
    assert (trainer.state.timestamp.epoch, trainer.state.timestamp.batch) == (1, 8)
    trainer.fit(duration="2ba")
    assert (trainer.state.timestamp.epoch, trainer.state.timestamp.batch) == (1, 10)
    trainer.fit(duration="2ba", train_dataloader=loader(blobs(64, seed=3)))
    # New data starts a new epoch; the partial epoch before it is closed.
    assert (trainer.state.timestamp.epoch, trainer.state.timestamp.batch) == (2, 12)


def test_event_order_in_one_batch():
    recorder = Recorder()
    make_trainer(max_duration="1ba", callbacks=[recorder], device_train_microbatch_size=8).fit()
    events = recorder.events
    assert events[: events.index(Event.FIT_START)] == [
        Event.INIT,
        Event.BEFORE_LOAD,
        Event.AFTER_LOAD,
    ]
    start = events.index(Event.BATCH_START)
    per_microbatch = [
        Event.BEFORE_FORWARD,
        Event.AFTER_FORWARD,
        Event.BEFORE_LOSS,
        Event.AFTER_LOSS,
        Event.BEFORE_BACKWARD,
        Event.AFTER_BACKWARD,
    ]
    expected = [
        Event.BATCH_START,
        Event.BEFORE_TRAIN_BATCH,
        *per_microbatch,
        *per_microbatch,
        Event.AFTER_TRAIN_BATCH,
        Event.BATCH_END,
        Event.BATCH_CHECKPOINT,
    ]
    assert events[start : start + len(expected)] == expected
    assert events[-3:] == [Event.ITERATION_END, Event.ITERATION_CHECKPOINT, Event.FIT_END]
    assert recorder.microbatch_sizes == [8, 8]


def test_gradient_accumulation_matches_the_full_batch():
    full = make_trainer(model=mlp(dropout=0.0), max_duration="3ba")
    full.fit()
    accumulated = make_trainer(
        model=mlp(dropout=0.0), max_duration="3ba", device_train_microbatch_size=3
    )
    accumulated.fit()
    torch.testing.assert_close(
        flat_params(full.state.model), flat_params(accumulated.state.model), rtol=1e-5, atol=1e-6
    )


def test_auto_microbatching_halves_on_out_of_memory():
    model = OOMAbove(limit=4)
    trainer = make_trainer(model=model, max_duration="3ba", device_train_microbatch_size="auto")
    trainer.fit()
    assert trainer.state.device_train_microbatch_size == 4
    assert model.sizes[:4] == [16, 8, 4, 4]  # 16 and 8 fail, then four microbatches of 4
    reference = make_trainer(model=mlp(dropout=0.0), max_duration="3ba")
    reference.fit()
    torch.testing.assert_close(
        flat_params(model.inner), flat_params(reference.state.model), rtol=1e-5, atol=1e-6
    )


def test_auto_microbatching_gives_up_at_size_one():
    trainer = make_trainer(
        model=OOMAbove(limit=0), max_duration="1ba", device_train_microbatch_size="auto"
    )
    with pytest.raises(RuntimeError, match="device_train_microbatch_size=1"):
        trainer.fit()


def test_out_of_memory_without_auto_propagates():
    trainer = make_trainer(model=OOMAbove(limit=4), max_duration="1ba")
    with pytest.raises(torch.OutOfMemoryError):
        trainer.fit()


def test_amp_bf16_runs_forward_in_bfloat16_on_cpu():
    dtypes = []

    class DtypeRecorder(Callback):
        def after_forward(self, state, logger):
            dtypes.append(state.outputs.dtype)

    trainer = make_trainer(precision="amp_bf16", max_duration="2ba", callbacks=[DtypeRecorder()])
    trainer.fit()
    assert dtypes == [torch.bfloat16, torch.bfloat16]
    assert all(p.dtype == torch.float32 for p in trainer.state.model.parameters())


def test_eval_interval_in_batches_and_final_eval():
    evals = []

    class EvalCounter(Callback):
        def eval_end(self, state, logger):
            evals.append(state.timestamp.batch)

    trainer = make_trainer(
        max_duration="7ba",
        eval_dataloader={
            "a": loader(blobs(32), shuffle=False),
            "b": loader(blobs(16), shuffle=False),
        },
        eval_interval="3ba",
        callbacks=[EvalCounter()],
    )
    trainer.fit()
    assert evals == [3, 3, 6, 6, 7, 7]  # two evaluators, every 3 batches and at the end


def test_predict_returns_outputs_per_batch():
    trainer = make_trainer()
    outputs = trainer.predict(loader(blobs(40), batch_size=16, shuffle=False))
    assert [o.shape for o in outputs] == [
        torch.Size([16, 2]),
        torch.Size([16, 2]),
        torch.Size([8, 2]),
    ]
    assert trainer.state.model.training


def test_stop_training_from_a_callback():
    class StopAt(Callback):
        def batch_end(self, state, logger):
            if state.timestamp.batch == 5:
                state.stop_training()

    trainer = make_trainer(callbacks=[StopAt()])
    trainer.fit()
    assert trainer.state.timestamp.batch == 5


def test_same_seed_same_result_different_seed_different_result():
    runs = []
    for seed in (1, 1, 2):
        trainer = make_trainer(seed=seed, max_duration="1ep")
        trainer.fit()
        runs.append(flat_params(trainer.state.model))
    assert torch.equal(runs[0], runs[1])
    assert not torch.equal(runs[0], runs[2])


def test_deterministic_mode_trains():
    try:
        trainer = make_trainer(deterministic=True, max_duration="2ba")
        trainer.fit()
        assert torch.are_deterministic_algorithms_enabled()
    finally:
        torch.use_deterministic_algorithms(False)


def test_default_optimizer_is_built_after_init_surgery():
    class Widen(Callback):
        pass

    class ReplaceHead(Algorithm):
        def match(self, event, state):
            return event == Event.INIT

        def apply(self, event, state, logger):
            state.model.module[3] = nn.Linear(16, 2)

    trainer = make_trainer(algorithms=[ReplaceHead()], max_duration="1ba")
    head = trainer.state.model.module[3].weight
    assert any(p is head for p in trainer.state.optimizers[0].param_groups[0]["params"])


def test_user_optimizer_is_rebound_after_surgery_at_init():
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    class ReplaceHead(Algorithm):
        def match(self, event, state):
            return event == Event.INIT

        def apply(self, event, state, logger):
            state.model.module[3] = nn.Linear(16, 2)

    trainer = make_trainer(
        model=model, optimizers=optimizer, algorithms=[ReplaceHead()], max_duration="2ba"
    )
    new_head = model.module[3].weight
    before = new_head.detach().clone()
    trainer.fit()
    assert any(p is new_head for p in optimizer.param_groups[0]["params"])
    assert not torch.equal(before, new_head.detach())


def test_user_optimizer_is_rebound_after_a_strategy_replaces_parameters():
    class ReplaceParameters(ParallelStrategy):
        """Stands in for a strategy that shards: every parameter becomes a new object."""

        def prepare(self, state):
            for module in state.model.modules():
                for name, param in list(module.named_parameters(recurse=False)):
                    setattr(module, name, nn.Parameter(param.detach().clone()))

        @property
        def data_parallel_size(self):
            return 1

    model = mlp()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    trainer = make_trainer(
        model=model, optimizers=optimizer, parallelism=ReplaceParameters(), max_duration="2ba"
    )
    live = list(model.parameters())
    before = flat_params(model)
    trainer.fit()
    bound = optimizer.param_groups[0]["params"]
    assert len(bound) == len(live) and all(a is b for a, b in zip(bound, live, strict=True))
    assert not torch.equal(before, flat_params(model))
