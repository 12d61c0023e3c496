"""``dfcil report RUN --timing``: where a run's time went, task by task, from its ``metrics.jsonl``; for a run that
has not finished, its total extrapolated from the tasks it did.

Tasks after the first share one schedule (inversion, then the same phases on as many images), so a task not yet
done is estimated as the mean of the finished tasks after the first, less their compile time (with ``engine.compile:
step`` and a static head only the first of them compiles); evaluation, which grows with the classes seen, is a small
part. The method's own work at a task's end can grow over a run (APR's ADC attacks each old class): a task records
how many units of it it did (``end_units``, :meth:`~dfcil.methods.Method.end_units`), and a task not yet done gets
the end work of its units (its units continued from the last two finished tasks': equal tasks add as many old
classes each) on the straight line through the finished tasks' (seconds against units, least squares: ADC has a
part that does not grow), or in proportion to their mean per unit while only one count of units is known. A run
whose earlier tasks were saved before tasks recorded their units is estimated flat. The table says which tasks were
measured and which estimated. Pure reading, as the rest of the report.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dfcil.errors import ReportError
from dfcil.io import read_regular_text
from dfcil.training.budget import end_work


def task_seconds(timing: dict[str, Any]) -> dict[str, float]:
    """A task record's timing as seconds: setup (inversion), each phase, the method's own work at the task's end
    (:func:`~dfcil.training.budget.end_work`, summed as ``end``), evaluation, of which compiling, and total."""
    phases = {name: p.get("time_s", 0.0) for name, p in timing.get("phases", {}).items()}
    end = sum(end_work(timing).values())
    parts = {"setup": timing.get("setup_s", 0.0), **phases, "end": end, "eval": timing.get("eval_s", 0.0)}
    return parts | {"compile": timing.get("compile_s", 0.0), "total": sum(parts.values())}


def end_line(units: dict[int, float], seconds: dict[int, float]) -> Callable[[float], float]:
    """The end work's seconds at a count of units, from the finished later tasks' (task -> units, task -> seconds):
    the least-squares line through them where they hold two counts or more (its slope at least 0, its value at
    least 0), else their mean seconds per unit times the count."""
    xs, ys = [units[t] for t in units], [seconds[t] for t in units]
    if len(set(xs)) > 1:
        slope = max(0.0, statistics.linear_regression(xs, ys).slope)
        base = statistics.mean(ys) - slope * statistics.mean(xs)
        return lambda u: max(0.0, base + slope * u)
    per_unit = statistics.mean(y / x for x, y in zip(xs, ys, strict=True)) if xs else 0.0
    return lambda u: per_unit * u


def units_at(units: dict[int, float], task: int) -> float:
    """The end units of a task not yet done, from the finished later tasks' (``units``, task -> units): the last
    one's plus the last step between two of them per task on (equal tasks: as many old classes more each)."""
    done = sorted(units)
    step = (units[done[-1]] - units[done[-2]]) / (done[-1] - done[-2]) if len(done) > 1 else 0.0
    return units[done[-1]] + step * (task - done[-1])


def timing_table(run_dir: Path, num_tasks: int) -> str:
    """The markdown table of ``run_dir``'s tasks (measured, or estimated from the finished ones) and its total."""
    if not (run_dir / "metrics.jsonl").exists():  # a sweep's run set up a moment ago: nothing logged yet
        return f"{run_dir}: no finished task yet (no metrics.jsonl: the run has not logged anything)"
    try:
        lines = read_regular_text(run_dir / "metrics.jsonl").splitlines()
        tasks = {r["task"]: r for r in map(json.loads, filter(str.strip, lines)) if r.get("type") == "task"}
    except (OSError, ValueError, KeyError) as err:
        raise ReportError(f"cannot read {run_dir / 'metrics.jsonl'} ({err})") from None
    if not tasks:
        return f"{run_dir}: no finished task yet"
    rows = {t: task_seconds(r.get("timing") or {}) for t, r in sorted(tasks.items())}
    later = [r["total"] - r["compile"] - r["end"] for t, r in rows.items() if t > 0]
    recorded = {t: (tasks[t].get("timing") or {}).get("end_units") for t in rows if t > 0}
    known = all(isinstance(u, int | float) and u > 0 for u in recorded.values())  # else flat: 1 unit a task
    units = {t: float(u) if known else 1.0 for t, u in recorded.items()}
    end_at = end_line(units, {t: rows[t]["end"] for t in units})
    head = "| task | how | setup s | phases s | task end s | eval s | of which compile s | total s | acc |"
    out = [f"{run_dir}", "", head, "|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    total = 0.0
    for t in range(num_tasks):
        if t in rows:
            r = rows[t]
            skip = ("setup", "end", "eval", "compile", "total")
            phases = ", ".join(f"{k} {v:.1f}" for k, v in r.items() if k not in skip)
            ends = end_work(tasks[t].get("timing") or {})
            end = ", ".join(f"{k} {v:.1f}" for k, v in ends.items()) if ends else "0.0"
            out.append(f"| {t} | measured | {r['setup']:.1f} | {phases} | {end} | {r['eval']:.1f} | "
                       f"{r['compile']:.1f} | {r['total']:.1f} | {tasks[t]['acc']:.2f} |")  # fmt: skip
            total += r["total"]
        elif later:
            est = statistics.mean(later) + end_at(units_at(units, t))
            out.append(f"| {t} | estimated (tasks 1..{max(rows)}, less compile) | | | | | | {est:.1f} | |")
            total += est
        else:
            out.append(f"| {t} | not estimated (no task after the first finished) | | | | | | | |")
    if len(rows) == num_tasks:
        out.append(f"\nmeasured total: {total:.0f} s ({total / 60:.1f} min) over {num_tasks} tasks")
    elif later:
        out.append(f"\nextrapolated total: {total:.0f} s ({total / 60:.1f} min) over {num_tasks} tasks")
    else:  # only the first task finished: the later ones, which cost more, are not counted
        out.append(f"\nno total yet: at least {total:.0f} s ({total / 60:.1f} min) over {num_tasks} tasks, the "
                   f"tasks after the first not counted until one of them has finished")  # fmt: skip
    return "\n".join(out)
