"""Composer's positional calls build trainkit's methods (issue 52, finding 5)."""

from __future__ import annotations

import pytest

from trainkit.algorithms import EMA, LabelSmoothing, SeqLengthWarmup


def test_composer_style_positional_calls_fill_the_primary_field():
    assert EMA("100ba").config.half_life == "100ba"
    assert LabelSmoothing(0.1).config.smoothing == 0.1
    assert SeqLengthWarmup(0.5).config.duration == 0.5


def test_a_wrong_positional_type_names_the_field():
    with pytest.raises(ValueError, match=r"^EMA\(half_life=100\), given by position: half_life"):
        EMA(100)
    with pytest.raises(TypeError, match=r"^LabelSmoothing\(smoothing='0\.1'\), given by position"):
        LabelSmoothing("0.1")


def test_a_misspelled_keyword_gets_a_suggestion():
    with pytest.raises(
        TypeError, match=r"no field 'half_lif'; did you mean 'half_life'\? Its fields: half_life"
    ):
        EMA(half_lif="100ba")
