"""``dfcil report``: tables (and plots) from finished run directories, next to the paper's numbers.

A run directory is any folder holding a ``config.yaml``; it is finished when it also holds ``summary.json``. Runs
are found recursively under the paths given (a run, a sweep, a folder of many), grouped so that the runs of a
group differ only in class order (``data.class_order_seed``, ``data.class_order``) and training ``seed``, and each
group's metrics are given as mean ± std over its finished runs. The paper's value for the group's dataset,
protocol and method (:mod:`dfcil.paper`) is shown next to ours, with the difference and whether ours lies within
one of the paper's standard deviations.

Pure reading: only ``config.yaml`` and ``summary.json`` are read, as plain data, and neither torch nor the
engine is imported.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import io
import json
import os
import re
import statistics
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import yaml

from dfcil.config import RUNTIME_KEYS
from dfcil.paper import DATASETS, PaperRow, Value, find_row, protocol_name, variant_of

# Our metrics: summary.json key → column title. old_acc / new_acc are the last task's entries of their lists.
METRICS = {
    "last_acc": "A_N",
    "avg_inc_acc": "Ā_N",
    "forgetting": "forgetting",
    "old_acc": "old acc",
    "new_acc": "new acc",
}
PAPER_METRICS = ("last_acc", "avg_inc_acc")
# Config keys that never split a group: what runs of one experiment may differ in (class order, training seed),
# runtime keys, and engine switches that keep fp32 results equal within rounding (engine.precision does split).
SAME_EXPERIMENT = {"seed", "data.class_order_seed", "data.class_order", "train.eval_batch_size"}
SAME_EXPERIMENT |= RUNTIME_KEYS | {f"engine.{k}" for k in ("merge_passes", "channels_last", "compile")}
SAME_EXPERIMENT |= {"engine.cudnn_benchmark", "engine.fused_optimizer"}
DIMENSIONS = ("method", "dataset", "protocol", "config")  # what --by may name
METHOD_ORDER = ("joint", "finetune", "lwf", "lwf_mc", "deepinversion", "dgr", "ucir_df", "podnet_df", "abd", "rdfcil")
STD_NOTE = (
    "± is the population standard deviation (n in the denominator) over a group's finished runs, which differ "
    "only in class order or training seed; the paper's ± is over its 3 class orders (convention not stated)."
)


class ReportError(ValueError):
    """Paths without runs, unreadable run files, a bad --by."""


@dataclasses.dataclass(frozen=True)
class Run:
    path: Path
    name: str  # the path from the folder given on the command line (its name included)
    config: dict[str, Any]  # config.yaml as plain data
    summary: dict[str, Any] | None  # summary.json; None: unfinished

    def metric(self, key: str) -> float | None:
        value = None if self.summary is None else self.summary.get(key)
        return value[-1] if isinstance(value, list) else value  # old_acc / new_acc: the last task's


@dataclasses.dataclass(frozen=True)
class Setting:
    """A run in the paper's terms: dataset, protocol (``n10``, ``b50_n11``), method and variant (:mod:`dfcil.paper`)."""

    dataset: str
    protocol: str
    method: str
    variant: str
    reduced: str  # "" on the paper's protocol, else how it was shrunk ("20 classes, 250 train/class")

    @property
    def method_label(self) -> str:
        return f"{self.method}[{self.variant}]" if self.variant else self.method

    @property
    def protocol_label(self) -> str:
        return f"{self.protocol} ({self.reduced})" if self.reduced else self.protocol

    def paper_row(self) -> PaperRow | None:
        """The paper's row; None on a reduced protocol, where the paper's numbers do not apply."""
        return None if self.reduced else find_row(self.dataset, self.protocol, self.method, self.variant)


def setting_of(config: dict[str, Any]) -> Setting:
    """The paper setting a run's config (``config.yaml``, plain) describes."""
    data, method = config.get("data") or {}, config.get("method") or {}
    dataset, name = data.get("name", "cifar100"), method.get("name", "rdfcil")
    reduced = []
    classes, pixels = DATASETS.get(dataset, (None, None))
    if data.get("num_classes") not in (None, classes):
        reduced.append(f"{data['num_classes']} classes")
    for key, what in (("train_per_class", "train"), ("test_per_class", "test")):
        if data.get(key) is not None:
            reduced.append(f"{data[key]} {what}/class")
    if data.get("image_size") not in (None, pixels):
        reduced.append(f"{data['image_size']} px")
    protocol = protocol_name(data.get("num_tasks", 5), data.get("base_classes", 0))
    return Setting(dataset, protocol, name, variant_of(name, method), ", ".join(reduced))


