"""Stopping a run cleanly on Ctrl-C or SIGTERM (a cluster's preemption): the first signal asks the engine to finish
its step, write a checkpoint and raise :class:`~dfcil.errors.RunInterrupted`; a second aborts at once."""

from __future__ import annotations

import contextlib
import logging
import signal
from collections.abc import Iterator
from typing import Any

from dfcil.training.state import Interrupt

log = logging.getLogger("dfcil")


@contextlib.contextmanager
def stop_on_signals(interrupt: Interrupt) -> Iterator[None]:
    """While the block runs, the first Ctrl-C or SIGTERM sets ``interrupt``: the run finishes its step, writes a
    checkpoint and raises :class:`~dfcil.errors.RunInterrupted`. A second signal aborts at once (KeyboardInterrupt).
    The handlers the process had are back afterwards."""

    def handler(signum: int, frame: Any) -> None:
        if interrupt.requested:  # a second signal aborts at once
            raise KeyboardInterrupt
        interrupt.requested = True
        log.warning("%s: finishing the current step, then writing a checkpoint", signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
