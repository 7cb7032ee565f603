"""Durations (`Time`), `ensure_time` and the run position (`Timestamp`)."""

import dataclasses

import pytest
import torch

from trainkit.core import Time, Timestamp, TimeUnit, ensure_time

ACCEPTED_FORMS = ("'10ep'", "'500ba'", "'2048sp'", "'1e6tok'", "'0.25dur'", "'1h30m'")


@pytest.mark.parametrize(
    ("text", "value", "unit"),
    [
        ("10ep", 10, TimeUnit.EPOCH),
        ("500ba", 500, TimeUnit.BATCH),
        ("2048sp", 2048, TimeUnit.SAMPLE),
        ("1e6tok", 1_000_000, TimeUnit.TOKEN),
        ("0.25dur", 0.25, TimeUnit.DURATION),
        ("1e-3dur", 0.001, TimeUnit.DURATION),
        ("1h30m", 5400.0, TimeUnit.SECOND),
        ("45m", 2700.0, TimeUnit.SECOND),
        ("90s", 90.0, TimeUnit.SECOND),
        ("1h", 3600.0, TimeUnit.SECOND),
        ("1h 2m 3s", 3723.0, TimeUnit.SECOND),
        ("30sec", 30.0, TimeUnit.SECOND),
        (" 3ep ", 3, TimeUnit.EPOCH),
    ],
)
def test_from_timestring_parses_each_form(text, value, unit):
    time = Time.from_timestring(text)
    assert time == Time(value, unit)
    assert time.value == value
    assert time.unit is unit


def test_counts_are_ints_and_fractions_are_floats():
    assert type(Time.from_timestring("1e6tok").value) is int
    assert type(Time.from_timestring("500ba").value) is int
    assert type(Time.from_timestring("1dur").value) is float
    assert type(Time.from_timestring("90s").value) is float


def test_large_counts_are_exact():
    assert Time.from_timestring("12345678901234567891sp").value == 12345678901234567891


@pytest.mark.parametrize(
    "text", ["10 epochs", "-3ba", "1.5ba", "", "ep", "   ", "10", "m", "1m30", "3 weeks", "1.5.2ep"]
)
def test_bad_strings_raise_value_error_naming_the_accepted_forms(text):
    with pytest.raises(ValueError) as info:
        Time.from_timestring(text)
    message = str(info.value)
    for form in ACCEPTED_FORMS:
        assert form in message
    if text != "1.5ba":
        assert repr(text) in message


def test_fractional_count_message_names_the_unit():
    with pytest.raises(ValueError, match=r"1\.5ba is not a whole number of batches"):
        Time.from_timestring("1.5ba")


def test_from_timestring_rejects_non_strings():
    with pytest.raises(TypeError, match="must be a str"):
        Time.from_timestring(10)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [-1, float("nan"), float("inf"), True, "10"])
def test_time_rejects_bad_values(value):
    with pytest.raises(ValueError):
        Time(value, TimeUnit.EPOCH)


def test_time_accepts_unit_string_and_whole_floats():
    time = Time(4.0, "ba")  # type: ignore[arg-type]
    assert time.unit is TimeUnit.BATCH
    assert time.value == 4 and type(time.value) is int


def test_time_rejects_unknown_unit():
    with pytest.raises(ValueError):
        Time(1, "weeks")  # type: ignore[arg-type]


@pytest.mark.parametrize("text", ["10ep", "500ba", "2048sp", "0.25dur", "1h30m"])
def test_str_round_trips(text):
    time = Time.from_timestring(text)
    assert Time.from_timestring(str(time)) == time


def test_time_is_immutable():
    time = Time(3, TimeUnit.EPOCH)
    with pytest.raises(dataclasses.FrozenInstanceError):
        time.value = 4  # type: ignore[misc]


def test_ensure_time_int_means_epochs():
    assert ensure_time(3) == Time(3, TimeUnit.EPOCH)
    assert ensure_time(0) == Time(0, TimeUnit.EPOCH)


