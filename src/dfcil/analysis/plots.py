"""Figures of ``dfcil report --plots DIR``, as PNG and PDF, from the runs a report has read.

* ``curves/<dataset>_<protocol>``: accuracy after each task against the classes seen so far, mean over a group's
  runs with a ±std band, one line per group (the paper's incremental-accuracy figures), each group with its own
  colour, line style, marker and hatch (:func:`curve_styles`); a hollow marker with an error bar is the paper's
  A_N where it has one.
* ``first/<dataset>_<protocol>``: the accuracy on the first task's classes after each task, mean ± std over a
  group's runs: how each method forgets the classes it has kept longest.
* ``against/<dataset>_<protocol>`` (with ``--against M``): each group's accuracy after each task minus that of M's
  run of the same class order and seed, mean ± std over the pairs: the report's paired difference, task by task.
* ``runs/<run>``: one run's accuracy matrix as a heatmap, old/new accuracy after each task, and forgetting after
  each task.
* ``synthetic/<run>``: a run's ``synthetic_task<t>.png`` images side by side (runs without them are skipped).
* ``stability/<dataset>_<protocol>``: stability against plasticity, one point per group of runs: the last task's
  accuracy on its new classes (x) and on the old classes (y), mean ± std over the group's runs (class orders,
  seeds); the points of one method joined in order of x, so that a sweep over a method's KD weight draws its
  frontier.

matplotlib is imported only here, and only when a figure is made (``pip install 'dfcil[plot]'``). Figures are
built with ``matplotlib.figure.Figure``, so no pyplot state or backend choice is touched.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import re
import textwrap
import warnings
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dfcil.analysis.run_dirs import Group, Run, differing_keys, is_condition
from dfcil.errors import PlotError
from dfcil.io import write_atomic
from dfcil.metrics import AccuracyMatrix

SYNTHETIC = re.compile(r"synthetic_task(\d+)\.png")


def _figure(**kwargs: Any) -> Any:
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise PlotError("plots need matplotlib: pip install 'dfcil[plot]'") from None
    return Figure(**kwargs)


def _literal(fig: Any) -> Any:
    """``fig`` with each text that holds a ``$`` drawn as it is: the names in titles, legends and labels come from
    run folders and configs, where a ``$`` is a character, never matplotlib's maths (an odd one is an error)."""
    from matplotlib.text import Text

    for text in fig.findobj(Text):
        if "$" in text.get_text():
            text.set_parse_math(False)
            text.set_usetex(False)  # a matplotlibrc's text.usetex would hand it to TeX, where $ is maths again
    return fig