def _flat(tree: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """Dotted key → JSON text of the value (hashable, comparable)."""
    out: dict[str, str] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out |= _flat(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = json.dumps(value)
    return out


@dataclasses.dataclass
class Group:
    """Runs of one experiment: the same config but for class order and training seed."""

    setting: Setting
    config: dict[str, str]  # the flat config its runs share (SAME_EXPERIMENT keys left out)
    runs: list[Run]
    config_label: str = ""  # the keys that tell it apart from other groups of the same setting

    @property
    def label(self) -> str:
        s = self.setting
        return " · ".join(p for p in (s.method_label, s.dataset, s.protocol_label, self.config_label) if p)

    @property
    def finished(self) -> list[Run]:
        return [r for r in self.runs if r.summary is not None]

    def values(self, metric: str) -> list[float]:
        return [v for r in self.finished if (v := r.metric(metric)) is not None]

    def dimension(self, name: str) -> str:
        s = self.setting
        return {"method": s.method_label, "dataset": s.dataset, "protocol": s.protocol_label}.get(
            name, self.config_label
        )


@dataclasses.dataclass(frozen=True)
class Stat:
    mean: float | None
    std: float | None  # None for fewer than two runs
    n: int

    @classmethod
    def of(cls, values: Sequence[float]) -> Stat:
        if not values:
            return cls(None, None, 0)
        return cls(statistics.fmean(values), statistics.pstdev(values) if len(values) > 1 else None, len(values))


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


# ------------------------------------------------------------------------------------------------ finding runs


def find_runs(paths: Iterable[str | os.PathLike]) -> list[Run]:
    """Every run directory (a folder with ``config.yaml``) at or below ``paths``, in path order. A sweep's root
    (``sweep.json``) is not a run, and runs' checkpoint folders and hidden folders are not searched."""
    runs: dict[Path, Run | None] = {}
    for given in map(Path, paths):
        if not given.exists():
            raise ReportError(f"{given} does not exist")
        root = given.resolve()
        for folder, subdirs, files in os.walk(root):
            subdirs[:] = sorted(d for d in subdirs if not d.startswith(".") and d != "checkpoints")
            here = Path(folder)
            if "config.yaml" in files and "sweep.json" not in files and here not in runs:
                runs[here] = _read_run(here, str(Path(root.name) / here.relative_to(root)))
    return [r for r in runs.values() if r is not None]


def _read_run(path: Path, name: str) -> Run | None:
    try:
        config = yaml.safe_load((path / "config.yaml").read_text(encoding="utf-8"))
        summary = json.loads((path / "summary.json").read_text()) if (path / "summary.json").exists() else None
    except (OSError, ValueError, yaml.YAMLError) as err:
        raise ReportError(f"cannot read the run in {path}: {err}") from None
    if not isinstance(config, dict) or not isinstance(config.get("method"), dict):
        print(f"dfcil report: skipping {path}: its config.yaml is not a dfcil run's", file=sys.stderr)
        return None
    return Run(path, name, config, summary)


def group_runs(runs: Iterable[Run]) -> list[Group]:
    """Runs grouped by everything but class order, training seed and runtime keys, in the paper's order."""
    groups: dict[tuple[Setting, tuple[tuple[str, str], ...]], Group] = {}
    for run in runs:
        setting = setting_of(run.config)
        flat = {k: v for k, v in _flat(run.config).items() if k not in SAME_EXPERIMENT}
        key = (setting, tuple(sorted(flat.items())))
        groups.setdefault(key, Group(setting, flat, [])).runs.append(run)
    by_setting: dict[Setting, list[Group]] = {}
    for group in groups.values():
        by_setting.setdefault(group.setting, []).append(group)
    for same in by_setting.values():  # label what tells apart groups of one setting
        keys = sorted({k for g in same for k in g.config})
        differ = [k for k in keys if len({g.config.get(k) for g in same}) > 1]
        for g in same:
            g.config_label = ", ".join(f"{k}={g.config.get(k, 'unset')}" for k in differ)
    return sorted(groups.values(), key=_order)


def _order(group: Group) -> tuple:
    s = group.setting
    datasets = list(DATASETS)
    base, _, n = s.protocol.rpartition("_")  # "b50_n11" → ("b50", "n11"); "n10" → ("", "n10")
    method = METHOD_ORDER.index(s.method) if s.method in METHOD_ORDER else len(METHOD_ORDER)
    return (
        datasets.index(s.dataset) if s.dataset in datasets else len(datasets), s.dataset, bool(s.reduced),
        s.reduced, int(base[1:] or 0), int(n[1:]), method, s.method, s.variant, group.config_label,
    )  # fmt: skip


# ------------------------------------------------------------------------------------------------ tables


def records(groups: Sequence[Group]) -> list[dict[str, Any]]:
    """One record per group: labels, run counts, each metric's mean/std/n and the paper comparison (numbers)."""
    out = []
    for g in groups:
        s, row = g.setting, g.setting.paper_row()
        rec: dict[str, Any] = {
            "group": g.label, "method": s.method, "variant": s.variant, "dataset": s.dataset,
            "protocol": s.protocol, "reduced": s.reduced, "config": g.config_label, "runs": len(g.finished),
            "unfinished": len(g.runs) - len(g.finished),
        }  # fmt: skip
        for metric in METRICS:
            stat = Stat.of(g.values(metric))
            rec |= {f"{metric}_mean": stat.mean, f"{metric}_std": stat.std, f"{metric}_n": stat.n}
        for metric in PAPER_METRICS:
            paper: Value | None = getattr(row, metric) if row else None
            cmp = Comparison.of(Stat.of(g.values(metric)), paper)
            rec |= {
                f"{metric}_paper_mean": paper.mean if paper else None,
                f"{metric}_paper_std": paper.std if paper else None,
                f"{metric}_diff": cmp.diff if cmp else None,
                f"{metric}_within_paper_std": cmp.within if cmp else None,
            }
        rec["paper_row"] = f"{row.label} ({row.source})" if row else ""
        out.append(rec)
    return out


_LATEX_TOKENS = {"Ā_N": "$\\bar{A}_N$", "A_N": "$A_N$", "±": "$\\pm$", "·": "$\\cdot$", "Δ": "$\\Delta$", "−": "$-$"}
_LATEX_ESCAPES = {c: f"\\{c}" for c in "&%$#_{}"} | {"\\": "\\textbackslash{}", "~": "\\~{}", "^": "\\^{}"}


class _Style:
    """Symbols and escaping of one output format."""

    def __init__(self, fmt: str) -> None:
        self.latex = fmt == "latex"
        self.pm = " $\\pm$ " if self.latex else " ± "
        self.yes, self.no = ("\\checkmark", "$\\times$") if self.latex else ("✓", "✗")

    def text(self, s: str) -> str:
        """``s`` as a cell: in LaTeX with its special characters escaped and A_N, Ā_N, ±, ·, Δ, − as maths."""
        if not self.latex:
            return s.replace("|", "\\|")
        parts = re.split(f"({'|'.join(_LATEX_TOKENS)})", s)
        return "".join(_LATEX_TOKENS.get(p) or "".join(_LATEX_ESCAPES.get(c, c) for c in p) for p in parts)

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


def long_table(recs: Sequence[dict[str, Any]], style: _Style) -> tuple[list[str], list[list[str]]]:
    """The default table: one row per group, every metric, the paper's values and the differences."""
    head = ["group", "runs"]
    for m, title in METRICS.items():
        head += [title] + ([f"paper {title}", "Δ"] if m in PAPER_METRICS else [])
    head.append("paper row")
    rows = []
    for r in recs:
        row = [
            style.text(r["group"]),
            str(r["runs"]) + (f" (+{r['unfinished']} unfinished)" if r["unfinished"] else ""),
        ]
        for m in METRICS:
            row.append(style.stat(r[f"{m}_mean"], r[f"{m}_std"]))
            if m in PAPER_METRICS:
                row.append(style.stat(r[f"{m}_paper_mean"], r[f"{m}_paper_std"]))
                row.append(style.diff(r[f"{m}_diff"], r[f"{m}_within_paper_std"]))
        rows.append(row + [style.text(r["paper_row"])])
    return [style.text(h) for h in head], rows


def pivot_table(
    groups: Sequence[Group], recs: Sequence[dict[str, Any]], rows: str, cols: str, metric: str, style: _Style
) -> tuple[list[str], list[list[str]]]:
    """Rows × columns of one metric, as the paper's tables (rows = method, columns = protocol). Dimensions not
    named that still vary are added to the row labels, so every group has its own cell."""
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
            cell += f" [paper {paper}, {style.diff(r[f'{metric}_diff'], r[f'{metric}_within_paper_std'])}]"
        cells[rk, ck] = cell
    head = [f"{rows} \\ {cols}" if not style.latex else f"{rows} / {cols}", *map(style.text, col_keys)]
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


def render_csv(recs: Sequence[dict[str, Any]]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(recs[0]) if recs else ["group"], lineterminator="\n")
    writer.writeheader()
    for r in recs:
        writer.writerow({k: "" if v is None else round(v, 4) if isinstance(v, float) else v for k, v in r.items()})
    return buf.getvalue()


def footer(runs: Sequence[Run], groups: Sequence[Group], style: _Style, by: bool) -> list[str]:
    """The notes under a table: which std, what Δ and the marks mean, the unfinished runs (a list)."""
    notes = [STD_NOTE]
    if by:
        notes.append("Cells: mean ± std (runs) [paper's value, ours − paper].")
    notes.append(f"Δ = ours − paper in points; {style.yes} within one paper std, {style.no} outside (no mark: the "
                 f"paper gives one run).")  # fmt: skip
    if any(g.setting.reduced for g in groups):
        notes.append("Reduced protocols (fewer classes, images or pixels) are never compared with the paper.")
    unfinished = [r for r in runs if r.summary is None]
    if unfinished:
        notes.append(f"Unfinished runs (no summary.json): {len(unfinished)}")
    lines = [line for note in notes for line in ("", note)]
    return lines + [f"- {style.text(r.name)}" for r in unfinished]


def report(runs: Sequence[Run], fmt: str = "md", by: tuple[str, str] | None = None, metric: str = "last_acc") -> str:
    """The report's text: a long table (default) or a ``by = (rows, cols)`` pivot of ``metric``, then notes."""
    if fmt not in ("md", "csv", "latex"):
        raise ReportError(f"format must be md, csv or latex, got {fmt!r}")
    groups = group_runs(runs)
    recs = records(groups)
    style = _Style(fmt)
    if fmt == "csv" and by is None:
        return render_csv(recs)
    head, rows = long_table(recs, style) if by is None else pivot_table(groups, recs, *by, metric, style)
    if fmt == "csv":
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerows([head, *rows])
        return buf.getvalue()
    notes = footer(runs, groups, style, by is not None)
    if fmt == "latex":
        return render(head, rows, fmt) + "".join(f"% {n}\n" for n in notes if n)
    return render(head, rows, fmt) + "\n".join(notes) + "\n"


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
    p.add_argument("--metric", choices=list(METRICS), default="last_acc", help="the metric of --by (last_acc)")
    p.add_argument("--plots", metavar="DIR", help="also write PNG and PDF figures into DIR (needs dfcil[plot])")
    return p


def main(args: argparse.Namespace) -> int:
    """Run ``dfcil report`` on parsed arguments; 0 on success, 2 on an error (printed)."""
    try:
        runs = find_runs(args.paths)
        if not runs:
            raise ReportError(f"no run directories (folders with a config.yaml) under {', '.join(args.paths)}")
        by = parse_by(args.by) if args.by else None
        sys.stdout.write(report(runs, args.format, by, args.metric))
        if args.format == "csv":
            notes = footer(runs, group_runs(runs), _Style("csv"), by is not None)
            print("".join(f"dfcil report: {n}\n" for n in notes if n), end="", file=sys.stderr)
        if args.plots:
            from dfcil.plots import PlotError, write_plots

            try:
                files = write_plots(group_runs(runs), Path(args.plots))
            except PlotError as err:
                raise ReportError(str(err)) from None
            print(f"dfcil report: {len(files)} figure files in {args.plots}", file=sys.stderr)
    except ReportError as err:
        print(f"dfcil: error: {err}", file=sys.stderr)
        return 2
    return 0
