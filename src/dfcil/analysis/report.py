"""``dfcil report``: tables (and plots) from finished run directories, next to the paper's numbers.

A run directory is any folder holding a ``config.yaml``; it is finished when it also holds ``summary.json``. Runs
are found recursively under the paths given (a run, a sweep, a folder of many), grouped so that the runs of a
group differ only in class order (``data.class_order_seed``, ``data.class_order``) and training ``seed``, and each
group's metrics are given as mean ± std over its finished runs. The paper's value for the group's dataset,
protocol and method (:mod:`dfcil.analysis.paper`) is shown next to ours, with the difference and whether ours lies
within one of the paper's standard deviations. A number another paper gives on its own protocol (ABD's, EFC's, LDC's:
another backbone, schedule or class order) is marked † and its protocol is said under the table.

Pure reading: only ``config.yaml`` and ``summary.json`` are read, as plain data, and neither torch nor the
engine is imported.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import io
import math
import re
import shlex
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from dfcil.analysis.paper import Value
from dfcil.analysis.run_dirs import Group, Run, at_defaults, find_runs, group_runs, printable, setting_of
from dfcil.catalogue import method_entries
from dfcil.errors import ReportError
from dfcil.stores import is_data_free

# Our metrics: summary.json key → column title. old_acc / new_acc are the last task's entries of their lists.
METRICS = {
    "last_acc": "A_N",
    "avg_inc_acc": "Ā_N",
    "forgetting": "forgetting",
    "old_acc": "old acc",
    "new_acc": "new acc",
    "bwt": "BWT",
    "first_acc": "first task",
}
# The long table's columns: all but BWT, which forgetting already shows from the other side (--by, CSV have it)
LONG_METRICS = ("last_acc", "avg_inc_acc", "forgetting", "old_acc", "new_acc")
# What a --by table's cells hold, said under it
MEANINGS = {
    "last_acc": "A_N, the accuracy on all seen classes after the last task (%)",
    "avg_inc_acc": "Ā_N, the mean over tasks of the accuracy on all seen classes after each (%)",
    "forgetting": "forgetting after the last task (points)",
    "old_acc": "old acc, the accuracy on the classes of the tasks before the last, after the last (%)",
    "new_acc": "new acc, the accuracy on the last task's classes after it (%)",
    "bwt": "BWT, backward transfer: the mean over the tasks before the last of their accuracy after the last task "
    "minus that just after their own (points; negative is forgetting, positive old tasks gained)",
    "first_acc": "the accuracy on the first task's classes after the last task (%)",
}
PAPER_METRICS = ("last_acc", "avg_inc_acc")
DIMENSIONS = ("method", "dataset", "protocol", "config")  # what --by may name
# --std: how ± is computed, for runs and pairs alike, said under every table
STDS = {
    "population": "population standard deviation (n in the denominator)",
    "sample": "sample standard deviation (n − 1 in the denominator)",
}
RUNS_NOTE = "A group's finished runs differ only in class order or training seed"
PAPER_STD_NOTE = "; the paper's ± is over its 3 class orders (convention not stated)"
OTHER_PROTOCOL = "†: another paper's number, on that paper's own protocol, not R-DFCIL's nor this run's"


@dataclasses.dataclass(frozen=True)
class Stat:
    mean: float | None
    std: float | None  # None for fewer than two runs
    n: int

    @classmethod
    def of(cls, values: Sequence[float], std: str = "population") -> Stat:
        """Mean and ``std`` (a key of :data:`STDS`) of ``values``; no std for fewer than two."""
        if not values:
            return cls(None, None, 0)
        # statistics.mean and its stds sum exactly, as fractions: fmean's float sum overflows near the largest float
        # (two runs of 1e308), where the mean itself is a float
        spread = statistics.pstdev if std == "population" else statistics.stdev
        try:
            deviation = spread(values) if len(values) > 1 else None
        except OverflowError:  # a sample std beyond the largest float (values near it): infinite as a float
            deviation = math.inf
        return cls(float(statistics.mean(values)), deviation, len(values))


def std_line(std: str, over: str) -> str:
    """The line under a table that says which std its ± is (``std``, a key of :data:`STDS`), over what."""
    return f"± is the {STDS[std]} over {over}."


@dataclasses.dataclass(frozen=True)
class Comparison:
    paper: Value
    diff: float  # ours − paper, points
    within: bool | None  # |diff| ≤ the paper's std; None where the paper gives one run

    @classmethod
    def of(cls, ours: Stat, paper: Value | None) -> Comparison | None:
        if paper is None or ours.mean is None:
            return None
        diff = ours.mean - paper.mean
        return cls(paper, diff, None if paper.std is None else abs(diff) <= paper.std + 1e-9)


def pairing_key(run: Run) -> str:
    """What pairs two runs of a comparison, as text: the class order (the explicit list, else its
    ``data.class_order_seed``) and the training seed, e.g. ``class order 0, seed 1``."""
    data = run.config.get("data") or {}
    order = data.get("class_order")
    order = order if order is not None else data.get("class_order_seed", 0)
    return f"class order {order}, seed {run.config.get('seed', 1)}"


def references(groups: Sequence[Group], against: str, quiet: bool = False) -> dict[tuple[Any, ...], Group | None]:
    """The reference group of each dataset and protocol that has one (:attr:`Group.comparable`): the group whose
    label is ``against``, or else whose method (``rdfcil``, ``lwf[ldc]``) is, one for each of the conditions its
    groups were run under (:attr:`Group.conditions`: a method with and without AutoAugment), so that a group is
    compared at its own conditions (:func:`reference_of`). Of several groups of that method in one setting and
    conditions (the method under several configs, an ablation), the one at the method's defaults
    (:func:`at_defaults`); where none or several are, an error lists their labels to choose from, or (where other
    conditions of the protocol have a reference) a warning (none with ``quiet``: the tables said it), and the
    conditions map to None."""
    by_setting: dict[tuple[Any, ...], list[Group]] = {}
    exact = [g for g in groups if g.label == against]
    for g in exact:  # one group named: every group of its dataset and protocol is compared with it
        by_setting.setdefault(g.comparable, []).append(g)
    for g in [] if exact else [g for g in groups if g.setting.method_label == against]:
        by_setting.setdefault((g.comparable, g.conditions), []).append(g)
    if not by_setting:
        methods = sorted({g.setting.method_label for g in groups})
        raise ReportError(
            f"--against {against!r} names no group: give a method ({', '.join(methods)}) or a group's full label"
        )
    out: dict[tuple[Any, ...], Group | None] = {}
    unclear = []
    for key, candidates in by_setting.items():
        chosen = candidates[0] if len(candidates) == 1 else at_defaults(candidates)
        if chosen is None:
            labels = "; ".join(repr(g.label) for g in candidates)
            unclear.append((candidates[0].comparable, f"--against {against!r} matches {len(candidates)} groups of one "
                            f"setting ({labels}), none of them alone at the method's defaults"))  # fmt: skip
        out[key] = chosen
    settled = {g.comparable for g in out.values() if g is not None}
    for comparable, line in unclear:  # a dataset and protocol without any reference: the user must choose
        if comparable not in settled:
            raise ReportError(f"{line}: give one of these labels")
    for _, line in [] if quiet else unclear:  # other conditions of the protocol have theirs: these groups have none
        print(printable(f"dfcil report: warning: {line}: the groups under these conditions are compared with none "
                        f"(give one of these labels to compare every group with it)"), file=sys.stderr)  # fmt: skip
    return out


def reference_of(refs: dict[tuple[Any, ...], Group | None], group: Group) -> Group | None:
    """``group``'s reference among :func:`references`: the one named by its label, else its method's at the
    group's own conditions; None where there is none (the reference method was not run under them)."""
    return refs.get(group.comparable) or refs.get((group.comparable, group.conditions))


