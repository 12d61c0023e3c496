"""Run directories as plain data, for ``dfcil report`` and its plots: finding them, reading their ``config.yaml``
and ``summary.json``, the paper setting each describes, and the groups of runs of one experiment (runs that differ
only in class order and training seed).

Pure reading: neither torch nor the engine is imported.
"""

from __future__ import annotations

import collections
import dataclasses
import fnmatch
import json
import math
import os
import shlex
import sys
import unicodedata
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import yaml

from dfcil.analysis.paper import DATASETS, PaperRow, find_row, protocol_name, variant_of
from dfcil.config import RUNTIME_KEYS, load_yaml, quoted, section_defaults
from dfcil.errors import ReportError
from dfcil.io import read_regular_text

# Config keys that never split a group: what runs of one experiment may differ in (class order, training seed),
# runtime keys, and engine switches that keep fp32 results equal within rounding (engine.precision does split).
SAME_EXPERIMENT = {"seed", "data.class_order_seed", "data.class_order", "train.eval_batch_size"}
SAME_EXPERIMENT |= RUNTIME_KEYS | {f"engine.{k}" for k in ("merge_passes", "channels_last", "compile")}
SAME_EXPERIMENT |= {"engine.cudnn_benchmark", "engine.fused_optimizer"}
# conditions that change every number (the augmentation, the precision): off their defaults, in every label
SAID_OFF_DEFAULT = ("data.augment", "engine.precision")
METHOD_ORDER = ("joint", "finetune", "lwf", "lwf_mc", "deepinversion", "dgr", "ucir_df", "podnet_df", "abd", "rdfcil")


# Method keys added after runs were saved, each with the value that keeps what such a run trained (lwf before its
# head switch trained the linear head): a saved method section that lacks one reads it so, and the run joins the
# later runs of its experiment. The report imports no method; tests/test_report.py checks these against the
# methods' own defaults.
_DRIFT = {
    "kind": "ldc", "init": "random", "epochs": 20, "lr": 0.001, "batch_size": 128, "passes": 20, "ridge": 0.001,
    "synthetic": False,
}  # fmt: skip
METHOD_KEYS_ADDED: dict[str, dict[str, Any]] = {
    "lwf": {"head": "linear", "ce": "seen", "ldc": False, "drift": _DRIFT},
    "rdfcil": {"ldc": False, "drift": _DRIFT},
    # the Bayes and ridge classifiers and the anti-collapse term (their keys read only when switched on)
    "rdfcil_plus": {
        "bayes_shrinkage": 3.0,
        "bayes_normalize": True,
        "ridge_gamma": 200.0,
        "ridge_normalize": True,
        "lambda_ac": 0.0,
        "ac_beta": 1.0,
        # APR's switches (pseudo-replay, its Mahalanobis head) and BiCyc's cycle-consistent distiller
        "pseudo_replay": "off",
        "pseudo": {"per_class": 200, "batch_size": 64, "steps": 4, "step_size": 64.0, "noise": 1.0},
        "bayes_offdiag": 0.0,
        "bayes_pseudo_inverse": False,
        "cycle": False,
        "lambda_cycle_kd": 5.0,
        "lambda_cycle": 2.0,
        "cycle_multiplier": 32,
        "cycle_ridge": 0.01,
        "cycle_momentum": 0.99,
    },
}