def test_ensure_time_passes_time_through_and_parses_strings():
    time = Time(5, TimeUnit.BATCH)
    assert ensure_time(time) is time
    assert ensure_time("0.5dur") == Time(0.5, TimeUnit.DURATION)


def test_ensure_time_errors_name_what_and_value():
    with pytest.raises(ValueError, match=r"max_duration '10 epochs' is not a duration.*'10ep'"):
        ensure_time("10 epochs", "max_duration")
    with pytest.raises(ValueError, match="interval -2 is negative"):
        ensure_time(-2, "interval")
    with pytest.raises(TypeError, match="must be a Time, a string or an int, got float"):
        ensure_time(1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="got bool"):
        ensure_time(True)


def test_timestamp_is_immutable():
    ts = Timestamp()
    with pytest.raises(dataclasses.FrozenInstanceError):
        ts.batch = 3  # type: ignore[misc]
    assert not hasattr(ts, "__dict__")


def test_to_next_batch_advances_every_count_and_returns_a_new_object():
    ts = Timestamp()
    nxt = ts.to_next_batch(samples=8, tokens=100, duration=0.5)
    assert ts == Timestamp()
    assert nxt is not ts
    assert (nxt.batch, nxt.sample, nxt.token) == (1, 8, 100)
    assert (nxt.batch_in_epoch, nxt.sample_in_epoch, nxt.token_in_epoch) == (1, 8, 100)
    assert (nxt.total_wct, nxt.epoch_wct, nxt.batch_wct) == (0.5, 0.5, 0.5)
    again = nxt.to_next_batch(samples=4, duration=0.25)
    assert (again.batch, again.sample, again.token) == (2, 12, 100)
    assert (again.total_wct, again.epoch_wct, again.batch_wct) == (0.75, 0.75, 0.25)
    assert again.epoch == 0


def test_to_next_epoch_resets_in_epoch_counts_only():
    ts = Timestamp().to_next_batch(8, 10, 1.0).to_next_batch(8, 10, 1.0)
    nxt = ts.to_next_epoch()
    assert nxt.epoch == 1
    assert (nxt.batch, nxt.sample, nxt.token, nxt.total_wct) == (2, 16, 20, 2.0)
    assert (nxt.batch_in_epoch, nxt.sample_in_epoch, nxt.token_in_epoch) == (0, 0, 0)
    assert nxt.epoch_wct == 0.0
    assert ts.epoch == 0 and ts.batch_in_epoch == 2
    after = nxt.to_next_batch(8)
    assert (after.batch, after.batch_in_epoch, after.sample_in_epoch) == (3, 1, 8)


def test_get_returns_the_count_in_each_unit():
    ts = Timestamp(epoch=2, batch=30, sample=480, token=9000, total_wct=12.5)
    assert ts.get(TimeUnit.EPOCH) == 2
    assert ts.get("ba") == 30
    assert ts.get(TimeUnit.SAMPLE) == 480
    assert ts.get("tok") == 9000
    assert ts.get(TimeUnit.SECOND) == 12.5


def test_get_dur_is_an_error_pointing_to_elapsed_fraction():
    with pytest.raises(ValueError, match="elapsed_fraction"):
        Timestamp().get(TimeUnit.DURATION)
    with pytest.raises(ValueError):
        Timestamp().get("weeks")


def test_state_dict_round_trip():
    ts = Timestamp().to_next_batch(8, 64, 0.1).to_next_epoch().to_next_batch(4, 32, 0.2)
    state = ts.state_dict()
    assert state["batch"] == 2 and state["epoch"] == 1
    assert Timestamp.from_state_dict(state) == ts


def test_from_state_dict_accepts_tensors_and_rejects_unknown_fields():
    ts = Timestamp.from_state_dict({"epoch": torch.tensor(3), "batch": torch.tensor(7)})
    assert ts.epoch == 3 and ts.batch == 7
    assert type(ts.epoch) is int
    with pytest.raises(ValueError, match=r"unknown Timestamp fields \['step'\]"):
        Timestamp.from_state_dict({"step": 1})
