"""`Engine`: order of algorithms, callbacks and destinations; traces; errors."""

import pytest
import torch
from torch import nn

from trainkit.core import (
    Algorithm,
    AlgorithmError,
    Callback,
    CallbackError,
    Engine,
    Event,
    Logger,
    LoggerDestination,
    State,
    Trace,
)


class Step(Algorithm):
    """An algorithm that records its name in a shared log at the events it matches."""

    def __init__(self, name, log, events=(Event.BATCH_START, Event.AFTER_FORWARD), exit_code=None):
        self.name, self.log, self.events, self.exit_code = name, log, set(events), exit_code

    def match(self, event, state):
        return event in self.events

    def apply(self, event, state, logger):
        self.log.append(self.name)
        return self.exit_code


class StepA(Step):
    pass


class StepB(Step):
    pass


class StepC(Step):
    pass


class Exploder(Algorithm):
    def __init__(self, error):
        self.error = error

    def match(self, event, state):
        return event == Event.BATCH_START

    def apply(self, event, state, logger):
        raise self.error


class Listener(Callback):
    def __init__(self, name, log):
        self.name, self.log = name, log
        self.closed = 0

    def batch_start(self, state, logger):
        self.log.append(self.name)

    def close(self):
        self.closed += 1


class DestinationListener(Listener, LoggerDestination):
    pass


class PlainDestination(LoggerDestination):
    def __init__(self, log):
        self.log = log
        self.closed = 0

    def batch_start(self, state, logger):  # not a Callback, yet called: duck typing
        self.log.append("plain")

    def close(self):
        self.closed += 1


class Everything(Callback):
    def __init__(self):
        self.events = []

    def run_event(self, event, state, logger):
        self.events.append(event)


class FailingCallback(Callback):
    def batch_end(self, state, logger):
        raise KeyError("missing")


def make_engine(algorithms=(), callbacks=(), destinations=(), **kwargs):
    state = State(model=nn.Linear(1, 1), algorithms=list(algorithms), callbacks=list(callbacks))
    return Engine(state, Logger(destinations, state), **kwargs)


def three(log):
    return [StepA("A", log), StepB("B", log), StepC("C", log)]


def test_algorithms_run_in_list_order():
    log = []
    engine = make_engine(three(log))
    traces = engine.run_event(Event.BATCH_START)
    assert log == ["A", "B", "C"]
    assert [(t.name, t.order) for t in traces] == [("StepA", 0), ("StepB", 1), ("StepC", 2)]


@pytest.mark.parametrize("event", [Event.AFTER_FORWARD, Event.AFTER_LOSS, Event.EVAL_AFTER_FORWARD])
def test_algorithms_run_in_reverse_for_after_events(event):
    log = []
    engine = make_engine(
        [StepA("A", log, [event]), StepB("B", log, [event]), StepC("C", log, [event])]
    )
    engine.run_event(event)
    assert log == ["C", "B", "A"]


def test_after_events_are_recognised():
    assert Event.AFTER_FORWARD.is_after
    assert Event.AFTER_BACKWARD.is_after
    assert Event.PREDICT_AFTER_FORWARD.is_after
    assert not Event.BATCH_END.is_after
    assert not Event.BEFORE_FORWARD.is_after


def test_only_matching_algorithms_run():
    log = []
    engine = make_engine([StepA("A", log, [Event.BATCH_START]), StepB("B", log, [Event.BATCH_END])])
    traces = engine.run_event("batch_end")
    assert log == ["B"]
    assert [t.name for t in traces] == ["StepB"]
    assert engine.run_event(Event.FIT_START) == []
    assert log == ["B"]