def _save(fig: Any, path: Path) -> list[Path]:
    """``path`` as PNG and PDF (the suffix added to its name, which may hold dots), each written whole (an
    interrupted report leaves the old figure or the new one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    files = [path.with_name(f"{path.name}.png"), path.with_name(f"{path.name}.pdf")]
    _literal(fig)
    for f in files:
        buf = io.BytesIO()
        with warnings.catch_warnings():  # a legend too big for the layout: saved whole (bbox_inches), not said
            warnings.filterwarnings("ignore", message="constrained_layout not applied")
            fig.savefig(buf, format=f.suffix[1:], dpi=120, bbox_inches="tight")
        write_atomic(f, buf.getvalue())
    return files


def wrapped(text: str, width: int = 56) -> str:
    """``text`` on lines of at most ``width`` characters where it has spaces to break at: a group's label of
    several config keys stays inside its legend or beside its point."""
    return textwrap.fill(text, width, break_long_words=False, break_on_hyphens=False)


STEM_LENGTH = 100  # characters of a name kept in its file's name; well below the file systems' 255 bytes


def figure_stems(names: Sequence[str]) -> list[str]:
    """The file names (without suffix) of the figures of ``names`` (runs, or settings) in one folder, each its own,
    also on a file system blind to case (macOS, Windows). A name reads as itself with ``__`` for each path separator
    (``runs/smoke``: ``runs__smoke``). Where that changed more (characters outside ``[A-Za-z0-9._=+-]`` become
    ``_``, a leading dot, a name cut to :data:`STEM_LENGTH`) or two names read alike (``a b`` and ``a_b``, ``Run``
    and ``run``), ``@`` and 10 hex digits of the exact name's SHA-256 follow (``@`` is never in a name that reads as
    itself); a name given twice (two runs' folders of one name below two PATHs) is numbered after that."""
    read = [name.replace(os.sep, "__").replace("/", "__") for name in names]
    safe = [re.sub(r"^\.|[^A-Za-z0-9._=+-]", "_", r)[:STEM_LENGTH] for r in read]
    alike = Counter(s.casefold() for s in safe)
    stems, given = [], Counter[str]()
    for name, r, s in zip(names, read, safe, strict=True):
        if s == r and alike[s.casefold()] == 1:
            stems.append(s)
            continue
        stem = f"{s.strip('_')}@{hashlib.sha256(name.encode('utf-8', 'surrogateescape')).hexdigest()[:10]}"
        given[stem] += 1
        stems.append(stem if given[stem] == 1 else f"{stem}-{given[stem]}")
    return stems


def forgetting_per_task(correct: Sequence[Sequence[int]], count: Sequence[Sequence[int]]) -> np.ndarray:
    """Forgetting after each task i: :meth:`dfcil.metrics.AccuracyMatrix.forgetting` of rows 0..i (NaN after the
    first task), so the last entry is the run's ``forgetting``.

    Args:
        correct, count: summary.json's ``correct_matrix`` and ``count_matrix``, (tasks done, N) each.
    """
    correct, count = np.asarray(correct, dtype=np.int64), np.asarray(count, dtype=np.int64)
    out = np.full(len(correct), np.nan)
    for i in range(len(correct)):
        acc = AccuracyMatrix(i + 1)
        acc.load_state_dict(
            {"correct": correct[: i + 1, : i + 1], "count": count[: i + 1, : i + 1], "rows_done": i + 1}
        )
        out[i] = acc.forgetting()
    return out


def _floats(values: Sequence[float | None]) -> np.ndarray:
    return np.array([np.nan if v is None else v for v in values], dtype=float)


# What tells one group's curve from another's where curves and bands overlap (fine-tuning's and LwF's within a
# point of each other): a colour of matplotlib's qualitative "tab10", a line style, a marker and a band hatch, each
# cycled on its own, so that two groups share all four only 140 groups apart.
LINESTYLES = ("-", "--", "-.", ":")
MARKERS = ("o", "s", "^", "D", "v", "P", "X")
HATCHES = ("/", "\\", "|", "-", "x", "+", ".")  # single strokes: sparse, so that two crossing hatches read as two
BAND_ALPHA = 0.12  # a band's fill: light, so that another band below it shows through; its edge is drawn stronger


@dataclasses.dataclass(frozen=True)
class CurveStyle:
    colour: tuple[float, float, float]
    linestyle: str
    marker: str
    hatch: str


def curve_styles(groups: Sequence[Group]) -> dict[tuple[str, str], CurveStyle]:
    """A :class:`CurveStyle` for each (method label, config label) of ``groups``, in the order they first appear
    (the report's order: the paper's methods first), so that a method keeps its style in every setting's figure."""
    from matplotlib import colormaps

    palette = colormaps["tab10"].colors
    keys = list(dict.fromkeys((g.setting.method_label, g.config_label) for g in groups))
    return {
        key: CurveStyle(palette[k % len(palette)], LINESTYLES[k % 4], MARKERS[k % 7], HATCHES[k % 7])
        for k, key in enumerate(keys)
    }


@dataclasses.dataclass(frozen=True)
class Series:
    """One group's curves in a figure of :func:`_band_figure`: ``y`` one row per run (or pair of runs), one column
    per task, drawn against ``x`` (the classes seen after each task) as their mean with a ±std band."""

    group: Group
    x: np.ndarray
    y: np.ndarray
    label: str


def _series(g: Group, curves: Sequence[tuple[Run, Sequence[float | None]]]) -> Series | None:
    """``g``'s :class:`Series` of (run, curve) pairs: the curves as long as the group's protocol (a run whose
    summary holds fewer tasks is left out, and counted out of n), ``x`` from that run's task sizes; None if none."""
    n_tasks = max((len(r.summary["task_sizes"]) for r, _ in curves), default=0)
    full = [(r, c) for r, c in curves if len(c) == n_tasks and len(r.summary["task_sizes"]) == n_tasks]
    if not full:
        return None
    x = np.cumsum(full[0][0].summary["task_sizes"])
    return Series(g, x, np.array([_floats(c) for _, c in full], dtype=float), f"{g.short_label} (n={len(full)})")


LEGEND_INSIDE = 6  # lines of text a legend may have inside the axes; more go beside them, where they hide no curve


def _band_figure(series: Sequence[Series], styles: dict[tuple[str, str], CurveStyle], title: str, ylabel: str,
                 legend: str, ddof: int, paper: bool = False, zero: str | None = None) -> Any:  # fmt: skip
    """One figure of ``series``: each its mean after each task with a ±std band (``ddof`` 0 the population std, 1
    the sample std, as the report's ``--std``) in its group's :class:`CurveStyle`; ``paper``: the paper's A_N ± std as
    a hollow marker at the last task where it has one; ``zero``: a horizontal line at 0 with that legend label (a
    paired difference's reference)."""
    from matplotlib.patches import Patch

    fig = _figure(figsize=(6.4, 4.4), layout="constrained")
    ax = fig.add_subplot()
    marked, handles, labels = False, [], []
    for s in series:
        mean = s.y.mean(0)
        label, style = wrapped(s.label), styles[(s.group.setting.method_label, s.group.config_label)]
        (line,) = ax.plot(s.x, mean, color=style.colour, linestyle=style.linestyle, marker=style.marker,
                          markersize=4, linewidth=1.6, label=label, zorder=3)  # fmt: skip
        handle: Any = line
        if len(s.y) > 1:  # one run (or pair) has no spread to draw
            # a light fill, its outline and a hatch of the group's own: two bands that overlap read as two
            std = s.y.std(0, ddof=ddof)
            band = dict(facecolor=(*style.colour, BAND_ALPHA), edgecolor=(*style.colour, 0.5), hatch=style.hatch,
                        linewidth=0.6)  # fmt: skip
            ax.fill_between(s.x, mean - std, mean + std, zorder=2, **band)
            handle = (Patch(**band), line)  # the legend shows the band under the line
        handles.append(handle)
        labels.append(label)
        row = s.group.setting.paper_row() if paper else None
        if row is not None and row.last_acc is not None:
            v = row.last_acc
            ax.errorbar(s.x[-1], v.mean, yerr=v.std or 0, fmt="o", mfc="none", color=style.colour, capsize=3)
            marked = True
    if zero is not None:
        handles.append(ax.axhline(0.0, color="black", linewidth=0.9, zorder=1, label=wrapped(zero)))
        labels.append(wrapped(zero))
    x = max((s.x for s in series), key=len)
    if len(x) <= 26:
        ax.set_xticks(x)
    ax.set(xlabel="classes seen", ylabel=ylabel, title=title)
    ax.grid(alpha=0.3)
    title = legend + ("; ○ the paper's A_N ± std" if marked else "")
    lines = sum(label.count("\n") + 1 for label in labels)
    if lines > LEGEND_INSIDE:  # beside the axes, on a figure wider by the legend's width (56 characters at 8 pt)
        fig.set_size_inches(6.4 + 4.0, max(4.4, 0.16 * lines + 0.6))
        fig.legend(
            handles, labels, fontsize=8, title=title, title_fontsize=8, handlelength=3, loc="outside right upper"
        )
    else:
        ax.legend(handles, labels, fontsize=8, title=title, title_fontsize=8, handlelength=3)
    return fig


def _by_setting(groups: Sequence[Group], min_tasks: int = 1) -> dict[tuple[str, str], list[Group]]:
    """The groups with finished runs by (dataset, protocol), for settings of at least ``min_tasks`` tasks."""
    settings: dict[tuple[str, str], list[Group]] = {}
    for g in groups:
        if g.finished and max(len(r.summary["task_sizes"]) for r in g.finished) >= min_tasks:
            settings.setdefault((g.setting.dataset, g.setting.protocol_label), []).append(g)
    return settings


STD_DDOF = {"population": (0, "std"), "sample": (1, "sample std")}  # the report's --std: ddof, and its legend's word


def _ddof(std: str) -> int:
    if std not in STD_DDOF:
        raise PlotError(f"std {std!r}: give one of {', '.join(STD_DDOF)}")
    return STD_DDOF[std][0]


def _std_words(std: str) -> str:
    return STD_DDOF[std][1]


def plot_curves(
    groups: Sequence[Group], out_dir: Path, styles: Styles | None = None, std: str = "population"
) -> list[Path]:
    """One figure per dataset and protocol: mean accuracy after each task against classes seen, ±std band."""
    settings = _by_setting(groups)
    styles = styles or curve_styles([g for same in settings.values() for g in same])
    files = []
    for ((dataset, protocol), same), stem in zip(settings.items(), _setting_stems(settings), strict=True):
        series = [s for g in same if (s := _series(g, [(r, r.summary["acc_per_task"]) for r in g.finished]))]
        if not series:
            continue
        fig = _band_figure(series, styles, f"{dataset}, {protocol}",
                           "accuracy on all seen classes (%)", f"mean ± {_std_words(std)} over runs", _ddof(std),
                           paper=True)  # fmt: skip
        files += _save(fig, out_dir / "curves" / stem)
    return files


def first_task_curve(summary: dict[str, Any]) -> list[float | None]:
    """The accuracy on the first task's classes after each task: the first column of summary.json's
    ``accuracy_matrix`` (so its last entry is the report's ``first_acc``)."""
    return [row[0] for row in summary["accuracy_matrix"]]


def plot_first_task(groups: Sequence[Group], out_dir: Path, styles: Styles | None = None,
                    std: str = "population") -> list[Path]:  # fmt: skip
    """One figure per dataset and protocol of two tasks or more: the accuracy on the first task's classes after
    each task (:func:`first_task_curve`), mean ± std over a group's runs: how each method forgets the classes it
    has kept longest, which a long sequence shows best. Runs from before summaries held the accuracy matrix are
    left out (a group's n says how many are drawn)."""
    settings = _by_setting(groups, min_tasks=2)
    styles = styles or curve_styles([g for same in settings.values() for g in same])
    files = []
    for ((dataset, protocol), same), stem in zip(settings.items(), _setting_stems(settings), strict=True):
        curves = [
            [(r, first_task_curve(r.summary)) for r in g.finished if "accuracy_matrix" in r.summary] for g in same
        ]
        series = [s for g, c in zip(same, curves, strict=True) if (s := _series(g, c))]
        if not series:
            continue
        fig = _band_figure(series, styles, f"{dataset}, {protocol}: the first task's classes",
                           "accuracy on the first task's classes (%)", f"mean ± {_std_words(std)} over runs",
                           _ddof(std))  # fmt: skip
        files += _save(fig, out_dir / "first" / stem)
    return files


Pairs = Mapping[str, tuple[Group, Sequence[tuple[Run, Run]]]]  # a group's label: its reference, (run, its partner)
Styles = dict[tuple[str, str], CurveStyle]
FOLDERS = ("curves", "first", "against", "stability", "runs", "synthetic")  # what write_plots writes into


def paired_curves(pairs: Sequence[tuple[Run, Run]]) -> list[tuple[Run, list[float]]]:
    """For each (run, reference's run) of one class order and seed: the run and its accuracy on all seen classes
    after each task minus the reference run's, over the tasks both have (NaN where either has no value)."""
    out = []
    for run, ref in pairs:
        a, b = _floats(run.summary["acc_per_task"]), _floats(ref.summary["acc_per_task"])
        n = min(len(a), len(b))
        out.append((run, list(a[:n] - b[:n])))
    return out


def plot_against(groups: Sequence[Group], pairs: Pairs, out_dir: Path, styles: Styles | None = None,
                 std: str = "population") -> list[Path]:  # fmt: skip
    """``dfcil report --against M --plots``: per dataset, protocol (of two tasks or more) and reference group, each
    compared group's accuracy after each task minus its reference's run of the same class order and seed, mean ±
    std over the pairs (the report's paired difference, task by task): where along the sequence a method gains or
    loses on M. M with groups under several conditions (with and without AutoAugment) is one figure per condition,
    each with its own zero."""
    figures: dict[tuple[str, str, str], list[Group]] = {}
    for (dataset, protocol), same in _by_setting(groups, min_tasks=2).items():
        for g in same:
            if g.label in pairs:
                figures.setdefault((dataset, protocol, pairs[g.label][0].label), []).append(g)
    styles = styles or curve_styles([g for same in figures.values() for g in same])
    several = Counter((d, p) for d, p, _ in figures)
    refs = [pairs[same[0].label][0] for same in figures.values()]
    names = [f"{d}_{p}".replace("/", " per ") + (f" vs {ref.short_label}" if several[(d, p)] > 1 else "")
             for (d, p, _), ref in zip(figures, refs, strict=True)]  # fmt: skip
    files = []
    for ((dataset, protocol, _), same), stem, reference in zip(figures.items(), figure_stems(names), refs, strict=True):
        ref = reference.short_label
        series = [s for g in same if (s := _series(g, paired_curves(pairs[g.label][1])))]
        if not series:
            continue
        title = wrapped(f"{dataset}, {protocol}: minus {ref}, paired by class order and seed", 70)
        fig = _band_figure(series, styles, title,
                           "accuracy on all seen classes,\nminus the reference's (points)",
                           f"mean ± {_std_words(std)} over the pairs (n: pairs)", _ddof(std),
                           zero=f"{ref} (the reference)")  # fmt: skip
        files += _save(fig, out_dir / "against" / stem)
    return files


def _setting_stems(settings: dict[tuple[str, str], Any]) -> list[str]:
    """:func:`figure_stems` of (dataset, protocol) settings: ``cifar100_n10``."""
    return figure_stems([f"{dataset}_{protocol}".replace("/", " per ") for dataset, protocol in settings])


@dataclasses.dataclass(frozen=True)
class StabilityPoint:
    """One group's place in the stability–plasticity plane: after the last task, the accuracy on its new classes
    (plasticity) and on the classes of the tasks before it (stability), mean and std (population or sample, the
    report's ``--std``; 0 where ``n`` is too small for one) over ``n`` runs."""

    method: str
    variant: str  # the group's config label (what sets it apart from the method's other groups), "" if none
    new_mean: float
    new_std: float
    old_mean: float
    old_std: float
    n: int
    joined: bool = False  # one of a method's points that differ in one config key only (a sweep): a curve


def _sweep(groups: Sequence[Group]) -> bool:
    """Whether ``groups`` (one method's, in one setting) are a sweep: they differ in one key of the method's recipe
    only (not a condition such as the augmentation), and its values are numbers (a weight, not a switch's modes)."""
    differ = differing_keys(groups)
    if len(differ) != 1 or is_condition(differ[0]):
        return False
    try:
        values = [json.loads(g.config[differ[0]]) for g in groups]
    except (KeyError, ValueError):
        return False
    return all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)


