"""Config validation derived from the components' dataclasses: field paths, values received,
what is accepted; overrides; the resolved config printed with every field documented."""

import dataclasses
import re
import sys
import types
from typing import Any

import pytest
import yaml

from trainkit.cli import main
from trainkit.cli._config import (
    ConfigError,
    apply_overrides,
    load_config,
    sections,
)
from trainkit.cli._plan import WarmupCosine, choose_plan, default_config, default_recipe
from trainkit.core import plugins
from trainkit.core.config import Configurable, field_docs, settings, slot, slot_group, slots
from trainkit.trainer import TrainerConfig

TINY_MODEL = "model: {name: tiny_gpt2, n_layer: 1, n_head: 2, n_embd: 32, n_positions: 32}\n"
TINY_DATA = (
    "data: {name: stdlib_text, seq_len: 32, batch_size: 8, max_bytes: 60000, eval_bytes: 4096}\n"
)
BASE = TINY_MODEL + TINY_DATA


def write(tmp_path, text):
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


def test_defaults_and_overrides(tmp_path):
    path = write(tmp_path, BASE + "trainer: {max_duration: 3ep}\nalgorithms: []\n")
    config = load_config(
        path, ["trainer.max_duration=2ep", "trainer.precision=amp_bf16", "model.n_layer=3"]
    )
    assert config.trainer["max_duration"] == "2ep"
    assert config.trainer["precision"] == "amp_bf16"
    assert config.trainer["seed"] is None  # TrainerConfig's default
    model = config.components["model"]
    assert model.name == "tiny_gpt2" and model.options["n_layer"] == 3
    assert config.components["algorithms"] == []
    assert config.components["optimizers"] is None  # the Trainer's default (AdamW)


def test_eval_microbatch_size_from_yaml_reaches_the_evaluators(tmp_path):
    from trainkit.cli._build import build_run
    from trainkit.trainer import Trainer

    path = write(tmp_path, BASE + "trainer: {max_duration: 1ba, device: cpu}\n")
    for value, expected in (("auto", (None, True)), ("4", (4, False))):
        override = f"trainer.device_eval_microbatch_size={value}"
        config = load_config(path, [override, "checkpoint=null"], run_dir=tmp_path / "run")
        trainer = Trainer(build_run(config).config)
        trainer.close()
        (evaluator,) = trainer.state.evaluators
        assert (evaluator.device_eval_microbatch_size, evaluator.auto_microbatching) == expected
    with pytest.raises(ConfigError, match="device_eval_microbatch_size 0 is not valid"):
        load_config(path, ["trainer.device_eval_microbatch_size=0"])


def test_exponent_floats_without_a_dot_are_numbers(tmp_path):
    # YAML 1.1 (PyYAML) reads 3e-4 as a string; configs and --set read it as a float.
    path = write(tmp_path, BASE + "optimizers: {name: AdamW, lr: 3e-4, eps: 1.0E-8}\n")
    config = load_config(path, ["optimizers.weight_decay=5e-2", "trainer.run_name=1e3x"])
    options = config.components["optimizers"].options
    assert options["lr"] == 3e-4 and isinstance(options["lr"], float)
    assert options["eps"] == 1e-8 and options["weight_decay"] == 0.05
    assert config.trainer["run_name"] == "1e3x"  # not a number: left a string
    assert apply_overrides({}, ["a=-2E+3", "b=7", "c=1.5", "d=e5"]) == {
        "a": -2000.0,
        "b": 7,
        "c": 1.5,
        "d": "e5",
    }


def test_the_schema_is_the_trainer_config():
    """Sections are TrainerConfig's slots (the two loaders share `data`), plus checkpoint
    and trainer; `trainer` holds every setting field."""
    keys = [s.key for s in sections()]
    expected = [f.name for f in slots(TrainerConfig) if slot_group(f) != "trainkit.data"]
    assert [k for k in keys if k != "data"] == expected
    assert {f for s in sections() for f in s.fills} == {f.name for f in slots(TrainerConfig)}
    config = load_config(None, base=yaml.safe_load(BASE))
    assert list(config.trainer) == [f.name for f in settings(TrainerConfig)]


def test_run_dir_and_run_name(tmp_path):
    path = write(tmp_path, BASE)
    config = load_config(path)
    assert str(config.run_dir) == "runs/config" and config.trainer["run_name"] == "config"
    named = load_config(path, ["trainer.run_name=exp7"])
    assert str(named.run_dir) == "runs/exp7"
    placed = load_config(path, run_dir=tmp_path / "here")
    assert placed.run_dir == tmp_path / "here" and placed.trainer["run_name"] == "here"


