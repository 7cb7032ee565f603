"""LRMonitor, OptimizerMonitor and NaNMonitor through a real Trainer."""

import pytest
import torch

from multirank import run_ranks
from toy import blobs, loader, mlp
from trainkit.core import CallbackError, TrainModel
from trainkit.loggers import InMemoryLogger, LRMonitor, NaNMonitor, OptimizerMonitor, l2_norms
from trainkit.trainer import Trainer
from trainkit.trainer.schedulers import LinearScheduler


def _trainer(*callbacks, model=None, duration="4ba", optimizers=None, **kwargs):
    memory = InMemoryLogger()
    model = model or mlp(dropout=0.0)
    trainer = Trainer(
        model=model,
        train_dataloader=loader(blobs(64), shuffle=False),
        max_duration=duration,
        optimizers=optimizers or torch.optim.SGD(model.parameters(), lr=0.1),
        device="cpu",
        progress_bar=False,
        seed=0,
        callbacks=list(callbacks),
        loggers=[memory],
        **kwargs,
    )
    return trainer, memory


def test_lr_monitor_follows_the_schedule():
    trainer, memory = _trainer(LRMonitor(), schedulers=LinearScheduler(alpha_i=1.0, alpha_f=0.0))
    trainer.fit()
    lrs = memory.history("lr-SGD/group0")
    assert [step for step, _ in lrs] == [1, 2, 3, 4]
    assert [round(lr, 6) for _, lr in lrs] == [0.075, 0.05, 0.025, 0.0]


def test_lr_monitor_names_repeated_optimizers_and_groups():
    model = mlp()
    first = torch.optim.SGD(
        [
            {"params": model.module[0].parameters()},
            {"params": model.module[3].parameters(), "lr": 0.5},
        ],
        lr=0.1,
    )
    second = torch.optim.SGD(model.module[0].parameters(), lr=0.2)
    trainer, memory = _trainer(LRMonitor(interval="2ba"), model=model, optimizers=[first, second])
    trainer.fit()
    assert memory.latest["lr-SGD/group0"] == 0.1
    assert memory.latest["lr-SGD/group1"] == 0.5
    assert memory.latest["lr-SGD.1/group0"] == 0.2
    assert [step for step, _ in memory.history("lr-SGD/group0")] == [2, 4]


def test_optimizer_monitor_measures_the_final_gradients_and_parameters():
    trainer, memory = _trainer(OptimizerMonitor(per_parameter=True))
    trainer.fit()
    params = dict(trainer.state.model.named_parameters())
    grad_norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params.values()]))
    param_norm = torch.linalg.vector_norm(torch.stack([p.detach().norm() for p in params.values()]))
    latest = memory.latest
    assert latest["l2_norm/grad/global"] == pytest.approx(float(grad_norm), rel=1e-6)
    assert latest["l2_norm/param/global"] == pytest.approx(float(param_norm), rel=1e-6)
    for name, param in params.items():
        assert latest[f"l2_norm/grad/{name}"] == pytest.approx(float(param.grad.norm()), rel=1e-6)
    assert len(memory.history("l2_norm/grad/global")) == 4


def test_monitors_do_not_read_the_device_during_training(count_syncs_during_training):
    def syncs(*callbacks):
        counter = count_syncs_during_training()
        trainer, _ = _trainer(counter, *callbacks, duration="6ba")
        trainer.fit()
        return counter.counter.count

    baseline = syncs()
    assert syncs(LRMonitor(), OptimizerMonitor(per_parameter=True)) == baseline
    # The check sees reads: NaNMonitor reads its flag once per batch by design.
    assert syncs(NaNMonitor()) == baseline + 6


def test_l2_norms_keeps_the_input_order_across_devices_and_dtypes():
    tensors = [
        torch.ones(4),
        torch.full((3,), 2.0, dtype=torch.float64),
        torch.ones(2, dtype=torch.bfloat16),
    ]
    assert l2_norms(tensors).tolist() == pytest.approx([2.0, 12**0.5, 2**0.5])
    assert l2_norms([]).numel() == 0


def _norms_after_two_batches(model):
    trainer, memory = _trainer(OptimizerMonitor(per_parameter=True), model=model, duration="2ba")
    trainer.fit()
    return memory.latest


def _fsdp_norms(rank, world_size):
    from torch.distributed.fsdp import fully_shard

    model = mlp(dropout=0.0)
    for layer in (model.module[0], model.module[3]):
        fully_shard(layer)
    fully_shard(model)
    assert type(next(model.parameters())).__name__ == "DTensor"
    # Every rank trains on the same batches, so the averaged gradients are the full ones.
    return _norms_after_two_batches(model)


def test_norms_of_fsdp_sharded_parameters_are_those_of_the_full_tensors():
    expected = _norms_after_two_batches(mlp(dropout=0.0))
    assert {"l2_norm/grad/global", "l2_norm/param/module.3.weight"} <= set(expected)
    # goodput/* is each process's own bookkeeping (a forked rank also times its start).
    monitored = {key for key in expected if not key.startswith("goodput/")}
    for latest in run_ranks(_fsdp_norms, 2):
        assert {key for key in latest if not key.startswith("goodput/")} == monitored
        for key, value in expected.items():
            if key.startswith("l2_norm/"):
                assert latest[key] == pytest.approx(value, rel=1e-5), key


class NaNAt(TrainModel):
    """A classifier whose loss is NaN at one batch."""

    def __init__(self, bad_batch):
        super().__init__()
        self.inner, self.bad_batch, self.calls = mlp(), bad_batch, 0

    def forward(self, batch):
        return self.inner(batch)

    def loss(self, outputs, batch):
        self.calls += 1
        loss = self.inner.loss(outputs, batch)
        return loss * float("nan") if self.calls == self.bad_batch else loss


def test_nan_monitor_stops_with_an_error_naming_the_batch():
    trainer, _ = _trainer(NaNMonitor(), model=NaNAt(bad_batch=6), duration="3ep")
    with pytest.raises(CallbackError, match="NaNMonitor failed at event BATCH_END") as err:
        trainer.fit()
    assert "the training loss is nan at batch 6 (epoch 1, batch 2 of the epoch)" in str(err.value)
    assert isinstance(err.value.__cause__, FloatingPointError)
    assert trainer.state.timestamp.batch == 6


def test_nan_monitor_read_later_still_names_the_first_bad_batch():
    # The Trainer's own check (on_nonfinite_loss) would stop at batch 2 before the monitor
    # reads its flag: let it only warn, so the monitor's late read is what is tested.
    trainer, _ = _trainer(
        NaNMonitor(check_interval="4ba"),
        model=NaNAt(bad_batch=2),
        duration="3ep",
        on_nonfinite_loss="warn",
    )
    with (
        pytest.warns(RuntimeWarning, match=r"loss of batch 2 \(counted from 1\) is nan; training"),
        pytest.raises(CallbackError, match="nan at batch 2 \\(epoch 0, batch 2 of the epoch\\)"),
    ):
        trainer.fit()
    assert trainer.state.timestamp.batch == 4


def test_nan_monitor_lets_finite_runs_finish():
    trainer, _ = _trainer(NaNMonitor(), duration="1ep")
    trainer.fit()
    assert trainer.state.timestamp.epoch == 1