def with_added_method_keys(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` (plain data) with the method keys of :data:`METHOD_KEYS_ADDED` its method section lacks."""
    method = config.get("method")
    added = METHOD_KEYS_ADDED.get(method.get("name")) if isinstance(method, dict) else None
    if not added:
        return config

    def fill(have: dict[str, Any], want: dict[str, Any]) -> dict[str, Any]:
        out = dict(have)
        for key, value in want.items():
            if key not in out:
                out[key] = value
            elif isinstance(value, dict) and isinstance(out[key], dict):
                out[key] = fill(out[key], value)
        return out

    return {**config, "method": fill(method, added)}


@dataclasses.dataclass(frozen=True)
class Run:
    path: Path
    name: str  # the path from the folder given on the command line (its name included)
    config: dict[str, Any]  # config.yaml as plain data, method keys added since it was saved filled in
    summary: dict[str, Any] | None  # summary.json; None: unfinished

    def metric(self, key: str) -> float | None:
        if self.summary is None:
            return None
        if key in DERIVED:
            return DERIVED[key](self.summary)
        value = self.summary.get(key)
        return value[-1] if isinstance(value, list) else value  # old_acc / new_acc: the last task's


def first_acc(summary: dict[str, Any]) -> float | None:
    """The accuracy on the first task's classes after the last task (%), from the accuracy matrix: what is left of
    the first task at the end of a long sequence."""
    matrix = summary.get("accuracy_matrix") or []
    return matrix[-1][0] if matrix and matrix[-1] else None


def unscored_tasks(config: dict[str, Any], summary: dict[str, Any]) -> list[int]:
    """The tasks after which a run's model was not its method's answer yet (joint trained in the last task only):
    the summary's ``unscored_tasks``, or for a summary written before it listed them, every task but the last of a
    joint run with ``method.last_only``."""
    if isinstance(listed := summary.get("unscored_tasks"), list):
        return [t for t in listed if isinstance(t, int)]
    method = config.get("method") or {}
    if method.get("name") == "joint" and method.get("last_only") is True:
        return list(range(len(summary.get("task_sizes") or []) - 1))
    return []


# what an unscored task's row of the accuracy matrix feeds: not a result where a run has one
FROM_EVERY_ROW = ("avg_inc_acc", "avg_inc_acc_task_avg", "forgetting", "bwt")
PER_TASK = ("acc_per_task", "acc_per_task_task_avg", "new_acc", "old_acc")


def scored_view(summary: dict[str, Any], unscored: Sequence[int]) -> dict[str, Any]:
    """``summary`` as a report reads it: without what comes from the rows of ``unscored`` tasks (each None: the
    per-task entries, the matrix's rows and the averages over rows), so that no table, figure or CSV shows an
    untrained network's accuracy as a result."""
    if not unscored:
        return summary
    skip = set(unscored)
    out = dict(summary)
    out |= {key: None for key in FROM_EVERY_ROW if key in out}
    for key in PER_TASK:
        if isinstance(out.get(key), list):
            out[key] = [None if t in skip else v for t, v in enumerate(out[key])]
    if isinstance(out.get("accuracy_matrix"), list):
        out["accuracy_matrix"] = [[None] * len(row) if t in skip else row
                                  for t, row in enumerate(out["accuracy_matrix"])]  # fmt: skip
    return out | {"unscored_tasks": sorted(skip)}


# metrics a report reads from a summary's matrices rather than a key of its own
DERIVED: dict[str, Callable[[dict[str, Any]], float | None]] = {"first_acc": first_acc}


@dataclasses.dataclass(frozen=True)
class Setting:
    """A run in the paper's terms: dataset, protocol (``n10``, ``b50_n11``), method and variant
    (:mod:`dfcil.analysis.paper`)."""

    dataset: str
    protocol: str
    method: str
    variant: str
    reduced: str  # "" on the paper's protocol or a dataset the paper never ran, else how the paper's was shrunk

    @property
    def in_paper(self) -> bool:
        """Whether the paper ran this dataset (at full size or not): only then is a comparison, or the lack of one,
        worth a word."""
        return self.dataset in DATASETS

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
    """The paper setting a run's config (``config.yaml``, plain) describes. Only the paper's datasets can be
    reduced: on a dataset the paper never ran (own data, ``fake``) any class count or image size is its own."""
    data, method = config.get("data") or {}, config.get("method") or {}
    dataset, name = data.get("name", "cifar100"), method.get("name", "rdfcil")
    protocol = protocol_name(data.get("num_tasks", 5), data.get("base_classes", 0))
    variant = variant_of(name, method)
    if dataset not in DATASETS:
        return Setting(dataset, protocol, name, variant, "")
    reduced = []
    classes, pixels = DATASETS[dataset]
    if (used := classes_of(data)) not in (None, classes):  # data.num_classes, or an explicit order of fewer
        reduced.append(f"{used} classes")
    for key, what in (("train_per_class", "train"), ("test_per_class", "test")):
        if data.get(key) is not None:
            reduced.append(f"{data[key]} {what}/class")
    if data.get("image_size") not in (None, pixels):
        reduced.append(f"{data['image_size']} px")
    return Setting(dataset, protocol, name, variant, ", ".join(reduced))


def classes_of(data: dict[str, Any]) -> int | None:
    """How many classes a run's data section trains, where it says: ``data.num_classes`` (the first of the order),
    or the length of an explicit ``data.class_order`` (a subset of the dataset's classes); None where it does not (a
    seeded order over all of the dataset's classes)."""
    order, limit = data.get("class_order"), data.get("num_classes")
    counts = [n for n in (limit, len(order) if isinstance(order, list) else None) if isinstance(n, int)]
    return min(counts) if counts else None


def _dataset_of(run: Run) -> tuple[str, str]:
    """A run's dataset and the folder it read it from: own data's identity (two folders are two datasets)."""
    data = run.config.get("data") or {}
    return str(data.get("name")), str(data.get("root"))


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
    # the keys outside the method's recipe (method, train) in which the groups of its dataset and protocol differ,
    # with its values (data.augment: "autoaugment"): --against pairs it with the reference of the same conditions
    conditions: tuple[tuple[str, str], ...] = ()

    @property
    def label(self) -> str:
        s = self.setting
        return " · ".join(p for p in (s.method_label, s.dataset, s.protocol_label, self.config_label) if p)

    @property
    def short_label(self) -> str:
        """The label without dataset and protocol (where a table's row or a figure already says them)."""
        return " · ".join(p for p in (self.setting.method_label, self.config_label) if p)

    @property
    def finished(self) -> list[Run]:
        return [r for r in self.runs if r.summary is not None]

    def values(self, metric: str) -> list[float]:
        return [v for r in self.finished if (v := r.metric(metric)) is not None]

    @property
    def comparable(self) -> tuple[str, str, str, str]:
        """What two groups share to be compared run by run: dataset, protocol, how it was reduced, and for own
        data (a dataset the paper never ran) the folder it was read from (``data.root``)."""
        s = self.setting
        return s.dataset, s.protocol, s.reduced, self.config.get("data.root", "")

    def dimension(self, name: str) -> str:
        s = self.setting
        return {"method": s.method_label, "dataset": s.dataset, "protocol": s.protocol_label}.get(
            name, self.config_label
        )


def find_runs(paths: Iterable[str | os.PathLike], exclude: Sequence[str] = ()) -> list[Run]:
    """Every run directory (a folder with ``config.yaml``) at or below ``paths``, in path order, through symbolic
    links too (each real folder once). A sweep's root
    (``sweep.json``) is not a run, and runs' checkpoint folders and hidden folders are not searched. A folder matched
    by one of the ``exclude`` globs (:func:`excluded`), run or not, is left out unread with everything below it; a
    glob that matches nothing is said. A run whose files cannot be used (unreadable, cut short, the wrong shape, not
    regular files, of two runs) is skipped with a warning that names it, and a last line says how many were: one
    damaged run never hides the rest."""
    runs: dict[Path, Run | None] = {}
    unused = dict.fromkeys(exclude, True)  # globs that matched no run so far
    for given in map(Path, paths):
        if not given.exists():
            raise ReportError(f"{given} does not exist")
        root = given.resolve()
        # a glob that matches the folder given (its name or path) would match every path below it: it is read
        # against the own names of the folders below, and never leaves out the folder given itself
        inherited = excluded(root, root.name, exclude)
        walked: set[Path] = set()  # the folders' real paths: a symlink loop, or a run reached twice, is read once
        for folder, subdirs, files in os.walk(root, followlinks=True):  # a folder of links to runs is a folder of runs
            here, name = Path(folder), str(Path(root.name) / Path(folder).relative_to(root))
            real = here.resolve()
            if real in walked:  # reached again through a link
                subdirs[:] = []
                continue
            walked.add(real)
            if here != root and (matched := excluded(here, name, exclude, inherited)):
                unused |= dict.fromkeys(matched, False)
                subdirs[:] = []  # nor anything below it
                continue
            subdirs[:] = sorted(d for d in subdirs if not d.startswith(".") and d != "checkpoints")
            if "config.yaml" in files and "sweep.json" not in files and real not in runs:
                runs[real] = _read_run(here, name)
    for glob in (g for g, left in unused.items() if left):
        print(f"dfcil report: warning: --exclude {glob!r} matches no run directory (a typo?)", file=sys.stderr)
    skipped = sum(r is None for r in runs.values())
    if skipped:
        print(
            f"dfcil report: skipped {skipped} of {len(runs)} run director{'ies' if len(runs) > 1 else 'y'} (above)",
            file=sys.stderr,
        )
    if runs and skipped == len(runs):  # not "no run directories": there were, and the lines above say why not
        raise ReportError(f"every run directory found ({len(runs)}) was skipped: the lines above say why")
    return [r for r in runs.values() if r is not None]


def excluded(path: Path, name: str, globs: Sequence[str], own_name_only: Sequence[str] = ()) -> list[str]:
    """The ``globs`` (``fnmatch``: ``*`` also crosses ``/``) that match a folder (a run directory, or one above runs):
    its own name (``smoke-logs``), its name in the report (``runs/smoke-logs``, from the folder given on the command
    line) or its absolute path; those of ``own_name_only`` (globs that match the folder given, and so every path below
    it) by its own name only."""
    return [
        g
        for g in globs
        if any(
            fnmatch.fnmatchcase(text, g)
            for text in ((path.name,) if g in own_name_only else (path.name, name, str(path)))
        )
    ]


def _read_run(path: Path, name: str) -> Run | None:
    """``path``'s run, or None, said on stderr with what is wrong and the fix, where its files cannot be used:
    unreadable, of the wrong shape (:func:`summary_problem`), or of two runs (:func:`disagreement`)."""
    leave_out = f"leave it out with --exclude {shlex.quote(name)}"

    def skip(why: str) -> None:
        print(printable(f"dfcil report: skipping {path}: {why}"), file=sys.stderr)

    try:
        config = load_yaml(read_regular_text(path / "config.yaml"))  # a FIFO is refused, never waited on
    except (OSError, ValueError, yaml.YAMLError) as err:
        return skip(f"its config.yaml cannot be read ({err})")
    if not isinstance(config, dict) or not isinstance(config.get("method"), dict):
        return skip("its config.yaml is not a dfcil run's")
    summary = None
    if (path / "summary.json").exists():
        try:
            summary = json.loads(read_regular_text(path / "summary.json"))
        except OSError as err:
            return skip(f"its summary.json cannot be read ({err})")
        except ValueError as err:
            return skip(f"its summary.json is not valid JSON ({err}): cut short, or still being copied?")
        if (problem := summary_problem(summary)) is not None:
            return skip(f"its summary.json is not a dfcil summary ({problem}): restore the run's own summary.json, "
                        f"or {leave_out}")  # fmt: skip
        if (problem := disagreement(config, summary)) is not None:
            return skip(f"its config.yaml and summary.json disagree ({problem}): they are two runs' files; put back "
                        f"the run's own file, or {leave_out}")  # fmt: skip
        summary = scored_view(summary, unscored_tasks(config, summary))
    return Run(path, name, with_added_method_keys(config), summary)


# Characters a terminal or a LaTeX file acts on rather than shows (Unicode categories): controls (ESC of an escape
# sequence, newline, carriage return), formatting (bidirectional overrides, zero-width), lone surrogates (a folder
# name's undecodable bytes, which no UTF-8 stream can print) and the line and paragraph separators.
HIDDEN = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})


def printable(text: str) -> str:
    """``text`` with each :data:`HIDDEN` character written as its Python escape (``\\x1b``, ``\\n``, ``\\u202e``):
    names come from run folders and files that anyone may write, and are printed to terminals and into LaTeX."""
    return "".join(c.encode("unicode_escape").decode("ascii") if unicodedata.category(c) in HIDDEN else c for c in text)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _numbers(value: Any, none: bool = False) -> bool:
    """A non-empty list of finite numbers (and Nones where ``none``)."""
    return isinstance(value, list) and bool(value) and all(_number(v) or (none and v is None) for v in value)


# The ranges of summary.json's numbers: accuracies (%) and the differences of two (points: forgetting, BWT)
ACCURACY, DIFFERENCE = ((0.0, 100.0), "an accuracy"), ((-100.0, 100.0), "a difference of accuracies")
RANGES = {k: ACCURACY for k in ("last_acc", "avg_inc_acc", "acc_per_task", "new_acc", "old_acc", "accuracy_matrix")}
RANGES |= {"forgetting": DIFFERENCE, "bwt": DIFFERENCE}


def _leaves(value: Any) -> list[float]:
    """The numbers of a number, a list or a matrix (Nones left out)."""
    if not isinstance(value, list):
        return [] if value is None else [value]
    return [v for item in value for v in _leaves(item)]


def summary_problem(summary: Any) -> str | None:
    """What makes ``summary`` (a parsed ``summary.json``) unusable for a report and its plots, or None: the keys
    they read, of the types the engine writes, each number in its range (:data:`RANGES`)."""
    if not isinstance(summary, dict):
        return f"a {type(summary).__name__}, not a mapping"
    for key in ("last_acc", "avg_inc_acc"):
        if not _number(summary.get(key)):
            return f"{key} is {quoted(summary.get(key))}, not a number"
    for key in ("forgetting", "bwt"):  # None (or absent) after one task, where neither is defined
        if summary.get(key) is not None and not _number(summary[key]):
            return f"{key} is {quoted(summary[key])}, not a number"
    for key, none in (("acc_per_task", False), ("new_acc", False), ("old_acc", True), ("task_sizes", False)):
        if not _numbers(summary.get(key), none):
            return f"{key} is {quoted(summary.get(key))}, not a list of numbers"
    for key in ("accuracy_matrix", "correct_matrix", "count_matrix"):  # for the plots, where present
        rows = summary.get(key)
        if key in summary and (not isinstance(rows, list) or not rows or not all(_numbers(r, True) for r in rows)):
            return f"{key} is {quoted(rows)}, not a matrix of numbers"
    for key, ((low, high), what) in RANGES.items():
        if (bad := next((v for v in _leaves(summary.get(key)) if not low <= v <= high), None)) is not None:
            verb = "holds" if isinstance(summary[key], list) else "is"
            return f"{key} {verb} {bad!r}, not {what} in [{low:g}, {high:g}]"
    return None


# The datasets whose builders name their data as they are registered, so that summary.json's dataset is the
# config's data.name; a plugin's dataset may name its data otherwise, and is not compared.
NAMED_AS_REGISTERED = frozenset(DATASETS) | {"fake", "folder", "arrays"}


def _order_text(order: Any) -> str:
    """A class order as a message shows it: its first six classes."""
    if not isinstance(order, list):
        return quoted(order)
    return f"[{', '.join(map(str, order[:6]))}{', ...' if len(order) > 6 else ''}]"


def _class_order(data: dict[str, Any], saved: list[Any]) -> tuple[str, list[int]] | None:
    """The class order a run's data section trains, and what in it says so, where the report can tell without the
    data: an explicit ``data.class_order``, or a seeded one on a dataset of known class count (the paper's, or the
    summary's own order where all of a dataset's classes are used); None otherwise."""
    order, limit, seed = data.get("class_order"), data.get("num_classes"), data.get("class_order_seed", 0)
    try:
        if order is not None:
            return f"data.class_order is {_order_text(order)}", [int(c) for c in order][:limit]
        classes = DATASETS[data["name"]][0] if data["name"] in DATASETS else len(saved) if limit is None else None
        if classes is None:
            return None
        from dfcil.data.splits import class_order_from_seed  # here: the data package costs every report 0.2 s

        seeded = class_order_from_seed(classes, seed)[:limit]
        return f"data.class_order_seed {seed} gives the class order {_order_text(seeded)}", seeded
    except (TypeError, ValueError):  # a config the engine would refuse: not this check's to judge
        return None


def disagreement(config: dict[str, Any], summary: dict[str, Any]) -> str | None:
    """Where a run's ``config.yaml`` and ``summary.json`` describe two runs (files mixed up when runs were copied),
    what each says, or None: the method, the dataset, the training seed, the augmentation and the class order, each
    where the summary has it (a summary from before a key was saved says nothing of it)."""
    defaults, data = section_defaults(), config.get("data")
    data = defaults["data"] | (data if isinstance(data, dict) else {})
    pairs = [
        ("method.name", config["method"].get("name"), "method"),
        ("seed", config.get("seed", defaults["seed"]), "seed"),
        ("data.augment", data["augment"], "augment"),
        *([("data.name", data["name"], "dataset")] if str(data["name"]) in NAMED_AS_REGISTERED else []),
    ]
    for key, mine, theirs in pairs:
        if theirs in summary and summary[theirs] != mine:
            return f"config.yaml's {key} is {quoted(mine)}, summary.json's {theirs} is {quoted(summary[theirs])}"
    saved = summary.get("class_order")
    if isinstance(saved, list) and (expected := _class_order(data, saved)) is not None and expected[1] != saved:
        return f"config.yaml's {expected[0]}, summary.json's class_order is {_order_text(saved)}"
    return None


def group_runs(runs: Iterable[Run]) -> list[Group]:
    """Runs grouped by everything but class order, training seed and runtime keys, in the paper's order. A key
    outside the method section that a run's config lacks (saved by a dfcil before the key existed) counts as its
    default, so that such a run joins the later runs of its experiment; the method section is compared as saved
    (its defaults are the methods' own, and the report imports no method). On own data (a dataset the paper never
    ran, e.g. ``folder``) the data's folder is the dataset, so ``data.root`` splits groups there: runs on two
    folders of images are never averaged together."""
    groups: dict[tuple[Setting, tuple[tuple[str, str], ...]], Group] = {}
    defaults = _flat(section_defaults())
    runs = list(runs)
    # own data's class count, where a finished run of a seeded order over all of it saved its order
    every = {
        _dataset_of(r): len(r.summary["class_order"]) for r in runs
        if classes_of(r.config.get("data") or {}) is None and isinstance((r.summary or {}).get("class_order"), list)
    }  # fmt: skip
    for run in runs:
        setting = setting_of(run.config)
        kept = {"data.root"} if not setting.in_paper else set()
        flat = {k: v for k, v in (defaults | _flat(run.config)).items() if k not in SAME_EXPERIMENT or k in kept}
        # the classes trained are the protocol's, whichever key says so: an explicit order of 3 classes is never
        # averaged with runs of all 10 (data.class_order, which runs of one experiment differ in, is left out above)
        used = classes_of(run.config.get("data") or {})
        full = DATASETS[setting.dataset][0] if setting.in_paper else every.get(_dataset_of(run))
        if used is not None:  # all of the dataset's classes read as the key unset, as a seeded order's
            flat["data.num_classes"] = defaults["data.num_classes"] if used == full else json.dumps(used)
        key = (setting, tuple(sorted(flat.items())))
        groups.setdefault(key, Group(setting, flat, [])).runs.append(run)
    by_setting: dict[Setting, list[Group]] = {}
    for group in groups.values():
        by_setting.setdefault(group.setting, []).append(group)
    # what the methods compared on one dataset and protocol differ in besides their recipes (the method, train and
    # model sections, which their presets set): data.augment, the precision... every group's label says it
    by_protocol: dict[tuple[str, str, str, str], list[Group]] = {}
    for group in groups.values():
        by_protocol.setdefault(group.comparable, []).append(group)
    across = {c: differing_keys(same, is_condition) for c, same in by_protocol.items()}
    for same in by_setting.values():  # label what tells apart groups of one setting
        conditions = set().union(*(across[g.comparable] for g in same))  # own data: a setting spans folders
        # a condition off its default is said even where no other group differs: a report of AutoAugment runs alone
        conditions |= {k for k in SAID_OFF_DEFAULT for g in same if g.config.get(k, defaults.get(k)) != defaults.get(k)}
        differ = sorted(set(differing_keys(same)) | conditions)
        labels = [_config_label(g, told_keys(g, differ, same), differ) for g in same]
        if len(set(labels)) < len(same):  # the short labels do not tell the groups apart: every differing key
            labels = [_config_label(g, differ, differ) for g in same]
        for g, label in zip(same, labels, strict=True):
            g.config_label = label
            g.conditions = tuple((k, g.config.get(k, "unset")) for k in across[g.comparable])
    return sorted(groups.values(), key=_order)


def is_condition(key: str) -> bool:
    """Whether ``key`` is one of the conditions runs are made under (``data.augment``, ``engine.precision``), not
    a method's recipe: the method, train and model sections, which each method's presets set its own way (AdaGauss's
    ResNet-18 of 64 channels on ImageNet-100)."""
    return not key.startswith(("method.", "train.", "model."))


def differing_keys(groups: Sequence[Group], keep: Callable[[str], bool] = lambda key: True) -> list[str]:
    """The keys (those ``keep`` takes) whose values differ among ``groups``."""
    keys = sorted({k for g in groups for k in g.config if keep(k)})
    return [k for k in keys if len({g.config.get(k) for g in groups}) > 1]


def method_changes(group: Group) -> list[list[Any]] | None:
    """Each finished run's ``method_changed`` (the method keys its config moved from the method's defaults); None
    where the group has no finished run or one does not say (saved by a dfcil before it did)."""
    changed = [r.summary.get("method_changed") for r in group.finished]
    return changed if changed and all(isinstance(c, list) for c in changed) else None


def _moved(group: Group) -> set[str]:
    """The method keys ``group``'s finished runs changed from the method's defaults (``method_changed``)."""
    return {str(k) for c in method_changes(group) or [] for k in c}


def _changed_key(key: str, moved: set[str]) -> bool:
    """Whether the flat ``key`` (``method.inversion.steps``) is one of ``moved`` (``inversion.steps``, or a section
    above it: ``inversion``)."""
    key = key.removeprefix("method.")
    return any(key == m or key.startswith(m + ".") for m in moved)


def _protocols(key: str, group: Group, peers: Sequence[Group]) -> bool:
    """Whether method key ``key`` is the protocol's for ``group``: every one of ``peers`` (the method's groups of one
    setting) changed it from the method's defaults (``cifar100-mini``'s 80 inversion steps), and ``group`` holds the
    value most of them share (a switch that sets it to 0 is still told by it)."""
    if not peers or any(method_changes(g) is None or not _changed_key(key, _moved(g)) for g in peers):
        return False
    counts = collections.Counter(g.config.get(key) for g in peers).most_common(2)
    return counts[0][0] == group.config.get(key) and (len(counts) == 1 or counts[0][1] > counts[1][1])


def told_keys(group: Group, differ: Sequence[str], peers: Sequence[Group] = ()) -> list[str]:
    """Of the keys ``differ`` in which groups of one method and setting (``peers``, ``group`` among them) differ,
    those that tell ``group`` apart: every key outside the method section, and the method keys its runs changed
    from the method's defaults (``method_changed`` of each finished run's ``summary.json``), so that a switch's
    group is labelled by the switch and not by every key another group changed; all of ``differ`` where a run does
    not say (unfinished, or saved before ``method_changed`` existed). A method key that is the protocol's
    (:func:`_protocols`) labels only the groups whose value is not the one most of them share."""
    if method_changes(group) is None:
        return list(differ)
    mine = _moved(group)
    return [
        k for k in differ
        if not k.startswith("method.") or (_changed_key(k, mine) and not _protocols(k, group, peers))
    ]  # fmt: skip


def _config_label(group: Group, keys: Sequence[str], differ: Sequence[str]) -> str:
    if not keys and differ:  # "method defaults" only where its runs changed nothing; else what it differs in
        changed = method_changes(group)
        if changed is not None and not any(changed):
            return "method defaults"
        # the protocol's keys it changed, where those are all it changed (80 inversion steps), else every key
        mine = _moved(group)
        keys = [k for k in differ if k.startswith("method.") and _changed_key(k, mine)] or differ
    return ", ".join(f"{k}={group.config.get(k, 'unset')}" for k in keys)


def at_defaults(candidates: Sequence[Group]) -> Group | None:
    """Of groups of one method in one setting, the one whose settings that tell them apart are all defaults: the
    method's own for its keys (each finished run's ``summary.json`` lists its ``method_changed``; runs saved before
    it did are never taken for it), but for the protocol's (:func:`_protocols`: ``cifar100-mini``'s 80 inversion
    steps, which every group changed), and the sections' for the others. None unless exactly one is."""
    differ = differing_keys(candidates)
    defaults = _flat(section_defaults())
    own = [k for k in differ if k.startswith("method.")]
    other = [k for k in differ if k not in own]

    def is_default(group: Group) -> bool:
        if method_changes(group) is None:
            return False
        mine = _moved(group)
        switched = [k for k in own if _changed_key(k, mine) and not _protocols(k, group, candidates)]
        return not switched and all(group.config.get(k) == defaults.get(k) for k in other)

    fits = [g for g in candidates if is_default(g)]
    return fits[0] if len(fits) == 1 else None


def _order(group: Group) -> tuple:
    s = group.setting
    datasets = list(DATASETS)
    base, _, n = s.protocol.rpartition("_")  # "b50_n11" → ("b50", "n11"); "n10" → ("", "n10")
    method = METHOD_ORDER.index(s.method) if s.method in METHOD_ORDER else len(METHOD_ORDER)
    return (
        datasets.index(s.dataset) if s.dataset in datasets else len(datasets), s.dataset, bool(s.reduced),
        s.reduced, int(base[1:] or 0), int(n[1:]), method, s.method, s.variant, group.config_label,
    )  # fmt: skip