def test_override_into_a_list():
    raw = {"schedulers": [{"name": "linear", "alpha_f": 0.5}]}
    assert apply_overrides(raw, ["schedulers.0.alpha_f=0.1"])["schedulers"][0]["alpha_f"] == 0.1
    assert raw["schedulers"][0]["alpha_f"] == 0.5  # the input is not changed


def test_overrides_into_missing_null_and_named_sections():
    raw = {"parallelism": "ddp", "checkpoint": None}
    result = apply_overrides(
        raw, ["parallelism.sync=true", "checkpoint.keep=2", "trainer.seed=3", "optimizers=SGD"]
    )
    assert result["parallelism"] == {"name": "ddp", "sync": True}
    assert result["checkpoint"] == {"keep": 2}
    assert result["trainer"] == {"seed": 3}
    assert result["optimizers"] == "SGD"
    with pytest.raises(ConfigError, match=r"'3' is not an index of a list of 1"):
        apply_overrides({"schedulers": [{"name": "linear"}]}, ["schedulers.3.alpha_f=0"])


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "trainer: {max_epochs: 3}",
            r"trainer\.max_epochs: unknown field \(got 3\); the trainer takes: max_duration, .*"
            r"on_nonfinite_loss \(`trainkit train --print-config` shows all \d+ fields of the "
            r"trainer with their meaning\)$",
        ),
        (
            "trainer: {seed: abc}",
            r"trainer\.seed: Input should be a valid integer.* \(got 'abc'\); accepted: "
            r"int \| None -- The run's seed",
        ),
        (
            "trainer: {progress_bar: [1]}",
            r"trainer\.progress_bar: Input should be a valid boolean \(got \[1\]\); accepted: bool",
        ),
        (
            "algorithms: [{name: warp_speed}]",
            r"algorithms\.0: unknown name 'warp_speed'; installed in trainkit\.algorithms: .*module:factory",
        ),
        (
            "loggers: [{name: carrier_pigeon}]",
            r"loggers\.0: unknown name 'carrier_pigeon'; installed in trainkit\.loggers: ",
        ),
        (
            "model: {name: resnet9000}",
            r"model: unknown name 'resnet9000'; installed in trainkit\.models: huggingface, tiny_gpt2",
        ),
        (
            "optimizer: {lr: 0.1}",
            r"optimizer: unknown section; did you mean 'optimizers'\? Sections: ",
        ),
        (
            "optimizers: {name: Adamm}",
            r"optimizers: unknown name 'Adamm'; did you mean 'Adam'\? \(`trainkit plugins` lists "
            r"the \d+ installed in trainkit\.optimizers; or use 'module:factory'\)$",
        ),
        (
            "optimizers: {name: SGD, learning_rate: 0.1}",
            r"optimizers\.learning_rate: unknown field \(got 0\.1\); SGD takes:\n\s+lr = 0\.001 -- learning rate",
        ),
        (
            "schedulers: [{name: cosine_anealing}]",
            r"schedulers\.0: unknown name 'cosine_anealing'; installed in trainkit\.schedulers: "
            r"constant, constant_with_warmup, cosine, cosine_warm_restarts, cosine_with_warmup,",
        ),
        (
            "schedulers: [{name: cosine_with_warmup, warmup: 0.1dur}]",
            r"schedulers\.0\.warmup: unknown field \(got '0\.1dur'\); did you mean 't_warmup'\? "
            r"cosine_with_warmup takes:\n\s+t_warmup: Time \| str \| int \(required\) -- How long",
        ),
        (
            "schedulers: [{name: linear, alpha_f: high}]",
            r"schedulers\.0\.alpha_f: Input should be a valid number.* \(got 'high'\); "
            r"accepted: float -- The multiplier at",
        ),
        (
            "schedulers: [{name: linear, alpha_f: -0.5}]",
            r"schedulers\.0\.alpha_f: alpha_f must be a non-negative number, got -0\.5$",
        ),
        (
            "schedulers: [{name: constant}, {name: step, gamma: 0.5}]",
            r"schedulers\.1\.step_size: required, not given; accepted: Time \| str \| int -- How often",
        ),
        (
            "schedulers: [{name: multistep, milestones: [0.3dur, half]}]",
            r"schedulers\.0\.milestones: milestone 'half' is not a duration; .*'10ep'.*"
            r"\(got \['0\.3dur', 'half'\]\)",
        ),
        (
            "trainer: {max_duration: 1ba, deterministic_mode: true}",
            r"trainer\.deterministic_mode: unknown field \(got True\); use deterministic=True\. ",
        ),
        ("parallelism: [ddp, fsdp]", r"parallelism: takes one component, got a list of 2"),
        ("schedulers: [7]", r"schedulers\.0: must be \{name: \.\.\., <field>: <value>, \.\.\.\}"),
        ("callbacks: [{lr: 1}]", r"callbacks\.0: needs a name; name one of the installed"),
        ("- just\n- a list", r"must hold a mapping of sections"),
    ],
)
def test_validation_errors(tmp_path, text, message):
    base = "" if text.startswith("- ") else BASE
    with pytest.raises(ConfigError, match=re.compile(message, re.M)):
        load_config(write(tmp_path, base + text))


