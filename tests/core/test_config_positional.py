"""A component's first positional value fills its config's primary field (issue 52, 5 and 10)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from trainkit.core.config import Configurable, build_config, primary, primary_field


@dataclass(kw_only=True)
class AverageConfig:
    half_life: str = primary("1000ba")
    """How long until older values count half."""
    update_interval: str = "1ba"
    """How often to update."""

    def __post_init__(self) -> None:
        if not isinstance(self.half_life, str):
            raise TypeError(f"half_life must be a duration string, got {self.half_life!r}")


class Average(Configurable, config=AverageConfig):
    def __init__(self, config: AverageConfig | None = None, /, **options: Any):
        super().__init__(config, **options)


@dataclass(kw_only=True)
class PlainConfig:
    rate: float = 0.5
    """A rate."""


class Plain(Configurable, config=PlainConfig):
    def __init__(self, config: PlainConfig | None = None, /, **options: Any):
        super().__init__(config, **options)


def test_a_positional_value_fills_the_primary_field():
    assert primary_field(AverageConfig) == "half_life"
    assert Average("100ba").config == AverageConfig(half_life="100ba")
    assert Average("100ba", update_interval="2ba").config.update_interval == "2ba"
    # The functional form (build_config) reads a positional value the same way.
    assert build_config(AverageConfig, "10ba", {}) == AverageConfig(half_life="10ba")


def test_a_wrong_positional_type_names_the_field():
    # The config's own check, with the field the positional value went to.
    with pytest.raises(
        TypeError, match=r"^Average\(half_life=100\), given by position: half_life must be a "
    ):
        Average(100)
    with pytest.raises(TypeError, match=r"^AverageConfig\(half_life=100\), given by position"):
        build_config(AverageConfig, 100, {})
    with pytest.raises(TypeError, match=r"got two values for 'half_life'"):
        Average("1ba", half_life="2ba")


def test_without_a_primary_field_a_positional_value_is_refused_with_the_fields():
    with pytest.raises(
        TypeError, match=r"expected a PlainConfig, got str 'x'.*no primary field.*rate"
    ):
        Plain("x")


def test_a_misspelled_keyword_gets_a_suggestion():
    with pytest.raises(
        TypeError, match=r"no field 'half_lif'; did you mean 'half_life'\? Its fields: half_life,"
    ):
        Average(half_lif="100ba")


def test_two_primary_fields_are_refused_when_declared():
    @dataclass(kw_only=True)
    class TwoConfig:
        a: int = primary(1)
        b: int = primary(2)

    with pytest.raises(TypeError, match="declares 2 or more primary fields"):

        class Two(Configurable, config=TwoConfig):
            pass
