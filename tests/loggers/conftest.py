"""Fixtures for the trainkit-loggers tests."""

import os

import pytest
import torch

from trainkit.core import Callback


class SyncCounter:
    """Counts reads of tensor values into Python (each one waits for the device).

    Patches the `torch.Tensor` methods that read values: ``item``, ``tolist``,
    ``float(t)``, ``int(t)``, ``bool(t)``, ``operator.index(t)``.
    """

    METHODS = ("item", "tolist", "__float__", "__int__", "__bool__", "__index__")

    def __init__(self):
        self.count = 0
        self._saved = {}

    def __enter__(self):
        for name in self.METHODS:
            self._saved[name] = torch.Tensor.__dict__.get(name)
            original = getattr(torch.Tensor, name)

            def counted(tensor, *args, _original=original, **kwargs):
                self.count += 1
                return _original(tensor, *args, **kwargs)

            setattr(torch.Tensor, name, counted)
        return self

    def __exit__(self, *exc):
        for name, saved in self._saved.items():
            if saved is None:
                delattr(torch.Tensor, name)
            else:
                setattr(torch.Tensor, name, saved)


class CountSyncsDuringTraining(Callback):
    """Counts the reads from the start of fit to the end of the last batch (not FIT_END)."""

    def __init__(self):
        self.counter = SyncCounter()

    def fit_start(self, state, logger):
        self.counter.__enter__()

    def iteration_end(self, state, logger):
        self.counter.__exit__(None, None, None)


@pytest.fixture
def sync_counter():
    return SyncCounter


@pytest.fixture
def count_syncs_during_training():
    return CountSyncsDuringTraining


# comet_ml reports its own errors to Comet's Sentry from `import comet_ml` unless this is
# off; tests reach no network (set before any test imports it).
os.environ["COMET_ERROR_TRACKING_ENABLE"] = "false"
