"""Composition rules: roles order algorithms; combined loss interpolation warns once."""

import warnings

import pytest

from trainkit.algorithms import order_by_role, warn_on_combined_loss_interpolation
from trainkit.core import Event


class Method:
    def __init__(self, role=None):
        self.composition_role = role


def test_first_and_last_roles():
    a, first, b, last = Method(), Method("first"), Method(), Method("last")
    assert order_by_role([last, a, first, b], Event.BEFORE_FORWARD) == [first, a, b, last]


def test_combined_loss_interpolation_warns_once():
    class MixA(Method):
        pass

    class MixB(Method):
        pass

    algorithms = [MixA("interpolates_loss"), MixB("interpolates_loss")]
    with pytest.warns(UserWarning, match="MixA, MixB all interpolate targets"):
        warn_on_combined_loss_interpolation(algorithms, Event.AFTER_DATALOADER)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_on_combined_loss_interpolation(algorithms, Event.AFTER_DATALOADER)