def test_missing_sections_name_what_is_installed(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, "trainer: {seed: 1}\n"))
    message = str(info.value)
    assert (
        "model: required, not given; name one of the installed trainkit.models: huggingface, "
        "tiny_gpt2" in message
    )
    assert (
        "data: required, not given; name one of the installed trainkit.data: stdlib_text" in message
    )


def test_every_problem_is_reported_at_once(tmp_path):
    text = BASE + "trainer: {seed: x, precision: 3}\nschedulers: [{name: linear, alpha_i: -1}]\n"
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text))
    paths = sorted(p.path for p in info.value.problems)
    assert paths == ["schedulers.0.alpha_i", "trainer.precision", "trainer.seed"]


def test_module_factory_component_is_validated_against_its_signature(tmp_path):
    text = BASE.replace("name: tiny_gpt2", "name: trainkit.cli._default:tiny_gpt2")
    config = load_config(write(tmp_path, text))
    assert config.components["model"].options["n_embd"] == 32
    with pytest.raises(ConfigError, match=r"model: cannot import 'trainkit\.cli\._default:nope'"):
        load_config(write(tmp_path, text.replace(":tiny_gpt2", ":nope")))


def test_bad_set_syntax():
    with pytest.raises(ConfigError, match=r"--set 'trainer\.max_duration' is not key=value"):
        load_config(None, ["trainer.max_duration"])


def test_missing_config_file_is_a_clear_cli_error(tmp_path, capsys):
    assert main(["train", str(tmp_path / "nope.yaml")]) == 2
    assert "config file" in capsys.readouterr().err


