"""The component model, checked on every registered method (found from the entry points).

Each is built from one config dataclass: the config and keyword arguments build the same
thing, an unknown keyword names the fields, every field is documented, plain fields
survive a round trip through a config file. The package imports lazily, and
``required_on_load`` is set exactly on the methods whose checkpoints a plain model
cannot load.
"""

import ast
import dataclasses
import importlib
import inspect
import json
import subprocess
import sys

import pytest
import torch
from torch import nn

import trainkit.algorithms
from trainkit.algorithms import ComposableAlgorithm
from trainkit.core import Algorithm, Callback, Event, Logger, State, plugins
from trainkit.core.config import field_docs, to_plain

DISTRIBUTION = "trainkit-algorithms"

# Values for the fields that have no default (every such field must be listed here).
REQUIRED = {
    "target": nn.Linear,  # StochasticDepthConfig
    "monitor": "accuracy",  # EarlyStopperConfig, ThresholdStopperConfig
    "threshold": 0.9,  # ThresholdStopperConfig
}


def _components():
    found = [("trainkit.algorithms", name) for name in plugins.available("trainkit.algorithms")]
    found += [
        ("trainkit.callbacks", info.name)
        for info in plugins.describe("trainkit.callbacks")
        if info.distribution == DISTRIBUTION
    ]
    return found


COMPONENTS = _components()


def _required(config_class):
    missing = [
        f.name
        for f in dataclasses.fields(config_class)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    unknown = [name for name in missing if name not in REQUIRED]
    assert not unknown, f"{config_class.__name__}: add a value for {unknown} to REQUIRED"
    return {name: REQUIRED[name] for name in missing}


@pytest.fixture(params=COMPONENTS, ids=[f"{group}:{name}" for group, name in COMPONENTS])
def component(request):
    group, name = request.param
    cls = plugins.load(group, name)
    assert cls.config_class is not None, f"{name} declares no config class"
    return group, cls


def test_every_method_of_the_package_is_covered():
    names = {name for _, name in COMPONENTS}
    assert {"ema", "mixup", "alibi", "early_stopper", "threshold_stopper"} <= names


def test_subclasses_the_base_of_its_group(component):
    group, cls = component
    if group == "trainkit.algorithms":
        assert issubclass(cls, Algorithm)
        if cls.__module__.startswith("trainkit.algorithms."):
            assert issubclass(cls, ComposableAlgorithm)
    else:
        assert issubclass(cls, Callback)


def test_config_and_keyword_arguments_build_the_same_config(component):
    _, cls = component
    config_class = cls.config_class
    required = _required(config_class)
    config = config_class(**required)
    assert cls(config).config == cls(**required).config == config
    assert cls(config).config is config
    every_field = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    assert cls(**every_field).config == config
    assert cls(config, **every_field).config == config  # keywords override the config's


def test_unknown_keyword_raises_type_error_naming_the_fields(component):
    _, cls = component
    names = [f.name for f in dataclasses.fields(cls.config_class)]
    with pytest.raises(TypeError, match="has no field 'not_a_field'") as info:
        cls(**_required(cls.config_class), not_a_field=1)
    for name in names:
        assert name in str(info.value)


def test_positional_values_fill_the_declared_fields_or_are_refused(component):
    _, cls = component
    if not cls.positional:
        with pytest.raises(TypeError, match=f"expected a {cls.config_class.__name__}, got float"):
            cls(0.5)
        return
    # The primary field (EMA("100ba")), or a declared order (Composer's, for the stoppers),
    # builds the same config as keywords.
    config = cls.config_class(**_required(cls.config_class))
    values = [getattr(config, name) for name in cls.positional]
    assert cls(*values).config == config
    with pytest.raises(TypeError, match="positional argument"):
        cls(*values, None)


def test_every_config_field_has_a_docstring(component):
    _, cls = component
    docs = field_docs(cls.config_class)
    undocumented = [name for name, doc in docs.items() if not doc.strip()]
    assert not undocumented, f"{cls.config_class.__name__}: no docstring under {undocumented}"


def test_plain_fields_survive_a_config_file(component):
    # What a config file holds (to_plain, then JSON as a stand-in for YAML) builds it again.
    _, cls = component
    config = cls.config_class(**_required(cls.config_class))
    plain = {
        name: value
        for name, value in to_plain(config).items()
        if not dataclasses.is_dataclass(getattr(config, name))
        and (getattr(config, name) is None or isinstance(getattr(config, name), str | int | float))
    }
    assert cls(config, **json.loads(json.dumps(plain))).config == config


def test_functional_forms_take_the_config_positionally_and_its_fields_as_keywords():
    # Every public function whose parameters include a config positional-only parameter
    # declares no parameter that restates one of the config's fields.
    for name in trainkit.algorithms.__all__:
        function = getattr(trainkit.algorithms, name)
        if not inspect.isfunction(function):
            continue
        parameters = inspect.signature(function).parameters
        if "config" not in parameters:
            continue
        config = parameters["config"]
        assert config.kind == inspect.Parameter.POSITIONAL_ONLY, name
        assert "options" in parameters, name
        annotation = config.annotation.split(" |")[0]
        config_class = getattr(trainkit.algorithms, annotation)
        restated = {f.name for f in dataclasses.fields(config_class)} & set(parameters)
        assert not restated, f"{name} restates {sorted(restated)} of {annotation}"


def test_functional_form_takes_the_same_fields_as_the_class():
    from trainkit.algorithms import CutOutConfig, cutout_batch

    torch.manual_seed(0)
    by_config = cutout_batch(torch.ones(4, 1, 8, 8), CutOutConfig(num_holes=2, length=3))
    torch.manual_seed(0)
    by_keywords = cutout_batch(torch.ones(4, 1, 8, 8), num_holes=2, length=3)
    assert torch.equal(by_config, by_keywords)
    with pytest.raises(TypeError, match="CutOutConfig has no field 'holes'"):
        cutout_batch(torch.ones(4, 1, 8, 8), holes=2)


# --- entry points and lazy import --------------------------------------------------------


def test_entry_points_name_the_defining_module():
    for group in ("trainkit.algorithms", "trainkit.callbacks"):
        for info in plugins.describe(group):
            if info.distribution != DISTRIBUTION:
                continue
            module, _, attribute = info.value.partition(":")
            cls = plugins.load(group, info.name)
            assert module == cls.__module__ and attribute == cls.__name__, info


_LAZY_PROBE = r"""
import json
import sys

from trainkit.core import plugins


def loaded():
    return sorted(m for m in sys.modules if m.startswith("trainkit.algorithms."))


import trainkit.algorithms  # noqa: E402

after_package = loaded()
plugins.load("trainkit.algorithms", "ema")
after_ema = loaded()
from trainkit.algorithms import MixUp  # noqa: E402, F401

after_mixup = loaded()
print(json.dumps([after_package, after_ema, after_mixup]))
"""


def test_loading_one_method_imports_no_other_method_module():
    method_modules = {
        info.value.partition(":")[0]
        for group in ("trainkit.algorithms", "trainkit.callbacks")
        for info in plugins.describe(group)
        if info.distribution == DISTRIBUTION
    }
    result = subprocess.run(
        [sys.executable, "-c", _LAZY_PROBE], capture_output=True, text=True, check=True
    )
    after_package, after_ema, after_mixup = json.loads(result.stdout.strip().splitlines()[-1])
    assert not method_modules & set(after_package)
    assert method_modules & set(after_ema) == {"trainkit.algorithms.ema"}
    assert method_modules & set(after_mixup) == {
        "trainkit.algorithms.ema",
        "trainkit.algorithms.mixup",
    }
    assert all(m.rpartition(".")[2].startswith("_") for m in set(after_ema) - method_modules)


def test_every_public_name_resolves_from_its_module_and_is_visible_to_type_checkers():
    package = trainkit.algorithms
    modules = package._MODULE_OF
    assert sorted(package.__all__) == sorted(modules)
    for name, module in modules.items():
        defining = importlib.import_module(f"trainkit.algorithms.{module}")
        assert getattr(package, name) is getattr(defining, name), name
    # The `if TYPE_CHECKING:` imports name the same things from the same modules.
    tree = ast.parse(inspect.getsource(package))
    block = next(node for node in tree.body if isinstance(node, ast.If))
    imported = {
        alias.name: node.module.removeprefix("trainkit.algorithms.")
        for node in block.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert imported == modules
    assert set(package.__all__) <= set(dir(package))
    with pytest.raises(AttributeError, match="has no attribute 'order_by_role'"):
        package.order_by_role  # noqa: B018


# --- required_on_load ----------------------------------------------------------------------


def _cnn():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(16, 16, 3, stride=2, padding=1),
        nn.BatchNorm2d(16),
        nn.GroupNorm(4, 16),
        nn.Flatten(),
        nn.Linear(16 * 4, 32),
        nn.LayerNorm(32),
        nn.Linear(32, 32),
    )


def _gpt2():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=32, n_positions=16)
    return transformers.GPT2LMHeadModel(config)


