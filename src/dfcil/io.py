"""Crash-safe file writes."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def _umask() -> int:
    mask = os.umask(0)  # the only way to read it; set straight back
    os.umask(mask)
    return mask


def write_atomic(path: str | os.PathLike, data: bytes | str) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the whole new one, never a part.

    Writes a temporary file in the same directory, fsyncs it, renames it over ``path`` and fsyncs the directory.
    """
    path = Path(path)
    raw = data.encode() if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            os.fchmod(f.fileno(), 0o666 & ~_umask())  # mkstemp's 0600 would hide results from a shared group
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
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
