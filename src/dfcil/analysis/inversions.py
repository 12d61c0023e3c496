"""``dfcil inspect RUN --synthetic``: the inversion statistics a run recorded (:mod:`dfcil.training.diagnostics`),
read from its ``summary.json`` (or, unfinished, its ``metrics.jsonl``), printed as a table and drawn beside the
synthetic grids. How to read them: ``docs/diagnostics.md``."""

from __future__ import annotations

import io
import json
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from dfcil.errors import ConfigError, MissingExtraError
from dfcil.extras import require
from dfcil.io import check_output, read_regular_text, write_atomic
from dfcil.training.grid import synthetic_images_path


def read_diagnostics(run_dir: str | os.PathLike) -> list[tuple[int, dict[str, Any]]]:
    """``(task, inversion statistics)`` of every task of a run that has them: from ``summary.json``, or, for an
    unfinished run, from the task records of ``metrics.jsonl``."""
    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").exists():
        raise ConfigError(f"{run_dir} is not a dfcil run directory (no config.yaml)")
    try:
        if (run_dir / "summary.json").exists():
            per_task = json.loads(read_regular_text(run_dir / "summary.json")).get("diagnostics") or []
        else:
            metrics = run_dir / "metrics.jsonl"
            lines = read_regular_text(metrics).splitlines() if metrics.exists() else []
            records = [json.loads(line) for line in lines if line.strip()]
            per_task = [r.get("diagnostics") or {} for r in records if r.get("type") == "task"]
    except (OSError, ValueError, AttributeError) as err:
        raise ConfigError(f"the records of {run_dir} cannot be read ({err}); they are damaged") from None
    found = [(t, d["inversion"]) for t, d in enumerate(per_task) if isinstance(d, dict) and d.get("inversion")]
    if not found:
        raise ConfigError(
            f"{run_dir} has no inversion diagnostics: its method inverts no generator, it has not finished a task "
            f"after its first, or dfcil recorded none when it ran (versions before them)"
        )
    return found


def format_diagnostics(found: list[tuple[int, dict[str, Any]]]) -> str:
    """The table ``dfcil inspect --synthetic`` prints: one line per task."""
    terms = sorted({k for _, d in found for k in (d.get("loss_terms") or {})})
    head = ["task", "old", "confidence", "coverage", "entropy", "gap", "nearest own", *terms, "pixel mean (data)"]
    rows = []
    for task, d in found:
        gap, px, data = d["feature_gap"], d["pixels"], d["data_pixels"]
        means = "/".join(f"{m:.2f}" for m in px["mean"]) + " (" + "/".join(f"{m:.2f}" for m in data["mean"]) + ")"
        rows.append([
            str(task), str(d["old_classes"]), f"{d['confidence']:.3f}", f"{d['coverage']:.2f}", f"{d['entropy']:.3f}",
            _num(gap["distance"]), _num(gap["nearest_own"]),
            *[_num((d.get("loss_terms") or {}).get(k)) for k in terms], means,
        ])  # fmt: skip
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(head, widths, strict=True))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(lines)


def _num(v: float | None) -> str:
    return "—" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.3f}"


# The panels of the figure, one per statistic: (title, y label with the unit, the value of one task's record,
# the dashed reference: "1/K", chance for K old classes, which a collapsed generator sits at; "1", the real class
# means' spacing; or None). Each has its own y axis: the gap exceeds 1 where the others cannot, and on one axis
# the shares near 0 and 1 were hard to tell apart.
PANELS: tuple[tuple[str, str, Callable[[dict[str, Any]], Any], str | None], ...] = (
    ("teacher confidence", "mean top-1 probability", lambda d: d["confidence"], "1/K"),
    ("class coverage", "share of old classes drawn", lambda d: d["coverage"], None),
    ("prediction entropy", "entropy / log K", lambda d: d["entropy"], None),
    ("class-mean gap", "distance / real means' spacing", lambda d: d["feature_gap"]["distance"], "1"),
    ("nearest own class", "share of old classes", lambda d: d["feature_gap"]["nearest_own"], "1/K"),
)


def _value(v: Any) -> float:
    return math.nan if v is None else float(v)


