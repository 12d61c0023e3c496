"""A process's time budget (``--budget-s``): a run that would not finish its next task in the time left stops at
the task boundary before it, checkpointed, rather than in the middle of the task.

A task boundary is where a run's state is smallest (the network and the method's statistics; no generator, no
optimiser: a few MB for R-DFCIL+ on CIFAR-100, against 100 MB inside an inversion), so what a machine lent for a
while must hand back to continue elsewhere is small. The next task's seconds are estimated from the run's own
timings (:func:`next_task_seconds`): a run with no incremental task timed yet cannot judge and goes on."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

# a task's timing entries of their own (compile_s is inside the phases' and setup's seconds); every other
# ``<name>_s`` is the method's own work at a phase's or the task's end (LDC's drift_s, APR's ADC)
SETUP_EVAL_COMPILE = frozenset({"setup_s", "eval_s", "compile_s"})


def units_of(method: Any, task: Any) -> int:
    """``method.end_units(task)`` (:meth:`~dfcil.methods.Method.end_units`), at least 1: a plugin's 0 would divide
    the estimates' seconds per unit by zero and drop the budget's end work."""
    return max(1, int(method.end_units(task)))


def end_work(timing: Mapping[str, Any]) -> dict[str, float]:
    """A finished task's seconds of the method's own work besides its setup, phases and evaluation, by name
    (``{"drift": 55.0}``): the one reading of a task's timing that the log, the report, the estimates and the
    budget share."""
    return {k[:-2]: float(v) for k, v in timing.items() if k.endswith("_s") and k not in SETUP_EVAL_COMPILE}


def task_seconds(timing: Mapping[str, Any]) -> float:
    """A finished task's seconds (one entry of a run's ``timings``): its setup, phases, evaluation and the method's
    own work at a phase's end (:func:`end_work`)."""
    own = float(timing.get("setup_s", 0.0)) + float(timing.get("eval_s", 0.0)) + sum(end_work(timing).values())
    return own + sum(float(p.get("time_s", 0.0)) for p in timing.get("phases", {}).values())


def next_task_seconds(
    timings: Sequence[Mapping[str, Any]], task: int, compiled_here: bool, units: int | None = None
) -> float | None:
    """The seconds task ``task`` is expected to take, from the run's finished tasks' ``timings``: the latest task
    after the first (they share their schedule and size in the paper's protocols, the base task of a 50%-base one
    excepted) without its compiling, plus the longest compiling of such a task where this process has not trained
    one yet (``compiled_here`` False: it compiles their steps again, or loads them from the compile cache).
    ``units``: the method's :meth:`~dfcil.methods.Method.end_units` for task ``task``; the latest task's own work at
    its end is scaled by it against that task's recorded ``end_units`` (APR's ADC grows per old class). None for the
    first task, or when no task after the first is timed yet: nothing to judge by."""
    later = [t for t in timings if int(t.get("task", 0)) >= 1]
    if task < 1 or not later:
        return None
    last = later[-1]
    compiling = 0.0 if compiled_here else max(float(t.get("compile_s", 0.0)) for t in later)
    end = sum(end_work(last).values())
    scaled = end * scale(last, units)
    return task_seconds(last) - end + scaled - float(last.get("compile_s", 0.0)) + compiling


def scale(timing: Mapping[str, Any], units: float | None) -> float:
    """The factor from a finished task's own end work to that of a task of ``units`` end units (1 where either is
    not known: a run written before tasks recorded their ``end_units``)."""
    recorded = timing.get("end_units")
    return 1.0 if units is None or not recorded else units / float(recorded)


@dataclasses.dataclass
class Budget:
    """The time a process may run: until ``deadline`` (seconds of ``clock``, the epoch by default)."""

    deadline: float
    clock: Callable[[], float] = time.time
    trained: int = 0  # tasks after the first that this process trained (their steps are compiled here)

    @classmethod
    def of(cls, seconds: float | None, clock: Callable[[], float] = time.time) -> Budget | None:
        """A budget of ``seconds`` from now; None for none."""
        return None if seconds is None else cls(clock() + seconds, clock)

    def left(self) -> float:
        return self.deadline - self.clock()

    def refuses(self, timings: Sequence[Mapping[str, Any]], task: int, units: int | None = None) -> str | None:
        """Why task ``task`` should not start with the time left (its estimate and the time left, in words), or
        None: it fits, or nothing can tell. ``units``: as :func:`next_task_seconds`'s."""
        need = next_task_seconds(timings, task, self.trained > 0, units)
        left = self.left()
        if need is None or need <= left:
            return None
        return f"task {task} would take about {need:.0f} s, and {max(left, 0.0):.0f} s of --budget-s are left"