def _finished_by_pair(group: Group) -> dict[str, list[Run]]:
    """``group``'s finished runs by :func:`pairing_key`: more than one under a key is a run repeated, or runs that
    differ only in keys that never split a group (such as ``engine.compile``)."""
    out: dict[str, list[Run]] = {}
    for r in group.finished:
        out.setdefault(pairing_key(r), []).append(r)
    return out


def _runs_by_pair(group: Group) -> dict[str, Run | None]:
    """``group``'s finished runs by :func:`pairing_key`; None under a class order and seed with more than one run,
    where which one to pair is ambiguous (:func:`ambiguous_pairs` says so)."""
    return {key: runs[0] if len(runs) == 1 else None for key, runs in _finished_by_pair(group).items()}


def ambiguous_pairs(group: Group) -> list[str]:
    """One warning line per class order and seed with more than one finished run in ``group``: naming the runs,
    saying that this class order and seed is left out of ``--against``'s pairs, and how to keep it."""
    return [
        printable(
            f"dfcil report: warning: --against: {group.label!r} has {len(runs)} finished runs of {key} "
            f"({' and '.join(r.name for r in runs)}), so which one to pair is ambiguous: that class order and seed is "
            f"left out of its pairs; leave all but one out with --exclude, e.g. --exclude {shlex.quote(runs[-1].name)}"
        )
        for key, runs in _finished_by_pair(group).items()
        if len(runs) > 1
    ]


def repeated_runs(groups: Sequence[Group]) -> list[tuple[str, list[str]]]:
    """(group label, run names) for each class order and seed that has more than one finished run in a group."""
    return [
        (g.label, [r.name for r in runs]) for g in groups for runs in _finished_by_pair(g).values() if len(runs) > 1
    ]


