"""A fault-tolerant run (trainkit-parallel's `fault_tolerant` strategy, on torchft) survives
repeated SIGKILLs of one replica group, and its checkpoints load into a plain run (issue 55).
"""

from __future__ import annotations

from collections import Counter

import torch
from torch.utils.data import DataLoader

from ft_chaos import FEATURES, ChaosRun, dataset, run_chaos
from toy import mlp
from trainkit.checkpoint import Checkpointer
from trainkit.trainer import Trainer


def test_three_groups_train_through_repeated_kills(tmp_path):
    # The done-when: group 2 is SIGKILLed three times, in the middle of a step, and
    # restarted; groups 0 and 1 never stop. Group 0 writes checkpoints, which a plain run
    # loads.
    checkpoints = tmp_path / "checkpoints"
    run = ChaosRun(
        folder=tmp_path,
        groups=3,
        victim=2,
        kill_every=5,
        kills=3,
        checkpoint={"folder": str(checkpoints), "interval": "2ep"},
    )
    results = run_chaos(run)
    survivors, victim = [results[0], results[1]], results[2]
    total = survivors[0].steps[-1]["batch"]
    for result in survivors:
        assert result.incarnations == 1 and result.exit_codes == [0]
        # Every committed step counted once: a skipped step did not advance the timestamp.
        # (A group that joined the first quorum late starts where the others were.)
        batches = [s["batch"] for s in result.steps]
        assert batches == list(range(batches[0], total + 1))
    assert min(r.steps[0]["batch"] for r in survivors) == 1
    assert victim.exit_codes == [-9, -9, -9, 0]
    for incarnation in range(1, 4):
        first = next(s for s in victim.steps if s["inc"] == incarnation)
        assert first["batch"] > 1, "a restarted group resumed where its peers were"
    assert victim.steps[-1]["batch"] == total
    # Bitwise equal weights on every group at the end.
    for result in [*survivors, victim]:
        for name, tensor in survivors[0].weights.items():
            assert torch.equal(result.weights[name], tensor), name
    # Each epoch: every sample exactly once over all groups' committed steps.
    per_epoch: dict[int, Counter] = {}
    for result in results.values():
        for s in result.steps:
            per_epoch.setdefault(s["epoch"], Counter()).update(s["ids"])
    assert sorted(per_epoch) == [0, 1, 2, 3]
    for epoch, counts in per_epoch.items():
        assert sorted(counts.elements()) == list(range(run.samples)), epoch

    # Group 0 wrote the run's checkpoints; a plain run (no torchft) loads the last one.
    last = max(checkpoints.glob("ep4-ba*"), key=lambda p: p.stat().st_mtime)
    model = mlp(features=FEATURES, seed=99)
    trainer = Trainer(
        model=model,
        train_dataloader=DataLoader(dataset(run.samples), batch_size=8, shuffle=True),
        max_duration="5ep",
        callbacks=[Checkpointer(folder=None, load_path=str(last))],
        device="cpu",
        progress_bar=False,
    )
    assert trainer.state.timestamp.batch == total and trainer.state.timestamp.epoch == 4
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, survivors[0].weights[name]), name
    trainer.fit(duration="2ba")  # and trains on, on its own
    assert trainer.state.timestamp.batch == total + 2