def test_traces_record_exit_codes_and_are_kept_in_history():
    log = []
    engine = make_engine([StepA("A", log, exit_code=3), StepB("B", log)])
    first = engine.run_event(Event.BATCH_START)
    second = engine.run_event(Event.AFTER_FORWARD)
    assert all(isinstance(t, Trace) for t in first + second)
    assert [t.exit_code for t in first] == [3, None]
    assert all(t.event == Event.BATCH_START and t.seconds >= 0 for t in first)
    assert [(t.name, t.event) for t in second] == [
        ("StepB", Event.AFTER_FORWARD),
        ("StepA", Event.AFTER_FORWARD),
    ]
    assert list(engine.history) == first + second
    assert {Event.BATCH_START, Event.AFTER_FORWARD} <= engine.fired


def test_history_keeps_the_last_history_size_traces():
    log = []
    engine = make_engine(three(log), history_size=4)
    engine.run_event(Event.BATCH_START)
    engine.run_event(Event.BATCH_START)
    assert len(engine.history) == 4
    assert [t.name for t in engine.history] == ["StepC", "StepA", "StepB", "StepC"]


def drop_first(algorithms, event):
    return algorithms[1:]


def last_to_front(algorithms, event):
    return algorithms[-1:] + algorithms[:-1]


def test_ordering_pass_changes_the_order():
    log = []
    engine = make_engine(three(log))
    engine.register_pass(last_to_front)
    traces = engine.run_event(Event.BATCH_START)
    assert log == ["C", "A", "B"]
    assert [t.order for t in traces] == [0, 1, 2]


def test_ordering_passes_run_in_registration_order_and_index_zero_runs_first():
    log = []
    appended = make_engine(three(log))
    appended.register_pass(drop_first)
    appended.register_pass(last_to_front)
    appended.run_event(Event.BATCH_START)
    assert log == ["C", "B"]

    log.clear()
    prepended = make_engine(three(log))
    prepended.register_pass(drop_first)
    prepended.register_pass(last_to_front, index=0)
    prepended.run_event(Event.BATCH_START)
    assert log == ["A", "B"]


def test_ordering_pass_receives_the_event_and_runs_before_the_after_reversal():
    log, seen = [], []

    def c_first(algorithms, event):
        seen.append(event)
        return last_to_front(algorithms, event)

    engine = make_engine(three(log))
    engine.register_pass(c_first)
    engine.run_event(Event.AFTER_FORWARD)
    assert seen == [Event.AFTER_FORWARD]
    assert log == ["B", "A", "C"]


def test_after_reversal_does_not_mutate_a_list_returned_by_a_pass():
    log = []
    fixed = three(log)
    engine = make_engine(three(log))
    engine.register_pass(lambda algorithms, event: fixed)
    engine.run_event(Event.AFTER_FORWARD)
    engine.run_event(Event.AFTER_FORWARD)
    assert log == ["C", "B", "A", "C", "B", "A"]
    assert [a.name for a in fixed] == ["A", "B", "C"]


def test_callbacks_run_after_algorithms_and_destination_callbacks_last():
    log = []
    destination = DestinationListener("destination", log)
    plain = PlainDestination(log)
    engine = make_engine(
        algorithms=[StepA("A", log)],
        callbacks=[Listener("cb1", log), Listener("cb2", log)],
        destinations=[destination, plain],
    )
    engine.run_event(Event.BATCH_START)
    assert log == ["A", "cb1", "cb2", "destination", "plain"]
    engine.run_event(Event.BATCH_END)  # nobody defines batch_end
    assert log == ["A", "cb1", "cb2", "destination", "plain"]


def test_an_object_that_is_callback_and_destination_runs_once():
    log = []
    both = DestinationListener("both", log)
    engine = make_engine(callbacks=[both], destinations=[both])
    engine.run_event(Event.BATCH_START)
    assert log == ["both"]


def test_callback_overriding_run_event_sees_every_event():
    everything = Everything()
    engine = make_engine(callbacks=[everything])
    for event in (Event.INIT, Event.BATCH_START, Event.EVAL_END):
        engine.run_event(event)
    assert everything.events == [Event.INIT, Event.BATCH_START, Event.EVAL_END]


