"""`FaultTolerant`: data parallel across replica groups that fail and rejoin (torchft).

Each step, torchft's Manager forms a quorum of the replica groups alive (through the
lighthouse), averages the gradients over them on a process group it rebuilds when the
quorum changes, and votes whether the step is committed: a step during which a group died
is skipped by every group, and the others go on with the next one. A group that starts
(or restarts) gets the weights, optimizer and scheduler state, the timestamp and the data
position from a healthy group at its first quorum (live recovery: from memory, not from a
checkpoint), then trains with the others.
"""

from __future__ import annotations

import datetime
import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from trainkit.core import ParallelStrategy, Precision, State, Timestamp
from trainkit.parallel._common import check_not_wrapped, require_process_group
from trainkit.parallel._ft_data import ReplicaBatches

__all__ = ["FaultTolerant", "FaultTolerantConfig", "import_torchft"]

INSTALL_HINT = 'pip install "trainkit-parallel[ft]"'
REPLICA_GROUP_ENV = "REPLICA_GROUP_ID"
"""torchft's variable for a group's number; `trainkit launch --ft-groups` sets it."""
LIGHTHOUSE_ENV = "TORCHFT_LIGHTHOUSE"
"""torchft's variable for the lighthouse's address; `trainkit launch --ft-groups` sets it."""


