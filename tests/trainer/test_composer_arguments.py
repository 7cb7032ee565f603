"""Trainer arguments and engine behaviour a Composer script relies on: subsets of batches,
per-evaluator intervals, standalone evaluation events, close/post_close, traces, logging."""

import dataclasses
import logging
import re

import pytest
import torch

from toy import CountingDataset, blobs, loader, mlp
from trainkit.core import Algorithm, Callback, CallbackError, Evaluator, Event, LoggerDestination
from trainkit.trainer import Trainer, TrainerConfig


def make_trainer(**kwargs):
    kwargs.setdefault("model", mlp())
    kwargs.setdefault("train_dataloader", loader(blobs()))  # 8 batches of 16
    kwargs.setdefault("max_duration", "2ep")
    kwargs.setdefault("progress_bar", False)
    kwargs.setdefault("device", "cpu")
    kwargs.setdefault("seed", 7)
    return Trainer(**kwargs)


class Events(Callback):
    def __init__(self):
        self.events = []

    def run_event(self, event, state, logger):
        self.events.append(event)


class Memory(LoggerDestination):
    def __init__(self):
        self.metrics = []

    def log_metrics(self, metrics, step):
        self.metrics.append((step, dict(metrics)))

    def keys(self):
        return {key for _, metrics in self.metrics for key in metrics}


# --- subsets of batches ----------------------------------------------------------------------


@pytest.mark.parametrize("subset", [3, 8, 20])
def test_train_subset_num_batches_ends_each_epoch_early(subset):
    data = CountingDataset(blobs())
    trainer = make_trainer(train_dataloader=loader(data), train_subset_num_batches=subset)
    trainer.fit()
    per_epoch = min(subset, 8)
    ts = trainer.state.timestamp
    assert (ts.epoch, ts.batch) == (2, 2 * per_epoch)
    assert trainer.state.dataloader_len == per_epoch
    assert len(data.loaded) == 2 * per_epoch * 16  # nothing read past the subset


def test_minus_one_means_every_batch_as_composer():
    trainer = make_trainer(train_subset_num_batches=-1, max_duration="1ep")
    trainer.fit()
    assert trainer.state.timestamp.batch == 8
    assert trainer.config.train_subset_num_batches is None


def test_eval_subset_and_per_evaluator_interval_and_subset():
    evaluated = []

    class CountEval(Callback):
        def eval_start(self, state, logger):
            self.batches = 0

        def eval_batch_end(self, state, logger):
            self.batches += 1

        def eval_end(self, state, logger):
            evaluated.append((state.timestamp.batch, state.dataloader_label, self.batches))

    data = blobs(64)  # 4 eval batches of 16
    often = Evaluator(label="often", data=loader(data), eval_interval="2ba")
    rare = Evaluator(label="rare", data=loader(data), subset_num_batches=3)
    trainer = make_trainer(
        eval_dataloader=[often, rare],
        eval_interval="4ba",
        eval_subset_num_batches=1,
        max_duration="8ba",
        callbacks=[CountEval()],
    )
    trainer.fit()
    # "often" runs every 2 batches on the Trainer's subset (1 batch); "rare" at the Trainer's
    # interval on its own subset (3 batches).
    assert evaluated == [
        (2, "often", 1),
        (4, "often", 1),
        (4, "rare", 3),
        (6, "often", 1),
        (8, "often", 1),
        (8, "rare", 3),
    ]
    assert trainer.state.dataloader_label == "train"
    assert set(trainer.last_eval) == {
        f"metrics/{label}/{name}"
        for label in ("often", "rare")
        for name in ("accuracy", "cross_entropy")
    }


def test_eval_subset_without_eval_data_is_an_error():
    with pytest.raises(ValueError, match="eval_subset_num_batches=2 without eval_dataloader"):
        make_trainer(eval_subset_num_batches=2)
    with pytest.raises(ValueError, match="positive number of batches, or None / -1"):
        TrainerConfig(model=mlp(), train_subset_num_batches=0)


def test_standalone_eval_fires_its_own_events_and_takes_a_subset():
    events = Events()
    trainer = make_trainer(eval_dataloader=loader(blobs(64)), callbacks=[events])
    results = trainer.eval(subset_num_batches=2)
    eval_events = [e for e in events.events if e.is_eval]
    assert eval_events[0] == Event.EVAL_STANDALONE_START
    assert eval_events[-1] == Event.EVAL_STANDALONE_END
    assert Event.EVAL_BEFORE_ALL not in eval_events and Event.EVAL_AFTER_ALL not in eval_events
    assert eval_events.count(Event.EVAL_BATCH_END) == 2
    assert "metrics/eval/accuracy" in results
    # During fit, evaluations are wrapped in EVAL_BEFORE_ALL / EVAL_AFTER_ALL instead.
    events.events.clear()
    trainer.fit(duration="1ep")
    assert Event.EVAL_BEFORE_ALL in events.events
    assert Event.EVAL_STANDALONE_START not in events.events


# --- close and post_close --------------------------------------------------------------------


