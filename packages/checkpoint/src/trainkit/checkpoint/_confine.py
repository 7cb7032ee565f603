"""Files below a folder, reached without ever leaving it.

Every file a load, a verify, an inspect or an export reads, and every file a rotation
deletes, is reached from its folder one name at a time with ``O_NOFOLLOW``: a symbolic
link anywhere below the folder is refused, never followed, and only regular files are
opened. A FIFO, a socket or a device is refused on `os.lstat` before it is opened (and
opened with ``O_NONBLOCK`` in case one replaced the file in between), so nothing ever
blocks on one. The folder itself is where the caller pointed: links in that path are the
caller's own and are followed.

Keys are ``/``-separated names below the folder (``"ep1-ba8/__0_0.distcp"``); a key with an
empty, ``.`` or ``..`` part, a backslash or a NUL is refused before anything is touched.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path

from trainkit.checkpoint._errors import UnsafePathError

__all__ = [
    "atomic_write_below",
    "check_plain",
    "lexists_below",
    "open_below",
    "read_below",
    "remove_below",
    "split_key",
]

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def check_plain(name: object, where: object) -> str:
    """``name`` when it is one plain file name; `UnsafePathError` naming ``where`` otherwise."""
    if (
        not isinstance(name, str)
        or name in {"", ".", ".."}
        or any(c in name for c in "/\\\0")
        or os.path.isabs(name)
    ):
        raise UnsafePathError(
            f"{where} names {name!r}, which is not a plain file name inside the checkpoint "
            "folder (an absolute path, a '..' or a path with separators would reach outside "
            "it); refusing to use it"
        )
    return name


def split_key(key: str, root: object = "") -> list[str]:
    """The names of ``key`` (``"a/b"`` -> ``["a", "b"]``), each checked with `check_plain`."""
    where = f"{root}/{key}" if root else key
    return [check_plain(part, f"the path {where!r}") for part in key.split("/")]


def _kind(mode: int) -> str:
    for test, kind in (
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return kind
    return "not a regular file"


def _refuse(path: object, kind: str) -> UnsafePathError:
    what = "followed" if kind == "a symbolic link" else "opened"
    return UnsafePathError(
        f"{path} is {kind}, not a regular file of the checkpoint folder; it was not {what} "
        "(a checkpoint is read only from regular files inside its folder)"
    )


@contextlib.contextmanager
def _folder(root: Path, parts: list[str], *, create: bool = False) -> Iterator[int]:
    """A descriptor of ``root/parts...``, each part opened without following links."""
    if create:
        root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for i, part in enumerate(parts):
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, dir_fd=fd)
            try:
                inner = os.open(part, _DIR, dir_fd=fd)
            except OSError as err:
                if err.errno in (errno.ELOOP, errno.ENOTDIR):
                    mode = os.stat(part, dir_fd=fd, follow_symlinks=False).st_mode
                    if not stat.S_ISREG(mode):  # a link, a FIFO, ...: refused by name
                        raise _refuse(root.joinpath(*parts[: i + 1]), _kind(mode)) from None
                raise
            os.close(fd)
            fd = inner
        yield fd
    finally:
        os.close(fd)


def open_below(root: Path, key: str) -> int:
    """A read-only descriptor of the regular file ``root/key`` (the caller closes it).

    Raises `FileNotFoundError` when it is missing, `UnsafePathError` naming the path when
    it (or a folder on the way) is a link, or it is not a regular file.
    """
    *folders, name = split_key(key, root)
    with _folder(root, folders) as parent:
        mode = os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode
        if not stat.S_ISREG(mode):
            raise _refuse(root / key, _kind(mode))
        try:
            fd = os.open(name, _FILE, dir_fd=parent)
        except OSError as err:
            if err.errno == errno.ELOOP:  # replaced by a link since the lstat
                raise _refuse(root / key, "a symbolic link") from None
            raise
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):  # replaced by a FIFO or a device since the lstat
        os.close(fd)
        raise _refuse(root / key, _kind(mode))
    return fd


def read_below(root: Path, key: str) -> bytes:
    """The content of the regular file ``root/key`` (see `open_below`)."""
    with os.fdopen(open_below(root, key), "rb", closefd=True) as stream:
        return stream.read()


def lexists_below(root: Path, key: str) -> bool:
    """Whether ``root/key`` exists (a link counts; links on the way are refused)."""
    *folders, name = split_key(key, root)
    try:
        with _folder(root, folders) as parent:
            os.stat(name, dir_fd=parent, follow_symlinks=False)
    except (FileNotFoundError, NotADirectoryError):
        return False
    return True


def remove_below(root: Path, key: str) -> None:
    """Delete ``root/key``: a file or link is unlinked (a link's target is never touched),
    a folder removed with everything in it (links inside are unlinked, not followed).
    Nothing happens when it is missing."""
    *folders, name = split_key(key, root)
    try:
        with _folder(root, folders) as parent:
            mode = os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode
            if stat.S_ISDIR(mode):
                shutil.rmtree(name, dir_fd=parent)
            else:
                os.unlink(name, dir_fd=parent)
    except FileNotFoundError:
        return


def atomic_write_below(root: Path, key: str, data: bytes) -> None:
    """Write ``data`` to ``root/key`` so that readers see the old or the new content, never a
    mix (a temporary file, fsync, rename, fsync of the folder); missing folders on the way
    are created, links on the way refused."""
    *folders, name = split_key(key, root)
    with _folder(root, folders, create=True) as parent:
        tmp = f".{name}.{secrets.token_hex(4)}.tmp"
        fd = os.open(
            tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=parent
        )
        try:
            with os.fdopen(fd, "wb") as stream:
                stream.write(data)
                stream.flush()
                os.fsync(stream.fileno())
            os.replace(tmp, name, src_dir_fd=parent, dst_dir_fd=parent)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=parent)
            raise
        os.fsync(parent)
