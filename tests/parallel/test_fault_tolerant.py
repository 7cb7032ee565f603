"""The fault-tolerant strategy on torchft: replica groups that die and rejoin."""

from __future__ import annotations

import sys
from collections import Counter

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from trainkit.core import plugins
from trainkit.parallel import FaultTolerant, FaultTolerantConfig, ReplicaBatches


def test_the_entry_point_resolves():
    assert plugins.load("trainkit.parallel", "fault_tolerant") is FaultTolerant


def test_without_torchft_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchft", None)  # `import torchft` now fails
    with pytest.raises(ImportError, match=r'pip install "trainkit-parallel\[ft\]"'):
        FaultTolerant(replica_group=0).prepare(None)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"replica_group": -1}, "replica_group must be an int >= 0"),
        ({"min_replicas": 0}, "min_replicas must be an int >= 1"),
        ({"timeout": 0}, "timeout must be a positive number of seconds"),
    ],
)
def test_bad_options_are_refused(options, message):
    with pytest.raises(ValueError, match=message):
        FaultTolerantConfig(**options)


def test_a_group_number_is_required(monkeypatch):
    monkeypatch.delenv("REPLICA_GROUP_ID", raising=False)
    with pytest.raises(ValueError, match="set replica_group=N, or REPLICA_GROUP_ID=N"):
        _ = FaultTolerant().replica_group
    monkeypatch.setenv("REPLICA_GROUP_ID", "3")
    assert FaultTolerant().replica_group == 3


class _Stream(IterableDataset):
    def __iter__(self):
        yield from range(4)


@pytest.mark.parametrize(
    ("loader", "message"),
    [
        (DataLoader(_Stream(), batch_size=2), "map-style dataset"),
        (DataLoader(TensorDataset(torch.zeros(8)), batch_size=2, num_workers=2), "num_workers=0"),
        (DataLoader(TensorDataset(torch.zeros(8)), batch_size=None), "batch_size"),
    ],
)
def test_data_the_groups_cannot_share_is_refused(loader, message):
    with pytest.raises((TypeError, ValueError), match=message):
        ReplicaBatches(loader, lambda: (0, 1), seed=0)


def test_batches_follow_the_groups_present_and_repeat_a_failed_step():
    # Three groups in lockstep; the quorum changes step by step and some steps fail (not
    # committed). A group that comes back gets the position of one that stayed, as a
    # restarted group recovers it. Every sample of each epoch is committed exactly once.
    quorums = [[0, 1, 2], [0, 1, 2], [0, 1], [0, 1], [1, 2], [0, 1, 2], [0, 2]]
    fails = {1, 4, 9, 13}
    size = 36  # a multiple of the batch size: no tail smaller than the groups present
    step = 0
    batches = {}
    for group in range(3):

        def quorum(group=group):
            present = quorums[step % len(quorums)]
            return present.index(group), len(present)

        loader = DataLoader(TensorDataset(torch.arange(size)), batch_size=4, shuffle=True)
        batches[group] = ReplicaBatches(loader, quorum, seed=5)
    iterators = {g: iter(b) for g, b in batches.items()}
    seen: list[Counter] = [Counter(), Counter()]
    previous = quorums[-1]
    while True:
        present = quorums[step % len(quorums)]
        leader = batches[next(g for g in present if g in previous)]
        for group in set(present) - set(previous):
            batches[group].load_state_dict(leader.state_dict())
        previous = present
        if leader.epoch == 2:
            break
        epoch, drawn = leader.epoch, {}
        for group in present:
            try:
                drawn[group] = next(iterators[group])[0].tolist()
            except StopIteration:
                iterators[group] = iter(batches[group])
        if not drawn:  # the epoch ended, on every group present alike
            continue
        assert len(drawn) == len(present)
        if step not in fails:
            for group in present:
                batches[group].commit()
                seen[epoch].update(drawn[group])
        step += 1
    assert step > 2 * size // 12  # steps with fewer groups, and failed ones, took more
    for epoch in range(2):
        assert sorted(seen[epoch].elements()) == list(range(size)), epoch