@dataclass(kw_only=True)
class FaultTolerantConfig:
    """The options of `FaultTolerant`."""

    replica_group: int | None = None
    """This replica group's number (0, 1, ...), unique among the run's groups. None: read
    from ``REPLICA_GROUP_ID``, which ``trainkit launch --ft-groups N`` sets for each group."""
    lighthouse: str | None = None
    """The lighthouse's address, ``http://HOST:PORT``. None: read from
    ``TORCHFT_LIGHTHOUSE``, which ``trainkit launch --ft-groups`` sets."""
    min_replicas: int = 1
    """A step is committed only when at least this many groups take part in it."""
    timeout: float = 30.0
    """Seconds a gradient all-reduce, a commit vote or a recovery may take; past it the
    step fails (and is skipped by every group)."""
    quorum_timeout: float = 60.0
    """Seconds to wait for a quorum of groups."""
    hostname: str | None = None
    """The address other groups reach this group at (its store and recovery server). None:
    this machine's host name."""

    def __post_init__(self) -> None:
        if self.replica_group is not None and (
            not isinstance(self.replica_group, int) or self.replica_group < 0
        ):
            raise ValueError(
                f"replica_group must be an int >= 0 (or None: from {REPLICA_GROUP_ENV}), "
                f"got {self.replica_group!r}"
            )
        if not isinstance(self.min_replicas, int) or self.min_replicas < 1:
            raise ValueError(f"min_replicas must be an int >= 1, got {self.min_replicas!r}")
        for name in ("timeout", "quorum_timeout"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or value <= 0:
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")


def import_torchft() -> Any:
    """The ``torchft`` module; raises `ImportError` with the install hint when it is missing."""
    try:
        import torchft
    except ImportError as error:
        raise ImportError(
            "the fault-tolerant strategy (FaultTolerant, 'fault_tolerant') needs torchft, "
            f"which is not installed: {INSTALL_HINT}"
        ) from error
    return torchft


class FaultTolerant(ParallelStrategy, config=FaultTolerantConfig):
    """Data parallel over replica groups that may die and rejoin, on torchft.

    Each group is one process (``trainkit launch --ft-groups N -n 1``); the groups train on
    disjoint parts of each step's samples, drawn after the step's quorum from one order
    they share (`ReplicaBatches`: the training data must be a map-style `DataLoader`
    with ``num_workers=0``; its ``batch_size`` is per group). A step that is not committed
    is not counted by the loop (`step_committed`): the timestamp does not advance, no
    BATCH_END fires, and its samples come again. Samples and tokens in the timestamp are
    this group's.
    """

    config: FaultTolerantConfig
    needs_process_group = True

    def __init__(self, config: FaultTolerantConfig | None = None, /, **options: Any) -> None:
        super().__init__(config, **options)
        self.manager: Any = None
        """torchft's `Manager`, once `prepare` has run."""
        self.batches: ReplicaBatches | None = None
        self._state: State | None = None
        self._committed = True
        self._store: Any = None

    @property
    def data_parallel_size(self) -> int:
        """1: each group counts its own samples (the groups present change step by step)."""
        return 1

    @property
    def step_committed(self) -> bool:
        """Whether every group in the quorum took the last step."""
        return self._committed

    @property
    def replica_group(self) -> int:
        """This group's number (the config's, else ``REPLICA_GROUP_ID``)."""
        if self.config.replica_group is not None:
            return self.config.replica_group
        value = os.environ.get(REPLICA_GROUP_ENV)  # torchft's launch convention
        if value is None or not value.isdigit():
            raise ValueError(
                f"the fault-tolerant strategy needs this replica group's number: set "
                f"replica_group=N, or {REPLICA_GROUP_ENV}=N (got {value!r}); "
                "`trainkit launch --ft-groups` sets it for each group"
            )
        return int(value)

    def prepare(self, state: State) -> None:
        """Start this group's Manager and take over the training data (`ReplicaBatches`)."""
        torchft = import_torchft()
        world = require_process_group("FaultTolerant")
        if world != 1:
            raise ValueError(
                f"the fault-tolerant strategy runs one process per replica group, and this "
                f"group has {world}: launch each group with -n 1 (`trainkit launch "
                "--ft-groups N -n 1`)"
            )
        check_not_wrapped(state.model, "FaultTolerant")
        if state.train_data is None:
            raise ValueError(
                "the fault-tolerant strategy needs the training data when the Trainer is "
                "built: pass train_dataloader to Trainer(...)"
            )
        self._state = state
        self.batches = ReplicaBatches(state.train_data.dataloader, self._quorum, state.seed)
        self.manager = self._start_manager(torchft)
        state.train_data.dataloader = self.batches

    def _start_manager(self, torchft: Any) -> Any:
        from torchft.process_group import ProcessGroupGloo

        config = self.config
        lighthouse = config.lighthouse or os.environ.get(LIGHTHOUSE_ENV)
        if not lighthouse:
            raise ValueError(
                "the fault-tolerant strategy needs the lighthouse's address: set "
                f"lighthouse='http://HOST:PORT', or {LIGHTHOUSE_ENV}; `trainkit launch "
                "--ft-groups` starts a lighthouse and sets it for each group"
            )
        host = config.hostname or socket.gethostname()
        timeout = datetime.timedelta(seconds=config.timeout)
        # The group's own store, which the lighthouse hands to the other groups for the
        # gradient process group; the OS picks its port.
        self._store = dist.TCPStore(host, 0, is_master=True, wait_for_workers=False)
        return torchft.Manager(
            pg=ProcessGroupGloo(timeout=timeout),
            load_state_dict=self._load_state_dict,
            state_dict=self._state_dict,
            min_replica_size=config.min_replicas,
            use_async_quorum=False,  # recover before the forward, in the quorum
            timeout=timeout,
            quorum_timeout=datetime.timedelta(seconds=config.quorum_timeout),
            connect_timeout=timeout,
            rank=0,
            world_size=1,
            store_addr=host,
            store_port=self._store.port,
            lighthouse_addr=lighthouse,
            replica_id=f"trainkit_ft_{self.replica_group}",
            hostname=host,
        )

    def precision_for(self, precision: Precision) -> Precision:
        """``precision`` with a step that averages gradients over the groups and votes."""
        return _CommittingPrecision(precision, self)

    def _quorum(self) -> tuple[int, int]:
        # Called by ReplicaBatches before each step; a recovering group loads its state here.
        assert self._state is not None
        committed = self._state.timestamp.batch
        if self.manager.current_step() != committed:
            # Loaded from a checkpoint: the quorum must see this group as that far along,
            # so that the groups that start from nothing recover from it (not the reverse).
            self.manager.load_state_dict(
                {"step": committed, "batches_committed": self.manager.batches_committed()}
            )
        self.manager.start_quorum()
        rank = self.manager.participating_rank()
        return (rank if rank is not None else 0), max(1, self.manager.num_participants())

    @torch.no_grad()
    def average_gradients(self, optimizers: Sequence[torch.optim.Optimizer]) -> None:
        """Average the gradients over the quorum's groups, each weighted by its samples."""
        assert self.batches is not None and self.manager is not None
        params = [p for o in optimizers for g in o.param_groups for p in g["params"]]
        params = [p for p in params if p.requires_grad]
        share = self.batches.local_share
        for dtype in sorted({p.dtype for p in params}, key=str):
            group = [p for p in params if p.dtype == dtype]
            flat = torch.cat([_grad(p).reshape(-1) for p in group]) * share
            self.manager.allreduce(flat, reduce_op=dist.ReduceOp.SUM).wait()
            offset = 0
            for param in group:
                size = param.numel()
                param.grad = flat[offset : offset + size].view_as(param).clone()
                offset += size

    def vote(self) -> bool:
        """torchft's commit vote for this step; the data position moves on if it passed."""
        assert self.batches is not None and self.manager is not None
        self._committed = bool(self.manager.should_commit())
        if self._committed:
            self.batches.commit()
        return self._committed

    def _state_dict(self) -> dict[str, Any]:
        # What a recovering group needs: read from a healthy group during the quorum.
        state, batches = self._state, self.batches
        assert state is not None and batches is not None
        return {
            "model": self.unwrap(state.model).state_dict(),
            "optimizers": [o.state_dict() for o in state.optimizers],
            "schedulers": [s.state_dict() for s in state.schedulers],
            "precision": state.precision.state_dict(),
            "timestamp": state.timestamp.state_dict(),
            "data": batches.state_dict(),
        }

    def _load_state_dict(self, saved: dict[str, Any]) -> None:
        state, batches = self._state, self.batches
        assert state is not None and batches is not None
        self.unwrap(state.model).load_state_dict(saved["model"])
        for optimizer, optimizer_state in zip(state.optimizers, saved["optimizers"], strict=True):
            optimizer.load_state_dict(optimizer_state)
        for scheduler, scheduler_state in zip(state.schedulers, saved["schedulers"], strict=True):
            scheduler.load_state_dict(scheduler_state)
        state.precision.load_state_dict(saved["precision"])
        state.timestamp = Timestamp.from_state_dict(saved["timestamp"])
        batches.load_state_dict(saved["data"])


def _grad(param: nn.Parameter) -> torch.Tensor:
    # A parameter without a gradient in this step adds zeros (every group sends as many).
    return param.grad if param.grad is not None else torch.zeros_like(param)


class _CommittingPrecision(Precision):
    """A precision whose step averages gradients over the groups, votes, and steps only
    when the step is committed; everything else is the wrapped precision's."""

    def __init__(self, inner: Precision, strategy: FaultTolerant) -> None:
        super().__init__(inner.device)
        self.inner, self.strategy = inner, strategy
        self.name = inner.name

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        return self.inner.autocast_dtype

    @property
    def scales_loss(self) -> bool:
        return self.inner.scales_loss

    def autocast(self) -> Any:
        return self.inner.autocast()

    def backward(self, loss: torch.Tensor) -> None:
        self.inner.backward(loss)

    def unscale_gradients(self, optimizer: torch.optim.Optimizer) -> None:
        self.inner.unscale_gradients(optimizer)

    def step(self, optimizers: Sequence[torch.optim.Optimizer]) -> None:
        self.strategy.average_gradients(optimizers)
        if self.strategy.vote():
            self.inner.step(optimizers)

    def reset_after_oom(self) -> None:
        self.inner.reset_after_oom()

    def state_dict(self) -> dict[str, Any]:
        return self.inner.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.inner.load_state_dict(state)
