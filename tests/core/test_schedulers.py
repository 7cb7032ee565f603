"""Schedules that speak `Time`: values at known points, unit conversion, configs, entry
points, and the Trainer."""

import dataclasses
from dataclasses import dataclass

import pytest
import torch
from torch import nn

from toy import blobs, loader, mlp
from trainkit.core import (
    Callback,
    ConstantScheduler,
    CosineAnnealingScheduler,
    CosineAnnealingWithWarmupScheduler,
    DataSpec,
    ExponentialScheduler,
    LinearScheduler,
    LinearWithWarmupScheduler,
    MultiStepScheduler,
    PolynomialScheduler,
    Scheduler,
    State,
    StepScheduler,
    Time,
    Timestamp,
    Trainer,
    ensure_time,
    plugins,
    schedulers,
)
from trainkit.core.config import Configurable, field_docs, to_plain
from trainkit.core.schedulers import as_fraction


@dataclass
class FakeState:
    """What a schedule reads from `State`."""

    max_duration: Time | None
    fraction: float = 0.0
    dataloader_len: int | None = None

    def elapsed_fraction(self) -> float:
        return self.fraction


def at(fraction: float, max_duration: str = "1ep", dataloader_len: int | None = None) -> FakeState:
    return FakeState(ensure_time(max_duration), fraction, dataloader_len)


def test_constant_scheduler_is_alpha_until_t_max_then_one():
    schedule = ConstantScheduler(alpha=0.5, t_max="0.5dur")
    assert schedule(at(0.0)) == 0.5
    assert schedule(at(0.49)) == 0.5
    assert schedule(at(0.5)) == 1.0
    assert schedule(at(0.9)) == 1.0


def test_constant_scheduler_default_is_one():
    assert ConstantScheduler()(at(0.3)) == 1.0


def test_linear_scheduler_interpolates_then_holds():
    schedule = LinearScheduler(alpha_i=1.0, alpha_f=0.2, t_max="0.5dur")
    assert schedule(at(0.0)) == pytest.approx(1.0)
    assert schedule(at(0.25)) == pytest.approx(0.6)
    assert schedule(at(0.5)) == pytest.approx(0.2)
    assert schedule(at(0.9)) == pytest.approx(0.2)
    assert LinearScheduler()(at(0.75)) == pytest.approx(0.25)


def test_linear_scheduler_can_increase():
    assert LinearScheduler(alpha_i=0.0, alpha_f=2.0)(at(0.25)) == pytest.approx(0.5)


def test_exponential_scheduler_decays_per_period():
    schedule = ExponentialScheduler(gamma=0.5, decay_period="1ep")
    assert schedule(at(0.0, "4ep")) == pytest.approx(1.0)
    assert schedule(at(0.25, "4ep")) == pytest.approx(0.5)
    assert schedule(at(0.5, "4ep")) == pytest.approx(0.25)
    assert schedule(at(0.125, "4ep")) == pytest.approx(0.5**0.5)


def test_step_scheduler_steps_at_each_boundary():
    schedule = StepScheduler(step_size="1ep", gamma=0.1)
    assert schedule(at(0.0, "4ep")) == pytest.approx(1.0)
    assert schedule(at(0.2, "4ep")) == pytest.approx(1.0)
    assert schedule(at(0.25, "4ep")) == pytest.approx(0.1)
    assert schedule(at(0.5, "4ep")) == pytest.approx(0.01)
    # 3 batches of 10 with step_size 1/10 of the run: float error must not miss a step
    assert StepScheduler(step_size="0.1dur", gamma=0.5)(at(0.3)) == pytest.approx(0.125)


def test_multistep_scheduler_multiplies_at_each_milestone():
    schedule = MultiStepScheduler(milestones=["0.3dur", "0.6dur"], gamma=0.1)
    assert schedule(at(0.29)) == pytest.approx(1.0)
    assert schedule(at(0.3)) == pytest.approx(0.1)
    assert schedule(at(0.59)) == pytest.approx(0.1)
    assert schedule(at(0.6)) == pytest.approx(0.01)
    assert schedule(at(1.0)) == pytest.approx(0.01)


def test_multistep_scheduler_mixes_units():
    schedule = MultiStepScheduler(milestones=["1ep", "15ba"], gamma=0.5)
    # max 2 epochs of 10 batches: milestones at 0.5 and 0.75
    assert schedule(at(0.45, "2ep", 10)) == 1.0
    assert schedule(at(0.5, "2ep", 10)) == 0.5
    assert schedule(at(0.75, "2ep", 10)) == 0.25


