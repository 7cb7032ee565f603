"""Exact resume: State.state_dict() after k batches continues bitwise, without data replay."""

import copy
import random

import numpy
import pytest
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Subset

from toy import CountingDataset, blobs, flat_params, mlp
from trainkit.core import Algorithm, Callback, DataSpec, Event, dist
from trainkit.trainer import Trainer
from trainkit.trainer.schedulers import LinearWithWarmupScheduler


class BatchCounter(Callback):
    """A callback with state: it must be restored on resume."""

    def __init__(self):
        self.count = 0

    def batch_end(self, state, logger):
        self.count += 1

    def state_dict(self):
        return {"count": self.count}

    def load_state_dict(self, state):
        self.count = state["count"]


class NoisyGradients(Algorithm):
    """An algorithm with RNG use and state: adds noise to gradients, counts its calls."""

    def __init__(self):
        self.calls = 0

    def match(self, event, state):
        return event == Event.AFTER_TRAIN_BATCH

    def apply(self, event, state, logger):
        self.calls += 1
        for p in state.model.parameters():
            p.grad.add_(torch.randn_like(p.grad) * 1e-3)

    def state_dict(self):
        return {"calls": self.calls}

    def load_state_dict(self, state):
        self.calls = state["calls"]


class StopAt(Callback):
    def __init__(self, batch):
        self.batch = batch

    def batch_end(self, state, logger):
        if state.timestamp.batch == self.batch:
            state.stop_training()


def build(dataset, extra_callbacks=(), **kwargs):
    model = mlp(dropout=0.2)
    counter, noise = BatchCounter(), NoisyGradients()
    trainer = Trainer(
        model=model,
        train_dataloader=DataLoader(dataset, batch_size=16, shuffle=True),
        optimizers=torch.optim.AdamW(model.parameters(), lr=0.01),
        schedulers=LinearWithWarmupScheduler(t_warmup="0.2dur"),
        max_duration="3ep",
        algorithms=[noise],
        callbacks=[counter, *extra_callbacks],
        device_train_microbatch_size=8,
        progress_bar=False,
        device="cpu",
        seed=17,
        **kwargs,
    )
    return trainer, counter, noise


def counts(timestamp):
    """The timestamp without its wall-clock fields."""
    return {k: v for k, v in timestamp.state_dict().items() if not k.endswith("wct")}


@pytest.mark.parametrize("stop_batch", [11, 8])  # mid-epoch, and exactly at an epoch boundary
def test_resume_is_bitwise_equal_to_an_uninterrupted_run(stop_batch):
    full, full_counter, full_noise = build(CountingDataset(blobs(128)))
    full.fit()

    first, _, _ = build(CountingDataset(blobs(128)), extra_callbacks=[StopAt(stop_batch)])
    first.fit()
    assert first.state.timestamp.batch == stop_batch
    saved = copy.deepcopy(first.state.state_dict())

    dataset = CountingDataset(blobs(128))
    resumed, counter, noise = build(dataset)
    resumed.state.load_state_dict(saved)
    resumed.fit()

    assert torch.equal(flat_params(resumed.state.model), flat_params(full.state.model))
    assert counts(resumed.state.timestamp) == counts(full.state.timestamp)
    assert counter.count == full_counter.count == 24
    assert noise.calls == full_noise.calls == 24
    # The resumed run loaded only what it trained on: the tail of the uninterrupted run's reads.
    full_reads = full.state.train_data.dataloader.dataset.loaded
    assert len(dataset.loaded) == (24 - stop_batch) * 16
    assert dataset.loaded == full_reads[stop_batch * 16 :]


def test_resume_restores_optimizer_scheduler_and_rng():
    trainer, _, _ = build(blobs(128), extra_callbacks=[StopAt(5)])
    trainer.fit()
    saved = copy.deepcopy(trainer.state.state_dict())
    lr = trainer.state.optimizers[0].param_groups[0]["lr"]
    expected_noise = torch.randn(3)

    fresh, _, _ = build(blobs(128))
    assert fresh.state.optimizers[0].param_groups[0]["lr"] != lr
    fresh.state.load_state_dict(saved)
    assert fresh.state.optimizers[0].param_groups[0]["lr"] == lr
    assert fresh.state.schedulers[0].last_epoch == 5
    assert torch.equal(torch.randn(3), expected_noise)


