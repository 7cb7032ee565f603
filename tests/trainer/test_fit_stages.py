"""``Trainer.fit`` called again for a next stage of training, with Composer's arguments:
``reset_time``, new data, schedulers, evaluation, microbatching and precision."""

import pytest
import torch

from toy import blobs, loader, mlp
from trainkit.core import Callback, Evaluator
from trainkit.trainer import Trainer
from trainkit.trainer.schedulers import ConstantScheduler, LinearScheduler


class Record(Callback):
    """Per training batch: the learning rate, the batch size at each forward; eval labels."""

    def __init__(self):
        self.lrs, self.forward_sizes, self.evals = [], [], []

    def batch_start(self, state, logger):
        self.lrs.append(state.optimizers[0].param_groups[0]["lr"])

    def before_forward(self, state, logger):
        self.forward_sizes.append(len(state.batch[0]))

    def eval_end(self, state, logger):
        self.evals.append((state.dataloader_label, int(state.timestamp.batch)))


def _trainer(**options):
    model = mlp(dropout=0.0)
    record = Record()
    trainer = Trainer(
        model=model,
        train_dataloader=loader(blobs(64), batch_size=16),  # 4 batches an epoch
        optimizers=torch.optim.SGD(model.parameters(), lr=1.0),
        progress_bar=False,
        device="cpu",
        seed=0,
        callbacks=[record],
        **options,
    )
    return trainer, record


def test_reset_time_and_duration_as_composer_documents_them():
    trainer, _ = _trainer(max_duration="1ep")
    ts = lambda: trainer.state.timestamp  # noqa: E731
    trainer.fit()
    assert (ts().epoch, ts().batch) == (1, 4)
    trainer.fit(reset_time=True)  # the same max_duration again, from zero
    assert (ts().epoch, ts().batch) == (1, 4)
    trainer.fit(duration="1ep")
    assert (ts().epoch, ts().batch) == (2, 8)
    trainer.fit(duration="1ba")  # units may change
    assert (ts().epoch, ts().batch_in_epoch) == (2, 1)
    trainer.fit(reset_time=True, duration="3ep")
    assert (ts().epoch, ts().batch) == (3, 12)


def test_reset_time_starts_trainkit_schedules_over_and_keeps_the_model():
    trainer, record = _trainer(max_duration="4ba", schedulers=LinearScheduler(alpha_f=0.0))
    trainer.fit()
    weights = [p.detach().clone() for p in trainer.state.model.parameters()]
    trainer.fit(reset_time=True)
    assert record.lrs == pytest.approx([1.0, 0.75, 0.5, 0.25] * 2)
    # The second stage trained the same model on.
    after = list(trainer.state.model.parameters())
    assert not all(torch.equal(a, b) for a, b in zip(weights, after, strict=True))


def test_a_next_stage_with_new_data_schedulers_evaluation_microbatches_and_precision():
    trainer, record = _trainer(max_duration="2ba", eval_dataloader=loader(blobs(32)))
    trainer.fit()
    assert record.evals == [("eval", 2)]  # at the end of training
    trainer.fit(
        duration="4ba",
        train_dataloader=loader(blobs(48, seed=3), batch_size=12),
        train_subset_num_batches=2,
        schedulers=ConstantScheduler(alpha=0.5),
        eval_dataloader=Evaluator(label="stage2", data=loader(blobs(16))),
        eval_interval="2ba",
        eval_subset_num_batches=1,
        device_train_microbatch_size=4,
        precision="amp_bf16",
    )
    state = trainer.state
    assert record.lrs[2:] == [0.5] * 4
    assert record.forward_sizes[2:] == [4, 4, 4] * 4  # batches of 12 in microbatches of 4
    # The new data starts a new epoch, of 2 batches (the subset).
    assert (state.timestamp.epoch, state.timestamp.batch) == (3, 6)
    assert record.evals[1:] == [("stage2", 4), ("stage2", 6)]
    assert [e.label for e in state.evaluators] == ["stage2"]
    assert state.evaluators[0].subset_num_batches == 1
    assert state.precision.name == "amp_bf16"
    assert trainer.last_eval.keys() == {"metrics/stage2/accuracy", "metrics/stage2/cross_entropy"}


def test_a_next_stage_scaled_by_scale_schedule_ratio_trains_its_share():
    trainer, record = _trainer(max_duration="2ba")
    trainer.fit()
    schedule = LinearScheduler(alpha_f=0.0, t_max="4ba")
    trainer.fit(reset_time=True, duration="8ba", schedulers=schedule, scale_schedule_ratio=0.5)
    assert trainer.state.timestamp.batch == 4  # 8 x 0.5
    assert record.lrs[2:] == pytest.approx([1.0, 0.5, 0.0, 0.0])  # t_max scaled to 2ba


def test_eval_settings_alone_apply_to_the_current_evaluators():
    trainer, record = _trainer(max_duration="1ba", eval_dataloader=loader(blobs(32)))
    trainer.fit()
    trainer.fit(duration="4ba", eval_interval="2ba", eval_subset_num_batches=1)
    # Every 2 batches of the run (2 and 4), and at the end (5).
    assert record.evals == [("eval", 1), ("eval", 2), ("eval", 4), ("eval", 5)]
    assert trainer.state.evaluators[0].subset_num_batches == 1


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"train_subset_num_batches": 0}, ValueError, "train_subset_num_batches must be a posi"),
        ({"scale_schedule_ratio": 0.5}, ValueError, "applies to the schedulers given with them"),
        ({"precision": "fp8"}, ValueError, "unknown precision 'fp8'"),
        ({"device_train_microbatch_size": 0}, ValueError, "device_train_microbatch_size 0 is"),
        ({"eval_interval": "often"}, ValueError, "not a duration"),
        ({"duration": "0.5dur"}, ValueError, "a fraction of the run cannot extend it"),
        ({"schedulers": "cosine"}, TypeError, "cosine"),
        (
            {"eval_dataloader": Evaluator(label="x", data=[1], metric_names=["f1"])},
            ValueError,
            "f1",
        ),
        ({"reset_time": "yes"}, TypeError, "reset_time=...\\) must be True or False"),
        # Checked by the call that builds the constructor's schedule, with its words.
        (
            {"schedulers": [], "scale_schedule_ratio": 0.5, "duration": "4ba"},
            ValueError,
            "no effect",
        ),
        (
            {"schedulers": [ConstantScheduler()], "step_schedulers_every_batch": "yes"},
            ValueError,
            "step_schedulers_every_batch must be True, False or None",
        ),
    ],
)
def test_a_bad_argument_is_refused_before_anything_changes(options, error, message):
    trainer, _ = _trainer(max_duration="2ba")
    trainer.fit()
    before = trainer.state.timestamp
    with pytest.raises(error, match=message):
        trainer.fit(**{"reset_time": True, "duration": "1ba", **options})
    assert trainer.state.timestamp == before
    assert trainer.state.max_duration.value == 2