def test_polynomial_scheduler():
    assert PolynomialScheduler(power=2.0)(at(0.5)) == pytest.approx(0.25)
    assert PolynomialScheduler(power=2.0, alpha_f=0.2)(at(0.5)) == pytest.approx(0.4)
    assert PolynomialScheduler(power=1.0, t_max="0.5dur")(at(0.75)) == pytest.approx(0.0)
    assert PolynomialScheduler(power=2.0)(at(0.0)) == pytest.approx(1.0)


def test_cosine_annealing_scheduler():
    schedule = CosineAnnealingScheduler(alpha_f=0.1)
    assert schedule(at(0.0)) == pytest.approx(1.0)
    assert schedule(at(0.5)) == pytest.approx(0.55)
    assert schedule(at(1.0)) == pytest.approx(0.1)
    assert schedule(at(1.5)) == pytest.approx(0.1)


def test_linear_with_warmup_scheduler():
    schedule = LinearWithWarmupScheduler(t_warmup="0.25dur")
    assert schedule(at(0.0)) == pytest.approx(0.0)
    assert schedule(at(0.125)) == pytest.approx(0.5)
    assert schedule(at(0.25)) == pytest.approx(1.0)
    assert schedule(at(0.625)) == pytest.approx(0.5)
    assert schedule(at(1.0)) == pytest.approx(0.0)
    assert LinearWithWarmupScheduler(t_warmup="0.25dur", alpha_f=0.1)(at(1.0)) == pytest.approx(0.1)


def test_cosine_with_warmup_scheduler():
    schedule = CosineAnnealingWithWarmupScheduler(t_warmup="0.2dur", alpha_f=0.0)
    assert schedule(at(0.1)) == pytest.approx(0.5)
    assert schedule(at(0.2)) == pytest.approx(1.0)
    assert schedule(at(0.6)) == pytest.approx(0.5)
    assert schedule(at(1.0)) == pytest.approx(0.0)


def test_warmup_edge_cases():
    assert LinearWithWarmupScheduler(t_warmup="0dur")(at(0.0)) == pytest.approx(1.0)
    whole = LinearWithWarmupScheduler(t_warmup="1dur", alpha_f=0.3)
    assert whole(at(0.5)) == pytest.approx(0.5)
    assert whole(at(1.0)) == pytest.approx(0.3)
    with pytest.raises(ValueError, match=r"t_warmup 0\.6dur is longer than t_max 0\.5dur"):
        LinearWithWarmupScheduler(t_warmup="0.6dur", t_max="0.5dur")(at(0.1))


def test_every_schedule_satisfies_the_protocol():
    schedules = [
        ConstantScheduler(),
        LinearScheduler(),
        ExponentialScheduler(gamma=0.9),
        StepScheduler(step_size="1ep"),
        MultiStepScheduler(milestones=["0.5dur"]),
        PolynomialScheduler(power=1.0),
        CosineAnnealingScheduler(),
        LinearWithWarmupScheduler(t_warmup="0.1dur"),
        CosineAnnealingWithWarmupScheduler(t_warmup="0.1dur"),
    ]
    for schedule in schedules:
        assert isinstance(schedule, Scheduler)


@pytest.mark.parametrize(
    ("time", "max_duration", "dataloader_len", "expected"),
    [
        ("0.3dur", "7sp", None, 0.3),
        ("2ep", "8ep", None, 0.25),
        ("50ba", "200ba", None, 0.25),
        ("1e3tok", "4e3tok", None, 0.25),
        ("30m", "2h", None, 0.25),
        ("1ep", "40ba", 10, 0.25),
        ("5ba", "2ep", 10, 0.25),
        (1, "4ep", None, 0.25),
    ],
)
def test_as_fraction_converts_units(time, max_duration, dataloader_len, expected):
    state = FakeState(ensure_time(max_duration), dataloader_len=dataloader_len)
    assert as_fraction(time, state) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("time", "max_duration", "dataloader_len"),
    [
        ("100sp", "2ep", 10),
        ("1ep", "1000tok", 10),
        ("1ep", "40ba", None),
        ("5ba", "2ep", None),
        ("10ba", "1h", 10),
    ],
)
def test_unconvertible_units_raise_a_clear_error(time, max_duration, dataloader_len):
    state = FakeState(ensure_time(max_duration), dataloader_len=dataloader_len)
    unit = ensure_time(max_duration).unit.value
    with pytest.raises(ValueError, match=rf"cannot be converted.*'0\.1dur'.*{unit}"):
        as_fraction(time, state)
    with pytest.raises(ValueError, match="cannot be converted"):
        StepScheduler(step_size=time)(FakeState(ensure_time(max_duration), 0.5, dataloader_len))