def run_pairs(group: Group, reference: Group) -> tuple[list[tuple[Run, Run]], int]:
    """Each of ``group``'s finished runs with the reference's run of the same class order and training seed
    (:func:`pairing_key`), and how many of ``group``'s runs have no partner run at all. A class order and seed with
    two runs on either side is ambiguous, and left out (:func:`ambiguous_pairs`)."""
    ref = _runs_by_pair(reference)
    out, alone = [], 0
    for key, r in _runs_by_pair(group).items():
        if key not in ref:
            alone += 1
        elif r is not None and (partner := ref[key]) is not None:
            out.append((r, partner))
    return out, alone


def paired(group: Group, reference: Group, metric: str, std: str = "population") -> tuple[Stat, int]:
    """``metric`` of each of ``group``'s finished runs minus that of the reference's run with the same class
    order and training seed (:func:`run_pairs`): their mean ± ``std`` over the pairs where both runs have the
    metric, and how many of ``group``'s runs have no partner run at all."""
    pairs, alone = run_pairs(group, reference)
    diffs = [
        v - w
        for r, partner in pairs
        if (v := r.metric(metric)) is not None and (w := partner.metric(metric)) is not None
    ]
    return Stat.of(diffs, std), alone


def plot_pairs(groups: Sequence[Group], against: str) -> dict[str, tuple[Group, list[tuple[Run, Run]]]]:
    """For ``--plots`` with ``--against``: each compared group's label, its reference group and their pairs of
    runs (:func:`run_pairs`), for the groups with at least one pair (the tables have said why others have none)."""
    refs = references(groups, against, quiet=True)
    out = {}
    for g in groups:
        ref = reference_of(refs, g)
        if ref is not None and ref is not g and (pairs := run_pairs(g, ref)[0]):
            out[g.label] = (ref, pairs)
    return out


# ------------------------------------------------------------------------------------------------ tables


def records(groups: Sequence[Group], against: str | None = None, std: str = "population") -> list[dict[str, Any]]:
    """One record per group: labels, run counts, each metric's mean/``std``/n and the paper comparison (numbers);
    with ``against``, also each metric's paired difference to the reference group of its setting (:func:`paired`:
    ``{metric}_vs_mean``, ``_vs_std``, ``_vs_n``, and ``vs`` the reference's label; empty for the reference itself
    and for settings without one). A class order and seed that two runs of a compared group share is left out of
    the pairs, with a warning on stderr (:func:`ambiguous_pairs`)."""
    out = []
    refs = references(groups, against) if against is not None else {}
    for warning in (w for g in groups if reference_of(refs, g) is not None for w in ambiguous_pairs(g)):
        print(warning, file=sys.stderr)
    unmatched = not_compared(refs, groups, against) if against is not None else []
    for line in unmatched:
        print(line, file=sys.stderr)
    for g in groups:
        s, row = g.setting, g.setting.paper_row()
        rec: dict[str, Any] = {
            "group": g.label, "method": s.method, "variant": s.variant, "dataset": s.dataset,
            "protocol": s.protocol, "reduced": s.reduced, "config": g.config_label, "runs": len(g.finished),
            "unfinished": len(g.runs) - len(g.finished),
        }  # fmt: skip
        for metric in METRICS:
            stat = Stat.of(g.values(metric), std)
            rec |= {f"{metric}_mean": stat.mean, f"{metric}_std": stat.std, f"{metric}_n": stat.n}
        for metric in PAPER_METRICS:
            paper: Value | None = getattr(row, metric) if row else None
            cmp = Comparison.of(Stat.of(g.values(metric), std), paper)
            rec |= {
                f"{metric}_paper_mean": paper.mean if paper else None,
                f"{metric}_paper_std": paper.std if paper else None,
                f"{metric}_diff": cmp.diff if cmp else None,
                f"{metric}_within_paper_std": cmp.within if cmp else None,
            }
        rec["paper_row"] = f"{row.label} ({row.source})" + (" †" if row.own_protocol else "") if row else ""
        rec["paper_protocol"] = row.own_protocol if row else ""
        if against is not None:
            rec |= _versus(g, reference_of(refs, g), std)
        out.append(rec)
    if against is not None and not any(rec["vs"] for rec in out):
        if unmatched:
            raise ReportError(
                f"--against {against!r}: no group could be compared with one of {against}'s (the lines above say "
                f"why); give a group's full label to compare every group with it"
            )
        raise ReportError(f"--against {against!r}: no other group shares a dataset and protocol with it")
    return out