def stability_points(groups: Sequence[Group], std: str = "population") -> dict[tuple[str, str], list[StabilityPoint]]:
    """Per (dataset, protocol), one :class:`StabilityPoint` per group with finished runs of two tasks or more (a
    single task has no old classes), in the groups' order; a method's points are ``joined`` where its groups there
    differ in one numeric key of its recipe only (a sweep of it: :func:`_sweep`), not where they differ otherwise
    (an ablation's switches, an augmentation), whose points joined would draw a trade-off never swept."""
    ddof = _ddof(std)
    out: dict[tuple[str, str], list[StabilityPoint]] = {}
    series: dict[tuple[str, str, str], list[Group]] = {}
    for g in groups:
        series.setdefault((g.setting.dataset, g.setting.protocol_label, g.setting.method_label), []).append(g)
    swept = {key for key, same in series.items() if _sweep(same)}
    for g in groups:
        pairs = [(r.metric("new_acc"), r.metric("old_acc")) for r in g.finished]
        pairs = [(n, o) for n, o in pairs if n is not None and o is not None]
        if not pairs:
            continue
        new, old = np.array(pairs, dtype=float).T
        spread = (new.std(ddof=ddof), old.std(ddof=ddof)) if len(pairs) > ddof else (0.0, 0.0)
        point = StabilityPoint(
            g.setting.method_label,
            g.config_label,
            *map(float, (new.mean(), spread[0], old.mean(), spread[1])),
            len(pairs),
            (g.setting.dataset, g.setting.protocol_label, g.setting.method_label) in swept,
        )
        out.setdefault((g.setting.dataset, g.setting.protocol_label), []).append(point)
    return out