def test_time_without_max_duration_raises():
    with pytest.raises(ValueError, match="needs the run's max_duration"):
        as_fraction("2ep", FakeState(None))
    assert as_fraction("0.5dur", FakeState(None)) == 0.5


@pytest.mark.parametrize(
    "make",
    [
        lambda: LinearScheduler(t_max="0dur"),
        lambda: ExponentialScheduler(gamma=0.5, decay_period="0ep"),
        lambda: StepScheduler(step_size="0ba"),
        lambda: PolynomialScheduler(power=2.0, t_max="0ba"),
        lambda: CosineAnnealingScheduler(t_max="0dur"),
    ],
)
def test_zero_periods_are_rejected(make):
    with pytest.raises(ValueError, match="is zero; use a positive duration"):
        make()


def test_bad_arguments_are_rejected_with_their_name():
    with pytest.raises(ValueError, match=r"alpha_f must be a non-negative number, got -0\.1"):
        LinearScheduler(alpha_f=-0.1)
    with pytest.raises(ValueError, match="gamma"):
        StepScheduler(step_size="1ep", gamma=float("nan"))
    with pytest.raises(ValueError, match="t_warmup '10 percent' is not a duration"):
        LinearWithWarmupScheduler(t_warmup="10 percent")
    with pytest.raises(ValueError, match="milestone"):
        MultiStepScheduler(milestones=["half"])


def test_schedule_on_a_real_state_converts_epochs_with_the_data_length():
    batches = [(torch.zeros(2, 1), torch.zeros(2, dtype=torch.long))] * 5
    state = State(model=nn.Linear(1, 1), train_data=DataSpec(batches), max_duration=Time(2, "ep"))
    state.timestamp = Timestamp(epoch=1, batch=7, batch_in_epoch=2)
    # 1.4 of 2 epochs elapsed; the step is every 2 batches = 0.2 of the run
    assert state.elapsed_fraction() == pytest.approx(0.7)
    assert StepScheduler(step_size="2ba", gamma=0.5)(state) == pytest.approx(0.5**3)
    assert LinearWithWarmupScheduler(t_warmup="1ep")(state) == pytest.approx(0.6)


# --- configs and entry points ---------------------------------------------------------------

SCHEDULE_CLASSES = [
    getattr(schedulers, name)
    for name in schedulers.__all__
    if name.endswith("Scheduler") and name != "Scheduler"
]
ENTRY_POINTS = {
    "constant": "ConstantScheduler",
    "linear": "LinearScheduler",
    "linear_with_warmup": "LinearWithWarmupScheduler",
    "cosine": "CosineAnnealingScheduler",
    "cosine_with_warmup": "CosineAnnealingWithWarmupScheduler",
    "multistep": "MultiStepScheduler",
    "exponential": "ExponentialScheduler",
    "polynomial": "PolynomialScheduler",
    "step": "StepScheduler",
}


def test_every_schedule_is_a_configurable_with_a_documented_config():
    assert len(SCHEDULE_CLASSES) == 9
    for cls in SCHEDULE_CLASSES:
        assert issubclass(cls, Configurable)
        assert cls.config_class is getattr(schedulers, f"{cls.__name__}Config")
        docs = field_docs(cls.config_class)
        assert docs and all(docs.values()), (cls.__name__, docs)


def test_config_and_keywords_build_the_same_schedule():
    config = schedulers.CosineAnnealingWithWarmupSchedulerConfig(t_warmup="0.2dur", alpha_f=0.1)
    from_config = CosineAnnealingWithWarmupScheduler(config)
    from_keywords = CosineAnnealingWithWarmupScheduler(t_warmup="0.2dur", alpha_f=0.1)
    assert from_config.config == from_keywords.config == config
    assert from_config(at(0.6)) == from_keywords(at(0.6))
    overridden = CosineAnnealingWithWarmupScheduler(config, alpha_f=0.5)
    assert overridden.config.alpha_f == 0.5 and config.alpha_f == 0.1
    assert to_plain(overridden) == {
        "name": "CosineAnnealingWithWarmupScheduler",
        "t_warmup": "0.2dur",
        "alpha_f": 0.5,
        "t_max": "1dur",
    }


def test_config_validation_runs_without_the_schedule():
    with pytest.raises(ValueError, match=r"alpha_f must be a non-negative number, got -1"):
        schedulers.LinearSchedulerConfig(alpha_f=-1)
    with pytest.raises(ValueError, match="is zero; use a positive duration"):
        schedulers.StepSchedulerConfig(step_size="0ep")
    with pytest.raises(ValueError, match=r"milestones must be a list of durations"):
        schedulers.MultiStepSchedulerConfig(milestones="0.5dur")
    with pytest.raises(ValueError, match=r"power must be a finite number"):
        schedulers.PolynomialSchedulerConfig(power=float("inf"))


