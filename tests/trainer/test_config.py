"""The component model: one config dataclass per component, everything derived from it."""

import dataclasses
from dataclasses import dataclass

import pytest
import torch

from toy import blobs, loader, mlp
from trainkit.core import Algorithm, Callback, Event, Time
from trainkit.core.config import (
    Configurable,
    build_config,
    field_docs,
    settings,
    slot_group,
    slots,
    to_plain,
)
from trainkit.trainer import Trainer, TrainerConfig


@dataclass(kw_only=True)
class ScaleConfig:
    factor: float = 2.0
    """What the loss is multiplied by."""
    every: str = "1ba"
    """How often."""

    def __post_init__(self):
        if self.factor <= 0:
            raise ValueError(f"factor must be positive, got {self.factor}")


class Scale(Algorithm, config=ScaleConfig):
    def match(self, event, state):
        return False

    def apply(self, event, state, logger):
        pass


def test_the_config_and_keywords_build_the_same_component():
    assert (
        Scale(ScaleConfig(factor=3.0)).config == Scale(factor=3.0).config == ScaleConfig(factor=3.0)
    )
    assert Scale().config == ScaleConfig()


def test_keywords_override_fields_of_a_given_config():
    assert Scale(ScaleConfig(factor=3.0), every="2ba").config == ScaleConfig(
        factor=3.0, every="2ba"
    )


def test_an_unknown_option_names_the_fields():
    with pytest.raises(
        TypeError,
        match=r"ScaleConfig has no field 'facter'; did you mean 'factor'\? Its fields: factor, every",
    ):
        Scale(facter=3.0)


def test_a_config_of_another_class_is_refused():
    with pytest.raises(TypeError, match=r"expected a ScaleConfig, got TrainerConfig"):
        build_config(ScaleConfig, TrainerConfig(model=mlp()), {})


def test_validation_runs_once_in_the_config():
    with pytest.raises(ValueError, match="factor must be positive"):
        Scale(factor=-1.0)


def test_a_config_class_must_be_keyword_only():
    @dataclass
    class Positional:
        x: int = 1

    with pytest.raises(TypeError, match=r"Bad: Positional must be @dataclass\(kw_only=True\)"):

        class Bad(Configurable, config=Positional):
            pass


def test_a_component_without_config_takes_no_options():
    class Plain(Callback):
        def batch_end(self, state, logger):
            pass

    assert Plain().config is None
    with pytest.raises(TypeError, match="Plain takes no options"):
        Plain(every=2)


def test_field_docs_are_read_from_the_docstrings_under_the_fields():
    assert field_docs(ScaleConfig) == {
        "factor": "What the loss is multiplied by.",
        "every": "How often.",
    }


def test_every_trainer_field_is_documented():
    docs = field_docs(TrainerConfig)
    assert set(docs) == {f.name for f in dataclasses.fields(TrainerConfig)}
    assert all(docs.values()), [name for name, doc in docs.items() if not doc]


def test_trainer_fields_split_into_settings_and_slots_with_groups():
    assert {f.name for f in slots(TrainerConfig)} == {
        "model",
        "train_dataloader",
        "optimizers",
        "schedulers",
        "algorithms",
        "callbacks",
        "loggers",
        "eval_dataloader",
        "parallelism",
    }
    groups = {f.name: slot_group(f) for f in slots(TrainerConfig)}
    assert groups["algorithms"] == "trainkit.algorithms"
    assert groups["train_dataloader"] == groups["eval_dataloader"] == "trainkit.data"
    assert "max_duration" in {f.name for f in settings(TrainerConfig)}


def test_to_plain_turns_components_and_values_into_plain_data():
    plain = to_plain(
        {
            "algorithm": Scale(factor=3.0),
            "time": Time.from_timestring("2ep"),
            "device": torch.device("cpu"),
            "optimizer": torch.optim.SGD(mlp().parameters(), lr=0.5),
            "event": Event.BATCH_END,
            "fn": test_to_plain_turns_components_and_values_into_plain_data,
            "other": object(),
        }
    )
    assert plain["algorithm"] == {"name": "Scale", "factor": 3.0, "every": "1ba"}
    assert plain["time"] == "2ep"
    assert plain["device"] == "cpu"
    assert plain["optimizer"]["name"] == "SGD" and plain["optimizer"]["lr"] == 0.5
    assert plain["event"] == "batch_end"
    assert plain["fn"] == "test_to_plain_turns_components_and_values_into_plain_data"
    assert plain["other"] == "object"


def test_the_trainer_takes_its_config_or_keywords():
    model, data = mlp(), loader(blobs(32))
    config = TrainerConfig(
        model=model, train_dataloader=data, max_duration="1ba", progress_bar=False
    )
    assert Trainer(config).config == config
    with pytest.raises(TypeError, match=r"TrainerConfig has no field 'max_duratoin'") as err:
        Trainer(model=model, max_duratoin="1ep")
    # One line: the suggestion, not the ~45 fields (a name with nothing close lists them).
    assert str(err.value) == (
        "TrainerConfig has no field 'max_duratoin'; did you mean 'max_duration'?"
    )
    with pytest.raises(TypeError, match=r"no field 'zzz'; its fields: model, train_dataloader"):
        Trainer(model=model, zzz=1)


def test_every_trainer_field_is_logged_as_a_hyperparameter():
    logged = []

    from trainkit.core import LoggerDestination

    class Keep(LoggerDestination):
        def log_hyperparameters(self, hyperparameters):
            logged.append(hyperparameters)

    Trainer(
        model=mlp(),
        train_dataloader=loader(blobs(32)),
        max_duration="1ba",
        algorithms=[Scale(factor=3.0)],
        loggers=[Keep()],
        progress_bar=False,
        device="cpu",
        seed=5,
    )
    (hparams,) = logged
    assert {f.name for f in dataclasses.fields(TrainerConfig)} <= set(hparams)
    assert hparams["algorithms"] == [{"name": "Scale", "factor": 3.0, "every": "1ba"}]
    assert hparams["seed"] == 5 and hparams["device"] == "cpu" and hparams["precision"] == "fp32"
    assert hparams["optimizers"][0]["name"] == "AdamW"  # the default, resolved


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("max_duration", "10 epochs", "not a duration"),
        ("eval_interval", "often", "not a duration"),
        ("precision", "fp8", "unknown precision 'fp8'"),
        ("device", "tpu", "unknown device 'tpu'"),
        ("device_train_microbatch_size", 0, "device_train_microbatch_size 0 is not valid"),
    ],
)
def test_trainer_settings_are_checked_in_the_config_without_a_model(field, value, message):
    with pytest.raises(ValueError, match=message):
        TrainerConfig(model=None, **{field: value})


@pytest.mark.parametrize("field", ["max_duration", "eval_interval"])
def test_iterations_are_refused_when_the_config_is_built(field):
    with pytest.raises(ValueError, match="does not count iterations"):
        TrainerConfig(model=None, **{field: "2iter"})
