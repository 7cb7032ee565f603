"""Recipes by name: ``recipe: lm_fast`` in a config, ``--recipe`` on the command line, the
embedded default trained with the measured recipe, and `Recipe.build` for Python users."""

import pytest

from trainkit.algorithms.batch_size_warmup import BatchSizeWarmup
from trainkit.algorithms.recipes import LM_FAST, Recipe
from trainkit.algorithms.relu_squared import ReLUSquared
from trainkit.algorithms.rotary import Rotary
from trainkit.cli import main
from trainkit.cli._config import ConfigError, load_config
from trainkit.cli._plan import DEFAULT_RECIPE, WarmupCosine, choose_plan, default_config
from trainkit.core import plugins
from trainkit.trainer.schedulers import WarmupStableDecayScheduler

BASE = (
    "model: {name: tiny_gpt2, n_layer: 1, n_head: 2, n_embd: 32, n_positions: 32}\n"
    "data: {name: stdlib_text, seq_len: 32, batch_size: 8, max_bytes: 60000, eval_bytes: 4096}\n"
    "trainer: {max_duration: 2ba}\n"
    "checkpoint: null\n"
)


def _load(tmp_path, text, overrides=()):
    path = tmp_path / "config.yaml"
    path.write_text(BASE + text)
    return load_config(path, list(overrides), run_dir=tmp_path / "run")


def _names(config, key):
    value = config.components[key]
    return [c.name for c in (value if isinstance(value, list) else [value])]


def test_lm_fast_is_registered_and_its_sections_are_what_a_config_gets(tmp_path):
    assert plugins.load("trainkit.recipes", "lm_fast") is LM_FAST
    config = _load(tmp_path, "recipe: lm_fast\n")
    sections = LM_FAST.sections
    assert _names(config, "algorithms") == [a["name"] for a in sections["algorithms"]]
    assert _names(config, "algorithms") == ["relu_squared", "rotary", "batch_size_warmup"]
    (schedule,) = config.components["schedulers"]
    assert schedule.name == "wsd" and schedule.options["t_warmup"] == "0.05dur"
    assert any(note.startswith("recipe lm_fast: relu_squared, rotary") for note in config.notes)
    # The printed config is the expanded one: a copy of it trains the same run, no recipe key.
    printed = config.to_yaml(portable=True)
    assert "recipe:" not in printed and "- name: rotary" in printed


def test_the_configs_own_entries_win(tmp_path):
    text = (
        "recipe: lm_fast\n"
        "algorithms: [{name: rotary, base: 500.0}, {name: gradient_clipping, "
        "clipping_type: norm, clipping_threshold: 1.0}]\n"
        "schedulers: [{name: cosine_with_warmup, t_warmup: 0.1dur}]\n"
    )
    config = _load(tmp_path, text)
    assert _names(config, "algorithms") == [
        "relu_squared",
        "batch_size_warmup",
        "rotary",
        "gradient_clipping",
    ]
    rotary = config.components["algorithms"][2]
    assert rotary.options["base"] == 500.0
    assert _names(config, "schedulers") == ["cosine_with_warmup"]
    assert "recipe lm_fast: the config's own schedulers used, not the recipe's" in config.notes


def test_a_bad_recipe_is_refused_with_what_is_accepted(tmp_path):
    with pytest.raises(ConfigError, match=r"recipe: no recipe named 'lm_fats'; did you mean "):
        _load(tmp_path, "recipe: lm_fats\n")
    with pytest.raises(ConfigError, match=r"installed: .*lm_fast"):
        _load(tmp_path, "recipe: fastest\n")
    with pytest.raises(ConfigError, match=r"recipe: must be a recipe's name, e\.g\. lm_fast"):
        _load(tmp_path, "recipe: [lm_fast]\n")


def test_an_entry_point_that_is_not_a_recipe_is_named(tmp_path, monkeypatch):
    real = plugins.load

    def load(group, name):
        return object() if group == "trainkit.recipes" else real(group, name)

    monkeypatch.setattr(plugins, "load", load)
    with pytest.raises(ConfigError, match="'lm_fast' is a object, not a recipe"):
        _load(tmp_path, "recipe: lm_fast\n")


def test_the_embedded_default_trains_with_the_recipe_and_none_gives_the_baseline(tmp_path, capsys):
    plan = choose_plan("cpu")
    assert DEFAULT_RECIPE == "lm_fast"
    config = load_config(None, base=default_config(plan, False, "lm_fast"), run_dir=tmp_path)
    assert _names(config, "algorithms") == ["relu_squared", "rotary", "batch_size_warmup"]
    assert _names(config, "schedulers") == ["wsd"]
    baseline = load_config(None, base=default_config(plan, False), run_dir=tmp_path)
    assert baseline.components["algorithms"] == []
    assert baseline.components["schedulers"][0].target is WarmupCosine

    assert main(["train", "--print-config"]) == 0
    assert "- name: relu_squared" in capsys.readouterr().out
    assert main(["train", "--recipe", "none", "--print-config"]) == 0
    out = capsys.readouterr().out
    assert "relu_squared" not in out and "WarmupCosine" in out


def test_recipe_on_the_command_line_applies_to_a_config_file(tmp_path, capsys):
    path = tmp_path / "config.yaml"
    path.write_text(BASE)
    assert main(["train", str(path), "--recipe", "lm_fast", "--print-config"]) == 0
    assert "- name: batch_size_warmup" in capsys.readouterr().out
    path.write_text(BASE + "recipe: lm_fast\n")
    assert main(["train", str(path), "--recipe", "none", "--print-config"]) == 0
    assert "batch_size_warmup" not in capsys.readouterr().out


def test_a_config_with_the_recipe_trains(tmp_path):
    from trainkit.cli._build import build_run
    from trainkit.trainer import Trainer

    config = _load(tmp_path, "recipe: lm_fast\n", ["trainer.device=cpu"])
    trainer = Trainer(build_run(config).config)
    kinds = [type(a) for a in trainer.state.algorithms]
    assert kinds == [ReLUSquared, Rotary, BatchSizeWarmup]
    trainer.fit()
    assert int(trainer.state.timestamp.batch) == 2
    trainer.close()


def test_build_gives_python_users_the_same_components():
    algorithms = LM_FAST.build("algorithms")
    assert [type(a) for a in algorithms] == [ReLUSquared, Rotary, BatchSizeWarmup]
    assert LM_FAST.build_algorithms() and len(LM_FAST.build_algorithms()) == 3
    (schedule,) = LM_FAST.build("schedulers")
    assert isinstance(schedule, WarmupStableDecayScheduler)
    with pytest.raises(ValueError, match="builds 'algorithms' or 'schedulers', not 'optimizers'"):
        LM_FAST.build("optimizers")
    missing = Recipe(name="x", summary="", algorithms=({"name": "no_such_method"},))
    with pytest.raises(KeyError, match=r"needs 'no_such_method' from the 'trainkit\.algorithms'"):
        missing.build("algorithms")
    with pytest.raises(ValueError, match="each entry must be a mapping with a 'name'"):
        Recipe(name="x", summary="", algorithms=("rotary",))