def diagnostics_figure(name: str, found: list[tuple[int, dict[str, Any]]], grids: list[tuple[int, Path]]) -> Any:
    """The figure of :func:`plot_diagnostics`: one panel per statistic of :data:`PANELS` against the task (one
    shared x axis, no legends: each panel's title names its statistic), and each task's synthetic grid below."""
    figure = require("matplotlib.figure", "plot", "dfcil inspect --synthetic", "matplotlib")
    image = require("matplotlib.image", "plot", "dfcil inspect --synthetic", "matplotlib")
    cols = max(len(grids), 1)
    fig = figure.Figure(figsize=(max(12.0, 2.6 * cols), 7.0 if grids else 3.4), layout="constrained")
    rows = fig.subfigures(2 if grids else 1, 1, height_ratios=[1, 1.5] if grids else None)
    top = rows[0] if grids else rows
    axes = top.subplots(1, len(PANELS), sharex=True)
    tasks = [t for t, _ in found]
    chance = [1 / d["old_classes"] if d.get("old_classes") else math.nan for _, d in found]
    for ax, (title, unit, value, reference) in zip(axes, PANELS, strict=True):
        values = [_value(value(d)) for _, d in found]
        if reference == "1/K":  # a dash at each task: K changes from task to task
            ax.hlines(chance, np.subtract(tasks, 0.3), np.add(tasks, 0.3), ls="--", lw=1, color="0.4")
        elif reference == "1":
            ax.axhline(1.0, ls="--", lw=1, color="0.4")
        ax.plot(tasks, values, marker="o", color="C0")
        top_ = max(1.05, 1.1 * float(np.nanmax([0.0, *values])))  # 0 to 1, the gap up to its largest
        ax.set(title=title + (f" (- - {reference})" if reference else ""), ylabel=unit, xlabel="task", xticks=tasks)
        ax.set_ylim(-0.05 * top_, top_)
        ax.title.set_fontsize(9)
        ax.yaxis.label.set_fontsize(8)
        ax.grid(alpha=0.3)
    top.suptitle(f"{name}: inversion diagnostics of each task's generator (K: the task's old classes)", fontsize=10)
    if grids:
        grid_axes = np.atleast_1d(rows[1].subplots(1, cols))
        for a, (task, path) in zip(grid_axes, grids, strict=True):
            a.imshow(image.imread(path))
            a.set_title(f"task {task}", fontsize=9)
            a.axis("off")
    return fig


def plot_diagnostics(run_dir: Path, found: list[tuple[int, dict[str, Any]]], out_dir: Path) -> list[Path]:
    """``synthetic_diagnostics.png`` and ``.pdf`` in ``out_dir``: the statistics per task
    (:func:`diagnostics_figure`), and each task's synthetic grid (``synthetic_task<t>.png``) below them."""
    grids = [(t, p) for t, _ in found if (p := synthetic_images_path(run_dir, t)).exists()]
    fig = diagnostics_figure(run_dir.name, found, grids)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / "synthetic_diagnostics.png", out_dir / "synthetic_diagnostics.pdf"]
    for path in paths:  # each written whole, as a new file: never into the file (or a hard link's other name) there
        buf = io.BytesIO()
        fig.savefig(buf, format=path.suffix[1:], dpi=130)
        write_atomic(path, buf.getvalue())
    return paths


def inspect_dir(run_dir: str | os.PathLike, out_dir: str | os.PathLike | None) -> Path:
    """Where ``dfcil inspect`` writes its figures: ``out_dir``, else the run's ``inspect`` folder, which must stay
    inside the run directory (no link out of it); refused before any work unless it is writable or can be made."""
    out = Path(out_dir) if out_dir is not None else Path(run_dir) / "inspect"
    try:
        check_output(out, "--out" if out_dir is not None else "inspect folder", "give a writable --out DIR",
                     inside=run_dir if out_dir is None else None)  # fmt: skip
    except ValueError as err:
        raise ConfigError(str(err)) from None
    return out


def inspect_synthetic(
    run_dir: str | os.PathLike, out_dir: str | os.PathLike | None = None
) -> tuple[str, list[Path], str | None]:
    """``dfcil inspect RUN --synthetic``: the table of every task's inversion statistics, its figure (default in
    ``<run>/inspect``), and, where matplotlib is missing, why there is no figure (the table needs nothing)."""
    found = read_diagnostics(run_dir)
    out = inspect_dir(run_dir, out_dir)
    try:
        return format_diagnostics(found), plot_diagnostics(Path(run_dir), found, out), None
    except MissingExtraError as err:
        return format_diagnostics(found), [], f"no figure: {err}"