def _bert():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=32,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=16,
    )
    return transformers.BertModel(config)


# Model surgery (every method that declares Event.INIT), with a model it changes.
SURGERY = {
    "activation_checkpointing": (_bert, {"modules": [nn.LayerNorm]}),
    "alibi": (_gpt2, {"max_sequence_length": 32}),
    "blurpool": (_cnn, {}),
    "channels_last": (_cnn, {}),
    "factorize": (_cnn, {"min_channels": 16, "latent_channels": 4}),
    "float8_training": (_cnn, {}),
    "gated_linear_units": (_bert, {}),
    "ghost_batchnorm": (_cnn, {}),
    "low_precision_groupnorm": (_cnn, {"dtype": "bfloat16"}),
    "low_precision_layernorm": (_cnn, {"dtype": "bfloat16"}),
    "qk_norm": (_gpt2, {}),
    "relu_squared": (_gpt2, {}),
    "rotary": (_gpt2, {}),
    "squeeze_excite": (_cnn, {"min_channels": 16}),
    "stochastic_depth": (_cnn, {"target": nn.LayerNorm}),
    "weight_standardization": (_cnn, {}),
}


def test_every_surgery_method_is_checked():
    at_init = {
        info.name
        for info in plugins.describe("trainkit.algorithms")
        if info.distribution == DISTRIBUTION
        and Event.INIT in plugins.load("trainkit.algorithms", info.name).required_events
    }
    assert at_init == set(SURGERY)


@pytest.mark.parametrize("name", sorted(SURGERY))
def test_required_on_load_exactly_when_a_plain_model_cannot_load_the_checkpoint(name):
    make, options = SURGERY[name]
    model = make()
    cls = plugins.load("trainkit.algorithms", name)
    state = State(model=model)
    cls(**options).apply(Event.INIT, state, Logger([], state))
    checkpoint = model.state_dict()
    try:
        make().load_state_dict(checkpoint)
        loads = True
    except RuntimeError:
        loads = False
    assert cls.required_on_load is not loads