def test_callbacks_added_later_are_called():
    log = []
    engine = make_engine(callbacks=[Listener("first", log)])
    engine.run_event(Event.BATCH_START)
    engine.state.callbacks.append(Listener("second", log))
    engine.run_event(Event.BATCH_START)
    assert log == ["first", "first", "second"]


def test_failing_algorithm_raises_algorithm_error_naming_it_and_the_event():
    cause = ValueError("bad shape")
    engine = make_engine([Exploder(cause)])
    with pytest.raises(AlgorithmError) as info:
        engine.run_event(Event.BATCH_START)
    message = str(info.value)
    assert "Exploder" in message
    assert "BATCH_START" in message
    assert "bad shape" in message
    assert info.value.__cause__ is cause


def test_failing_algorithm_stops_the_event():
    log = []
    engine = make_engine([Exploder(RuntimeError("x")), StepB("B", log)], [Listener("cb", log)])
    with pytest.raises(AlgorithmError):
        engine.run_event(Event.BATCH_START)
    assert log == []


def test_failing_callback_raises_callback_error_naming_it_and_the_event():
    engine = make_engine(callbacks=[FailingCallback()])
    with pytest.raises(CallbackError) as info:
        engine.run_event(Event.BATCH_END)
    message = str(info.value)
    assert "FailingCallback" in message
    assert "BATCH_END" in message
    assert isinstance(info.value.__cause__, KeyError)


def test_failing_destination_event_handler_warns_once_and_training_goes_on():
    calls = []

    class BrokenDestination(Callback, LoggerDestination):
        def fit_start(self, state, logger):
            calls.append("fit_start")
            raise OSError("disk full")

    engine = make_engine(destinations=[BrokenDestination()])
    with pytest.warns(
        RuntimeWarning, match=r"BrokenDestination\.fit_start failed .*disk full.*training continues"
    ):
        engine.run_event(Event.FIT_START)
    engine.run_event(Event.FIT_START)  # still called, no second warning
    assert calls == ["fit_start", "fit_start"]


def test_a_failing_callback_that_is_also_a_destination_still_raises():
    class Both(Callback, LoggerDestination):
        def fit_start(self, state, logger):
            raise OSError("disk full")

    both = Both()
    engine = make_engine(callbacks=[both], destinations=[both])
    with pytest.raises(CallbackError, match=r"Both failed at event FIT_START"):
        engine.run_event(Event.FIT_START)


def test_out_of_memory_from_an_algorithm_keeps_its_type_with_a_note():
    oom = torch.OutOfMemoryError("CUDA out of memory")
    engine = make_engine([Exploder(oom)])
    with pytest.raises(torch.OutOfMemoryError) as info:
        engine.run_event(Event.BATCH_START)
    assert info.value is oom
    assert not isinstance(info.value, AlgorithmError)
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "Exploder" in notes and "BATCH_START" in notes


def test_out_of_memory_from_a_callback_keeps_its_type():
    class Hungry(Callback):
        def batch_end(self, state, logger):
            raise torch.OutOfMemoryError("out of memory")

    engine = make_engine(callbacks=[Hungry()])
    with pytest.raises(torch.OutOfMemoryError) as info:
        engine.run_event(Event.BATCH_END)
    assert "Hungry" in "\n".join(info.value.__notes__)


def test_close_closes_each_callback_and_destination_once():
    log = []
    callback = Listener("cb", log)
    both = DestinationListener("both", log)
    plain = PlainDestination(log)
    engine = make_engine(callbacks=[callback, callback, both], destinations=[both, plain])
    engine.close()
    assert (callback.closed, both.closed, plain.closed) == (1, 1, 1)


def test_duck_typed_callback_without_base_class_is_called():
    calls = []

    class Duck:
        def batch_end(self, state, logger):
            calls.append(state.timestamp.batch)

    engine = make_engine(callbacks=[Duck()])
    engine.run_event(Event.BATCH_END)
    engine.run_event(Event.BATCH_START)
    assert calls == [0]