def plot_stability(
    groups: Sequence[Group],
    out_dir: Path,
    styles: dict[tuple[str, str], CurveStyle] | None = None,
    std: str = "population",
) -> list[Path]:
    """One figure per dataset and protocol of :func:`stability_points`: new-class accuracy (x) against old-class
    accuracy (y) after the last task, error bars of one ``std`` over each group's runs, a method's points joined
    where they are a sweep of one key; each method in the colour and marker of its first group's
    :class:`CurveStyle` (``styles``: the other figures'), else of matplotlib's cycle."""
    files, settings = [], stability_points(groups, std)
    for ((dataset, protocol), points), stem in zip(settings.items(), _setting_stems(settings), strict=True):
        fig = _figure(figsize=(6.4, 4.8), layout="constrained")
        ax = fig.add_subplot()
        methods: dict[str, list[StabilityPoint]] = {}
        for p in points:
            methods.setdefault(p.method, []).append(p)
        for i, (method, same) in enumerate(methods.items()):
            same = sorted(same, key=lambda p: p.new_mean)
            x, y = [p.new_mean for p in same], [p.old_mean for p in same]
            xerr, yerr = [p.new_std for p in same], [p.old_std for p in same]
            runs = "/".join(sorted({str(p.n) for p in same}))
            style = (styles or {}).get((method, methods[method][0].variant))
            colour, marker = (style.colour, style.marker) if style else (f"C{i % 10}", "o")
            ax.errorbar(x, y, xerr=xerr, yerr=yerr, fmt=marker, linestyle="-" if all(p.joined for p in same) else "",
                        color=colour, capsize=3, markersize=4, label=f"{method} (n={runs})")  # fmt: skip
            for j, p in enumerate(same):  # a sweep's neighbouring labels alternate above and below their points
                if p.variant:
                    ax.annotate(wrapped(p.variant, 32), (p.new_mean, p.old_mean), textcoords="offset points",
                                xytext=(4, 4 if j % 2 == 0 else -11), fontsize=7, color=colour)  # fmt: skip
        ax.set(xlabel="new classes: accuracy on the last task's classes (%)",
               ylabel="old classes: accuracy on the earlier tasks' classes (%)",
               title=f"{dataset}, {protocol}: stability against plasticity")  # fmt: skip
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, title=f"after the last task; mean ± {_std_words(std)} over runs", title_fontsize=8)
        files += _save(fig, out_dir / "stability" / stem)
    return files


