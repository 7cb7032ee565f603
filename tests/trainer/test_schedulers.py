"""Schedules that speak `Time`: values at known points, unit conversion, configs, entry
points, and the Trainer."""

import dataclasses
import math
from dataclasses import dataclass

import pytest
import torch
from torch import nn

from toy import blobs, loader, mlp
from trainkit.core import Callback, DataSpec, State, Time, Timestamp, ensure_time, plugins
from trainkit.core.config import Configurable, field_docs, to_plain
from trainkit.core.interval import as_fraction
from trainkit.trainer import Trainer, schedulers
from trainkit.trainer.schedulers import (
    ConstantScheduler,
    ConstantWithWarmupScheduler,
    CosineAnnealingScheduler,
    CosineAnnealingWarmRestartsScheduler,
    CosineAnnealingWithWarmupScheduler,
    ExponentialScheduler,
    LinearScheduler,
    LinearWithWarmupScheduler,
    MultiStepScheduler,
    MultiStepWithWarmupScheduler,
    PolynomialScheduler,
    PolynomialWithWarmupScheduler,
    Scheduler,
    StepScheduler,
)


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
        ConstantWithWarmupScheduler(t_warmup="0.1dur"),
        MultiStepWithWarmupScheduler(t_warmup="0.1dur", milestones=["0.5dur"]),
        PolynomialWithWarmupScheduler(t_warmup="0.1dur"),
        CosineAnnealingWarmRestartsScheduler(t_0="0.25dur"),
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


@pytest.mark.parametrize(("time", "max_duration"), [("1ep", "40ba"), ("5ba", "2ep")])
def test_schedules_without_the_data_length_cannot_mix_epochs_and_batches(time, max_duration):
    with pytest.raises(ValueError, match="cannot be converted"):
        StepScheduler(step_size=time)(FakeState(ensure_time(max_duration), 0.5, None))


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
    "constant_with_warmup": "ConstantWithWarmupScheduler",
    "multistep_with_warmup": "MultiStepWithWarmupScheduler",
    "polynomial_with_warmup": "PolynomialWithWarmupScheduler",
    "cosine_warm_restarts": "CosineAnnealingWarmRestartsScheduler",
    "wsd": "WarmupStableDecayScheduler",
}


def test_every_schedule_is_a_configurable_with_a_documented_config():
    assert len(SCHEDULE_CLASSES) == 14
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
        "scale_warmup": False,
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
    with pytest.raises(
        TypeError,
        match=r"has no field 'warmup'; did you mean 't_warmup'\? Its fields: t_warmup, alpha_f",
    ):
        LinearWithWarmupScheduler(warmup="0.1dur")
    assert ExponentialScheduler(0.9).config.gamma == 0.9  # the primary field, as Composer
    with pytest.raises(ValueError, match=r"ExponentialScheduler\(gamma='0.9'\), given by position"):
        ExponentialScheduler("0.9")
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
    assert values["cosine"] == "trainkit.trainer.schedulers:CosineAnnealingScheduler"


def test_torch_optimizers_are_registered_as_entry_points():
    names = plugins.available("trainkit.optimizers")
    assert {"AdamW", "SGD", "Adam"} <= set(names)
    for name in names:
        cls = plugins.load("trainkit.optimizers", name)
        # torch's own by their torch name; trainkit's (DecoupledAdamW, ...) are its own classes
        assert cls is getattr(torch.optim, name, cls)
        assert issubclass(cls, torch.optim.Optimizer)


# --- with the Trainer ----------------------------------------------------------------------


class LearningRates(Callback):
    def __init__(self):
        self.lrs: list[float] = []

    def batch_start(self, state, logger):
        self.lrs.append(state.optimizers[0].param_groups[0]["lr"])


def train_and_record_lrs(max_duration, make_scheduler, batches_per_epoch=4, lr=2.0, **options):
    model = mlp(dropout=0.0)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
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
        **options,
    )
    trainer.fit()
    return recorder.lrs, optimizer


def test_trainer_applies_linear_warmup_batch_by_batch():
    lrs, _ = train_and_record_lrs("4ba", lambda _: LinearWithWarmupScheduler(t_warmup="0.5dur"))
    assert lrs == pytest.approx([0.0, 1.0, 2.0, 1.0])


def test_trainer_converts_epoch_warmup_with_the_data_length():
    lrs, _ = train_and_record_lrs("2ep", lambda _: LinearWithWarmupScheduler(t_warmup="1ep"))
    assert lrs == pytest.approx([0.0, 0.5, 1.0, 1.5, 2.0, 1.5, 1.0, 0.5])


def test_trainer_steps_a_torch_scheduler_every_batch_when_asked():
    lrs, optimizer = train_and_record_lrs(
        "5ba",
        lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.1),
        step_schedulers_every_batch=True,
    )
    assert lrs == pytest.approx([2.0, 2.0, 0.2, 0.2, 0.02])
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.02)