def not_compared(refs: dict[tuple[Any, ...], Group | None], groups: Sequence[Group], against: str) -> list[str]:
    """A note for each group left without a reference: because ``against`` has several groups under its conditions
    (:attr:`Group.conditions`), none alone at the method's defaults (the warning of :func:`references` lists them),
    or because ``against``'s groups on its dataset and protocol were run under other conditions: which, and how to
    compare it anyway."""
    notes = []
    for g in groups:
        if reference_of(refs, g) is not None or g.setting.method_label == against:
            continue
        if (g.comparable, g.conditions) in refs:  # several of against's groups under these conditions
            mine = ", ".join(f"{k}={v}" for k, v in g.conditions) or "the same conditions"
            notes.append(printable(
                f"dfcil report: note: --against {against!r}: {g.label!r} is compared with none: {against} has "
                f"several groups under {mine}, none of them alone at the method's defaults (the warning above lists "
                f"them); give one of their labels to compare every group with it"
            ))  # fmt: skip
            continue
        others = [ref for key, ref in refs.items() if len(key) == 2 and key[0] == g.comparable and ref is not None]
        if others:
            mine = ", ".join(f"{k}={v}" for k, v in g.conditions)
            theirs = "; ".join(", ".join(f"{k}={v}" for k, v in ref.conditions) for ref in others)
            notes.append(printable(
                f"dfcil report: note: --against {against!r}: {g.label!r} is compared with none: {against} was run "
                f"under {theirs}, not under {mine}; give a full label ({others[0].label!r}) to compare every group "
                f"with one group"
            ))  # fmt: skip
    return notes


def _versus(group: Group, ref: Group | None, std: str) -> dict[str, Any]:
    """A record's ``--against`` columns: the reference's labels and each metric's :func:`paired` difference to it,
    empty for the reference itself and where the setting has none."""
    if ref is None or ref is group:
        ref, rec = None, {"vs": "", "vs_short": ""}
    else:
        rec = {"vs": ref.label, "vs_short": ref.short_label}
    for metric in METRICS:
        stat, alone = paired(group, ref, metric, std) if ref is not None else (Stat(None, None, 0), 0)
        rec |= {f"{metric}_vs_mean": stat.mean, f"{metric}_vs_std": stat.std, f"{metric}_vs_n": stat.n}
        rec |= {f"{metric}_vs_unpaired": alone} if metric == "last_acc" else {}
    return rec


_LATEX_TOKENS = {"Ā_N": "$\\bar{A}_N$", "A_N": "$A_N$", "†": "$^\\dagger$", "±": "$\\pm$", "·": "$\\cdot$"}
_LATEX_TOKENS |= {"Δ": "$\\Delta$", "−": "$-$"}
_LATEX_ESCAPES = {c: f"\\{c}" for c in "&%$#_{}"} | {"\\": "\\textbackslash{}", "~": "\\~{}", "^": "\\^{}"}


def _latex(s: str) -> str:
    parts = re.split(f"({'|'.join(_LATEX_TOKENS)})", s)
    return "".join(_LATEX_TOKENS.get(p) or "".join(_LATEX_ESCAPES.get(c, c) for c in p) for p in parts)


# What each format escapes in text of its own: markdown's cell separator, LaTeX's special characters; CSV quotes
ESCAPES: dict[str, Callable[[str], str]] = {"md": lambda s: s.replace("|", "\\|"), "csv": str, "latex": _latex}


def escape(text: str, fmt: str) -> str:
    """``text`` (a name from a run's files, or a line that holds one) as output of format ``fmt``, the one way
    any reaches the report: its control characters written as escapes (:func:`printable`: an escape sequence never
    reaches the terminal, a newline never ends a LaTeX comment), then the format's own (:data:`ESCAPES`); in LaTeX
    A_N, Ā_N, ±, ·, Δ and − become maths."""
    return ESCAPES[fmt](printable(text))


class _Style:
    """Symbols and escaping of one output format."""

    def __init__(self, fmt: str) -> None:
        self.fmt, self.latex = fmt, fmt == "latex"
        self.pm = " $\\pm$ " if self.latex else " ± "
        self.yes, self.no = ("\\checkmark", "$\\times$") if self.latex else ("✓", "✗")
        self.dagger = "$^\\dagger$" if self.latex else "†"  # another paper's protocol

    def text(self, s: str) -> str:
        """``s`` as a cell or in a note: :func:`escape`."""
        return escape(s, self.fmt)

    def stat(self, mean: float | None, std: float | None, n: int | None = None) -> str:
        if mean is None:
            return "–"
        text = f"{mean:.2f}" + (f"{self.pm}{std:.2f}" if std is not None else "")
        return text + (f" ({n})" if n is not None else "")

    def diff(self, diff: float | None, within: bool | None) -> str:
        if diff is None:
            return ""
        mark = "" if within is None else " " + (self.yes if within else self.no)
        return f"{diff:+.2f}{mark}".replace("-", "$-$" if self.latex else "−")