def run_figure(run: Run) -> Any:
    """The figure of :func:`plot_run`: a run's accuracy matrix (heatmap), old/new accuracy after each task, and
    forgetting after each task."""
    s = run.summary
    assert s is not None, "only finished runs have a summary"
    matrix = _floats([v for row in s["accuracy_matrix"] for v in row]).reshape(len(s["accuracy_matrix"]), -1)
    n = len(matrix)
    tasks = np.arange(n)
    # beyond 12 tasks a taller figure (to 7 inches at 32) and a wider heatmap, so that its cells keep room for
    # their numbers
    fig = _figure(figsize=(16, min(7.0, 4.6 + 0.12 * max(0, n - 12))), layout="constrained")
    # space between panels (a fraction of the figure's width): the colour bar's label otherwise sits about
    # 0.1 inch from the next panel's "accuracy (%)" and the two read as one
    fig.get_layout_engine().set(wspace=0.08)
    ax_m, ax_on, ax_f = fig.subplots(1, 3, width_ratios=(1.4 if n > 12 else 1, 1, 1))
    image = ax_m.imshow(np.ma.masked_invalid(matrix[:, :n]), vmin=0, vmax=100, cmap="viridis")
    fig.colorbar(image, ax=ax_m, label="accuracy (%)")
    ax_m.set(xlabel="test classes of task j", ylabel="after learning task i", title="accuracy matrix a(i, j)")
    ax_on.plot(tasks, _floats(s["new_acc"]), marker="o", label="new: a(i, i)")
    ax_on.plot(tasks, _floats(s["old_acc"]), marker="s", label="old: tasks j < i")
    ax_on.plot(tasks, _floats(s["acc_per_task"]), marker=".", linestyle="--", label="all seen: A_i")
    ax_on.set(xlabel="task i", ylabel="accuracy (%)", title="old and new accuracy", ylim=(-2, 102))
    ax_on.legend(fontsize=8)
    forgetting = forgetting_per_task(s["correct_matrix"], s["count_matrix"])
    if unscored := s.get("unscored_tasks"):  # forgetting after task i reads rows 0..i: none with an unscored row
        forgetting[min(unscored) :] = np.nan
    ax_f.plot(tasks, forgetting, marker="o", color="C3")
    ax_f.set(xlabel="task i", ylabel="forgetting (points)", title="forgetting after each task")
    if n <= 26:
        for ax in (ax_m, ax_on, ax_f):
            ax.set_xticks(tasks)
            if n > 12:
                ax.tick_params(labelsize=7)  # two-digit task numbers side by side
        ax_m.set_yticks(tasks)
    ax_on.grid(alpha=0.3)
    ax_f.grid(alpha=0.3)
    fig.suptitle(f"{run.name}: {s.get('method')} on {s.get('dataset')}, A_N = {s['last_acc']:.2f}")
    _literal(fig)  # before the layout of _cell_numbers draws the names
    _cell_numbers(fig, ax_m, image, matrix[:, :n])
    return fig