def test_schedule_with_max_duration_given_to_fit():
    from toy import blobs, loader, mlp
    from trainkit.core import Callback
    from trainkit.trainer import Trainer
    from trainkit.trainer.schedulers import LinearScheduler

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


# --- when schedulers are stepped (Composer's step_schedulers_every_batch) -----------------------


def step_lr(opt):
    return torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)


def test_a_torch_scheduler_is_stepped_once_per_epoch_by_default():
    lrs, optimizer = train_and_record_lrs("2ep", step_lr, lr=0.1)
    assert lrs == pytest.approx([0.1 * 0.5 ** (batch // 4) for batch in range(8)])
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.025)


def test_step_schedulers_every_batch_steps_a_torch_scheduler_after_each_batch():
    lrs, optimizer = train_and_record_lrs("2ep", step_lr, lr=0.1, step_schedulers_every_batch=True)
    assert lrs == pytest.approx([0.1 * 0.5**batch for batch in range(8)])
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.1 * 0.5**8)


def test_step_schedulers_every_batch_false_steps_trainkit_schedules_per_epoch():
    lrs, _ = train_and_record_lrs(
        "2ep", lambda _: LinearScheduler(), step_schedulers_every_batch=False
    )
    # re-read only at epoch ends: 1.0 for the first epoch, 0.5 (4 of 8 batches) for the second
    assert lrs == pytest.approx([2.0 * (1 - (batch // 4) * 4 / 8) for batch in range(8)])


def test_a_torch_scheduler_among_the_schedulers_makes_all_step_per_epoch():
    lrs, _ = train_and_record_lrs(
        "2ep",
        lambda opt: [LinearScheduler(), torch.optim.lr_scheduler.StepLR(opt, 1, gamma=1.0)],
    )
    assert lrs == pytest.approx([2.0 * (1 - (batch // 4) * 4 / 8) for batch in range(8)])


def test_bad_step_schedulers_every_batch_is_rejected():
    with pytest.raises(ValueError, match="step_schedulers_every_batch"):
        train_and_record_lrs("1ep", step_lr, step_schedulers_every_batch="yes")


# --- schedules in another unit than max_duration (Composer: the run's own count) -------------


def test_batch_schedules_in_a_run_measured_in_samples():
    # 16 samples a batch: 128sp is 8 batches; the schedules count batches.
    lrs, _ = train_and_record_lrs(
        "128sp", lambda _: LinearWithWarmupScheduler(t_warmup="2ba", t_max="6ba", alpha_f=0.2)
    )
    expected = [b / 2 if b < 2 else 1 + (0.2 - 1) * min((b - 2) / 4, 1.0) for b in range(8)]
    assert lrs == pytest.approx([2.0 * e for e in expected])

    lrs, _ = train_and_record_lrs("128sp", lambda _: StepScheduler(step_size="3ba", gamma=0.5))
    assert lrs == pytest.approx([2.0 * 0.5 ** (b // 3) for b in range(8)])


def test_epoch_schedules_in_a_run_measured_in_samples_count_the_epochs_batches():
    lrs, _ = train_and_record_lrs(
        "128sp", lambda _: MultiStepScheduler(milestones=["1ep", "6ba"], gamma=0.5)
    )
    assert lrs == pytest.approx([2.0 * 0.5 ** ((b >= 4) + (b >= 6)) for b in range(8)])


def test_warmup_and_t_max_measured_differently_raise():
    with pytest.raises(ValueError, match="measured differently"):
        train_and_record_lrs("128sp", lambda _: LinearWithWarmupScheduler(t_warmup="2ba"))


# --- scale_schedule_ratio --------------------------------------------------------------------


def test_scale_schedule_ratio_scales_max_duration_and_milestones():
    lrs, _ = train_and_record_lrs(
        "2ep",
        lambda _: MultiStepScheduler(milestones=["4ba", "6ba"], gamma=0.5),
        scale_schedule_ratio=0.5,
    )
    milestones = [int(4 * 0.5), int(6 * 0.5)]
    assert len(lrs) == 4  # 2 epochs of 4 batches, halved
    assert lrs == pytest.approx([2.0 * 0.5 ** sum(b >= m for m in milestones) for b in range(4)])


def test_scale_schedule_ratio_leaves_warmup_alone_unless_scale_warmup():
    def expected(warmup: int, total: int = 4) -> list[float]:
        return [
            2.0 * (b / warmup if b < warmup else 1 - (b - warmup) / (total - warmup))
            for b in range(total)
        ]

    lrs, _ = train_and_record_lrs(
        "2ep", lambda _: LinearWithWarmupScheduler(t_warmup="2ba"), scale_schedule_ratio=0.5
    )
    assert lrs == pytest.approx(expected(warmup=2))
    lrs, _ = train_and_record_lrs(
        "2ep",
        lambda _: LinearWithWarmupScheduler(t_warmup="2ba", scale_warmup=True),
        scale_schedule_ratio=0.5,
    )
    assert lrs == pytest.approx(expected(warmup=1))


def test_scale_schedule_ratio_scales_torch_schedulers():
    lrs, optimizer = train_and_record_lrs(
        "4ep",
        lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5),
        scale_schedule_ratio=0.5,
        lr=0.1,
    )
    # 2 epochs; step_size 2 -> 1 epoch
    assert lrs == pytest.approx([0.1 * 0.5 ** (b // 4) for b in range(8)])
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.025)


def test_scale_schedule_ratio_errors():
    with pytest.raises(ValueError, match="has no effect without schedulers"):
        train_and_record_lrs("2ep", lambda _: None, scale_schedule_ratio=0.5)
    with pytest.raises(ValueError, match="scale_schedule_ratio must be a positive number"):
        train_and_record_lrs("2ep", lambda _: None, scale_schedule_ratio=0)
    with pytest.raises(ValueError, match="cannot scale LambdaLR"):
        train_and_record_lrs(
            "2ep",
            lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0),
            scale_schedule_ratio=0.5,
        )
    with pytest.raises(ValueError, match="takes only the state"):
        train_and_record_lrs("2ep", lambda _: lambda state: 1.0, scale_schedule_ratio=0.5)


# --- the warm-up schedules and warm restarts --------------------------------------------------


def test_linear_with_warmup_alpha_i():
    schedule = LinearWithWarmupScheduler(t_warmup="0.25dur", alpha_i=0.5, alpha_f=0.1)
    assert schedule(at(0.125)) == pytest.approx(0.25)
    assert schedule(at(0.25)) == pytest.approx(0.5)
    assert schedule(at(0.625)) == pytest.approx(0.3)
    assert schedule(at(1.0)) == pytest.approx(0.1)


def test_constant_with_warmup_scheduler():
    schedule = ConstantWithWarmupScheduler(t_warmup="0.25dur", alpha=0.5)
    assert [schedule(at(f)) for f in (0.0, 0.125, 0.25, 0.6, 1.0)] == pytest.approx(
        [0.0, 0.25, 0.5, 0.5, 0.5]
    )


def test_multistep_with_warmup_scheduler():
    schedule = MultiStepWithWarmupScheduler(
        t_warmup="0.2dur", milestones=["0.5dur", "0.75dur"], gamma=0.1
    )
    assert [schedule(at(f)) for f in (0.1, 0.2, 0.49, 0.5, 0.8)] == pytest.approx(
        [0.5, 1.0, 1.0, 0.1, 0.01]
    )


def test_polynomial_with_warmup_scheduler():
    schedule = PolynomialWithWarmupScheduler(t_warmup="0.2dur", power=2.0, alpha_f=0.1)
    for f in (0.1, 0.2, 0.6, 1.0):
        expected = f / 0.2 if f < 0.2 else 0.1 + 0.9 * (1 - (f - 0.2) / 0.8) ** 2
        assert schedule(at(f)) == pytest.approx(expected)


def test_cosine_warm_restarts_in_the_trainer():
    lrs, _ = train_and_record_lrs(
        "2ep", lambda _: CosineAnnealingWarmRestartsScheduler(t_0="2ba", t_mult=2.0, alpha_f=0.1)
    )

    def expected(batch: int) -> float:
        start, length = 0, 2
        while start + length <= batch:
            start, length = start + length, int(length * 2.0)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (batch - start) / length))

    assert lrs == pytest.approx([2.0 * expected(b) for b in range(8)])


def test_new_schedules_in_the_trainer_with_warmup():
    lrs, _ = train_and_record_lrs(
        "2ep", lambda _: MultiStepWithWarmupScheduler(t_warmup="1ep", milestones=["6ba"])
    )
    assert lrs == pytest.approx([2.0 * (b / 4 if b < 4 else 0.1 ** (b >= 6)) for b in range(8)])
    lrs, _ = train_and_record_lrs(
        "2ep", lambda _: ConstantWithWarmupScheduler(t_warmup="2ba", alpha=0.5)
    )
    assert lrs == pytest.approx([2.0 * (0.5 * b / 2 if b < 2 else 0.5) for b in range(8)])


def test_bad_new_schedule_options_are_rejected():
    with pytest.raises(ValueError, match="t_mult"):
        CosineAnnealingWarmRestartsScheduler(t_0="1ep", t_mult=0.5)
    with pytest.raises(ValueError, match="scale_warmup"):
        PolynomialWithWarmupScheduler(t_warmup="1ep", scale_warmup="no")
    with pytest.raises(ValueError, match="milestone"):
        MultiStepWithWarmupScheduler(t_warmup="1ep", milestones=["half"])
