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
    with pytest.raises(AttributeError):
        ts.batch = 3  # type: ignore[misc]
    assert not hasattr(ts, "__dict__")


def test_to_next_batch_advances_every_count_and_returns_a_new_object():
    ts = Timestamp()
    nxt = ts.to_next_batch(samples=8, tokens=100, duration=0.5)
    assert ts == Timestamp()
    assert nxt is not ts and type(nxt) is Timestamp
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


# --- arithmetic and comparison (Composer's `Time` semantics) -------------------------------


@pytest.mark.parametrize(
    ("left", "right", "total"),
    [("1ep", "2ep", 3), ("500ba", "250ba", 750), ("2048sp", "1sp", 2049), ("2iter", "1iter", 3)],
)
def test_add_same_unit(left, right, total):
    a, b = Time.from_timestring(left), Time.from_timestring(right)
    assert a + b == Time(total, a.unit)
    assert a + right == Time(total, a.unit)  # a string is parsed
    assert type((a + b).value) is int


def test_add_and_subtract_fractions_and_seconds():
    assert Time(0.25, TimeUnit.DURATION) + "0.5dur" == Time(0.75, TimeUnit.DURATION)
    assert Time.from_timestring("1h") - "30m" == Time(1800.0, TimeUnit.SECOND)


def test_subtract_and_reverse_operations():
    assert Time(5, TimeUnit.BATCH) - Time(2, TimeUnit.BATCH) == Time(3, TimeUnit.BATCH)
    assert Time(5, TimeUnit.BATCH) - 5 == Time(0, TimeUnit.BATCH)
    assert 7 - Time(5, TimeUnit.BATCH) == Time(2, TimeUnit.BATCH)
    assert "7ba" - Time(5, TimeUnit.BATCH) == Time(2, TimeUnit.BATCH)
    assert 2 + Time(5, TimeUnit.BATCH) == Time(7, TimeUnit.BATCH)
    times = [Time(n, TimeUnit.SAMPLE) for n in (3, 4, 5)]
    assert sum(times) == Time(3 + 4 + 5, TimeUnit.SAMPLE)
    assert Time(7, TimeUnit.BATCH) % "3ba" == Time(7 % 3, TimeUnit.BATCH)


def test_a_bare_number_takes_the_unit_of_the_time():
    # As in Composer: the Time on the other side gives the unit (ensure_time alone says epochs).
    assert Time(5, TimeUnit.BATCH) + 1 == Time(6, TimeUnit.BATCH)
    assert Time(5, TimeUnit.BATCH) < 10
    assert Time(5, TimeUnit.BATCH) == 5
    assert Time(5, TimeUnit.BATCH) < 5.5  # compared as a number, fractional or not


def test_negative_results_are_refused():
    with pytest.raises(ValueError, match=r"1ep - 3ep is negative \(-2ep\)"):
        Time(1, TimeUnit.EPOCH) - Time(3, TimeUnit.EPOCH)
    with pytest.raises(ValueError, match="negative"):
        Time(2, TimeUnit.BATCH) * -1


@pytest.mark.parametrize(
    ("time", "factor"),
    [
        (Time(10, TimeUnit.EPOCH), 2),
        (Time(5, TimeUnit.BATCH), 0.5),
        (Time(7, TimeUnit.SAMPLE), 1.5),
    ],
)
def test_scaling_counts_truncates_like_composer(time, factor):
    expected = Time(int(time.value * factor), time.unit)
    assert time * factor == expected
    assert factor * time == expected
    assert type((time * factor).value) is int
    assert time / factor == Time(int(time.value / factor), time.unit)


def test_scaling_fractions_and_seconds_keeps_floats():
    assert Time(0.5, TimeUnit.DURATION) * 0.5 == Time(0.25, TimeUnit.DURATION)
    assert Time(90.0, TimeUnit.SECOND) / 4 == Time(22.5, TimeUnit.SECOND)


def test_multiplying_by_a_fraction_of_the_run():
    dur = Time(0.3, TimeUnit.DURATION)
    assert Time(10, TimeUnit.EPOCH) * dur == Time(int(10 * 0.3), TimeUnit.EPOCH)
    assert dur * Time(1000, TimeUnit.BATCH) == Time(int(0.3 * 1000), TimeUnit.BATCH)
    assert Time(10, TimeUnit.EPOCH) * "0.5dur" == Time(5, TimeUnit.EPOCH)
    with pytest.raises(TypeError, match="one side must be a number or a fraction in 'dur'"):
        Time(2, TimeUnit.EPOCH) * Time(3, TimeUnit.EPOCH)


def test_dividing_two_times_gives_their_ratio_in_dur():
    ratio = Time(2, TimeUnit.EPOCH) / Time(8, TimeUnit.EPOCH)
    assert ratio == Time(2 / 8, TimeUnit.DURATION)
    assert float(ratio) == 2 / 8 and type(float(ratio)) is float
    assert Time(300, TimeUnit.BATCH) / "1200ba" == 300 / 1200
    assert int(Time(7, TimeUnit.BATCH)) == 7


def test_division_by_zero_raises():
    with pytest.raises(ZeroDivisionError):
        Time(1, TimeUnit.EPOCH) / 0
    with pytest.raises(ZeroDivisionError):
        Time(1, TimeUnit.EPOCH) / Time(0, TimeUnit.EPOCH)


def test_arithmetic_returns_new_immutable_times():
    a = Time(1, TimeUnit.EPOCH)
    b = a + a
    assert a == Time(1, TimeUnit.EPOCH) and b is not a
    with pytest.raises(dataclasses.FrozenInstanceError):
        b.value = 0  # type: ignore[misc]