def long_table(recs: Sequence[dict[str, Any]], style: _Style, paper: bool = True) -> tuple[list[str], list[list[str]]]:
    """The default table: one row per group, every metric, and with ``paper`` the paper's values and the
    differences (left out when no group is on a dataset the paper ran: they would all be empty)."""
    compared = PAPER_METRICS if paper else ()
    head = ["group", "runs"]
    for m in LONG_METRICS:
        head += [METRICS[m]] + ([f"paper {METRICS[m]}", "Δ"] if m in compared else [])
    head += ["paper row"] if paper else []
    rows = []
    for r in recs:
        row = [
            style.text(r["group"]),
            str(r["runs"]) + (f" (+{r['unfinished']} unfinished)" if r["unfinished"] else ""),
        ]
        for m in LONG_METRICS:
            row.append(style.stat(r[f"{m}_mean"], r[f"{m}_std"]))
            if m in compared:
                row.append(style.stat(r[f"{m}_paper_mean"], r[f"{m}_paper_std"]))
                row.append(style.diff(r[f"{m}_diff"], r[f"{m}_within_paper_std"]))
        rows.append(row + ([style.text(r["paper_row"])] if paper else []))
    return [style.text(h) for h in head], rows


PAIRED_METRICS = ("last_acc", "avg_inc_acc", "forgetting")


def paired_table(recs: Sequence[dict[str, Any]], style: _Style) -> tuple[list[str], list[list[str]]]:
    """``--against``: one row per group compared with a reference, each metric's paired difference (mean ± std,
    pairs), A_N's marked where the mean is farther from 0 than the std (a gain or loss beyond the spread)."""
    head = ["group", "against", "pairs"] + [f"Δ {METRICS[m]}" for m in PAIRED_METRICS] + ["A_N beyond spread"]
    rows = []
    for r in recs:
        if not r.get("vs"):
            continue
        n, alone = r["last_acc_vs_n"], r["last_acc_vs_unpaired"]
        row = [style.text(r["group"]), style.text(r["vs_short"]), str(n) + (f" (+{alone} unpaired)" if alone else "")]
        for m in PAIRED_METRICS:
            mean, std, m_n = r[f"{m}_vs_mean"], r[f"{m}_vs_std"], r[f"{m}_vs_n"]
            cell = "–" if mean is None else style.diff(mean, None) + (f"{style.pm}{std:.2f}" if std is not None else "")
            row.append(cell + (f" ({m_n} pairs)" if mean is not None and m_n != n else ""))  # a metric some lack
        mean, std = r["last_acc_vs_mean"], r["last_acc_vs_std"]
        row.append("" if mean is None or std is None else style.yes if abs(mean) > std else style.no)
        rows.append(row)
    return [style.text(h) for h in head], rows


PAIRED_NOTE = (
    "Paired: each run minus the reference run of the same class order and training seed, then mean ± std over the "
    "pairs; a positive Δ forgetting is more forgetting than the reference's. Beyond spread: "
    "|mean| > std, which needs at least two pairs (left blank with one)."
)


def pivot_table(
    groups: Sequence[Group], recs: Sequence[dict[str, Any]], rows: str, cols: str, metric: str, style: _Style
) -> tuple[list[str], list[list[str]]]:
    """Rows × columns of one metric, as the paper's tables (rows = method, columns = protocol); the corner cell
    names the metric. Dimensions not named that still vary are added to the row labels, so every group has its
    own cell."""
    varying = [d for d in DIMENSIONS if d not in (rows, cols) and len({g.dimension(d) for g in groups}) > 1]
    row_keys, col_keys, cells = [], [], {}
    for g, r in zip(groups, recs, strict=True):
        rk = " · ".join(p for p in (g.dimension(rows), *(g.dimension(d) for d in varying)) if p)
        ck = g.dimension(cols)
        row_keys += [rk] if rk not in row_keys else []
        col_keys += [ck] if ck not in col_keys else []
        assert (rk, ck) not in cells, f"two groups in one cell: {rk}, {ck}"
        cell = style.stat(r[f"{metric}_mean"], r[f"{metric}_std"], r[f"{metric}_n"])
        if r.get(f"{metric}_paper_mean") is not None:
            paper = style.stat(r[f"{metric}_paper_mean"], r[f"{metric}_paper_std"])
            paper += style.dagger if r["paper_protocol"] else ""
            cell += f" [paper {paper}, {style.diff(r[f'{metric}_diff'], r[f'{metric}_within_paper_std'])}]"
        cells[rk, ck] = cell
    across = "/" if style.latex else "\\"  # a backslash is a command in LaTeX
    head = [style.text(f"{METRICS[metric]}: {rows} {across} {cols}"), *map(style.text, col_keys)]
    return head, [[style.text(rk), *(cells.get((rk, ck), "") for ck in col_keys)] for rk in row_keys]