def _cell_numbers(fig: Any, ax: Any, image: Any, matrix: np.ndarray) -> None:
    """Each cell's accuracy written on the heatmap ``image`` in ``ax``, for the learnt tasks only (j ≤ i; the upper
    triangle is empty): dark text on a light cell and light on a dark one, in a size that follows the cell (the
    figure laid out once to measure it); where the cells are too small for a readable number, none, and the
    title says so."""
    fig.draw_without_rendering()  # the layout, so that the heatmap's size on the page is known
    cell = ax.get_window_extent().width / matrix.shape[1] * 72 / fig.dpi  # points
    size = min(11.0, 0.42 * cell)  # "100" in DejaVu Sans is 1.9 em wide: 0.8 of the cell at most
    if size < 5.5:
        ax.set_title(f"{ax.get_title()}\n(cells too small for numbers: read the colour bar)")
        return
    for i, j in zip(*np.nonzero(~np.isnan(matrix)), strict=True):
        if j <= i:
            colour = "0.1" if _luminance(image.to_rgba(matrix[i, j])) > 0.179 else "white"
            ax.text(j, i, f"{matrix[i, j]:.0f}", ha="center", va="center", fontsize=size, color=colour)


def _luminance(rgba: Sequence[float]) -> float:
    """WCAG's relative luminance of an sRGB colour, 0 (black) to 1 (white); above 0.179 black text contrasts
    more with it than white text does."""
    linear = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in rgba[:3]]
    return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]