def test_bad_duration_names_the_field_the_value_and_the_forms(tmp_path, capsys):
    path = write(tmp_path, BASE + "trainer: {max_duration: 10 epochs}\ncheckpoint: null\n")
    assert main(["train", str(path), "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "max_duration '10 epochs' is not a duration" in err and "'10ep'" in err


def test_no_max_duration_is_a_clear_error(tmp_path, capsys):
    path = write(tmp_path, BASE + "checkpoint: null\n")
    assert main(["train", str(path), "--run-dir", str(tmp_path / "run")]) == 2
    assert "trainer.max_duration is not set" in capsys.readouterr().err


def test_bad_component_fields_list_the_accepted_ones(tmp_path, capsys):
    path = write(tmp_path, BASE.replace("n_layer: 1", "layers: 3") + "checkpoint: null\n")
    assert main(["train", str(path), "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "model.layers: unknown field (got 3); did you mean 'n_layer'? tiny_gpt2 takes:" in err
    for name in ("n_layer = 2", "n_head = 4", "n_embd = 128", "n_positions = 128"):
        assert name in err


def test_without_trainkit_checkpoint_the_section_is_a_note(tmp_path, monkeypatch):
    # As in an environment without trainkit-checkpoint (tests/cli runs in one, too).
    available = plugins.available
    monkeypatch.setattr(
        plugins,
        "available",
        lambda group: [n for n in available(group) if n != "checkpointer"],
    )
    config = load_config(write(tmp_path, BASE + "checkpoint: {keep: 5}\n"))
    assert config.checkpoint is None
    assert config.notes == [
        "trainkit-checkpoint is not installed, so this run will not be resumable"
    ]


# --- --print-config --------------------------------------------------------------------------


def printed(capsys, *args):
    assert main(["train", "--print-config", *args]) == 0
    return capsys.readouterr().out


def comments_above(text, key, indent, section=None):
    """The comment lines right above ``<indent>key:`` (inside top-level ``section:`` if
    given) joined into one line."""
    lines = text.splitlines()
    start, end = 0, len(lines)
    if section is not None:
        start = lines.index(f"{section}:")
        end = next(
            (i for i in range(start + 1, len(lines)) if lines[i] and not lines[i][0].isspace()),
            len(lines),
        )
    (index,) = [i for i in range(start, end) if lines[i].startswith(" " * indent + f"{key}:")]
    comments = []
    for line in reversed(lines[:index]):
        if not line.startswith(" " * indent + "# "):
            break
        comments.insert(0, line.strip()[2:])
    return " ".join(comments)


def test_print_config_shows_the_resolved_default(capsys):
    out = printed(capsys, "--max-duration", "7ba")
    config = yaml.safe_load(out)
    assert config["model"]["name"] == "tiny_gpt2"
    assert config["trainer"]["max_duration"] == "7ba"
    assert config["optimizers"]["lr"] == choose_plan().lr
    assert config["optimizers"]["eps"] == 1e-8  # AdamW's default, filled in
    assert config["model"]["dropout"] == 0.0  # the model factory's default, filled in


def test_print_config_documents_every_trainer_setting(capsys):
    out = printed(capsys)
    config = yaml.safe_load(out)
    docs = field_docs(TrainerConfig)
    for field in settings(TrainerConfig):
        assert field.name in config["trainer"]
        assert comments_above(out, field.name, 2, "trainer") == " ".join(docs[field.name].split())


def test_print_config_documents_component_fields(capsys):
    out = printed(capsys, "--recipe", "none")
    docs = field_docs(WarmupCosine.config_class)  # the baseline's schedule
    for field in dataclasses.fields(WarmupCosine.config_class):
        assert comments_above(out, field.name, 4) == " ".join(docs[field.name].split())
    section_doc = field_docs(TrainerConfig)["schedulers"]
    assert comments_above(out, "schedulers", 0) == " ".join(section_doc.split())
    assert comments_above(out, "lr", 2).startswith("learning rate")  # the optimizer's Args


def test_printed_config_loads_back_to_the_same_config(tmp_path, capsys):
    out = printed(capsys, "--set", "algorithms=[]", "--run-dir", str(tmp_path / "r"))
    path = write(tmp_path, out)
    again = load_config(path, run_dir=tmp_path / "r")
    first = load_config(None, ["algorithms=[]"], _default(), tmp_path / "r")
    assert again.plain() == first.plain()
    # Printing is a fixed point (a note on a missing package may be dropped once).
    assert load_config(write(tmp_path, again.to_yaml()), run_dir=tmp_path / "r").to_yaml() == (
        again.to_yaml()
    )
    if "checkpointer" in plugins.available("trainkit.callbacks"):  # no note to drop
        assert again.to_yaml(portable=True) == out


def _default():
    has_generate = "generate" in plugins.available("trainkit.callbacks")
    return default_config(choose_plan(), has_generate, default_recipe())


# --- a component whose config has a slot: filled by a nested component -------------------------


@dataclasses.dataclass(kw_only=True)
class ScaledScheduleConfig:
    factor: float = 1.0
    """Multiplies the inner schedule."""
    inner: Any = slot("trainkit.schedulers", default=None)
    """The schedule to scale."""


class ScaledSchedule(Configurable, config=ScaledScheduleConfig):
    def __call__(self, state):
        return self.config.factor * self.config.inner(state)


@pytest.fixture
def scaled(monkeypatch):
    module = types.ModuleType("cli_test_components")
    module.ScaledSchedule = ScaledSchedule
    monkeypatch.setitem(sys.modules, module.__name__, module)
    return "cli_test_components:ScaledSchedule"


def test_a_slot_of_a_component_takes_a_nested_component(tmp_path, scaled):
    text = BASE + f"schedulers: {{name: '{scaled}', factor: 0.5, inner: {{name: cosine}}}}\n"
    config = load_config(write(tmp_path, text), run_dir=tmp_path)
    schedule = config.components["schedulers"].build()
    assert type(schedule.config.inner).__name__ == "CosineAnnealingScheduler"
    assert config.plain()["schedulers"] == {
        "name": scaled,
        "factor": 0.5,
        "inner": {"name": "cosine", "t_max": "1dur", "alpha_f": 0.0},
    }
    printed = yaml.safe_load(config.to_yaml())
    assert printed["schedulers"]["inner"]["name"] == "cosine"
    with pytest.raises(ConfigError, match=r"schedulers\.inner\.alpha: unknown field \(got 1\)"):
        load_config(write(tmp_path, text.replace("name: cosine", "name: cosine, alpha: 1")))
    with pytest.raises(
        ConfigError,
        match=r"schedulers\.factr: .*did you mean 'factor'.*\n.*"
        r"\n\s+inner: a component of trainkit\.schedulers",
    ):
        load_config(write(tmp_path, text.replace("factor:", "factr:")))