def test_passes_declared_by_algorithms_are_registered_once():
    log = []

    def last_first(algorithms, event):
        return sorted(algorithms, key=lambda a: a.name != "B")

    class First(StepA):
        ordering_passes = (last_first,)

    engine = make_engine(algorithms=[First("A", log), First("B", log)])
    engine.run_event(Event.BATCH_START)
    engine.run_event(Event.BATCH_START)
    assert log == ["B", "A", "B", "A"]
    assert engine.passes == [last_first]


def test_required_events_that_never_fired_are_reported():
    class NeedsInit(Algorithm):
        required_events = (Event.INIT,)

        def match(self, event, state):
            return False

        def apply(self, event, state, logger):
            pass

    class NeedsCheckpointEvents(Callback):
        required_events = ((Event.BATCH_CHECKPOINT, Event.EPOCH_CHECKPOINT), Event.FIT_END)

    engine = make_engine(algorithms=[NeedsInit()], callbacks=[NeedsCheckpointEvents()])
    with pytest.warns(
        RuntimeWarning, match=r"NeedsInit needs Event\.INIT, which this loop never fired"
    ):
        engine.run_event(Event.BATCH_START)  # the first batch: set-up events are checked
    engine.run_event(Event.EPOCH_CHECKPOINT)
    with pytest.warns(RuntimeWarning, match="which this loop never fired") as record:
        engine.close()  # checks every required event again, the set-up ones too
    # INIT is still missing; one of the checkpoint events fired, FIT_END did not.
    assert sorted(str(w.message).split(", which")[0] for w in record) == [
        "NeedsCheckpointEvents needs Event.FIT_END",
        "NeedsInit needs Event.INIT",
    ]


def test_the_trainer_fires_everything_its_components_need(recwarn):
    from toy import blobs, loader, mlp
    from trainkit.trainer import Trainer

    class NeedsAll(Callback):
        required_events = (
            Event.INIT,
            Event.BEFORE_LOAD,
            Event.FIT_START,
            Event.BATCH_CHECKPOINT,
            Event.FIT_END,
        )

    trainer = Trainer(
        model=mlp(),
        train_dataloader=loader(blobs(32)),
        max_duration="2ba",
        callbacks=[NeedsAll()],
        progress_bar=False,
        device="cpu",
    )
    trainer.fit()
    trainer.close()
    assert not [w for w in recwarn if "never fired" in str(w.message)]


def test_closing_a_trainer_whose_fit_raised_does_not_blame_the_loop(recwarn):
    # fit fires FIT_ABORTED instead of FIT_END when it raises; closing afterwards (as
    # ``with Trainer(...)`` does) must not warn that the loop never fired FIT_END.
    from toy import blobs, loader, mlp
    from trainkit.trainer import Trainer

    class NeedsFitEnd(Callback):
        required_events = (Event.FIT_END,)

    class Crash(Callback):
        def batch_end(self, state, logger):
            raise RuntimeError("crash at batch 1")

    trainer = Trainer(
        model=mlp(),
        train_dataloader=loader(blobs(32)),
        max_duration="2ba",
        callbacks=[NeedsFitEnd(), Crash()],
        progress_bar=False,
        device="cpu",
    )
    with pytest.raises(CallbackError, match="crash at batch 1"), trainer:
        trainer.fit()
    assert Event.FIT_ABORTED in trainer.engine.fired and Event.FIT_END not in trainer.engine.fired
    assert not [w for w in recwarn if "never fired" in str(w.message)]


def test_a_destination_failing_at_init_stops_the_run():
    class BadFolder(Callback, LoggerDestination):
        def init(self, state, logger):
            raise ValueError("cannot write to /nope")

    engine = make_engine(destinations=[BadFolder()])
    with pytest.raises(CallbackError, match=r"BadFolder failed at event INIT.*cannot write"):
        engine.run_event(Event.INIT)


# --- registration checks ---------------------------------------------------------------