def plot_run(run: Run, out_dir: Path, stem: str | None = None) -> list[Path]:
    """Write :func:`run_figure` as ``runs/<stem>`` below ``out_dir`` (by default the run's :func:`figure_stems`
    alone); returns the PNG and PDF paths."""
    return _save(run_figure(run), out_dir / "runs" / (stem or figure_stems([run.name])[0]))


def synthetic_images(run_dir: Path) -> list[tuple[int, Path]]:
    """``(task, path)`` of a run's ``synthetic_task<t>.png`` files, by task."""
    found = [(int(m.group(1)), p) for p in run_dir.glob("synthetic_task*.png") if (m := SYNTHETIC.fullmatch(p.name))]
    return sorted(found)


def plot_synthetic(run: Run, out_dir: Path, stem: str | None = None) -> list[Path]:
    """A run's synthetic-image grids, tasks side by side, as ``synthetic/<stem>`` (as :func:`plot_run`); nothing for
    a run without them."""
    images = synthetic_images(run.path)
    if not images:
        return []
    import matplotlib.image

    fig = _figure(figsize=(3.2 * len(images), 3.6), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, len(images)))
    for ax, (task, path) in zip(axes, images, strict=True):
        try:
            pixels = matplotlib.image.imread(path)
        except (OSError, ValueError, SyntaxError) as err:  # Pillow's errors for a damaged or truncated file
            raise PlotError(f"{path} cannot be read as an image ({err}); remove it or train the run again") from None
        ax.imshow(pixels)
        ax.set_title(f"task {task}", fontsize=9)
        ax.axis("off")
    fig.suptitle(f"{run.name}: synthetic images")
    return _save(fig, out_dir / "synthetic" / (stem or figure_stems([run.name])[0]))