def render(head: list[str], rows: list[list[str]], fmt: str) -> str:
    if fmt == "md":
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows]) + "\n"
    body = [" & ".join(r) + " \\\\" for r in rows]
    return "\n".join(
        ["% needs \\usepackage{booktabs, amssymb}", f"\\begin{{tabular}}{{l{'r' * (len(head) - 1)}}}", "\\toprule",
         " & ".join(head) + " \\\\", "\\midrule", *body, "\\bottomrule", "\\end{tabular}"]
    ) + "\n"  # fmt: skip


def _csv_cell(value: Any) -> Any:
    if isinstance(value, str):
        return escape(value, "csv")
    return "" if value is None else round(value, 4) if isinstance(value, float) else value


def render_csv(recs: Sequence[dict[str, Any]]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(recs[0]) if recs else ["group"], lineterminator="\n")
    writer.writeheader()
    for r in recs:
        writer.writerow({k: _csv_cell(v) for k, v in r.items()})
    return buf.getvalue()


def stores_of(runs: Sequence[Run]) -> dict[str, str]:
    """What each finished run's method keeps between tasks (``Method.stores``), by method name (by variant, e.g.
    ``lwf[ldc]``, where variants of one method keep different things): from summary.json, else (runs from before it
    said) from the method's source (:mod:`dfcil.catalogue`, no torch)."""
    known = {e.name: e.stores for e in method_entries()}
    by_name: dict[str, dict[str, str]] = {}  # method name → its variants' labels (lwf[ldc]) → what they keep
    for r in runs:
        method = (r.config.get("method") or {}).get("name") if r.summary is not None else None
        if isinstance(method, str) and (stores := r.summary.get("stores") or known.get(method)):
            by_name.setdefault(method, {})[setting_of(r.config).method_label] = stores
    kept = {}
    for method, labels in by_name.items():  # by variant only where a switch changes it (LwF with LDC)
        kept |= {method: next(iter(labels.values()))} if len(set(labels.values())) == 1 else labels
    return kept


def scoring_notes(runs: Sequence[Run]) -> dict[str, str]:
    """What a method's summary says of how it scores, where that changes what a number means (FeCAM's task 0 by
    its cosine head, later tasks by Mahalanobis distances: a forgetting across two classifiers), by method."""
    notes = {}
    for r in runs:
        text = (r.summary or {}).get("scoring")
        if isinstance(text, str) and text:
            notes[str(r.config.get("method", {}).get("name", "?"))] = text
    return notes


def unscored_notes(runs: Sequence[Run]) -> dict[str, str]:
    """For each method with runs whose model was not its answer after some tasks (joint trained in the last task
    only: :func:`dfcil.analysis.run_dirs.unscored_tasks`), what the report leaves out of them, by method."""
    notes = {}
    for r in runs:
        if r.summary is not None and (tasks := r.summary.get("unscored_tasks")):
            shown = f"task {tasks[0]}" if len(tasks) == 1 else f"tasks {tasks[0]} to {tasks[-1]}"
            notes[str(r.config.get("method", {}).get("name", "?"))] = (
                f"untrained after {shown} (trained later in the run), so its Ā_N, forgetting and BWT read – and its "
                f"curves have no point there; its A_N and old/new accuracy after the last task are results"
            )
    return notes


def compares_paper(groups: Sequence[Group]) -> bool:
    """Whether a group is on a protocol the paper's numbers can apply to: a dataset it ran, not reduced. A report of
    reduced protocols alone (cifar100-mini) has no paper columns, which would all read "–"."""
    return any(g.setting.in_paper and not g.setting.reduced for g in groups)


