"""Resumable data: a loader's own state (state_dict / load_state_dict) is saved for every
rank with the run and restored on resume, without reading again what was trained on."""

import copy
import warnings

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.utils.data import DataLoader, DistributedSampler

from multirank import run_ranks
from toy import blobs, flat_params, mlp
from trainkit.core import Callback, DataSpec, SingleProcess
from trainkit.core.data import DataPosition, LoaderState, ReplayPosition, SamplerPosition
from trainkit.trainer import Trainer


class CursorLoader:
    """A stateful loader (as torchdata's StatefulDataLoader): a per-epoch shuffled order
    and a cursor into it, both in its state; it records every sample it reads."""

    def __init__(self, dataset, batch_size=8, seed=0):
        self.dataset, self.batch_size, self.seed = dataset, batch_size, seed
        self.epoch, self.cursor = 0, 0
        self.reads: list[int] = []

    def __len__(self):
        return len(self.dataset) // self.batch_size

    def __iter__(self):
        order = torch.randperm(len(self.dataset), generator=torch.Generator().manual_seed(
            self.seed * 1000 + self.epoch)).tolist()  # fmt: skip
        while self.cursor + self.batch_size <= len(order):
            indices = order[self.cursor : self.cursor + self.batch_size]
            self.cursor += self.batch_size
            self.reads.extend(indices)
            samples = [self.dataset[i] for i in indices]
            yield torch.stack([x for x, _ in samples]), torch.stack([y for _, y in samples])
        self.epoch, self.cursor = self.epoch + 1, 0

    def state_dict(self):
        return {"epoch": self.epoch, "cursor": self.cursor, "seed": self.seed}

    def load_state_dict(self, state):
        self.epoch, self.cursor, self.seed = state["epoch"], state["cursor"], state["seed"]


class StopAt(Callback):
    def __init__(self, batch):
        self.batch = batch

    def batch_end(self, state, logger):
        if state.timestamp.batch == self.batch:
            state.stop_training()


def _trainer(data, *callbacks, max_duration="3ep"):
    model = mlp(dropout=0.2)
    return Trainer(
        model=model,
        train_dataloader=data,
        optimizers=torch.optim.AdamW(model.parameters(), lr=0.01),
        max_duration=max_duration,
        callbacks=list(callbacks),
        progress_bar=False,
        device="cpu",
        seed=5,
        # Core alone (no trainkit-parallel): each rank trains its replica; positions are
        # what these tests check.
        parallelism=SingleProcess(),
    )


def test_a_stateful_loader_resumes_from_its_own_state_bitwise_without_rereading():
    full_loader = CursorLoader(blobs(64))
    full = _trainer(full_loader)
    full.fit()

    first = _trainer(CursorLoader(blobs(64)), StopAt(11))  # 8 batches an epoch: mid-epoch 1
    first.fit()
    saved = copy.deepcopy(first.state.state_dict())

    loader = CursorLoader(blobs(64))
    resumed = _trainer(loader)
    assert isinstance(resumed.state.train_data.position, LoaderState)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "skipping batches by iterating them"
        resumed.state.load_state_dict(saved)
        resumed.fit()
    assert torch.equal(flat_params(resumed.state.model), flat_params(full.state.model))
    assert loader.reads == full_loader.reads[11 * 8 :]  # only what was not trained on


def _save_per_rank_positions(rank, world, folder):
    dataset = blobs(64, seed=rank)
    run = _trainer(CursorLoader(dataset, seed=10 + rank), StopAt(3), max_duration="1ep")
    run.fit()
    state = run.state.state_dict()
    dcp.save({"state": state}, checkpoint_id=folder)

    fresh = _trainer(CursorLoader(dataset, seed=99), max_duration="1ep")
    template = {"state": fresh.state.state_dict()}
    dcp.load(template, checkpoint_id=folder)
    fresh.state.load_state_dict(template["state"])
    return fresh.state.train_data.dataloader.state_dict(), state["data"]