def write_plots(
    groups: Sequence[Group], out_dir: Path, pairs: Pairs | None = None, std: str = "population"
) -> list[Path]:
    """Every figure for ``groups``: the curves, the first task's classes, stability against plasticity, with
    ``pairs`` (``--against``) the paired differences after each task, each finished run's panels, each run's
    synthetic images; bands of one ``std`` (``population`` or ``sample``, the report's ``--std``), each group in one
    :class:`CurveStyle` in every figure. A folder that cannot be written, or a run's image that cannot be read, is a
    :class:`PlotError` naming it."""
    _figure()  # fail early, before any file, without matplotlib
    _ddof(std)  # and with a std it does not know
    if out_dir.exists() and not out_dir.is_dir():
        raise PlotError(f"--plots {out_dir} is a file; give a folder for the figures")
    try:
        styles = curve_styles([g for same in _by_setting(groups).values() for g in same])
        files = plot_curves(groups, out_dir, styles, std) + plot_first_task(groups, out_dir, styles, std)
        files += plot_stability(groups, out_dir, styles, std)
        files += plot_against(groups, pairs, out_dir, styles, std) if pairs else []
        runs = [r for g in groups for r in g.runs]
        for run, stem in zip(runs, figure_stems([r.name for r in runs]), strict=True):
            matrices = run.summary is not None and all(k in run.summary for k in ("accuracy_matrix", "count_matrix"))
            files += (plot_run(run, out_dir, stem) if matrices else []) + plot_synthetic(run, out_dir, stem)
    except OSError as err:  # a folder not writable, a disk full
        where = err.filename or out_dir
        raise PlotError(f"cannot write the figures: {where}: {err.strerror or err}") from None
    return files
