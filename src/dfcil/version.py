"""dfcil's version, in a module of its own so that any module may record it without importing the package's API,
and the revision of the source a result comes from."""

from __future__ import annotations

from pathlib import Path

__version__ = "0.1.0"


def git(*args: str) -> str | None:
    """``git ARGS`` run in this package's folder: its output, or None where the package is no git checkout (an
    installed wheel) or git is missing."""
    import subprocess  # here: the version alone is imported by every command, git only by runs

    try:
        out = subprocess.run(
            ["git", *args], cwd=Path(__file__).parent, capture_output=True, text=True, timeout=10, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def source_revision() -> str:
    """The code that computes a result: the version, and where the package is part of a git checkout the hash of
    its own folder at HEAD (so a commit that changes no source, docs or notes, keeps the revision) and a digest of
    uncommitted changes to it (an edited checkout is another revision)."""
    import hashlib

    tree = git("rev-parse", "HEAD:./")  # the package folder's tree; none where it is not tracked (a wheel)
    if tree is None:
        return __version__
    diff = git("diff", "HEAD", "--", ".") or ""
    return f"{__version__}+{tree}" + (f"+{hashlib.sha256(diff.encode()).hexdigest()[:16]}" if diff else "")
