"""Checksummed downloads and safe archive extraction."""

from __future__ import annotations

import os
import shutil
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path, PurePosixPath

from dfcil.errors import DatasetError


def _check_member(member: tarfile.TarInfo, links: set[PurePosixPath]) -> None:
    """Refuse a member that could write or point outside the destination. Checked on names alone, so links are
    held to a strict rule (a dataset archive has no need of more): no absolute or ``..`` link targets, and no
    member below a symbolic link (``links``, the archive's symlinks so far)."""
    name = PurePosixPath(member.name)
    if name.is_absolute() or ".." in name.parts:
        raise DatasetError(f"unsafe archive member {member.name!r}: absolute path or '..' component")
    if not (member.isfile() or member.isdir() or member.issym() or member.islnk()):
        raise DatasetError(f"unsafe archive member {member.name!r}: special file (device, fifo)")
    if any(parent in links for parent in name.parents):
        raise DatasetError(f"unsafe archive member {member.name!r}: lies below a symbolic link of the archive")
    if member.issym() or member.islnk():
        target = PurePosixPath(member.linkname)
        if target.is_absolute() or ".." in target.parts:
            raise DatasetError(
                f"unsafe archive member {member.name!r}: link to {member.linkname!r} may leave the target"
            )
        if member.issym():
            links.add(name)


def safe_extract(archive: str | Path, dest: str | Path) -> list[str]:
    """Extract a tar archive into ``dest``, refusing members that would land outside it.

    Members with absolute paths, ``..`` components, links pointing outside ``dest`` or special files make the
    whole extraction fail before anything is written. Files are extracted into a temporary directory next to
    their destination and moved in afterwards, so a failure leaves no partial tree behind.

    Returns:
        The top-level names that were created in ``dest``.
    """
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    try:
        with tarfile.open(archive) as tar:
            members, links = tar.getmembers(), set()
            for member in members:
                _check_member(member, links)
            tmp = Path(tempfile.mkdtemp(prefix=".extract-", dir=dest))
            try:
                if hasattr(tarfile, "data_filter"):  # Python ≥ 3.12 and recent 3.10/3.11 patch releases
                    tar.extractall(tmp, members=members, filter="data")
                else:  # pragma: no cover - older interpreters; members were checked above
                    tar.extractall(tmp, members=members)
                tops = sorted({PurePosixPath(m.name).parts[0] for m in members if PurePosixPath(m.name).parts})
                for top in tops:
                    target = dest / top
                    if target.exists():
                        shutil.rmtree(target) if target.is_dir() else target.unlink()
                    os.replace(tmp / top, target)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    except (tarfile.TarError, EOFError, OSError) as err:
        raise DatasetError(f"cannot extract {str(archive)!r}: {err}. Delete it and download again.") from err
    return tops


Downloader = Callable[[str, str, object], None]


def fetch(url: str, known_hash: str, dest_dir: str | Path, fname: str, downloader: Downloader | None = None) -> Path:
    """Download ``url`` into ``dest_dir/fname`` (unless present with the right hash) and verify its checksum.

    Args:
        url: where to get the file.
        known_hash: ``"md5:..."`` or ``"sha256:..."``.
        dest_dir: directory to keep the file in.
        fname: file name to store it under.
        downloader: a pooch downloader (``(url, output_file, pooch) -> None``); tests pass one that copies a
            local file.
    """
    import pooch

    try:
        path = pooch.retrieve(
            url, known_hash=known_hash, fname=fname, path=str(dest_dir), downloader=downloader, progressbar=False
        )
    except ValueError as err:  # pooch raises ValueError on a hash mismatch and removes the bad file
        raise DatasetError(f"download of {url} failed its checksum ({known_hash}): {err}") from err
    except Exception as err:  # network errors come from requests/urllib and vary by backend
        raise DatasetError(
            f"cannot download {url}: {err}. Download it by hand into {dest_dir} or point --data.root to a copy."
        ) from err
    return Path(path)
