"""Crash-safe file writes."""

from __future__ import annotations

import json
import os
import secrets
import stat
from pathlib import Path
from typing import Any


def remove_temporaries(folder: Path) -> list[Path]:
    """Remove the temporary files that :func:`write_atomic` left in ``folder`` when its process was killed
    mid-write (``.<name>.<16 hex>.tmp``); only for a folder no other process writes now (a locked run's)."""
    removed = []
    for tmp in folder.glob(".*.tmp") if folder.is_dir() else []:
        stem = tmp.name[:-4]
        if len(stem) > 17 and stem[-17] == "." and all(c in "0123456789abcdef" for c in stem[-16:]):
            tmp.unlink(missing_ok=True)
            removed.append(tmp)
    return removed


def _create_temp(path: Path) -> tuple[int, Path]:
    """A new, uniquely named file beside ``path``, opened for writing with the modes an ordinary file gets (0666
    less the umask; ``tempfile.mkstemp`` makes 0600, which would hide a run's results from a shared group)."""
    while True:
        tmp = path.parent / f".{path.name}.{secrets.token_hex(8)}.tmp"
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), tmp
        except FileExistsError:  # pragma: no cover - a 64-bit name collision
            continue


def write_atomic(path: str | os.PathLike, data: bytes | str) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the whole new one, never a part.

    Writes a temporary file in the same directory, fsyncs it, renames it over ``path`` and fsyncs the directory.
    """
    path = Path(path)
    raw = data.encode() if isinstance(data, str) else data
    fd, tmp = _create_temp(path)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def check_creatable_dir(path: str | os.PathLike, what: str, fix: str) -> None:
    """Raise ``ValueError`` (naming ``what`` and ``fix``) unless ``path`` is a writable directory or can be created
    as one: its nearest existing ancestor must be a writable directory."""
    path = Path(path).expanduser().absolute()
    if path.exists():
        if not path.is_dir():
            raise ValueError(f"{what} {path} exists and is not a directory; {fix}")
        if not os.access(path, os.W_OK | os.X_OK):
            raise ValueError(f"{what} {path} is not writable; {fix}")
        return
    parent = path.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"{what} {path} cannot be created ({parent} is not a writable directory); {fix}")


def fsync_dir(path: str | os.PathLike) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def write_json(path: str | os.PathLike, value: Any) -> None:
    write_atomic(path, json.dumps(value, indent=2) + "\n")


class NotARegularFile(OSError):
    """A path that names a FIFO, a device, a socket or a directory where a file was expected."""


def read_regular_text(path: str | os.PathLike) -> str:
    """The text of the regular file ``path`` (a link to one is followed). Anything else (a FIFO, which would block
    the reader until a writer comes, a device, a directory) raises :class:`NotARegularFile` without waiting: the
    file is opened non-blocking and checked before it is read.

    Raises:
        NotARegularFile: ``path`` is no regular file.
        OSError: it cannot be read.
        UnicodeDecodeError: it is not UTF-8 text.
    """
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = "a FIFO" if stat.S_ISFIFO(mode) else "a directory" if stat.S_ISDIR(mode) else "not a regular file"
            raise NotARegularFile(f"{path} is {kind}, not a file")
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read().decode("utf-8")
    finally:
        os.close(fd)