def test_unknown_option_and_positional_values_are_type_errors():
    with pytest.raises(TypeError, match=r"has no field 'warmup'; its fields: t_warmup, alpha_f"):
        LinearWithWarmupScheduler(warmup="0.1dur")
    with pytest.raises(TypeError, match=r"expected a ExponentialSchedulerConfig, got float"):
        ExponentialScheduler(0.9)
    with pytest.raises(TypeError, match="step_size"):
        StepScheduler()


def test_configs_are_keyword_only_dataclasses():
    for cls in SCHEDULE_CLASSES:
        assert all(f.kw_only for f in dataclasses.fields(cls.config_class))


def test_schedules_are_registered_as_entry_points():
    assert plugins.available("trainkit.schedulers") == sorted(ENTRY_POINTS)
    for name, class_name in ENTRY_POINTS.items():
        assert plugins.load("trainkit.schedulers", name) is getattr(schedulers, class_name)
    values = {i.name: i.value for i in plugins.describe("trainkit.schedulers")}
    assert values["cosine"] == "trainkit.core.schedulers:CosineAnnealingScheduler"


def test_torch_optimizers_are_registered_as_entry_points():
    names = plugins.available("trainkit.optimizers")
    assert {"AdamW", "SGD", "Adam"} <= set(names)
    for name in names:
        cls = plugins.load("trainkit.optimizers", name)
        assert cls is getattr(torch.optim, name)
        assert issubclass(cls, torch.optim.Optimizer)


# --- with the Trainer ----------------------------------------------------------------------


class LearningRates(Callback):
    def __init__(self):
        self.lrs: list[float] = []

    def batch_start(self, state, logger):
        self.lrs.append(state.optimizers[0].param_groups[0]["lr"])


def train_and_record_lrs(max_duration, make_scheduler, batches_per_epoch=4):
    model = mlp(dropout=0.0)
    optimizer = torch.optim.SGD(model.parameters(), lr=2.0)
    recorder = LearningRates()
    trainer = Trainer(
        model=model,
        train_dataloader=loader(blobs(16 * batches_per_epoch), batch_size=16),
        max_duration=max_duration,
        optimizers=optimizer,
        schedulers=make_scheduler(optimizer),
        callbacks=[recorder],
        progress_bar=False,
        device="cpu",
        seed=0,
    )
    trainer.fit()
    return recorder.lrs, optimizer


def test_trainer_applies_linear_warmup_batch_by_batch():
    lrs, _ = train_and_record_lrs("4ba", lambda _: LinearWithWarmupScheduler(t_warmup="0.5dur"))
    assert lrs == pytest.approx([0.0, 1.0, 2.0, 1.0])


def test_trainer_converts_epoch_warmup_with_the_data_length():
    lrs, _ = train_and_record_lrs("2ep", lambda _: LinearWithWarmupScheduler(t_warmup="1ep"))
    assert lrs == pytest.approx([0.0, 0.5, 1.0, 1.5, 2.0, 1.5, 1.0, 0.5])


def test_trainer_steps_a_torch_scheduler_every_batch():
    lrs, optimizer = train_and_record_lrs(
        "5ba", lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.1)
    )
    assert lrs == pytest.approx([2.0, 2.0, 0.2, 0.2, 0.02])
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.02)


def test_schedule_with_max_duration_given_to_fit():
    from toy import blobs, loader, mlp
    from trainkit.core import Callback, LinearScheduler, Trainer

    lrs = []

    class Record(Callback):
        def batch_start(self, state, logger):
            lrs.append(state.optimizers[0].param_groups[0]["lr"])

    model = mlp()
    trainer = Trainer(
        model=model,
        train_dataloader=loader(blobs(64)),
        optimizers=torch.optim.SGD(model.parameters(), lr=1.0),
        schedulers=LinearScheduler(alpha_i=1.0, alpha_f=0.0),
        max_duration=None,
        callbacks=[Record()],
        progress_bar=False,
        device="cpu",
    )
    trainer.fit(duration="4ba")
    assert lrs == pytest.approx([1.0, 0.75, 0.5, 0.25])
    trainer.fit(duration="4ba")  # max_duration is now 8ba: the schedule is re-read at 4/8
    assert lrs[4:] == pytest.approx([0.5, 0.375, 0.25, 0.125])
