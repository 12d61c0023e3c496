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
    except OSError as err:
        tmp.unlink(missing_ok=True)
        if err.filename is None:  # a failed write() names no file (a full disk, a file past `ulimit -f`): name it
            raise OSError(err.errno, err.strerror, str(path)) from err
        raise
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


# Folders of a run directory that another program writes (wandb links its debug logs to its cache, outside the
# run; a resumed wandb run adds a folder there, writing through none of them): checked themselves, not their files
FOREIGN_DIRS = ("wandb",)


def links_leaving(folder: str | os.PathLike, foreign: tuple[str, ...] = ()) -> list[tuple[Path, str]]:
    """The symbolic links at any depth inside ``folder`` (none of them followed) that lead outside it, or in a loop,
    each with where it leads. Writing through one would write outside ``folder``: a received run directory's
    ``metrics.jsonl`` linked to a file elsewhere would be truncated and appended to. Folders named in ``foreign``
    (at any depth) hold another program's files, which dfcil never writes through (wandb's, which links its debug
    logs to its cache): each is checked itself, not what it holds."""
    root, found = Path(folder).resolve(), []
    for top, dirs, files in os.walk(folder):  # a link to a folder is listed among dirs, not entered
        names = [*dirs, *files]
        dirs[:] = [d for d in dirs if d not in foreign]  # at any depth: a sweep's runs each have theirs
        for name in names:
            path = Path(top) / name
            if path.is_symlink() and (where := _leads_outside(path, root)) is not None:
                found.append((path, where))
    return found


def _leads_outside(link: Path, root: Path) -> str | None:
    """Where ``link`` leads, if that is outside ``root`` (or nowhere: a loop); None inside."""
    try:
        target = link.resolve()
    except (OSError, RuntimeError):  # a loop of links (RuntimeError before Python 3.13)
        return f"{os.readlink(link)}, a loop"
    return None if target == root or root in target.parents else str(target)


def own_copies(folder: str | os.PathLike, names: tuple[str, ...]) -> list[str]:
    """Give each file ``names`` in ``folder`` that has other names (a hard link: ``cp -al`` copies a run directory
    that way, each file one inode under two names) an inode of its own, the same bytes and modes written beside it
    and renamed over it, so that appending to it or cutting it back writes nothing under the other names (which keep
    what they held). Returns the names given their own copy. Only for a folder no other process writes now (a
    locked run's)."""
    copied = []
    for name in names:
        path = Path(folder) / name
        try:
            path = path.resolve(strict=True)  # a link inside the folder: the file it names (links out are refused)
            info = path.stat()
        except (FileNotFoundError, RuntimeError):
            continue
        if stat.S_ISREG(info.st_mode) and info.st_nlink > 1:
            write_atomic(path, path.read_bytes())
            os.chmod(path, stat.S_IMODE(info.st_mode))
            copied.append(name)
    return copied


def shared_lock_note(lock: str | os.PathLike) -> str:
    """Where a lock file that another process holds has other names (a `cp -al` copy of the directory shares it with
    the original, whose running process then locks the copy out): the way out, to end a refusal with; else ""."""
    try:
        shared = Path(lock).lstat().st_nlink > 1
    except OSError:
        return ""
    if not shared:
        return ""
    return (
        f". {lock} is also another file's name (a hard link, as `cp -al` makes), so the process may be working in "
        f"the directory this one was copied from: if so, delete {lock} here and run the command again"
    )


def check_stays_inside(folder: str | os.PathLike, what: str, fix: str, foreign: tuple[str, ...] = ()) -> None:
    """Raise ``ValueError`` if ``folder`` holds a link that leads outside it (:func:`links_leaving`): whatever dfcil
    writes into a directory it was given stays in it. ``what`` names the folder, ``fix`` ends the message (after
    "replace each link ..., ")."""
    found = links_leaving(folder, foreign)
    if found:
        shown = ", ".join(f"{path.relative_to(folder)} → {target}" for path, target in found[:5])
        more = f" and {len(found) - 5} more" if len(found) > 5 else ""
        raise ValueError(
            f"{what} {folder} holds symbolic links that lead outside it ({shown}{more}): dfcil writes nothing outside "
            f"the directory it is given; replace each link with a copy of what it points to (or delete it), {fix}"
        )


def check_writable_tree(
    folder: str | os.PathLike,
    what: str,
    fix: str,
    dirs: tuple[str, ...] = (),
    files: tuple[str, ...] = (),
    foreign: tuple[str, ...] = (),
) -> None:
    """Raise ``ValueError`` (naming ``what``; ``fix``, the other way out, ends it) before any work unless dfcil can
    write what it writes into the existing directory ``folder``, all of it inside: no link leads out
    (:func:`check_stays_inside`; ``foreign``: sub-folders another program writes), ``folder`` and its sub-folders
    ``dirs`` (where they exist) take new files, and its ``files`` (where they exist) can be appended to in place. A
    read-only file system or a file without write permission is refused here rather than by an ``OSError`` in the
    middle of a run."""
    folder = Path(folder)
    check_stays_inside(folder, what, fix, foreign)
    for sub in (folder, *(folder / d for d in dirs)):
        if sub.is_dir() and not os.access(sub, os.W_OK | os.X_OK):
            part = "" if sub == folder else f" (its folder {sub.name})"
            raise ValueError(f"{what} {folder}{part} is not writable; make it writable, {fix}")
    for name in files:
        if (folder / name).exists() and not os.access(folder / name, os.W_OK):
            raise ValueError(f"{what} {folder} (its file {name}) is not writable; make it writable, {fix}")


def check_output(path: str | os.PathLike, what: str, fix: str, inside: str | os.PathLike | None = None) -> None:
    """Raise ``ValueError`` before any work unless ``path`` is a writable directory or can be created as one
    (:func:`check_creatable_dir`) and, with ``inside`` (a run directory whose own sub-folder it is by default),
    stays inside that directory when its links are followed."""
    check_creatable_dir(path, what, fix)
    if inside is not None:
        root, where = Path(inside).resolve(), Path(path).resolve()
        if where != root and root not in where.parents:
            raise ValueError(f"{what} {path} leads outside {inside} (to {where}); {fix}")


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
