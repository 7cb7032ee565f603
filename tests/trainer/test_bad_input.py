"""User mistakes get a ValueError/TypeError saying what was wrong and what is accepted."""

import pytest
import torch
from torch import nn

from toy import blobs, loader, mlp
from trainkit.core import Algorithm, AlgorithmError, Device, Event, dist, plugins
from trainkit.core._precision import check_device, resolve_device
from trainkit.trainer import Trainer, TrainerConfig


def trainer(**kwargs):
    kwargs.setdefault("model", mlp())
    kwargs.setdefault("train_dataloader", loader(blobs(64)))
    kwargs.setdefault("max_duration", "1ep")
    kwargs.setdefault("progress_bar", False)
    kwargs.setdefault("device", "cpu")
    return Trainer(**kwargs)


@pytest.mark.parametrize(
    ("duration", "message"),
    [
        ("10 epochs", r"'10 epochs' is not a duration; use .*'10ep'.*'500ba'"),
        ("-3ba", r"'-3ba' is not a duration"),
        (-2, r"-2 is negative"),
        ("0.5dur", r"fraction of itself"),
        (2.5, r"must be a Time, a string or an int, got float"),
    ],
)
def test_bad_max_duration(duration, message):
    with pytest.raises((ValueError, TypeError), match=message):
        trainer(max_duration=duration)


@pytest.mark.parametrize(
    ("size", "message"),
    [
        (0, r"device_train_microbatch_size 0 is not valid; use a positive int, 'auto'"),
        (-4, r"device_train_microbatch_size -4 is not valid"),
        ("half", r"device_train_microbatch_size 'half' is not valid"),
        (17, r"17 is larger than the batch size 16; use a size from 1 to 16"),
    ],
)
def test_bad_microbatch_size(size, message):
    with pytest.raises(ValueError, match=message):
        trainer(
            train_dataloader=loader(blobs(64), batch_size=16), device_train_microbatch_size=size
        )


def test_optimizer_over_other_parameters():
    other = nn.Linear(3, 3)
    with pytest.raises(
        ValueError, match=r"SGD covers none of the model's 4 parameters \(2 others\)"
    ):
        trainer(optimizers=torch.optim.SGD(other.parameters(), lr=0.1))


def test_not_an_optimizer():
    with pytest.raises(TypeError, match=r"torch\.optim\.Optimizer objects, got str"):
        trainer(optimizers=["adam"])


def test_model_without_loss():
    with pytest.raises(TypeError, match=r"Sequential has no loss\(outputs, batch\) method"):
        trainer(model=nn.Sequential(nn.Linear(8, 2)))


def test_not_a_module():
    with pytest.raises(TypeError, match=r"must be a torch\.nn\.Module"):
        trainer(model=lambda batch: batch)


def test_empty_dataloader():
    with pytest.raises(ValueError, match=r"train_dataloader is empty"):
        trainer(train_dataloader=loader(blobs(0), shuffle=False))


def test_empty_iterable_without_length_fails_at_first_epoch():
    t = trainer(train_dataloader=iter(()))
    with pytest.raises(ValueError, match="yielded no batches"):
        t.fit()


@pytest.mark.parametrize("precision", ["fp8", "bf16", "float32"])
def test_unknown_precision(precision):
    with pytest.raises(
        ValueError,
        match=rf"unknown precision '{precision}'; accepted: 'fp32', 'amp_bf16', 'amp_fp16'",
    ):
        trainer(precision=precision)


def test_composer_amp_fp8_points_to_float8_training_under_bf16():
    with pytest.raises(
        ValueError,
        match=r"'amp_fp8' is not a precision in trainkit: .* use precision='amp_bf16' with "
        r"algorithms=\[Float8Training\(\)\] .*trainkit-algorithms\[fp8\]",
    ):
        trainer(precision="amp_fp8")


def test_fp16_needs_cuda():
    with pytest.raises(
        ValueError, match=r"'amp_fp16' needs a CUDA device.*use 'amp_bf16' or 'fp32'"
    ):
        trainer(precision="amp_fp16", device="cpu")


@pytest.mark.parametrize("device", ["tpu", "GPU", "cuda:0:1"])
def test_unknown_device(device):
    with pytest.raises(
        ValueError,
        match=rf"unknown device '{device}'; accepted: 'cpu', 'cuda', 'mps', 'auto', 'gpu'",
    ):
        trainer(device=device)


def test_cuda_requested_without_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="no CUDA device is available"):
        trainer(device="cuda")


def test_gpu_is_composers_name_for_cuda(monkeypatch):
    assert check_device("gpu") == Device.CUDA
    assert TrainerConfig(model=mlp(), device="gpu").device == "gpu"  # accepted when read
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(
        ValueError, match="device 'gpu' was requested but no CUDA device is available; use 'cpu'"
    ):
        resolve_device("gpu")
    with pytest.raises(ValueError, match="device 'gpu' was requested"):
        trainer(device="gpu")


def test_several_ranks_without_trainkit_parallel_say_what_to_install(monkeypatch):
    # Two ranks as the Trainer sees them; the error comes before any collective.
    monkeypatch.setattr(dist, "get_world_size", lambda: 2)
    monkeypatch.setattr(plugins, "available", lambda group: [])
    monkeypatch.setattr(plugins, "load", _no_plugin)
    with pytest.raises(ImportError) as info:
        trainer()
    message = str(info.value)
    assert "2 ranks and no parallelism= was given" in message
    assert "`pip install trainkit-parallel`" in message
    assert "parallelism=SingleProcess()" in message


def _no_plugin(group, name):
    raise AssertionError(f"{group}:{name} must not be loaded when it is not available")


def test_not_an_algorithm():
    with pytest.raises(
        TypeError,
        match=r"Linear is not an Algorithm \(it has no match\): subclass "
        r"trainkit\.core\.Algorithm",
    ):
        trainer(algorithms=[nn.Linear(2, 2)])


def test_failing_algorithm_is_named_with_the_event():
    class Explodes(Algorithm):
        def match(self, event, state):
            return event == Event.AFTER_LOSS

        def apply(self, event, state, logger):
            raise KeyError("boom")

    t = trainer(algorithms=[Explodes()])
    with pytest.raises(
        AlgorithmError, match=r"algorithm Explodes failed at event AFTER_LOSS: KeyError: 'boom'"
    ) as info:
        t.fit()
    assert isinstance(info.value.__cause__, KeyError)


def test_no_duration_anywhere():
    t = trainer(max_duration=None)
    with pytest.raises(ValueError, match="pass max_duration to Trainer"):
        t.fit()


def test_extending_by_a_fraction_is_rejected():
    t = trainer()
    with pytest.raises(ValueError, match="a fraction of the run cannot extend it"):
        t.fit(duration="0.5dur")


def test_evaluator_asking_for_unknown_metric():
    from trainkit.core import DataSpec, Evaluator

    bad = Evaluator(label="val", data=DataSpec(loader(blobs(16))), metric_names=["f1"])
    with pytest.raises(
        ValueError,
        match=r"asks for metrics \['f1'\], but the model provides \['accuracy', 'cross_entropy'\]",
    ):
        trainer(eval_dataloader=bad)
