"""`Checkpointer`: save at an interval, keep the newest K, resume automatically.

While it saves (from the start of each ``fit`` to its end) the run holds its folder
(`FolderLock`): a second run there refuses to start, naming the holder. Rotation deletes
only checkpoints whose manifest carries this run's id (kept across resumes).

When ``fit`` is preempted (``state.preemption`` is set at ``BATCH_CHECKPOINT``), it saves
there whatever the interval, waits until the save is published (an asynchronous one too),
and abandons it at the request's deadline (the grace period); when ``fit`` raises
(``FIT_ABORTED``), it publishes the save in flight and lets go of the folder at once.

With ``upload_to_loggers``, rank 0 gives each published checkpoint's folder to the run's
`Logger` (kept from the events, which carry it) before rotating old ones away.
"""

from __future__ import annotations

import atexit
import logging
import secrets
import threading
import time
import weakref
from pathlib import Path
from typing import Any

from trainkit.checkpoint._commit import LATEST, interrupted_saves, remove_checkpoint
from trainkit.checkpoint._common import on_rank0
from trainkit.checkpoint._config import CheckpointerConfig
from trainkit.checkpoint._errors import (
    CheckpointError,
    CheckpointExistsError,
    MissingAlgorithmError,
    StorageError,
)
from trainkit.checkpoint._listing import complete, future_collisions, manifests, rotate
from trainkit.checkpoint._load import load_checkpoint, load_from
from trainkit.checkpoint._lock import FolderLock
from trainkit.checkpoint._manifest import Manifest
from trainkit.checkpoint._names import (
    fill_folder,
    format_name,
    has_fields,
)
from trainkit.checkpoint._owner import current_model_summary, refuse_other_model
from trainkit.checkpoint._save import PendingSave, release_staging, save_to
from trainkit.checkpoint._storage import Storage, is_url, location, open_storage
from trainkit.checkpoint._write import Cancel
from trainkit.core import Callback, Event, Logger, PreemptionRequest, State, Timestamp, dist
from trainkit.core.interval import interval_trigger
from trainkit.core.messages import warn

__all__ = ["Checkpointer", "CheckpointerConfig"]

log = logging.getLogger(__name__)