def test_close_gets_state_and_logger_then_post_close_runs_after_all_closed():
    calls = []

    class Closing(Callback):
        def __init__(self, name, fail=False):
            self.name, self.fail = name, fail

        def close(self, state, logger):
            calls.append(("close", self.name, state is trainer.state, logger is trainer.logger))
            if self.fail:
                raise OSError(f"{self.name} cannot flush")

        def post_close(self):
            calls.append(("post_close", self.name))

    class DuckTyped:
        def fit_end(self, state, logger):
            pass

        def close(self):  # an older callback (or a file-like object): no arguments
            calls.append(("close", "duck"))

    trainer = make_trainer(
        callbacks=[Closing("a"), Closing("b", fail=True), DuckTyped(), Closing("c")]
    )
    with pytest.raises(CallbackError, match=r"Closing.close\(\) failed: OSError\('b cannot flush'"):
        trainer.close()
    assert calls == [
        ("close", "a", True, True),
        ("close", "b", True, True),
        ("close", "duck"),
        ("close", "c", True, True),
        ("post_close", "a"),  # not b: its close raised
        ("post_close", "c"),
    ]
    calls.clear()
    trainer.close()  # closing twice does nothing
    assert calls == []


# --- traces and logging ----------------------------------------------------------------------


class Halve(Algorithm):
    def match(self, event, state):
        return event in (Event.AFTER_DATALOADER, Event.BATCH_END)

    def apply(self, event, state, logger):
        if event == Event.AFTER_DATALOADER:
            return 7
        return None


@pytest.mark.parametrize("log_traces", [True, False])
def test_log_traces_sends_each_algorithm_run_to_the_destinations(log_traces):
    memory = Memory()
    trainer = make_trainer(
        algorithms=[Halve()], loggers=[memory], log_traces=log_traces, max_duration="2ba"
    )
    trainer.fit()
    traces = [
        (step, key, value)
        for step, metrics in memory.metrics
        for key, value in metrics.items()
        if key.startswith("algorithm_traces/")
    ]
    if not log_traces:
        assert traces == []
        return
    assert traces == [
        (0, "algorithm_traces/Halve/after_dataloader", 7),
        (1, "algorithm_traces/Halve/batch_end", 1),
        (1, "algorithm_traces/Halve/after_dataloader", 7),
        (2, "algorithm_traces/Halve/batch_end", 1),
    ]


def test_python_log_level(caplog):
    package = logging.getLogger("trainkit")
    assert package.level == logging.NOTSET  # so INFO records are dropped (root: WARNING)
    try:
        make_trainer(max_duration="1ba", python_log_level="info").fit()
        assert package.level == logging.INFO
    finally:
        package.setLevel(logging.NOTSET)
    messages = [r.getMessage() for r in caplog.records if r.name.startswith("trainkit")]
    assert any(m.startswith("run ") and "1 rank(s), device cpu" in m for m in messages)
    assert any(m.startswith("fit ended at epoch 0 batch 1 (done)") for m in messages)
    with pytest.raises(ValueError, match="python_log_level 'loud' is not a logging level"):
        TrainerConfig(model=mlp(), python_log_level="loud")


def test_torch_scheduler_stepping_is_unchanged_by_subsets():
    # A torch scheduler steps once per (shortened) epoch.
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    trainer = make_trainer(
        model=model,
        optimizers=optimizer,
        schedulers=scheduler,
        train_subset_num_batches=2,
        max_duration="3ep",
    )
    trainer.fit()
    assert trainer.state.timestamp.batch == 6
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.1 * 0.5**3)


# --- Composer arguments that trainkit spells otherwise ----------------------------------------


COMPOSER_ONLY = {
    "parallelism_config": "FSDP(...), TensorParallel(...) or DDP(...)",
    "deterministic_mode": "deterministic=True",
    "precision_config": "MixedPrecision(...)",
    "compile_config": "compile=True",
    "ddp_sync_strategy": "DDP(sync=...)",
    "dist_timeout": "init_distributed(timeout=...)",
    "console_stream": "ConsoleLogger(stream=...)",
    "profiler": "Profiler(...)",
    "algorithm_passes": "register_pass",
    "load_object_store": "a URL as load_path",
    "accumulate_train_batch_on_tokens": "loss_weight(batch)",
    "train_dataloader_label": "labelled 'train'",
    "spin_dataloaders": "without spinning",
    "auto_log_hparams": "every field is logged",
    "load_progress_bar": "not needed",
    "save_latest_filename": "'latest' is written",
    "save_metrics": "metrics are always saved",
    "save_ignore_keys": "not supported",
}


@pytest.mark.parametrize("name", sorted(COMPOSER_ONLY))
def test_a_composer_argument_says_what_to_use_instead(name):
    assert name not in {f.name for f in dataclasses.fields(TrainerConfig)}
    instead = re.escape(COMPOSER_ONLY[name])
    with pytest.raises(TypeError, match=rf"no field '{name}'; {name}: .*{instead}"):
        make_trainer(**{name: None})
    assert TrainerConfig.unknown_field_hints.keys() == COMPOSER_ONLY.keys()


def test_an_unknown_argument_without_a_hint_lists_the_fields():
    with pytest.raises(
        TypeError,
        match=r"no field 'device_eval_batch_size'; did you mean 'device_eval_microbatch_size'\?",
    ):
        make_trainer(device_eval_batch_size=2)
