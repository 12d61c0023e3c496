"""Console output: progress bars (tqdm), one per phase on a terminal and silent when output is not a TTY (logs, CI,
SLURM), and the log lines of the ``dfcil`` logger."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any

from tqdm.auto import tqdm

ProgressFactory = Callable[..., Any]


def make_progress(enabled: bool | None = None) -> ProgressFactory:
    """A factory ``(total, desc, initial=0, unit="it") -> tqdm``.

    Args:
        enabled: True/False forces bars on/off; None shows them only when stderr is a terminal.
    """
    disable = None if enabled is None else not enabled

    def factory(total: int, desc: str, initial: int = 0, unit: str = "it") -> tqdm:
        return tqdm(
            total=total, desc=desc, initial=initial, unit=unit, disable=disable, leave=False, dynamic_ncols=True
        )

    return factory


class _Stderr(logging.StreamHandler):
    """A handler that writes to whatever ``sys.stderr`` is when a line is logged (a redirect, a notebook's, a
    test's capture), not to the stream it was when the handler was made, which may be closed by then."""

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:  # StreamHandler sets it; the property always answers sys.stderr
        pass


def log_to_console() -> None:
    """Print the ``dfcil`` logger's lines from INFO up to the console (stderr), with the time, and not through the
    root logger: what every command does first. Once per process; later calls change nothing."""
    log = logging.getLogger("dfcil")
    if not log.handlers:
        handler = _Stderr()
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
        log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
