"""Run directories as plain data, for ``dfcil report`` and its plots: finding them, reading their ``config.yaml``
and ``summary.json``, the paper setting each describes, and the groups of runs of one experiment (runs that differ
only in class order and training seed).

Pure reading: neither torch nor the engine is imported.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import math
import os
import sys
from collections.abc import Iterable, Sequence
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
        value = None if self.summary is None else self.summary.get(key)
        return value[-1] if isinstance(value, list) else value  # old_acc / new_acc: the last task's


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
    if data.get("num_classes") not in (None, classes):
        reduced.append(f"{data['num_classes']} classes")
    for key, what in (("train_per_class", "train"), ("test_per_class", "test")):
        if data.get(key) is not None:
            reduced.append(f"{data[key]} {what}/class")
    if data.get("image_size") not in (None, pixels):
        reduced.append(f"{data['image_size']} px")
    return Setting(dataset, protocol, name, variant, ", ".join(reduced))


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
    regular files) is skipped with a warning that names it, and a last line says how many were: one damaged run
    never hides the rest."""
    runs: dict[Path, Run | None] = {}
    unused = dict.fromkeys(exclude, True)  # globs that matched no run so far
    for given in map(Path, paths):
        if not given.exists():
            raise ReportError(f"{given} does not exist")
        root = given.resolve()
        walked: set[Path] = set()  # the folders' real paths: a symlink loop, or a run reached twice, is read once
        for folder, subdirs, files in os.walk(root, followlinks=True):  # a folder of links to runs is a folder of runs
            here, name = Path(folder), str(Path(root.name) / Path(folder).relative_to(root))
            real = here.resolve()
            if real in walked:  # reached again through a link
                subdirs[:] = []
                continue
            walked.add(real)
            if matched := excluded(here, name, exclude):
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
    return [r for r in runs.values() if r is not None]


def excluded(path: Path, name: str, globs: Sequence[str]) -> list[str]:
    """The ``globs`` (``fnmatch``: ``*`` also crosses ``/``) that match a folder (a run directory, or one above runs):
    its own name (``smoke-logs``), its name in the report (``runs/smoke-logs``, from the folder given on the command
    line) or its absolute path."""
    return [g for g in globs if any(fnmatch.fnmatchcase(text, g) for text in (path.name, name, str(path)))]


def _read_run(path: Path, name: str) -> Run | None:
    def skip(why: str) -> None:
        print(f"dfcil report: skipping {path}: {why}", file=sys.stderr)

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
        problem = summary_problem(summary)
        if problem is not None:
            return skip(f"its summary.json is not a dfcil summary ({problem})")
    return Run(path, name, with_added_method_keys(config), summary)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _numbers(value: Any, none: bool = False) -> bool:
    """A non-empty list of finite numbers (and Nones where ``none``)."""
    return isinstance(value, list) and bool(value) and all(_number(v) or (none and v is None) for v in value)


def summary_problem(summary: Any) -> str | None:
    """What makes ``summary`` (a parsed ``summary.json``) unusable for a report and its plots, or None: the keys
    they read, of the types the engine writes."""
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
    for run in runs:
        setting = setting_of(run.config)
        kept = {"data.root"} if not setting.in_paper else set()
        flat = {k: v for k, v in (defaults | _flat(run.config)).items() if k not in SAME_EXPERIMENT or k in kept}
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


def at_defaults(candidates: Sequence[Group]) -> Group | None:
    """Of groups of one method in one setting, the one whose settings that tell them apart are all defaults: the
    method's own for its keys (each finished run's ``summary.json`` lists its ``method_changed``; runs saved before
    it did are never taken for it), the sections' for the others. None unless exactly one is."""
    keys = sorted({k for g in candidates for k in g.config})
    differ = [k for k in keys if len({g.config.get(k) for g in candidates}) > 1]
    defaults = _flat(section_defaults())
    own = [k for k in differ if k.startswith("method.")]
    other = [k for k in differ if k not in own]

    def is_default(group: Group) -> bool:
        changed = [r.summary.get("method_changed") for r in group.finished]
        if not changed or not all(isinstance(c, list) for c in changed):
            return False
        moved = {f"method.{k}" for c in changed for k in c}
        return not moved.intersection(own) and all(group.config.get(k) == defaults.get(k) for k in other)

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
