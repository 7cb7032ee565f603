"""A third-party algorithm package (examples/third_party_algorithm) is found and used by name.

Needs the example installed in the environment (a dev dependency of the workspace root).
"""

import torch

from toy import blobs, loader, mlp
from trainkit.core import Algorithm, Callback, plugins
from trainkit.trainer import Trainer


def test_registered_under_trainkit_algorithms_by_its_own_distribution():
    assert "example_input_noise" in plugins.available("trainkit.algorithms")
    info = {p.name: p for p in plugins.describe("trainkit.algorithms")}["example_input_noise"]
    assert info.distribution == "trainkit-example-algorithm"
    assert info.value == "trainkit_example_algorithm:InputNoise"


def test_loaded_by_name_and_used_in_a_trainer():
    InputNoise = plugins.load("trainkit.algorithms", "example_input_noise")
    noise = InputNoise(std=0.5)
    assert isinstance(noise, Algorithm)
    seen = []

    class Probe(Callback):
        def batch_start(self, state, logger):
            seen.append(state.batch[0].clone())

        def before_forward(self, state, logger):
            assert not torch.equal(state.batch[0], seen[-1])  # the inputs got noise

    Trainer(
        model=mlp(),
        train_dataloader=loader(blobs(32)),
        max_duration="2ba",
        algorithms=[noise],
        callbacks=[Probe()],
        progress_bar=False,
        device="cpu",
    ).fit()
    assert len(seen) == 2
