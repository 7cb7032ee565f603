"""A run's hold on its checkpoint folder: the lock file ``.trainkit-lock``.

Two runs saving into one folder would overwrite each other's checkpoints (and clear each
other's saves in progress as interrupted). So a run takes the folder before it saves: the
lock file names it (the run's name and id, host, pid, the process's start) and holds a
lease that a background thread renews. Another run refuses to start there, naming the
holder, unless the holder is gone:

- on the same machine, its process is dead (or its pid now belongs to another process);
- elsewhere, its lease expired (it stopped renewing it: it died, or lost the storage).

A stale lock is taken over with a warning. The lock is changed only by conditional writes
(`ConditionalStorage`): under ``flock`` on a file system, with ``If-None-Match`` /
``If-Match`` requests on S3; so of two runs starting together exactly one gets it. On a
storage without conditional writes the lock is best-effort (write, then read back).
Releasing deletes the lock file (an empty one is free too); on a file system a process
that locked a file deleted meanwhile starts again on the file that has the name.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import secrets
import socket
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import asdict, dataclass

from trainkit.checkpoint._errors import FolderLockedError
from trainkit.checkpoint._storage import ConditionalStorage, Storage, location

__all__ = ["LOCK", "FolderLock", "Holder"]

LOCK = ".trainkit-lock"
_held_here: set[str] = set()  # tokens of the locks this process holds
_POLL = 0.5


def _read_text(path: str) -> str:
    try:
        with open(path) as stream:
            return stream.read()
    except OSError:
        return ""


def process_start(pid: int) -> str:
    """Which process ``pid`` is: boot id and start time (Linux); "" where unknown."""
    stat = _read_text(f"/proc/{pid}/stat")
    if not stat:
        return ""
    fields = stat.rsplit(")", 1)[-1].split()
    boot = _read_text("/proc/sys/kernel/random/boot_id").strip()
    return f"{boot}:{fields[19]}" if len(fields) > 19 else ""


def _boot_id() -> str:
    return _read_text("/proc/sys/kernel/random/boot_id").strip()


@dataclass(frozen=True)
class Holder:
    """Who holds a folder, as its lock file says."""

    owner: str
    run_id: str
    host: str
    boot: str
    pid: int
    process: str
    token: str
    acquired: float
    expires: float

    def describe(self) -> str:
        when = datetime.datetime.fromtimestamp(self.acquired, datetime.UTC)
        until = datetime.datetime.fromtimestamp(self.expires, datetime.UTC)
        return (
            f"run {self.owner!r} (pid {self.pid} on host {self.host}, since "
            f"{when:%Y-%m-%d %H:%M:%S} UTC, lease renewed until {until:%H:%M:%S} UTC)"
        )

    def dead(self, now: float) -> str | None:
        """Why this holder is gone (in words), or None while it may still be running."""
        if self.token in _held_here:
            return None  # another run of this very process
        if self.host == socket.gethostname() and self.boot == _boot_id():
            if self.pid == os.getpid():
                return "its pid is this process's, so it is an earlier, dead process"
            if not _alive(self.pid):
                return f"process {self.pid} is dead"
            if self.process and process_start(self.pid) not in ("", self.process):
                return f"pid {self.pid} now belongs to another process"
            return None
        if now > self.expires:
            return f"its lease expired {now - self.expires:.0f} s ago"
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _parse(data: bytes) -> Holder | None:
    if not data.strip():
        return None
    try:
        return Holder(**json.loads(data))
    except (ValueError, TypeError):
        # Not ours, or torn by a storage without conditional writes: nobody to name.
        return Holder("unknown", "", "?", "", -1, "", "unreadable", 0.0, 0.0)


class FolderLock:
    """Rank 0's hold on ``storage``'s root for the run ``owner`` (id ``run_id``).

    ``lease``: seconds the hold lasts without renewal; `start_renewing` renews it every
    third of that in a background thread. ``clock`` gives wall-clock seconds (tests inject
    one).
    """

    def __init__(
        self,
        storage: Storage,
        *,
        owner: str,
        run_id: str,
        lease: float,
        clock: Callable[[], float] = time.time,
    ):
        self.storage, self.owner, self.run_id = storage, owner, run_id
        self.lease, self.clock = lease, clock
        self.token = secrets.token_hex(8)
        # Once this object is gone its run is too: its lock is then stale even here.
        weakref.finalize(self, _held_here.discard, self.token)
        self.held = False
        self.lost: FolderLockedError | None = None
        self._stop = threading.Event()
        self._mutex = threading.Lock()
        self._renewer: threading.Thread | None = None
        self.where = location(storage, LOCK)

    # --- the lock file ---------------------------------------------------------------------

    def _mine(self) -> bytes:
        now = self.clock()
        me = Holder(
            owner=self.owner,
            run_id=self.run_id,
            host=socket.gethostname(),
            boot=_boot_id(),
            pid=os.getpid(),
            process=process_start(os.getpid()),
            token=self.token,
            acquired=now,
            expires=now + self.lease,
        )
        return json.dumps(asdict(me), indent=1).encode()

    def _read(self) -> tuple[Holder | None, str | None]:
        if isinstance(self.storage, ConditionalStorage):
            data, version = self.storage.read_versioned(LOCK)
            return _parse(data), version
        try:
            data = self.storage.read_bytes(LOCK)
        except FileNotFoundError:
            return None, None
        return _parse(data), data.decode(errors="replace")

    def _write(self, data: bytes, version: str | None) -> bool:
        if isinstance(self.storage, ConditionalStorage):
            return self.storage.write_if(LOCK, data, version)
        # Best-effort: the read-check-write is not atomic on this storage.
        self.storage.write_bytes(LOCK, data)
        return self.storage.read_bytes(LOCK) == data

    # --- taking, keeping, giving back ------------------------------------------------------

    def acquire(self, wait: float = 0.0) -> str | None:
        """Take the folder; returns why a stale holder's lock was taken over (else None).

        Raises `FolderLockedError` naming the holder when it is alive, after waiting up to
        ``wait`` seconds for it to let go.
        """
        deadline = time.monotonic() + wait
        while True:
            holder, version = self._read()
            reason = None if holder is None else holder.dead(self.clock())
            if holder is not None and holder.token == self.token:
                reason = None
            elif holder is not None and reason is None:
                if time.monotonic() < deadline:
                    time.sleep(min(_POLL, max(0.0, deadline - time.monotonic())))
                    continue
                raise self._held_by(holder)
            if self._write(self._mine(), version):
                self.held = True
                _held_here.add(self.token)
                if holder is not None and holder.token != self.token:
                    return f"took over the lock of {holder.describe()}: {reason}"
                return None
            # Someone changed the lock between our read and write: look again.

    def _held_by(self, holder: Holder) -> FolderLockedError:
        return FolderLockedError(
            f"{self.where}: the checkpoint folder is held by {holder.describe()}; two runs "
            "saving there would overwrite each other's checkpoints. Use another folder, stop "
            "that run, or wait for it (the Checkpointer's lock_wait); a lock whose holder "
            "died is taken over by itself"
        )

    def refuse_if_held(self) -> None:
        """Raise `FolderLockedError` naming the holder when a live run holds the folder
        (writes nothing)."""
        if (holder := self.holder()) is not None:
            raise self._held_by(holder)

    def renew(self) -> None:
        """Extend the lease; `FolderLockedError` when another run took the folder meanwhile."""
        with self._mutex:  # the background renewals and a save's own never interleave
            if not self.held:
                return
            for _ in range(3):  # a write that lost a race with nobody but a reader: retry
                holder, version = self._read()
                if holder is None or holder.token != self.token:
                    break
                if self._write(self._mine(), version):
                    return
            self.held = False
            _held_here.discard(self.token)
            taker = "nobody" if holder is None else holder.describe()
            self.lost = FolderLockedError(
                f"{self.where}: this run lost its hold on the checkpoint folder (now held by "
                f"{taker}; its lease may have expired while it could not renew it); it saves "
                "nothing more there"
            )
            raise self.lost

    def start_renewing(self) -> None:
        """Renew the lease every third of it in a background thread until `release`."""
        if self._renewer is not None:
            return
        self._stop.clear()

        def run() -> None:
            while not self._stop.wait(self.lease / 3):
                with contextlib.suppress(Exception):  # a lost lock is kept in self.lost
                    self.renew()
                if self.lost is not None:
                    return

        self._renewer = threading.Thread(target=run, name="trainkit-lock-lease", daemon=True)
        self._renewer.start()

    def release(self) -> None:
        """Give the folder back (when still ours); stops the renewals."""
        self._stop.set()
        if self._renewer is not None and self._renewer is not threading.current_thread():
            self._renewer.join()
        self._renewer = None
        if not self.held:
            return
        self.held = False
        _held_here.discard(self.token)
        with contextlib.suppress(Exception):  # the next run takes a stale lock over anyway
            holder, version = self._read()
            if holder is None or holder.token != self.token:
                return
            if isinstance(self.storage, ConditionalStorage):
                assert version is not None, "a lock file that was read has a version"
                self.storage.delete_if(LOCK, version)
            else:
                self.storage.delete(LOCK)

    def check(self) -> None:
        """Raise the error that took the folder from this run, if any."""
        if self.lost is not None:
            raise self.lost

    def holder(self) -> Holder | None:
        """Whoever holds the folder now, when alive (None when free or stale)."""
        holder, _ = self._read()
        if holder is None or holder.token == self.token or holder.dead(self.clock()):
            return None
        return holder
