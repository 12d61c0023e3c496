"""Fingerprints of the sources a decoded-image cache is built from, so that a cache whose source changed is told
apart: an archive by its bytes, a folder of images by its files' paths, sizes and modification times."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path


def fingerprint_file(path: Path) -> str:
    """SHA-256 of a file's bytes (an archive the cache is built from)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return "sha256:" + digest.hexdigest()


def fingerprint_files(root: Path, files: Sequence[Path]) -> str:
    """A digest of ``files``' paths relative to ``root``, sizes and modification times: a folder of images changes
    its fingerprint when a file is added, removed, replaced or edited, without reading every image."""
    digest = hashlib.sha256()
    for f in sorted(files):
        st = f.stat()
        digest.update(f"{f.relative_to(root)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return "stat-sha256:" + digest.hexdigest()