def test_a_misspelled_event_method_is_refused_naming_the_callback_and_the_event():
    class Typo(Callback):
        def batch_ends(self, state, logger):
            pass

    with pytest.raises(TypeError, match=r"callback Typo defines batch_ends\(\).*batch_end\(\)\?"):
        make_engine(callbacks=[Typo()])


def test_a_lightning_style_event_name_is_refused_on_a_duck_typed_callback():
    class Lightningish:
        def on_batch_end(self, state, logger):
            pass

        def fit_end(self, state, logger):
            pass

    with pytest.raises(TypeError, match=r"on_batch_end\(\).*did you mean batch_end\(\)\?"):
        make_engine(callbacks=[Lightningish()])


def test_a_callback_added_after_construction_is_checked_when_it_is_first_seen():
    class Typo(Callback):
        def fit_ends(self, state, logger):
            pass

    engine = make_engine()
    engine.state.callbacks.append(Typo())
    with pytest.raises(TypeError, match=r"callback Typo defines fit_ends\(\)"):
        engine.run_event(Event.FIT_START)


def test_a_duck_typed_callback_with_no_event_method_is_refused():
    class Nothing:
        def report(self):
            pass

    with pytest.raises(TypeError, match=r"callback Nothing defines no method named after an event"):
        make_engine(callbacks=[Nothing()])


def test_helper_methods_far_from_event_names_are_accepted():
    class Helpful(Callback):
        def summarise(self, state, logger):
            pass

        def batch_end(self, state, logger):
            self.summarise(state, logger)

    make_engine(callbacks=[Helpful()]).run_event(Event.BATCH_END)


def test_an_algorithm_without_apply_cannot_be_built():
    class NoApply(Algorithm):
        def match(self, event, state):
            return True

    with pytest.raises(TypeError, match=r"NoApply.*abstract method.*apply"):
        NoApply()


def test_a_duck_typed_algorithm_is_refused_naming_what_to_do():
    class Duck:
        def match(self, event, state):
            return True

    with pytest.raises(TypeError, match=r"Duck is not an Algorithm \(it has no apply\)"):
        make_engine(algorithms=[Duck()])


def test_an_unknown_order_is_refused_naming_the_accepted_orders():
    class Early(StepA):
        order = "early"

    with pytest.raises(
        ValueError, match=r"algorithm Early: order 'early' is not known; use one of 'first'"
    ):
        make_engine(algorithms=[Early("A", [])])


def test_algorithms_run_by_order_then_list_order_and_after_events_reverse():
    log = []

    class Last(StepA):
        order = "last"

    class First(StepB):
        order = "first"

    engine = make_engine(
        algorithms=[Last("last", log), StepA("a", log), First("first", log), StepC("c", log)]
    )
    engine.run_event(Event.BATCH_START)
    assert log == ["first", "a", "c", "last"]
    log.clear()
    engine.run_event(Event.AFTER_FORWARD)
    assert log == ["last", "c", "a", "first"]


def test_an_unknown_required_event_is_refused():
    class Needs(Callback):
        required_events = ("batch_ends",)

    with pytest.raises(ValueError, match=r"callback Needs: required_events names 'batch_ends'"):
        make_engine(callbacks=[Needs()])


def test_a_bad_component_added_later_is_refused_at_every_event_until_removed():
    engine = make_engine()
    engine.run_event(Event.FIT_START)
    bad = Asked(frozenset({"batch_ends"}))
    engine.state.algorithms.append(bad)
    for _ in range(2):  # not once, then silently kept
        with pytest.raises(ValueError, match="'batch_ends', which is not an event"):
            engine.run_event(Event.BATCH_START)
    engine.state.algorithms.remove(bad)
    engine.state.callbacks.append(Recorder())
    engine.run_event(Event.BATCH_START)
    assert engine.state.callbacks[0].heard == [Event.BATCH_START]


