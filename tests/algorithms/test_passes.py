"""Composition rules: methods that mix targets, combined, warn once."""

import warnings

import pytest

from trainkit.algorithms import (
    ComposableAlgorithm,
    CutMix,
    LabelSmoothing,
    MixUp,
    warn_on_combined_loss_interpolation,
)
from trainkit.core import Event, plugins


class Method(ComposableAlgorithm):
    def match(self, event, state):
        return True

    def apply(self, event, state, logger):
        pass


class MixA(Method):
    mixes_targets = True


class MixB(Method):
    mixes_targets = True


def test_combined_loss_interpolation_warns_once():
    algorithms = [MixA(), Method(), MixB()]
    with pytest.warns(UserWarning, match="MixA, MixB all interpolate targets"):
        warn_on_combined_loss_interpolation(algorithms, Event.AFTER_DATALOADER)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_on_combined_loss_interpolation(algorithms, Event.AFTER_DATALOADER)


def test_one_mixing_method_alone_does_not_warn():
    algorithms = [MixA(), Method()]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert warn_on_combined_loss_interpolation(algorithms, Event.AFTER_LOSS) is algorithms


def test_exactly_mixup_cutmix_and_label_smoothing_mix_targets():
    mixing = set()
    for name in plugins.available("trainkit.algorithms"):
        cls = plugins.load("trainkit.algorithms", name)
        if issubclass(cls, ComposableAlgorithm) and cls.mixes_targets:
            mixing.add(cls)
    assert mixing == {MixUp, CutMix, LabelSmoothing}


def test_a_method_that_declares_its_events_matches_exactly_those():
    class AtInit(ComposableAlgorithm):
        match_events = frozenset({Event.INIT})

        def apply(self, event, state, logger):
            pass

    method = AtInit()
    assert [e for e in Event if method.match(e, None)] == [Event.INIT]


def test_a_method_with_neither_match_events_nor_match_is_refused_when_defined():
    with pytest.raises(TypeError, match="Nothing declares neither match_events nor match"):

        class Nothing(ComposableAlgorithm):
            def apply(self, event, state, logger):
                pass