def footer(runs: Sequence[Run], groups: Sequence[Group], style: _Style, metric: str | None = None) -> list[str]:
    """The notes under the tables: what a group's runs differ in, what a ``--by`` table's cells hold (``metric``),
    what Δ and the marks mean, the unfinished runs (a list). The paper is mentioned only when a group is on a protocol
    its numbers can apply to (:func:`compares_paper`). Which std ± is goes right under each table (:func:`std_line`)."""
    paper = compares_paper(groups)
    notes = [RUNS_NOTE + (PAPER_STD_NOTE if paper else "") + "."]
    if metric is not None:
        notes.append(
            f"Cells: {MEANINGS[metric]}, mean ± std (runs)" + (" [paper's value, ours − paper]." if paper else ".")
        )
    if paper:
        notes.append(f"Δ = ours − paper in points; {style.yes} within one paper std, {style.no} outside (no mark: "
                     f"the paper gives one run or no std).")  # fmt: skip
    shown = [row for g in groups if (row := g.setting.paper_row()) is not None]
    if protocols := sorted({row.own_protocol for row in shown if row.own_protocol}):
        notes.append(f"{OTHER_PROTOCOL}: " + "; ".join(protocols) + ".")
    if any(g.setting.reduced for g in groups):
        notes.append("Reduced protocols (fewer classes, images or pixels) are never compared with the paper.")
    if kept := stores_of(runs):
        notes.append("Kept between tasks besides the model: " + "; ".join(
            f"{style.text(method)}: {style.text(stores)}" + ("" if is_data_free(stores) else " (not data-free)")
            for method, stores in sorted(kept.items())
        ) + ".")  # fmt: skip
    if scoring := scoring_notes(runs):
        notes.append(
            "How methods score: "
            + "; ".join(f"{style.text(m)}: {style.text(t)}" for m, t in sorted(scoring.items()))
            + "."
        )
    if unscored := unscored_notes(runs):
        notes.append(
            "Not results: " + "; ".join(f"{style.text(m)}: {style.text(t)}" for m, t in sorted(unscored.items())) + "."
        )
    if repeats := repeated_runs(groups):
        notes.append(
            "Warning: runs of one class order and seed in one group, each counted in its mean, std and n, so that "
            "its ± is not a spread over class orders or seeds alone (a run repeated, or runs that differ only in "
            "keys that never split a group, such as engine.compile): "
            + "; ".join(f"{style.text(label)}: {', '.join(style.text(n) for n in names)}" for label, names in repeats)
            + "."
        )
    unfinished = [r for r in runs if r.summary is None]
    if unfinished:
        notes.append(f"Unfinished runs (no summary.json): {len(unfinished)}")
    lines = [line for note in notes for line in ("", note)]
    return lines + [f"- {style.text(r.name)}" for r in unfinished]


def report(
    runs: Sequence[Run],
    fmt: str = "md",
    by: tuple[str, str] | None = None,
    metric: str = "last_acc",
    against: str | None = None,
    std: str = "population",
) -> str:
    """The report's text: a long table (default) or a ``by = (rows, cols)`` pivot of ``metric``, then notes; with
    ``against`` (a method or a group's label) a table of paired differences to that reference follows the long
    table (in CSV: the ``*_vs_*`` columns). ``std`` (``population`` or ``sample``) is the ± of runs and pairs alike,
    said under each table."""
    if fmt not in ("md", "csv", "latex"):
        raise ReportError(f"format must be md, csv or latex, got {fmt!r}")
    if std not in STDS:
        raise ReportError(f"std must be {' or '.join(STDS)}, got {std!r}")
    if against is not None and by is not None:
        raise ReportError("--against goes with the long table (or --format csv), not with --by: leave one out")
    groups = group_runs(runs)
    recs = records(groups, against, std)
    style = _Style(fmt)
    if fmt == "csv" and by is None:
        return render_csv(recs)
    paper = compares_paper(groups)
    head, rows = long_table(recs, style, paper) if by is None else pivot_table(groups, recs, *by, metric, style)
    if fmt == "csv":
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerows([head, *rows])
        return buf.getvalue()
    notes = footer(runs, groups, style, metric if by is not None else None)
    text = render(head, rows, fmt) + _under(std_line(std, "a group's finished runs"), fmt)
    if against is not None:
        p_head, p_rows = paired_table(recs, style)
        text += ("\n" if fmt == "md" else "") + render(p_head, p_rows, fmt) + _under(std_line(std, "the pairs"), fmt)
        notes = ["", PAIRED_NOTE, *notes]
    # the notes' names are escaped (style.text); printable again here, so that no note ever ends its comment
    if fmt == "latex":
        return text + "".join(f"% {printable(n)}\n" for n in notes if n)
    return text + "\n".join(map(printable, notes)) + "\n"


def _under(line: str, fmt: str) -> str:
    """``line`` right under a rendered table: a paragraph of its own in markdown (a line that follows a table's
    rows would read as one more row), a comment in LaTeX."""
    return f"% {line}\n" if fmt == "latex" else f"\n{line}\n"


def csv_notes(runs: Sequence[Run], metric: str | None, against: str | None, std: str) -> list[str]:
    """The notes a CSV report prints on stderr (a CSV has no room under its table): which std for runs (and for
    pairs with ``against``), then :func:`footer`'s."""
    notes = [std_line(std, "a group's finished runs")]
    notes += [std_line(std, "the pairs"), PAIRED_NOTE] if against is not None else []
    return notes + footer(runs, group_runs(runs), _Style("csv"), metric)


# ------------------------------------------------------------------------------------------------ command line