def test_a_logger_destination_must_subclass_the_base_class():
    class Duck:
        def log_metrics(self, metrics, step):
            pass

    with pytest.raises(TypeError, match=r"Duck is not a LoggerDestination: subclass"):
        make_engine(destinations=[Duck()])


class Recorder(Callback):
    """Records every event it hears; with ``adds``, registers that callback at ``when``."""

    def __init__(self, adds=None, when=None):
        self.heard, self.adds, self.when = [], adds, when

    def run_event(self, event, state, logger):
        self.heard.append(event)
        if event == self.when and self.adds not in state.callbacks:
            state.callbacks.append(self.adds)


BATCH = (
    Event.BEFORE_DATALOADER,
    Event.AFTER_DATALOADER,
    Event.BATCH_START,
    Event.BEFORE_TRAIN_BATCH,
    Event.BEFORE_FORWARD,
    Event.AFTER_FORWARD,
    Event.BEFORE_LOSS,
    Event.AFTER_LOSS,
    Event.BEFORE_BACKWARD,
    Event.AFTER_BACKWARD,
    Event.AFTER_TRAIN_BATCH,
    Event.BATCH_END,
    Event.BATCH_CHECKPOINT,
)


def run_batch(engine):
    for event in BATCH:
        engine.run_event(event)


def test_batch_events_nobody_hears_are_recorded_as_fired():
    engine = make_engine()
    run_batch(engine)
    run_batch(engine)
    assert engine.fired == set(BATCH)


def test_a_callback_added_between_batches_hears_the_next_batch_from_batch_start():
    engine = make_engine()
    run_batch(engine)  # nothing listens: the batch's events are skipped from now on
    late = Recorder()
    engine.state.callbacks.append(late)
    run_batch(engine)
    assert late.heard == list(BATCH[2:])  # from BATCH_START: it re-reads what is registered


EVAL_BATCH = (
    Event.EVAL_BATCH_START,
    Event.EVAL_BEFORE_FORWARD,
    Event.EVAL_AFTER_FORWARD,
    Event.EVAL_BATCH_END,
)
PREDICT_BATCH = (
    Event.PREDICT_BATCH_START,
    Event.PREDICT_BEFORE_FORWARD,
    Event.PREDICT_AFTER_FORWARD,
    Event.PREDICT_BATCH_END,
)


@pytest.mark.parametrize("events", [EVAL_BATCH, PREDICT_BATCH], ids=["eval", "predict"])
def test_eval_and_predict_batch_events_nobody_hears_are_skipped_until_the_next_batch_start(
    events,
):
    engine = make_engine()
    for event in events:
        engine.run_event(event)
    assert engine._quiet == set(events[1:])  # the batch's start re-reads what is registered
    late = Recorder()
    engine.state.callbacks.append(late)
    for _ in range(2):
        for event in events:
            engine.run_event(event)
    assert late.heard == list(events) * 2
    assert engine.fired == set(events)


def test_a_callback_added_by_another_hears_the_very_next_event():
    late = Recorder()
    adder = Recorder(adds=late, when=Event.AFTER_FORWARD)
    engine = make_engine(callbacks=[adder])
    run_batch(engine)
    assert late.heard == list(BATCH[6:])
    late.heard.clear()
    run_batch(engine)
    assert late.heard == list(BATCH)


def test_an_algorithm_hears_every_batch_event_even_after_quiet_batches():
    engine = make_engine()
    run_batch(engine)
    log = []
    engine.state.algorithms.append(StepA("A", log, events=BATCH))
    run_batch(engine)
    assert len(log) == len(BATCH) - 2  # from BATCH_START, like a callback


class Asked(Algorithm):
    """Records every event its match() is asked at; says yes at ``yes``."""

    def __init__(self, match_events=None, yes=()):
        self.match_events, self.yes, self.asked, self.applied = match_events, set(yes), [], []

    def match(self, event, state):
        self.asked.append(event)
        return event in self.yes

    def apply(self, event, state, logger):
        self.applied.append(event)


