"""Preemption in core: the options, the handlers' lifetime, the exit, and FIT_ABORTED.

Saving on preemption (through trainkit-checkpoint) is tested in
tests/checkpoint/test_preemption.py, with real signals to real processes.
"""

from __future__ import annotations

import signal
import threading

import pytest

from toy import blobs, loader, mlp
from trainkit.core import PREEMPTED_EXIT_CODE, Callback, Event, TrainingPreempted
from trainkit.trainer import Trainer, TrainerConfig


def _trainer(callbacks=(), **options) -> Trainer:
    return Trainer(
        model=mlp(),
        train_dataloader=loader(blobs(64)),
        max_duration="2ep",
        progress_bar=False,
        device="cpu",
        seed=5,
        callbacks=list(callbacks),
        **options,
    )


class SignalAt(Callback):
    """Signals this thread at the end of batch ``batch``; its Python handler has run (or
    raised) before ``raise_signal`` returns. ``os.kill(os.getpid(), ...)`` would signal the
    process: any of its threads may take the signal, and under load the main thread may
    only run the handler batches later (or after ``fit`` returned)."""

    def __init__(self, batch, sig=signal.SIGTERM):
        self.batch, self.sig = batch, sig

    def batch_end(self, state, logger):
        if state.timestamp.batch == self.batch:
            signal.raise_signal(self.sig)


class Events(Callback):
    """Records FIT_END, FIT_ABORTED and close, and what ``state.preemption`` said."""

    def __init__(self):
        self.seen = []

    def batch_checkpoint(self, state, logger):
        if state.preemption is not None:
            self.seen.append(("batch_checkpoint", state.preemption.batch))

    def fit_end(self, state, logger):
        self.seen.append("fit_end")

    def fit_aborted(self, state, logger):
        self.seen.append("fit_aborted")

    def close(self, state, logger):
        self.seen.append("close")


def test_a_signal_stops_after_the_batch_and_fit_raises_exit_status_75():
    events = Events()
    run = _trainer([SignalAt(3), events])
    with pytest.raises(TrainingPreempted) as caught:
        run.fit()
    err = caught.value
    assert isinstance(err, SystemExit) and err.code == PREEMPTED_EXIT_CODE == 75
    assert err.request.signal == "SIGTERM" and err.request.batch == 3
    assert "no checkpoint saved (the run has no checkpointer)" in str(err)
    assert run.state.timestamp.batch == 3
    # BATCH_CHECKPOINT sees the request, FIT_END runs (not FIT_ABORTED), loggers are closed.
    assert events.seen == [("batch_checkpoint", 3), "fit_end", "close"]


def test_handlers_are_restored_after_fit_and_a_later_fit_is_not_preempted():
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    run = _trainer([SignalAt(2)])
    with pytest.raises(TrainingPreempted):
        run.fit()
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before
    run.fit()  # the request was for the fit it stopped
    assert run.state.is_done() and run.state.preemption is None


def test_empty_preemption_signals_leaves_sigint_as_keyboard_interrupt():
    # Python's own SIGINT handler, whatever started pytest: a shell script's background job
    # (`pytest ... &`) starts with SIGINT ignored, and Python then installs no handler.
    outer = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        events = Events()
        run = _trainer([SignalAt(2, signal.SIGINT), events], preemption_signals=[])
        with pytest.raises(KeyboardInterrupt):
            run.fit()
        assert events.seen == ["fit_aborted"]
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # left alone
    finally:
        signal.signal(signal.SIGINT, outer)


def test_empty_preemption_signals_leaves_an_ignored_sigint_ignored():
    outer = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        run = _trainer([SignalAt(2, signal.SIGINT)], preemption_signals=[])
        run.fit()
        assert run.state.is_done() and run.state.preemption is None
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, outer)


def test_fit_in_another_thread_installs_no_handler_and_trains():
    before = signal.getsignal(signal.SIGTERM)
    seen = []

    class Look(Callback):
        def batch_end(self, state, logger):
            seen.append(signal.getsignal(signal.SIGTERM))

    run = _trainer([Look()])
    thread = threading.Thread(target=run.fit)
    thread.start()
    thread.join(60)
    assert run.state.is_done() and set(seen) == {before}


def test_fit_aborted_fires_on_an_error_and_its_own_failure_becomes_a_note():
    class Boom(Callback):
        def batch_end(self, state, logger):
            if state.timestamp.batch == 2:
                raise ValueError("boom")

    class BadCleanup(Callback):
        def fit_aborted(self, state, logger):
            raise OSError("cleanup failed")

    events = Events()
    run = _trainer([Boom(), BadCleanup(), events])
    with pytest.raises(Exception, match="boom") as caught:
        run.fit()
    assert events.seen == ["fit_aborted"]  # after the failing one: every listener runs
    assert any("FIT_ABORTED failed too" in note for note in caught.value.__notes__)
    assert Event.FIT_ABORTED.value == "fit_aborted"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"preemption_signals": ["SIGNOPE"]}, r"'SIGNOPE' is not a signal on this system"),
        ({"preemption_signals": ["SIGKILL"]}, r"'SIGKILL' cannot be caught"),
        ({"preemption_signals": "SIGTERM"}, r"must be a list of signal names.*\[\"SIGTERM\"\]"),
        ({"preemption_grace_period": -1}, r"preemption_grace_period must be a number of seconds"),
        ({"preemption_grace_period": "30s"}, r"must be a number of seconds >= 0 or None"),
    ],
)
def test_bad_preemption_options_are_refused_naming_what_is_accepted(options, message):
    with pytest.raises(ValueError, match=message):
        TrainerConfig(model=mlp(), **options)


def test_signal_names_may_omit_the_sig_prefix():
    run = _trainer([SignalAt(1, signal.SIGUSR1)], preemption_signals=["usr1"])
    with pytest.raises(TrainingPreempted, match="SIGUSR1 after batch 1"):
        run.fit()
