"""`interval_trigger`: when ``"2ba"`` / ``"1ep"`` / ``"0.5dur"`` fire in the loop."""

import pytest
import torch
from torch import nn

from toy import blobs, loader, mlp
from trainkit.core import Callback, DataSpec, Event, State, Timestamp, ensure_time
from trainkit.core.interval import interval_trigger
from trainkit.trainer import Trainer


def make_state(max_duration, batches_per_epoch):
    batches = [(torch.zeros(2, 1), torch.zeros(2, dtype=torch.long))] * batches_per_epoch
    return State(
        model=nn.Linear(1, 1),
        train_data=DataSpec(batches),
        max_duration=ensure_time(max_duration),
    )


def fired(trigger, max_duration, batches_per_epoch):
    """Replays the Trainer's order of BATCH_END / EPOCH_END; returns where ``trigger`` fired."""
    state = make_state(max_duration, batches_per_epoch)
    hits = []
    while not state.is_done():
        state.timestamp = state.timestamp.to_next_batch(samples=2)
        if trigger(state, Event.BATCH_END):
            hits.append(("batch_end", state.timestamp.batch))
        for event in (Event.BATCH_START, Event.EVAL_END, Event.FIT_END):
            assert not trigger(state, event)
        if state.timestamp.batch_in_epoch == batches_per_epoch:
            state.timestamp = state.timestamp.to_next_epoch()
            if trigger(state, Event.EPOCH_END):
                hits.append(("epoch_end", state.timestamp.batch))
    return hits


def test_batch_interval_fires_at_every_multiple_and_at_the_end():
    assert fired(interval_trigger("2ba"), "7ba", 3) == [
        ("batch_end", 2),
        ("batch_end", 4),
        ("batch_end", 6),
        ("batch_end", 7),
    ]


def test_batch_interval_without_at_end():
    trigger = interval_trigger("2ba", at_end=False)
    assert fired(trigger, "7ba", 3) == [("batch_end", 2), ("batch_end", 4), ("batch_end", 6)]


def test_epoch_interval_fires_at_epoch_end_only():
    assert fired(interval_trigger("1ep"), "3ep", 4) == [
        ("epoch_end", 4),
        ("epoch_end", 8),
        ("epoch_end", 12),
    ]
    assert fired(interval_trigger(1), "2ep", 2) == [("epoch_end", 2), ("epoch_end", 4)]


def test_epoch_interval_fires_at_the_last_epoch_even_off_the_interval():
    assert fired(interval_trigger("2ep"), "3ep", 2) == [("epoch_end", 4), ("epoch_end", 6)]
    assert fired(interval_trigger("2ep", at_end=False), "3ep", 2) == [("epoch_end", 4)]


def test_epoch_interval_fires_at_a_final_batch_mid_epoch():
    assert fired(interval_trigger("1ep"), "6ba", 4) == [("epoch_end", 4), ("batch_end", 6)]


def test_epoch_interval_fires_once_when_the_last_batch_ends_an_epoch():
    assert fired(interval_trigger("1ep"), "8ba", 4) == [("epoch_end", 4), ("epoch_end", 8)]


def test_duration_interval_fires_halfway_and_at_the_end():
    assert fired(interval_trigger("0.5dur"), "4ba", 10) == [("batch_end", 2), ("batch_end", 4)]
    assert fired(interval_trigger("0.5dur"), "2ep", 3) == [("batch_end", 3), ("batch_end", 6)]


def test_duration_interval_crossings_that_are_not_on_a_batch():
    assert fired(interval_trigger("0.3dur"), "10ba", 5) == [
        ("batch_end", 3),
        ("batch_end", 6),
        ("batch_end", 9),
        ("batch_end", 10),
    ]


def test_sample_interval_fires_where_the_count_crosses_a_multiple():
    # 2 samples per batch: 5 samples are crossed at batches 3 (6 samples) and 5 (10)
    assert fired(interval_trigger("5sp"), "6ba", 10) == [
        ("batch_end", 3),
        ("batch_end", 5),
        ("batch_end", 6),
    ]


def test_trigger_created_mid_run_assumes_a_steady_rate():
    state = make_state("100ba", 50)
    trigger = interval_trigger("4ba")
    state.timestamp = Timestamp(batch=8, batch_in_epoch=8)
    assert trigger(state, Event.BATCH_END)
    fresh = interval_trigger("4ba")
    state.timestamp = Timestamp(batch=9, batch_in_epoch=9)
    assert not fresh(state, Event.BATCH_END)


def test_callable_is_returned_as_is():
    def every_time(state, event):
        return True

    assert interval_trigger(every_time) is every_time


@pytest.mark.parametrize("interval", ["0ba", "0ep", "0dur", 0])
def test_zero_interval_raises(interval):
    with pytest.raises(ValueError, match="is zero; use a positive interval"):
        interval_trigger(interval)


def test_bad_interval_names_the_value():
    with pytest.raises(ValueError, match="interval 'often' is not a duration"):
        interval_trigger("often")


class EvalBatches(Callback):
    def __init__(self):
        self.batches = []

    def eval_start(self, state, logger):
        self.batches.append(state.timestamp.batch)


@pytest.mark.parametrize(
    ("eval_interval", "expected"), [("2ba", [2, 4, 6]), ("1ep", [4, 6]), ("0.5dur", [3, 6])]
)
def test_trainer_evaluates_at_the_interval(eval_interval, expected):
    recorder = EvalBatches()
    trainer = Trainer(
        model=mlp(),
        train_dataloader=loader(blobs(64)),
        eval_dataloader=loader(blobs(32), shuffle=False),
        eval_interval=eval_interval,
        max_duration="6ba",
        callbacks=[recorder],
        progress_bar=False,
        device="cpu",
        seed=0,
    )
    trainer.fit()
    assert recorder.batches == expected
