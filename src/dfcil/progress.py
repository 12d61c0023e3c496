"""Console output: progress bars (tqdm), one per phase on a terminal and silent when output is not a TTY (logs, CI,
SLURM); progress lines for long loops, which reach ``run.log`` too (:class:`ProgressLog`); and the log lines of the
``dfcil`` logger."""

from __future__ import annotations

import logging
import math
import sys
import time
from collections.abc import Callable
from typing import Any

from tqdm.auto import tqdm

ProgressFactory = Callable[..., Any]

log = logging.getLogger("dfcil")


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


class ProgressLog:
    """Log lines through a long loop (model inversion, a slow epoch): one at every tenth of its steps, with the loss
    terms, the speed and the time left, so that ``run.log`` shows progress where no bar is drawn.

    Step numbers are absolute: a loop resumed at ``start`` continues the schedule at the next tenth past it, and
    measures its speed over this process's steps only (from construction). Reading the clock is all it does per
    step (:meth:`due`); the caller reads the loss terms only for the steps it logs, which keeps device syncs few.

    Args:
        desc: what runs, the start of every line (``"task 1 inversion"``).
        total: the loop's steps.
        start: steps done before this process took over.
        parts: lines over the whole loop (fewer on a resumed one).
        clock: seconds, monotonic (a test's fake clock).
    """

    def __init__(
        self, desc: str, total: int, start: int = 0, parts: int = 10, clock: Callable[[], float] = time.perf_counter
    ) -> None:
        self.desc, self.total, self.start, self.parts, self.clock = desc, total, start, parts, clock
        self.started = clock()
        self.next = self._mark_after(start)

    def _mark_after(self, step: int) -> float:
        """The first mark past ``step``: mark k is ceil(k · total / parts), k = 1..parts; inf after the last."""
        if step >= self.total:
            return math.inf
        k = step * self.parts // self.total + 1  # the smallest k with k · total / parts > step
        return -(-k * self.total // self.parts)

    def due(self, step: int) -> bool:
        """Whether ``step`` (steps done) reached the next mark."""
        return step >= self.next

    def elapsed(self) -> float:
        """Seconds since this process began its share of the loop."""
        return self.clock() - self.started

    def projected_s(self, step: int) -> float:
        """Seconds this process's share of the loop (``start`` to ``total``) takes at its speed up to ``step``."""
        return self.elapsed() * (self.total - self.start) / max(step - self.start, 1)

    def log(self, step: int, terms: dict[str, float], note: str = "", run: str = "") -> None:
        """Log the line of ``step`` with the loss ``terms`` (``note`` after them, e.g. what they average; ``run``
        at the end, the run's time left: :func:`run_left`), and move the schedule past it."""
        dt = self.elapsed()
        rate = (step - self.start) / dt if dt > 0 else math.inf
        left = (self.total - step) / rate if rate > 0 else math.inf
        values = " ".join(f"{k}={v:.4f}" for k, v in terms.items())
        log.info(
            "%s step %d/%d (%d%%): %s%s; %.2f steps/s, %s left%s",
            self.desc,
            step,
            self.total,
            100 * step // self.total,
            values,
            note,
            rate,
            duration(left),
            f"; {run}" if run else "",
        )
        self.next = self._mark_after(step)


def duration(seconds: float) -> str:
    """``seconds`` for a log line: 42s, 3m05s, 2h07m."""
    if not math.isfinite(seconds):
        return "?"
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def rough_duration(seconds: float) -> str:
    """``seconds`` as an estimate says it, two figures at most: 0.4s, 40s, 4.5 min, 12 min, 2.3 h."""
    if not math.isfinite(seconds):
        return "?"
    if seconds < 9.95:
        return f"{seconds:.1f}s"
    if seconds < 59.5:
        return f"{round(seconds)}s"
    minutes = seconds / 60
    if minutes < 9.95:
        return f"{minutes:.1f} min"
    if minutes < 99.5:
        return f"{round(minutes)} min"
    hours = minutes / 60
    return f"{hours:.1f} h" if hours < 9.95 else f"{round(hours)} h"


def run_left(seconds: float, complete: bool) -> str:
    """A run's time left for a log line: ``run: about 12 min left``, or where some kinds of its steps are not timed
    yet (``complete`` False: ``seconds`` counts only the timed ones) ``run: over 40s left``, and where none of what
    is left is timed yet (a short run without an estimate, at its first task's end) ``run: time left not known
    yet``."""
    if not complete and seconds < 0.05:  # "over 0.0s" would say nothing
        return "run: time left not known yet"
    return f"run: {'about' if complete else 'over'} {rough_duration(seconds)} left"


class _Stderr(logging.StreamHandler):
    """A handler that writes to whatever ``sys.stderr`` is when a line is logged (a redirect, a notebook's, a
    test's capture), not to the stream it was when the handler was made, which may be closed by then."""

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:  # StreamHandler sets it; the property always answers sys.stderr
        pass

    def emit(self, record: logging.LogRecord) -> None:
        # a line printed under a progress bar: the bars clear, the line prints, and they are drawn again below it
        with tqdm.external_write_mode(file=sys.stderr):
            super().emit(record)


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
