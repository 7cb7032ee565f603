"""ActivationMonitor: statistics of every module's inputs and outputs at chosen batches,
checked against the same statistics computed here from the recorded batch."""

import pytest
import torch

from toy import blobs, loader, mlp
from trainkit.core import Callback
from trainkit.loggers import ActivationMonitor, ActivationMonitorConfig, InMemoryLogger
from trainkit.trainer import Trainer


class RecordInputs(Callback):
    """Keeps each training batch's inputs, by batch number."""

    def __init__(self):
        self.inputs = {}

    def batch_start(self, state, logger):
        self.inputs[state.timestamp.batch + 1] = state.batch[0].clone()


def _fit(*callbacks, duration="7ba", **kwargs):
    model, memory, inputs = mlp(dropout=0.0), InMemoryLogger(), RecordInputs()
    trainer = Trainer(
        model=model,
        train_dataloader=loader(blobs(64), shuffle=False),  # 4 batches of 16
        max_duration=duration,
        device="cpu",
        progress_bar=False,
        seed=0,
        optimizers=torch.optim.SGD(model.parameters(), lr=0.0),  # the weights stay put
        callbacks=[inputs, *callbacks],
        loggers=[memory],
        **kwargs,
    )
    trainer.fit()
    trainer.close()
    return model, memory, inputs.inputs


def _expected(x):
    return {
        "mean": x.mean(),
        "std": x.std(correction=0),
        "max_abs": x.abs().max(),
        "l2_norm": x.norm(dim=-1).mean(),
        "kurtosis": (
            ((x - x.mean(-1, keepdim=True)) ** 4).mean(-1) / x.var(-1, correction=0) ** 2
        ).mean(),
    }


def test_statistics_of_inputs_and_outputs_at_the_chosen_batches():
    monitor = ActivationMonitor(
        interval="3ba", stats=["mean", "std", "max_abs", "l2_norm", "kurtosis"]
    )
    model, memory, inputs = _fit(monitor)
    key = "activations/mean/module.0/output.0"
    assert [step for step, _ in memory.history(key)] == [1, 4, 7]  # the first, then every 3
    net = model.module
    for step, _ in memory.history(key):
        x = inputs[step]
        hidden = net[0](x)
        tensors = {
            "model/input.0.0": x,  # the batch (inputs, targets): the integer targets are left out
            "module.0/input.0": x,
            "module.0/output.0": hidden,
            "module.1/output.0": torch.relu(hidden),
            "module.3/output.0": net(x),
            "model/output.0": net(x),
        }
        for where, tensor in tensors.items():
            for stat, value in _expected(tensor.detach()).items():
                got = dict(memory.history(f"activations/{stat}/{where}"))[step]
                assert got == pytest.approx(value.item(), rel=1e-5, abs=1e-6), (where, stat)
    assert not any(k.startswith("activations/") and "model/input.0.1" in k for k in memory.keys)


def test_only_the_first_microbatch_is_measured():
    monitor = ActivationMonitor(interval="2ba")
    _, memory, inputs = _fit(monitor, duration="2ba", device_train_microbatch_size=8)
    ((step, value),) = memory.history("activations/mean/module.0/input.0")
    assert step == 1
    assert value == pytest.approx(inputs[1][:8].mean().item())
    assert value != pytest.approx(inputs[1].mean().item())  # the whole batch's differs


def test_epoch_intervals_and_ignored_modules():
    monitor = ActivationMonitor(interval="1ep", ignore=["Dropout", "module.1"], inputs=False)
    _, memory, _ = _fit(monitor, duration="2ep")
    keys = [k for k in memory.keys if k.startswith("activations/")]
    assert [s for s, _ in memory.history("activations/std/module.3/output.0")] == [1, 5]
    assert {k.split("/")[2] for k in keys} == {"model", "module", "module.0", "module.3"}
    assert not any("/input." in k for k in keys)
    assert {k.split("/")[1] for k in keys} == {"mean", "std", "max_abs"}  # the default stats


def test_no_device_reads_during_training(count_syncs_during_training):
    def syncs(*callbacks):
        counter = count_syncs_during_training()
        _fit(counter, *callbacks, duration="4ba")
        return counter.counter.count

    assert syncs(ActivationMonitor(interval="1ba")) == syncs()


def test_bad_options_are_refused():
    with pytest.raises(
        ValueError, match=r"interval '0\.5dur' is not valid; use a number of batches"
    ):
        ActivationMonitorConfig(interval="0.5dur")
    with pytest.raises(ValueError, match="stats \\['median'\\] is not valid; choose from 'mean'"):
        ActivationMonitorConfig(stats=["median"])
    with pytest.raises(ValueError, match="give a list of patterns"):
        ActivationMonitorConfig(ignore="Dropout")