def test_state_dict_holds_every_part():
    trainer, _, _ = build(blobs(64), extra_callbacks=[StopAt(2)])
    trainer.fit()
    state = trainer.state.state_dict()
    assert {
        "model",
        "optimizers",
        "schedulers",
        "timestamp",
        "rng",
        "train_metrics",
        "algorithms",
        "callbacks",
    } <= set(state)
    assert state["timestamp"]["batch"] == 2
    assert state["algorithms"] == {"NoisyGradients": {"calls": 2}}
    assert state["callbacks"] == {"BatchCounter": {"count": 2}}
    assert set(state["model"]) == {name for name, _ in trainer.state.model.named_parameters()}
    assert len(state["rng"]) == 1  # one entry per rank


def test_loading_into_a_run_with_other_optimizers_is_a_clear_error():
    trainer, _, _ = build(blobs(64))
    state = trainer.state.state_dict()
    state["optimizers"] = state["optimizers"] * 2
    fresh, _, _ = build(blobs(64))
    with pytest.raises(ValueError, match="2 optimizers but this run has 1"):
        fresh.state.load_state_dict(state)


def test_state_for_an_unknown_callback_warns():
    trainer, _, _ = build(blobs(64))
    state = trainer.state.state_dict()
    state["callbacks"]["Vanished"] = {"x": 1}
    with pytest.warns(UserWarning, match="'Vanished', which this run does not use"):
        trainer.state.load_state_dict(state)


class Inputs(Callback):
    """Records each batch's inputs, as the step sees them."""

    def __init__(self):
        self.seen: list[torch.Tensor] = []

    def batch_start(self, state, logger):
        self.seen.append(state.batch[0].clone())


def with_workers(dataset, *callbacks, workers=2, batch_size=16):
    model = mlp(dropout=0.2)
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=workers)
    return Trainer(
        model=model,
        train_dataloader=loader,
        max_duration="2ep",
        callbacks=list(callbacks),
        progress_bar=False,
        device="cpu",
        seed=17,
    )


class Augmented(Dataset):
    """`blobs` with a random augmentation, drawn from torch's, Python's and NumPy's global
    generators where the sample is loaded (in a DataLoader worker)."""

    def __init__(self):
        self.base = blobs(128)

    def __len__(self):
        return len(self.base)

    def __getitem__(self, index):
        x, y = self.base[index]
        noise = torch.randn_like(x) + float(numpy.random.normal())
        return x * random.uniform(0.5, 1.5) + noise, y


@pytest.mark.parametrize("data", [blobs, Augmented])
@pytest.mark.parametrize("stop_batch", [5, 8])  # mid-epoch, and exactly at an epoch boundary
def test_resume_with_data_workers_goes_on_with_the_next_batch(stop_batch, data):
    # A DataLoader with workers asks its batch sampler for an iterator twice and uses the
    # second: the resumed epoch must still skip what was trained, not start over. Workers
    # that start afresh and skip batches without loading them must still augment each
    # batch as the uninterrupted run did.
    full_inputs = Inputs()
    full = with_workers(data(), full_inputs)
    full.fit()

    first = with_workers(data(), StopAt(stop_batch))
    first.fit()
    saved = copy.deepcopy(first.state.state_dict())

    inputs = Inputs()
    resumed = with_workers(data(), inputs)
    resumed.state.load_state_dict(saved)
    resumed.fit()

    assert len(inputs.seen) == 16 - stop_batch
    assert all(map(torch.equal, inputs.seen, full_inputs.seen[stop_batch:]))
    assert torch.equal(flat_params(resumed.state.model), flat_params(full.state.model))


def augmented_subset():
    return Subset(Augmented(), range(128))  # a dataset with __getitems__: loaded through it


@pytest.mark.parametrize("data", [Augmented, augmented_subset])
def test_a_batch_is_augmented_the_same_by_any_number_of_workers(data):
    runs = {}
    for workers in (1, 2):
        runs[workers] = Inputs()
        with_workers(data(), runs[workers], workers=workers).fit()
    assert len(runs[1].seen) == len(runs[2].seen) == 16
    assert all(map(torch.equal, runs[1].seen, runs[2].seen))
    assert not torch.equal(runs[1].seen[0], runs[1].seen[8])  # not one draw for every batch


