"""The model's training outputs are freed after the loss unless a component needs them."""

import weakref

import pytest
import torch

from toy import blobs, loader, mlp
from trainkit.core import Algorithm, Callback, Event, LoggerDestination
from trainkit.trainer import Trainer
from trainkit.trainer.loop import run_microbatches

LATE_EVENTS = (
    Event.BEFORE_BACKWARD,
    Event.AFTER_BACKWARD,
    Event.AFTER_TRAIN_BATCH,
    Event.BATCH_END,
)


class OutputsSeen(Callback):
    """Records, per event, whether ``state.outputs`` is there; keeps no reference to them."""

    def __init__(self) -> None:
        self.seen: dict[Event, list[bool]] = {}
        self.alive_at_before_backward: list[bool] = []
        self._forward: weakref.ref | None = None

    def run_event(self, event, state, logger) -> None:
        self.seen.setdefault(event, []).append(state.outputs is not None)
        if event == Event.AFTER_FORWARD:
            self._forward = weakref.ref(state.outputs)
        elif event == Event.BEFORE_BACKWARD:
            assert self._forward is not None
            self.alive_at_before_backward.append(self._forward() is not None)


class NeedsOutputs(OutputsSeen):
    needs_outputs = True


class KeepsOutputs(Algorithm):
    needs_outputs = True

    def match(self, event, state):
        return False

    def apply(self, event, state, logger):
        return None


class DuckTyped:
    """A callback without the base class, declaring the attribute."""

    needs_outputs = True

    def batch_end(self, state, logger) -> None:
        pass


class DestinationNeedingOutputs(LoggerDestination):
    needs_outputs = True


def _fit(callbacks=(), algorithms=(), max_duration="2ba", **kwargs):
    trainer = Trainer(
        model=mlp(),
        train_dataloader=loader(blobs(64)),
        max_duration=max_duration,
        device="cpu",
        seed=0,
        progress_bar=False,
        callbacks=list(callbacks),
        algorithms=list(algorithms),
        **kwargs,
    )
    trainer.fit()
    return trainer


def test_outputs_are_dropped_after_the_loss_by_default():
    probe = OutputsSeen()
    trainer = _fit([probe])
    for event in (Event.AFTER_FORWARD, Event.BEFORE_LOSS, Event.AFTER_LOSS):
        assert probe.seen[event] == [True, True], event
    for event in LATE_EVENTS:
        assert probe.seen[event] == [False, False], event
    assert probe.alive_at_before_backward == [False, False]  # nothing else holds the tensor
    assert trainer.state.outputs is None


def test_a_callback_that_needs_outputs_keeps_them_through_backward_and_the_step():
    probe = NeedsOutputs()
    trainer = _fit([probe])
    for event in LATE_EVENTS:
        assert probe.seen[event] == [True, True], event
    assert probe.alive_at_before_backward == [True, True]
    assert trainer.state.outputs is not None


@pytest.mark.parametrize(
    "components",
    [
        {"algorithms": [KeepsOutputs()]},
        {"callbacks": [DuckTyped()]},
        {"loggers": [DestinationNeedingOutputs()]},
    ],
    ids=["algorithm", "duck_typed_callback", "logger_destination"],
)
def test_any_registered_component_can_declare_it(components):
    probe = OutputsSeen()
    components = dict(components)
    callbacks = [probe, *components.pop("callbacks", [])]
    _fit(callbacks, **components)
    assert probe.seen[Event.BATCH_END] == [True, True]
    assert probe.alive_at_before_backward == [True, True]


def test_each_microbatch_drops_its_outputs():
    probe = OutputsSeen()
    _fit([probe], device_train_microbatch_size=4)
    assert probe.seen[Event.AFTER_LOSS] == [True] * 8  # 2 batches of 16 in 4 microbatches
    assert probe.seen[Event.BEFORE_BACKWARD] == [False] * 8
    assert probe.alive_at_before_backward == [False] * 8


def test_a_component_added_during_the_run_is_seen():
    probe = OutputsSeen()

    class AddsOneAfterTheFirstBatch(Callback):
        def batch_end(self, state, logger):
            if not any(isinstance(c, DuckTyped) for c in state.callbacks):
                state.callbacks.append(DuckTyped())

    _fit([probe, AddsOneAfterTheFirstBatch()])
    assert probe.seen[Event.BEFORE_BACKWARD] == [False, True]


def test_a_hand_written_loop_gets_the_same_rule():
    trainer = _fit(max_duration="1ba")
    state, engine = trainer.state, trainer.engine
    state.batch = next(iter(loader(blobs(16))))
    run_microbatches(state, engine)
    assert state.outputs is None and state.loss is not None
    state.callbacks.append(DuckTyped())
    run_microbatches(state, engine)
    assert isinstance(state.outputs, torch.Tensor)


def test_train_metrics_still_see_every_batch():
    trainer = _fit(max_duration="1ep")
    accuracy = trainer.state.train_metrics["accuracy"]
    assert int(accuracy.count) == 64