def test_an_algorithm_is_asked_only_at_its_match_events():
    declared = Asked(frozenset({Event.AFTER_TRAIN_BATCH, Event.FIT_END}), yes=BATCH)
    everywhere = Asked()
    engine = make_engine([declared, everywhere])
    run_batch(engine)
    run_batch(engine)
    engine.run_event(Event.FIT_END)
    assert declared.asked == [Event.AFTER_TRAIN_BATCH] * 2 + [Event.FIT_END]
    assert declared.applied == [Event.AFTER_TRAIN_BATCH] * 2
    assert everywhere.asked == [*BATCH, *BATCH, Event.FIT_END]  # None: every event


def test_batch_events_outside_every_algorithms_match_events_are_skipped():
    clipping = Asked(frozenset({Event.AFTER_TRAIN_BATCH}), yes={Event.AFTER_TRAIN_BATCH})
    engine = make_engine([clipping])
    run_batch(engine)
    assert engine._quiet == set(BATCH) - {
        Event.BATCH_START,
        Event.BEFORE_TRAIN_BATCH,
        Event.AFTER_TRAIN_BATCH,
    }
    run_batch(engine)
    assert clipping.applied == [Event.AFTER_TRAIN_BATCH] * 2
    late = Asked(frozenset({Event.AFTER_FORWARD}), yes={Event.AFTER_FORWARD})
    engine.state.algorithms.append(late)  # by other code: heard from the next BATCH_START
    run_batch(engine)
    assert late.applied == [Event.AFTER_FORWARD]
    assert Event.AFTER_FORWARD not in engine._quiet


def test_ordering_passes_run_only_where_an_algorithm_matched():
    calls = []

    def record(algorithms, event):
        calls.append((event, [type(a).__name__ for a in algorithms]))
        return algorithms

    engine = make_engine([Asked(yes={Event.AFTER_LOSS})])
    engine.register_pass(record)
    run_batch(engine)
    assert calls == [(Event.AFTER_LOSS, ["Asked"])]


@pytest.mark.parametrize(
    ("match_events", "error", "message"),
    [
        ("batch_end", TypeError, "must be a set of events"),
        (Event.BATCH_END, TypeError, "must be a set of events"),
        (5, TypeError, "must be a set of events"),
        ({"batch_ends"}, ValueError, "'batch_ends', which is not an event"),
    ],
)
def test_match_events_that_are_not_events_are_refused(match_events, error, message):
    with pytest.raises(error, match=message):
        make_engine([Asked(match_events)])


def test_match_events_may_name_events_by_their_value():
    named = Asked(frozenset({"after_loss"}), yes={Event.AFTER_LOSS})
    engine = make_engine([named])
    run_batch(engine)
    assert named.asked == [Event.AFTER_LOSS] and named.applied == [Event.AFTER_LOSS]


def test_a_removed_callback_hears_nothing_more_and_skipping_starts_again():
    gone = Recorder()
    engine = make_engine(callbacks=[gone])
    run_batch(engine)
    engine.state.callbacks.remove(gone)
    run_batch(engine)
    assert gone.heard == list(BATCH)  # the next event it listened to re-read the list
    assert engine._quiet == set(BATCH) - {Event.BATCH_START, Event.BEFORE_TRAIN_BATCH}


def test_event_names_as_strings_are_still_checked_and_skipped():
    engine = make_engine()
    engine.run_event("after_forward")
    assert engine.run_event("after_forward") == []
    with pytest.raises(ValueError, match="after_froward"):
        engine.run_event("after_froward")


def test_a_callback_swapped_in_while_nothing_was_registered_is_the_one_that_hears():
    first, second = Recorder(), Recorder()
    engine = make_engine(callbacks=[first])
    run_batch(engine)
    engine.state.callbacks.remove(first)
    run_batch(engine)  # nothing registered: same list, same length as before once refilled
    engine.state.callbacks.append(second)
    run_batch(engine)
    assert first.heard == list(BATCH)
    assert second.heard == list(BATCH[2:])