class AugmentedBatches(Dataset):
    """Whole batches of `Augmented`, for a DataLoader with automatic batching off."""

    def __init__(self):
        self.samples = Augmented()

    def __len__(self):
        return len(self.samples) // 16

    def __getitem__(self, index):
        xs, ys = zip(*(self.samples[i] for i in range(index * 16, index * 16 + 16)), strict=True)
        return torch.stack(xs), torch.stack(ys)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_loader_of_whole_batches_resumes_exactly(workers):
    # DataLoader(batch_size=None): no batch sampler; its sampler's indices are the batches.
    full_inputs = Inputs()
    full = with_workers(AugmentedBatches(), full_inputs, workers=workers, batch_size=None)
    full.fit()
    first = with_workers(AugmentedBatches(), StopAt(5), workers=workers, batch_size=None)
    first.fit()
    saved = copy.deepcopy(first.state.state_dict())

    inputs = Inputs()
    resumed = with_workers(AugmentedBatches(), inputs, workers=workers, batch_size=None)
    resumed.state.load_state_dict(saved)
    resumed.fit()
    assert len(full_inputs.seen) == 16 and len(inputs.seen) == 11
    assert all(map(torch.equal, inputs.seen, full_inputs.seen[5:]))
    assert torch.equal(flat_params(resumed.state.model), flat_params(full.state.model))
    assert full.state.timestamp.sample == 16 * 16  # each batch counted by its samples


class EpochBatches:
    """A batch sampler of its own (no ``.sampler``), shuffled by the epoch it is told."""

    def __init__(self):
        self.epoch = None
        self.told = []

    def set_epoch(self, epoch):
        self.epoch = epoch
        self.told.append(epoch)

    def __iter__(self):
        order = torch.randperm(128, generator=torch.Generator().manual_seed(self.epoch))
        return iter(order.view(8, 16).tolist())

    def __len__(self):
        return 8


def test_a_batch_sampler_of_its_own_is_told_the_epoch_and_resumes_in_it():
    full_sampler, resumed_sampler = EpochBatches(), EpochBatches()
    full_inputs, inputs = Inputs(), Inputs()
    full = Trainer(
        model=mlp(), train_dataloader=DataLoader(blobs(128), batch_sampler=full_sampler),
        max_duration="2ep", callbacks=[full_inputs], progress_bar=False, device="cpu", seed=3,
    )  # fmt: skip
    full.fit()
    assert full_sampler.told == [0, 1]

    first = Trainer(
        model=mlp(), train_dataloader=DataLoader(blobs(128), batch_sampler=EpochBatches()),
        max_duration="2ep", callbacks=[StopAt(11)], progress_bar=False, device="cpu", seed=3,
    )  # fmt: skip
    first.fit()
    resumed = Trainer(
        model=mlp(), train_dataloader=DataLoader(blobs(128), batch_sampler=resumed_sampler),
        max_duration="2ep", callbacks=[inputs], progress_bar=False, device="cpu", seed=3,
    )  # fmt: skip
    resumed.state.load_state_dict(copy.deepcopy(first.state.state_dict()))
    resumed.fit()
    assert resumed_sampler.told == [1]  # mid-epoch 1, after 3 of its 8 batches
    assert all(map(torch.equal, inputs.seen, full_inputs.seen[11:])) and len(inputs.seen) == 5


class Noisy(Dataset):
    """`blobs` plus standard normal noise drawn where the sample is loaded."""

    def __init__(self):
        self.x, self.y = blobs(128).tensors

    def __len__(self):
        return len(self.x)

    def __getitem__(self, index):
        return self.x[index] + torch.randn(8), self.y[index]


def _first_batch(data_slice):
    # The first batch of one data-parallel slice (of 2), as the Trainer's training data
    # loads it with 2 workers; its noise (the inputs less the clean samples).
    sampler = DistributedSampler(Noisy(), num_replicas=2, rank=data_slice, seed=4)
    data = DataSpec(DataLoader(Noisy(), batch_size=16, sampler=sampler, num_workers=2))
    data.make_resumable(seed=17)
    inputs = next(iter(data.iter_epoch(0)))[0]
    return inputs - Noisy().x[list(sampler)[:16]]


def test_ranks_reading_one_slice_augment_it_alike_and_other_slices_differently(monkeypatch):
    # Ranks of one tensor-parallel group read the same slice and must see the same inputs;
    # each data-parallel slice gets draws of its own, not the same noise on other samples.
    rank0_slice0, rank0_slice1 = _first_batch(0), _first_batch(1)
    monkeypatch.setattr(dist, "get_rank", lambda: 1)  # as on another rank of the job
    rank1_slice0 = _first_batch(0)
    assert torch.equal(rank0_slice0, rank1_slice0)
    assert not torch.allclose(rank0_slice0, rank0_slice1, atol=0.1)