def test_every_ranks_position_survives_a_distributed_checkpoint(tmp_path):
    # torch.distributed.checkpoint keeps one copy of a non-tensor value (rank 0's); the
    # data state still brings each rank its own position back.
    results = run_ranks(_save_per_rank_positions, 2, tmp_path / "ckpt")
    restored = [loaded for loaded, _ in results]
    assert restored == [
        {"epoch": 0, "cursor": 24, "seed": 10},
        {"epoch": 0, "cursor": 24, "seed": 11},
    ]

    # Per-rank positions cannot be moved to another number of ranks: a clear error.
    saved = results[0][1]
    single = _trainer(CursorLoader(blobs(64)))
    with pytest.raises(ValueError, match=r"saved by 2 ranks and this run has 1.*LoaderState"):
        single.state.load_state_dict({"data": saved})
    # A loader declared elastic must have saved one position for all ranks.
    elastic = _trainer(DataSpec(CursorLoader(blobs(64)), position=LoaderState(elastic=True)))
    with pytest.raises(ValueError, match="positions differ between its 2 ranks"):
        elastic.state.load_state_dict({"data": saved})


def _map_style_position(rank, world):
    data = blobs(64)
    loader = DataLoader(data, batch_size=8, sampler=DistributedSampler(data, shuffle=True))
    run = _trainer(loader, StopAt(2), max_duration="1ep")
    run.fit()
    return run.state.state_dict()["data"]


def test_a_global_position_moves_to_another_number_of_ranks_and_a_counted_one_warns():
    saved = run_ranks(_map_style_position, 2)[0]
    run = _trainer(DataLoader(blobs(64), batch_size=8, shuffle=True), max_duration="1ep")
    assert isinstance(run.state.train_data.position, SamplerPosition)
    run.state.load_state_dict({"data": saved, "timestamp": _mid_epoch(run, batches=2)})
    with pytest.warns(UserWarning, match="resuming mid-epoch on 1 ranks from a run on 2"):
        run.fit()

    same = [{"loader": CursorLoader(blobs(64), seed=3).state_dict()}] * 2
    elastic = _trainer(DataSpec(CursorLoader(blobs(64)), position=LoaderState(elastic=True)))
    elastic.state.load_state_dict({"data": _saved_by(same)})
    assert elastic.state.train_data.dataloader.seed == 3


def _saved_by(positions):
    """What DataSpec.state_dict returns for these per-rank positions."""
    import io

    blobs_ = []
    for position in positions:
        buffer = io.BytesIO()
        torch.save(position, buffer)
        blobs_.append(buffer.getvalue())
    return {"ranks": blobs_}


def _mid_epoch(run, batches):
    timestamp = run.state.timestamp.state_dict()
    timestamp.update(batch=batches, batch_in_epoch=batches)
    return timestamp


class Batches:
    """A re-iterable of batches with no state of its own; records what it reads."""

    def __init__(self, count=8):
        self.data, self.count, self.reads = blobs(8 * count), count, []

    def __iter__(self):
        for i in range(self.count):
            self.reads.append(i)
            yield self.data[i * 8 : (i + 1) * 8]


def test_a_stopped_fit_goes_on_in_the_same_process_without_replaying():
    batches = Batches()
    run = _trainer(batches, max_duration="1ep")
    assert isinstance(run.state.train_data.position, ReplayPosition)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        run.fit(duration="3ba")
        run.fit(duration="3ba")
    assert run.state.timestamp.batch == 6
    assert batches.reads == list(range(6))


def test_a_resumed_plain_iterable_replays_and_says_so():
    first = _trainer(Batches(), StopAt(3), max_duration="1ep")
    first.fit()
    batches = Batches()
    resumed = _trainer(batches, max_duration="1ep")
    resumed.state.load_state_dict(copy.deepcopy(first.state.state_dict()))
    with pytest.warns(UserWarning, match="skipping 3 batches by iterating them"):
        resumed.fit()
    assert batches.reads == list(range(8))


class EveryOther(DataPosition):
    """A user's own position: reads every other batch, its offset saved with the run."""

    elastic = True

    def __init__(self):
        self.offset = 0

    def iter_epoch(self, loader, epoch, batches_done):
        for i, batch in enumerate(loader):
            if i % 2 == self.offset % 2 and i // 2 >= batches_done:
                yield batch

    def state_dict(self):
        return {"offset": self.offset}

    def load_state_dict(self, state):
        self.offset = state["offset"]


def test_a_custom_position_is_the_hook_for_any_data():
    position = EveryOther()
    run = _trainer(DataSpec(Batches(), position=position), max_duration="1ep")
    assert run.state.train_data.position is position
    run.state.load_state_dict({"data": _saved_by([{"offset": 1}])})
    assert position.offset == 1
    run.fit()
    assert run.state.timestamp.batch == 4  # batches 1, 3, 5, 7
    with pytest.raises(TypeError, match="position must be a DataPosition"):
        DataSpec(Batches(), position="streaming")