class Checkpointer(Callback, config=CheckpointerConfig):
    """Saves the run to ``folder`` and resumes it from there.

    ``Checkpointer(folder="runs/a", interval="500ba")`` and
    ``Checkpointer(CheckpointerConfig(folder="runs/a", interval="500ba"))`` are the same;
    see `CheckpointerConfig` for every option.
    """

    config: CheckpointerConfig

    # Loading happens at BEFORE_LOAD; saving at the checkpoint events and at FIT_END.
    required_events = (
        Event.BEFORE_LOAD,
        (Event.BATCH_CHECKPOINT, Event.EPOCH_CHECKPOINT),
        Event.FIT_END,
    )

    def __init__(self, config: CheckpointerConfig | None = None, /, **options: Any) -> None:
        if "weights_only" in options:
            raise TypeError(
                "Checkpointer has no option 'weights_only': use load_weights_only=True to load "
                "only the weights from load_path, or save_weights_only=True to save only them"
            )
        super().__init__(config, **options)
        config = self.config
        self.trigger = interval_trigger(config.interval, at_end=False)
        self.storage: Storage | None = None
        self.folder: Path | str | None = None  # set when the run starts if folder has fields
        if config.folder is not None and not has_fields(config.folder):
            self._open_folder(config.folder)
        self.pending: PendingSave | None = None
        self.saved_at: tuple[int, int] | None = None
        self.loaded_from: Path | str | None = None
        self.run_id = ""
        """This run's id, recorded in every manifest it writes (kept when it resumes)."""
        self.lock: FolderLock | None = None
        """Rank 0's hold on the folder while the run saves."""
        self._cleared = False
        self._checked_existing = False
        self._replaceable: frozenset[str] = frozenset()
        self._fitting = False
        self._cancel: Cancel | None = None
        self._give_up_reason = ""  # set when a preemption's grace period is over
        self._last_name = ""
        self._logger: Logger | None = None  # the run's, for upload_to_loggers

    def _open_folder(self, folder: str) -> Storage:
        self.storage = open_storage(folder, self.config.storage_options)
        self.folder = location(self.storage, "")
        return self.storage

    def _storage_for(self, state: State) -> Storage:
        if self.storage is not None:
            return self.storage
        if self.config.folder is None:
            raise ValueError("this Checkpointer has no folder (folder=None): it only loads")
        world = dist.get_world_size()
        return self._open_folder(
            fill_folder(self.config.folder, run_name=state.run_name, world_size=world)
        )

    def _name(self, state: State) -> str:
        return format_name(
            self.config.name_format,
            timestamp=state.timestamp,
            run_name=state.run_name,
            world_size=dist.get_world_size(),
        )

    # --- loading ---------------------------------------------------------------------------

    def before_load(self, state: State, logger: Logger) -> None:
        self._logger = logger
        config = self.config
        if config.folder is not None:
            self._storage_for(state)
            self._name(state)  # a run_name that cannot name a folder fails here, not later
            reads = config.autoresume or config.load_path == LATEST
            if reads and config.lock and config.lock_wait == 0:
                # About to read the folder: refuse now if a live run holds it (otherwise the
                # refusal comes at fit, without a request to the storage before).
                on_rank0(lambda: self._refuse_if_held(state))
            if reads and not config.overwrite:  # before reading; otherwise at fit, as below
                self._refuse_other_model(state)
        if config.autoresume and config.save_weights_only:
            # Checked here rather than in the config, which takes each field on its own.
            raise ValueError(
                "autoresume=True needs full checkpoints, but save_weights_only=True saves only "
                "the model weights, from which a run cannot resume; drop one of them"
            )
        if config.autoresume:
            found = self._newest_loadable(state)
            self._replaceable = frozenset(on_rank0(lambda: self._newer_than(state.timestamp)))
            if found is not None:
                name, manifest = found
                self.loaded_from = location(self._storage_for(state), name)
                state.resumed_from = str(self.loaded_from)
                self.saved_at = (state.timestamp.epoch, state.timestamp.batch)
                self.run_id = manifest.run_id  # the resumed run goes on under its own id
                return
        if config.load_path is None:
            return
        path = fill_folder(
            config.load_path, run_name=state.run_name, world_size=dist.get_world_size()
        )
        options: dict[str, Any] = {
            "weights_only": config.load_weights_only,
            "strict": config.strict,
            "ignore_keys": config.ignore_keys,
            "exclude_algorithms": config.exclude_algorithms,
            "verify": config.verify,
            "local_dir": config.local_dir,
        }
        if path == LATEST:
            storage = self._storage_for(state)
            load_from(storage, LATEST, state, **options)
            self.loaded_from = location(storage, LATEST)
        else:
            storage_options = config.storage_options if is_url(path) else None
            load_checkpoint(state, path, storage_options=storage_options, **options)
            self.loaded_from = path
        state.resumed_from = str(self.loaded_from)

    def _refuse_other_model(self, state: State) -> None:
        """Refuse a folder whose newest checkpoint is another model's, before reading or
        writing anything there (collective)."""
        storage, mine = self._storage_for(state), current_model_summary(state)
        on_rank0(lambda: refuse_other_model(storage, mine, state.run_name))

    def _newest_loadable(self, state: State) -> tuple[str, Manifest] | None:
        config, storage = self.config, self._storage_for(state)
        names = on_rank0(lambda: complete(storage, newest_first=True, prefer_latest=True))
        for name in names:
            try:
                manifest = load_from(
                    storage,
                    name,
                    state,
                    strict=config.strict,
                    verify=config.verify,
                    local_dir=config.local_dir,
                )
                return name, manifest
            except (StorageError, MissingAlgorithmError):
                # The storage failed, or the run lacks an algorithm: not this checkpoint's
                # fault, so never fall back to older ones (or silently start afresh).
                raise
            except CheckpointError as err:
                if not config.overwrite and name == names[-1]:
                    raise _none_loadable(storage, len(names), err) from err
                warn(
                    f"cannot resume from {location(storage, name)} ({err}); "
                    "trying the previous checkpoint",
                )
        return None

    def _newer_than(self, timestamp: Timestamp) -> list[str]:
        """Rank 0: the complete checkpoints saved after ``timestamp`` (by batch)."""
        assert self.storage is not None, "opened in before_load"
        return [
            name
            for name, manifest in manifests(self.storage)
            if manifest.timestamp.get("batch", 0) > timestamp.batch
        ]

    # --- holding the folder ----------------------------------------------------------------

    def _folder_lock(self, state: State) -> FolderLock:
        if self.lock is None:
            if not self.run_id:
                self.run_id = on_rank0(lambda: secrets.token_hex(8))
            self.lock = FolderLock(
                self._storage_for(state),
                owner=state.run_name,
                run_id=self.run_id,
                lease=self.config.lease,
            )
        return self.lock

    def _refuse_if_held(self, state: State) -> None:
        """Rank 0: fail at once when a live run holds the folder (no waiting asked for)."""
        FolderLock(self._storage_for(state), owner="", run_id="", lease=1).refuse_if_held()

    def _hold(self, state: State) -> None:
        """Take the folder for this run (collective; rank 0 holds the lock)."""
        if not self.run_id:
            self.run_id = on_rank0(lambda: secrets.token_hex(8))
        if not self.config.lock:
            return
        lock = self._folder_lock(state)

        def take() -> str | None:
            if lock.held:
                return None
            taken_over = lock.acquire(wait=self.config.lock_wait)
            lock.start_renewing()
            _held.add(lock)
            return taken_over

        if (taken_over := on_rank0(take)) is not None and dist.get_rank() == 0:
            warn(f"{self.folder}: {taken_over}")

    def _let_go(self) -> None:
        if self.lock is not None and dist.get_rank() == 0:
            self.lock.release()
            _held.discard(self.lock)

    # --- saving ----------------------------------------------------------------------------

    def fit_start(self, state: State, logger: Logger) -> None:
        self._logger = logger
        saves, config = self.config.folder is not None, self.config
        if saves and config.lock and config.lock_wait == 0:
            on_rank0(lambda: self._refuse_if_held(state))  # another run's folder: say so first
        if saves and not config.overwrite and not self._checked_existing:
            self._storage_for(state)
            if not (config.autoresume or config.load_path == LATEST):  # not yet checked
                self._refuse_other_model(state)
            on_rank0(lambda: self._refuse_future_collisions(state))  # before touching it
        self._checked_existing = True
        if saves:
            self._hold(state)
            self._fitting = True

    def _refuse_future_collisions(self, state: State) -> None:
        """Rank 0: raise if the folder holds checkpoints from later in training that this
        run would save over (the same name at the same point), as Composer checks."""
        assert self.storage is not None, "opened in before_load"
        clashes = future_collisions(
            self.storage, self.config.name_format, state, exempt=self._replaceable
        )
        if clashes:
            raise CheckpointExistsError(
                f"{self.folder} already holds checkpoints from later in training that this run "
                f"(now at batch {state.timestamp.batch}) would save over: {', '.join(clashes[:5])}"
                f"{' ...' if len(clashes) > 5 else ''}. Use another folder, delete them, resume "
                "the run that wrote them (autoresume=True), or allow replacing them with "
                "overwrite=True (the Trainer's save_overwrite=True)"
            )

    def batch_checkpoint(self, state: State, logger: Logger) -> None:
        if self.config.folder is None:
            return
        if state.preemption is not None:
            self._save_preempted(state, state.preemption)
        elif self.trigger(state, Event.BATCH_END) and not (state.is_done() or state.stop_requested):
            # The run's last batch is saved at FIT_END instead, once: after the end of its
            # epoch and what algorithms do at the end (SWA puts in its average), which a save
            # here would miss and a second save there would repeat under another name.
            self.save(state)

    def _save_preempted(self, state: State, request: PreemptionRequest) -> None:
        """Save and publish now (after the save in flight), or give up at the deadline."""
        at = (state.timestamp.epoch, state.timestamp.batch)
        log.warning("preempted: saving a checkpoint of batch %d (every rank)", at[1])
        timer = None
        if request.deadline is not None:
            left = request.deadline - time.monotonic()
            self._give_up_reason = "" if left > 0 else "the grace period ended before it began"
            if left > 0:
                reason = f"the {left:.3g} s left of the grace period ran out"
                timer = threading.Timer(left, self._give_up, args=(reason,))
                timer.daemon = True
                timer.start()
        try:
            self.save(state)
            self.wait()  # an asynchronous save too: the process is about to exit
            request.checkpoint = str(location(self._storage_for(state), self._last_name))
        except CheckpointError as err:  # abandoned here or on another rank, or failed
            # Exiting "to be retried" still holds: the run resumes from the previous one.
            request.abandoned = str(err)
            self.saved_at = at  # FIT_END must not try again
            self._cancel = None
            warn(f"preemption checkpoint abandoned: {err}")
        finally:
            if timer is not None:
                timer.cancel()
                timer.join()  # a timer firing right now must not cancel later saves
            self._give_up_reason = ""

    def _give_up(self, reason: str) -> None:
        self._give_up_reason = reason
        self.abandon(reason)

    def epoch_checkpoint(self, state: State, logger: Logger) -> None:
        if self.config.folder is not None and self.trigger(state, Event.EPOCH_END):
            self.save(state)

    def fit_end(self, state: State, logger: Logger) -> None:
        at = (state.timestamp.epoch, state.timestamp.batch)
        try:
            if self.config.folder is not None and self.saved_at != at:
                self.save(state)
            self.wait()
        finally:
            self._fitting = False
            self._let_go()

    def fit_aborted(self, state: State, logger: Logger) -> None:
        """``fit`` is raising: publish the save in flight (it holds a good state) if it can,
        and let go of the folder at once, so another run can take it."""
        self._fitting = False
        try:
            self.wait()
        except Exception as err:  # the error fit raises is the one that matters
            warn(f"the save in flight when fit failed did not finish: {err}")
        finally:
            self._let_go()

    def save(self, state: State) -> PendingSave:
        """Save now (after the previous save, if still running, has finished)."""
        self.wait()
        storage = self._storage_for(state)
        self._hold(state)  # within fit: already held; called on its own: until it is done
        lock = self.lock

        def prepare() -> str:
            if lock is not None:  # another run took the folder: never save over its work
                lock.check()  # lost in the background,
                lock.renew()  # or found now
            if not self._cleared:
                self._clear_interrupted_saves()
                self._cleared = True
            # Named on rank 0: wall-clock fields differ between ranks, the folder must not.
            return self._name(state)

        name = on_rank0(prepare)
        self._last_name = name
        self._cancel = Cancel()
        if self._give_up_reason:  # the grace period ended before this save began
            self._cancel.set(self._give_up_reason)
        pending = save_to(
            storage,
            name,
            state,
            weights_only=self.config.save_weights_only,
            overwrite=self.config.overwrite or name in self._replaceable,
            async_save=self.config.async_save,
            local_dir=self.config.local_dir,
            checksum=self.config.checksum,
            run_id=self.run_id,
            cancel=self._cancel,
        )
        self.saved_at = (state.timestamp.epoch, state.timestamp.batch)
        if self.config.async_save:
            self.pending = pending  # published (and handed on) when it is awaited
        else:
            self._published(pending)
            if not self._fitting:
                self._let_go()
        return pending

    def _clear_interrupted_saves(self) -> None:
        # What saves of an earlier, interrupted run left behind (this run holds the folder,
        # so no other run's save is in progress there). Later saves of this run never leave
        # any: each is awaited (and fails loudly) before the next starts.
        assert self.storage is not None, "opened before the first save"
        for folder in interrupted_saves(self.storage):
            remove_checkpoint(self.storage, folder)

    def abandon(self, reason: str = "abandoned") -> None:
        """Give up the save in progress (from another thread, e.g. when a grace period
        ends): it fails with `SaveAbandoned` at its next write, before it is published, and
        the previous checkpoint stays the latest. Call it on every rank."""
        if self._cancel is not None:
            self._cancel.set(reason)

    def wait(self) -> None:
        """Block until the save in flight (if any) is published; re-raise its error."""
        if self.pending is not None:
            pending, self.pending = self.pending, None
            try:
                self._published(pending)
            finally:
                if not self._fitting:
                    self._let_go()

    def _published(self, pending: PendingSave) -> None:
        """After ``pending`` is published (`wait` raises if it failed or was abandoned):
        give it to the loggers, then delete old checkpoints."""
        published = pending.wait()
        if self.config.upload_to_loggers and dist.get_rank() == 0 and published is not None:
            self._upload(Path(published))
        self._rotate()

    def _upload(self, folder: Path) -> None:
        """Rank 0: give the checkpoint ``folder`` to every logger destination (a
        destination's failure is a warning from the `Logger`; training goes on)."""
        if self._logger is None:
            warn(
                f"upload_to_loggers: {folder} was saved outside a run (no Logger yet), so it "
                "was not given to any logger destination",
            )
            return
        # overwrite: a checkpoint saved again under its name (overwrite=True, or a resumed
        # run redoing lost progress) replaced the old one, so its artifact does too.
        self._logger.upload_folder(f"checkpoints/{folder.name}", folder, overwrite=True)

    def _rotate(self) -> None:
        """Rank 0: delete this run's own checkpoints but the newest ``keep``."""
        if self.config.keep == -1 or dist.get_rank() != 0 or self.storage is None:
            return
        try:
            rotate(self.storage, self.run_id, self.config.keep)
        except CheckpointError as err:
            # Training goes on; the next rotation tries again.
            warn(f"could not remove old checkpoints: {err}")

    def close(self, state: State | None = None, logger: Logger | None = None) -> None:
        try:
            self.wait()
        finally:
            self._let_go()
            if state is not None:
                release_staging(state)


def _none_loadable(storage: Storage, count: int, last: CheckpointError) -> CheckpointError:
    """The folder holds checkpoints and none loads into this run: another run's (one saved
    before manifests recorded the model), or all damaged. Starting afresh there would put
    this run's checkpoints beside them and move ``latest``, so the run stops instead."""
    return CheckpointError(
        f"{location(storage, '')} holds {count} checkpoint(s) and none can be loaded into this "
        f"run (the oldest: {last}): they are another run's (another model or config) or "
        "damaged. Nothing was written there. To start fresh, give this run a folder of its "
        "own (trainkit train: another run_name, config file name or --run-dir; the Trainer: "
        "another save_folder), or set overwrite=True (the Trainer's save_overwrite=True) to "
        "train this run there anyway"
    )


_held: weakref.WeakSet[FolderLock] = weakref.WeakSet()


@atexit.register
def _let_go_at_exit() -> None:
    # A run that ends without close() must not leave its folder looking held by the living.
    for lock in list(_held):
        lock.release()