def parse_by(text: str) -> tuple[str, str]:
    parts = [p.strip() for p in text.split(",")]
    if len(parts) != 2 or any(p not in DIMENSIONS for p in parts) or parts[0] == parts[1]:
        raise ReportError(f"--by takes ROWS,COLS, two of {', '.join(DIMENSIONS)}; got {text!r}")
    return parts[0], parts[1]


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``report`` subcommand to an argparse subparsers object."""
    p = subparsers.add_parser(
        "report",
        help="tables (and plots) of finished runs, mean ± std over class orders, next to the paper's numbers",
        description="Find run directories below PATHs, group runs that differ only in class order or seed, and "
        "print mean ± std of A_N, average incremental accuracy, forgetting and old/new accuracy beside the "
        "paper's numbers.",
    )
    p.add_argument("paths", nargs="+", metavar="PATH", help="run directories, or folders above them (sweeps)")
    p.add_argument("--format", choices=("md", "csv", "latex"), default="md", help="output format (default md)")
    p.add_argument("--by", metavar="ROWS,COLS", help=f"a table of one metric; ROWS and COLS among {DIMENSIONS}")
    p.add_argument(
        "--metric", choices=list(METRICS), default=None,
        help="the metric of --by's table (default last_acc; only with --by); bwt is backward transfer, negative "
        "for forgetting; first_acc the accuracy on the first task's classes after the last task",
    )  # fmt: skip
    p.add_argument(
        "--against",
        metavar="METHOD",
        help="also each group's paired difference to this method's group (or a group's full label) on the same "
        "dataset and protocol: run minus run of the same class order and seed, mean ± std over the pairs",
    )
    p.add_argument(
        "--exclude", action="append", default=[], metavar="GLOB",
        help="leave out, before anything else, the run directories (and folders of runs) whose name (smoke-logs), "
        "path from PATH (runs/smoke-logs) or absolute path matches GLOB (* also crosses /); repeatable",
    )  # fmt: skip
    p.add_argument(
        "--std", choices=tuple(STDS), default="population",
        help="the ± over runs and over --against's pairs: population (n in the denominator, default) or sample "
        "(n − 1)",
    )  # fmt: skip
    p.add_argument("--plots", metavar="DIR", help="also write PNG and PDF figures into DIR (needs dfcil[plot])")
    p.add_argument(
        "--timing", action="store_true",
        help="instead, each run's time task by task (setup, phases, eval, compile) and its total, extrapolated "
        "for an unfinished run",
    )  # fmt: skip
    return p


def main(args: argparse.Namespace) -> int:
    """Run ``dfcil report`` on parsed arguments; 0 on success, 2 on an error (printed)."""
    try:
        runs = find_runs(args.paths, args.exclude)
        if not runs:
            left = f" that --exclude {' '.join(map(shlex.quote, args.exclude))} leaves" if args.exclude else ""
            raise ReportError(f"no run directories (folders with a config.yaml){left} under {', '.join(args.paths)}")
        if args.timing:
            from dfcil.analysis.timing import timing_table

            tables = [timing_table(r.path, int(r.config.get("data", {}).get("num_tasks", 0))) for r in runs]
            print("\n\n".join(tables))
            return 0
        by = parse_by(args.by) if args.by else None
        if args.metric is not None and by is None:
            raise ReportError(
                f"--metric {args.metric} picks the metric of a --by table; the long table shows A_N, Ā_N, "
                f"forgetting and old/new accuracy (CSV: every metric): add --by ROWS,COLS (e.g. --by method,config)"
            )
        args.metric = args.metric or "last_acc"
        sys.stdout.write(report(runs, args.format, by, args.metric, args.against, args.std))
        if args.format == "csv":
            notes = csv_notes(runs, args.metric if by is not None else None, args.against, args.std)
            print("".join(f"dfcil report: {printable(n)}\n" for n in notes if n), end="", file=sys.stderr)
        if args.plots:
            from dfcil.analysis.plots import FOLDERS, write_plots
            from dfcil.errors import PlotError

            groups = group_runs(runs)
            pairs = plot_pairs(groups, args.against) if args.against is not None else None
            try:
                files = write_plots(groups, Path(args.plots), pairs, args.std)
            except PlotError as err:
                raise ReportError(str(err)) from None
            print(f"dfcil report: {len(files)} figure files in {args.plots}", file=sys.stderr)
            written = {f.resolve() for f in files}
            folders = [Path(args.plots) / name for name in FOLDERS]  # its own: not a user's images beside them
            stale = [f for d in folders for f in sorted(d.rglob("*")) if f.suffix in (".png", ".pdf")]
            stale = [f for f in stale if f.resolve() not in written]
            if stale:  # an earlier report's figures, which read as this one's
                print(printable(f"dfcil report: note: {args.plots} also holds {len(stale)} figure files this report "
                                f"did not write (an earlier report's?), e.g. {stale[0]}; give an empty folder to "
                                f"have only this report's"), file=sys.stderr)  # fmt: skip
    except ReportError as err:
        print(printable(f"dfcil: error: {err}"), file=sys.stderr)
        return 2
    return 0