@pytest.mark.parametrize(
    ("small", "large"), [("1ep", "2ep"), ("99ba", "100ba"), ("0.1dur", "0.2dur")]
)
def test_ordering_same_unit(small, large):
    a, b = Time.from_timestring(small), Time.from_timestring(large)
    assert a < b and a <= b and b > a and b >= a and a != b
    assert a <= Time.from_timestring(small) and a >= Time.from_timestring(small)
    assert a < large and b > small  # strings are parsed
    assert sorted([b, a]) == [a, b]
    assert max(a, b) is b


def test_equality_and_hash_are_consistent():
    assert Time(4.0, TimeUnit.BATCH) == Time(4, TimeUnit.BATCH)
    assert hash(Time(4.0, TimeUnit.BATCH)) == hash(Time(4, TimeUnit.BATCH))
    assert hash(Time(4, TimeUnit.BATCH)) == hash(4)  # Time("4ba") == 4, so hashes agree
    assert len({Time(1, TimeUnit.EPOCH), Time.from_timestring("1ep"), Time(1, TimeUnit.BATCH)}) == 2
    assert {Time(3, TimeUnit.EPOCH): "x"}[Time.from_timestring("3ep")] == "x"
    assert Time(3, TimeUnit.EPOCH) == "3ep" and Time(3, TimeUnit.EPOCH) != "4ep"
    assert Time(3, TimeUnit.EPOCH) != "not a time"
    assert Time(3, TimeUnit.EPOCH) != None  # noqa: E711
    assert Time(3, TimeUnit.EPOCH) != [3]


def test_equality_between_different_units_is_false_not_an_error():
    # 1 epoch may or may not be 4 batches: only a run knows, so they are not equal.
    assert Time(1, TimeUnit.EPOCH) != Time(4, TimeUnit.BATCH)
    assert (Time(1, TimeUnit.EPOCH) == "1ba") is False
    assert Time(1, TimeUnit.EPOCH) in [Time(4, TimeUnit.BATCH), Time(1, TimeUnit.EPOCH)]


@pytest.mark.parametrize(
    "operation",
    [
        lambda a, b: a < b,
        lambda a, b: a >= b,
        lambda a, b: a + b,
        lambda a, b: a - b,
        lambda a, b: a / b,
        lambda a, b: a % b,
    ],
)
def test_different_units_raise_naming_both_and_the_fix(operation):
    with pytest.raises(TypeError) as info:
        operation(Time(1, TimeUnit.EPOCH), Time(4, TimeUnit.BATCH))
    message = str(info.value)
    assert "1ep and 4ba" in message
    assert "(epochs and batches)" in message
    assert "convert one first" in message and "run's progress" in message


def test_different_units_from_a_string_raise_too():
    with pytest.raises(TypeError, match=r"cannot add 1ep and 100sp.*epochs and samples"):
        Time(1, TimeUnit.EPOCH) + "100sp"
    with pytest.raises(TypeError, match=r"seconds and fraction of max_duration"):
        _ = Time(60.0, TimeUnit.SECOND) < "0.5dur"


def test_unsupported_operands_raise_type_error():
    with pytest.raises(TypeError):
        _ = Time(1, TimeUnit.EPOCH) < None  # type: ignore[operator]
    with pytest.raises(TypeError):
        _ = Time(1, TimeUnit.EPOCH) + {1}  # type: ignore[operator]
    with pytest.raises(TypeError):
        Time(1, TimeUnit.EPOCH) + True  # type: ignore[operator]


def test_bad_strings_in_arithmetic_name_the_accepted_forms():
    with pytest.raises(ValueError, match="'10ep'"):
        Time(1, TimeUnit.EPOCH) + "1 epoch"
    with pytest.raises(ValueError, match="not a whole number of batches"):
        Time(1, TimeUnit.BATCH) + 0.5


def test_composer_constructors_and_to_timestring():
    assert Time.from_epoch(3) == Time(3, TimeUnit.EPOCH)
    assert Time.from_batch(3) == Time(3, TimeUnit.BATCH)
    assert Time.from_sample(3) == Time(3, TimeUnit.SAMPLE)
    assert Time.from_token(3) == Time(3, TimeUnit.TOKEN)
    assert Time.from_duration(0.5) == Time(0.5, TimeUnit.DURATION)
    assert Time.from_iteration(2) == Time(2, TimeUnit.ITERATION)
    assert Time.from_timestring(Time(42, TimeUnit.TOKEN).to_timestring()) == Time(
        42, TimeUnit.TOKEN
    )


# --- iterations ---------------------------------------------------------------------------------


def test_iter_unit_parses_and_round_trips():
    time = Time.from_timestring("3iter")
    assert time.unit is TimeUnit.ITERATION and time.value == 3 and type(time.value) is int
    assert str(time) == "3iter"
    assert Time.from_timestring(str(time)) == time
    assert ensure_time("2iter") == Time(2, TimeUnit.ITERATION)
    with pytest.raises(ValueError, match="not a whole number of iterations"):
        Time.from_timestring("1.5iter")


def test_timestamp_refuses_iterations_naming_the_counted_units():
    with pytest.raises(ValueError, match="does not count iterations") as info:
        Timestamp().get(TimeUnit.ITERATION)
    for unit in ("'ep'", "'ba'", "'sp'", "'tok'"):
        assert unit in str(info.value)
    with pytest.raises(ValueError, match="does not count iterations"):
        Timestamp().get("iter")


def test_timestamp_state_dict_is_unchanged():
    assert set(Timestamp().state_dict()) == {
        "epoch",
        "batch",
        "sample",
        "token",
        "batch_in_epoch",
        "sample_in_epoch",
        "token_in_epoch",
        "total_wct",
        "epoch_wct",
        "batch_wct",
    }
