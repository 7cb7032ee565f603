"""Every strategy trainkit-parallel registers is built from one documented config dataclass.

The strategies are found through this package's ``trainkit.parallel`` entry points, so a
new one is checked without editing this file (except to give ``EXAMPLES`` a value for it).
"""

import dataclasses

import pytest

from component_checks import check_entry_point, check_fields_are_documented
from trainkit.core import ParallelStrategy, plugins
from trainkit.core.config import settings

STRATEGIES = sorted(
    (info.name, plugins.load("trainkit.parallel", info.name))
    for info in plugins.describe("trainkit.parallel")
    if info.distribution == "trainkit-parallel"
)
NAMES = [name for name, _ in STRATEGIES]

REQUIRED = {"plan": {"blocks.*.up": "colwise", "blocks.*.down": "rowwise"}}
"""Values for fields without a default."""
REQUIRED_BY = {"pipeline_parallel": {"plan": "llama"}}
"""Where one strategy's field of the same name takes another kind of value."""
EXAMPLES = {
    "sync": "forced",
    "find_unused_parameters": True,
    "sharding": "grad_op",
    "cpu_offload": True,
    "sync_module_states": False,
    "degree": 2,
    "min_replicas": 2,
}
"""A valid value, other than the default, for fields the equivalence tests set."""


def _required(config_class, name=None):
    required = {**REQUIRED, **REQUIRED_BY.get(name, {})}
    return {
        f.name: required[f.name]
        for f in dataclasses.fields(config_class)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    }


def test_the_package_registers_its_strategies():
    assert NAMES == [
        "context_parallel",
        "ddp",
        "fault_tolerant",
        "fsdp",
        "pipeline_parallel",
        "tensor_parallel",
    ]


@pytest.mark.parametrize(("name", "cls"), STRATEGIES, ids=NAMES)
def test_entry_point_names_the_defining_module(name, cls):
    info = next(i for i in plugins.describe("trainkit.parallel") if i.name == name)
    check_entry_point(info, ParallelStrategy)


@pytest.mark.parametrize(("name", "cls"), STRATEGIES, ids=NAMES)
def test_every_config_field_is_documented(name, cls):
    check_fields_are_documented(cls.config_class)


@pytest.mark.parametrize(("name", "cls"), STRATEGIES, ids=NAMES)
def test_config_and_keyword_arguments_build_the_same_strategy(name, cls):
    config_class = cls.config_class
    required = _required(config_class, name)
    examples = {f.name: EXAMPLES[f.name] for f in settings(config_class) if f.name in EXAMPLES}
    assert examples, f"give EXAMPLES a value for one of {config_class.__name__}'s fields"

    assert cls(**required).config == config_class(**required)
    assert cls(config_class(**required)).config == config_class(**required)
    assert cls(**required, **examples).config == config_class(**required, **examples)
    # A config with keyword overrides: the keywords win, the rest is the config's.
    field, value = next(iter(examples.items()))
    built = cls(config_class(**required), **{field: value})
    assert built.config == dataclasses.replace(config_class(**required), **{field: value})
    # The strategy's contract is complete: data_parallel_size is declared.
    assert isinstance(built.data_parallel_size, int)


@pytest.mark.parametrize(("name", "cls"), STRATEGIES, ids=NAMES)
def test_unknown_options_and_positional_values_are_refused(name, cls):
    required = _required(cls.config_class, name)
    close = "did you mean 'sharding'" if name == "fsdp" else "its fields: "
    with pytest.raises(TypeError, match=rf"has no field 'shardng'; {close}"):
        cls(**required, shardng="full")
    if not cls.positional:
        with pytest.raises(TypeError, match=f"expected a {cls.config_class.__name__}"):
            cls({"sync": "forced"})
        return
    # A declared primary field takes the first positional value: TensorParallel(plan).
    (field,) = cls.positional
    assert cls(required[field]).config == cls(**required).config


def test_data_parallel_size_without_a_process_group():
    from trainkit.parallel import DDP, FSDP, ContextParallel, TensorParallel

    # One process, no group: every strategy reads one stream of data.
    assert DDP().data_parallel_size == FSDP().data_parallel_size == 1
    assert ContextParallel().data_parallel_size == 1
    assert TensorParallel(plan=REQUIRED["plan"]).data_parallel_size == 1
