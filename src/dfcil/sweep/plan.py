"""Planning a sweep: its runs (config groups × grid, fixed overrides), their names, and the checks made before
anything runs (every run's config valid, no name clash, a sweep directory that holds nothing else).

A run is an ordinary ``dfcil train`` in its own directory under the sweep directory, named from what varies: the
config's name when there are several, then a part for each grid key with more than one value (:func:`name_part`:
``order0``, ``seed2``, ``finetune`` for ``method.name``, ``lambda_hkd0.5``), joined by ``-``, as in
``rdfcil-order0``. Sweeps made before (``name=finetune-class_order_seed=0``) keep their names
(:func:`keep_earlier_names`).

Loading a run's config (:mod:`dfcil.load`) needs the methods, and with them torch; it is imported where a plan is
made, so that building ``dfcil``'s command line (which names the sweep's options) stays light.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dfcil import presets
from dfcil.analysis.paper import DATASETS
from dfcil.config import RunConfig, changed_keys, config_to_dict, dump_config, with_absolute_paths
from dfcil.errors import ConfigError
from dfcil.io import read_regular_text, write_atomic

log = logging.getLogger("dfcil")

RESERVED = frozenset({"logs", "slurm"})  # the sweep's own folders
PATH_KEYS = frozenset({"data.root", "data.cache", "task0_cache"})


@dataclasses.dataclass
class SweepRun:
    """One run of a sweep: how to start it (config files and overrides) and what it resolved to."""

    name: str
    configs: tuple[str, ...]
    overrides: tuple[tuple[str, str], ...]
    config: dict[str, Any]
    image_size: int
    # pending, running, done, resumed, failed, interrupted, not started, skipped, submitted
    state: str = "pending"
    attempts: int = 0
    time_s: float | None = None
    error: str | None = None
    job_id: str | None = None
    result: dict[str, Any] | None = None  # from its summary.json, read once when the run is found or ends finished
    plugins: tuple[str, ...] = ()  # dfcil sweep --plugin, each passed on as dfcil train --plugin
    # the run's config as planned, written to a file (write_planned_config): what its process trains
    planned_file: str | None = None
    earlier_name: str = ""  # the name dfcil gave this run before run names lost their '=' (key=value parts)

    def argv(self, run_dir: Path) -> list[str]:
        """``dfcil train`` arguments that start (or, on an existing run directory, resume) this run; paths are
        absolute, so that the command works from any directory (a SLURM job's, for one). Once the planned config is
        written (:meth:`write_planned_config`), that file alone: the config files the sweep was given may be edited
        while it runs, and its runs must still train what it planned. Before: the files and overrides (the command
        ``--dry-run`` shows)."""
        if self.planned_file:
            return ["train", "--config", self.planned_file, "--out", os.path.abspath(run_dir), "--no-progress"]
        args = ["train"]
        for path in self.configs:
            args += ["--config", os.path.abspath(path)]
        for key, value in self.overrides:
            if key in PATH_KEYS and value.lower() not in ("null", "none", "~", ""):
                value = os.path.abspath(os.path.expanduser(value))
            if key == "log":  # dfcil train's own option takes names, not a YAML list
                value = ",".join(self.config.get("log") or []) or "[]"
                if value == "[]":
                    continue
            args += [f"--{key}", value]
        for plugin in self.plugins:
            args += ["--plugin", plugin]
        return [*args, "--out", os.path.abspath(run_dir), "--no-progress"]

    def write_planned_config(self, folder: Path) -> None:
        """Write the run's resolved config (overrides and ``--plugin`` included, paths absolute) to
        ``folder/<name>.config.yaml``, and start the run from it from now on."""
        from dfcil.load import build_config

        path = folder / f"{self.name}.config.yaml"
        folder.mkdir(parents=True, exist_ok=True)
        write_atomic(path, dump_config(build_config(self.config), actions=True))
        self.planned_file = os.path.abspath(path)

    def record(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        del d["planned_file"]
        d["dir"] = self.name
        d["overrides"] = [list(o) for o in self.overrides]
        if self.result is None:
            del d["result"]
        return d

    def read_result(self, out: Path) -> None:
        """The finished run's headline numbers, from its ``summary.json``; :class:`DamagedSummary` where that file
        cannot be read or holds no accuracy."""
        path = out / self.name / "summary.json"
        try:
            s = json.loads(read_regular_text(path))
        except (OSError, ValueError) as err:  # unreadable, not a regular file, not UTF-8, not JSON
            raise DamagedSummary(path, f"cannot be read ({type(err).__name__}: {err})") from None
        if not isinstance(s, dict) or not isinstance(s.get("last_acc"), int | float):
            raise DamagedSummary(path, "holds no run summary (no last_acc)")
        self.result = {k: s.get(k) for k in ("last_acc", "avg_inc_acc", "forgetting", "total_time_s")}


class DamagedSummary(Exception):
    """A finished run's ``summary.json`` that cannot be read: the sweep reports that run as failed, not the others."""

    def __init__(self, path: Path, problem: str) -> None:
        super().__init__(
            f"{path} {problem}: restore it, or delete {path.parent} and run the sweep again to train that run anew"
        )


def split_values(text: str) -> list[str]:
    """``"0,1,2"`` -> ``["0", "1", "2"]``; commas inside brackets or quotes belong to the value (``[1,2],[3]``)."""
    out, depth, quote, current = [], 0, None, ""
    for ch in text:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append(current.strip())
            current = ""
            continue
        current += ch
    out.append(current.strip())
    if any(v == "" for v in out):
        raise ConfigError(f"--grid value list {text!r} has an empty value")
    return out


def parse_grid(specs: Sequence[str]) -> list[tuple[str, list[str]]]:
    """``["data.class_order_seed=0,1,2", ...]`` -> ``[("data.class_order_seed", ["0", "1", "2"]), ...]``."""
    grid: list[tuple[str, list[str]]] = []
    for spec in specs:
        key, sep, values = spec.partition("=")
        key = key.strip().removeprefix("--")
        if not sep or not key or not values.strip():
            raise ConfigError(f"--grid {spec!r}: write KEY=V1,V2,... (e.g. --grid data.class_order_seed=0,1,2)")
        if any(key == k for k, _ in grid):
            raise ConfigError(f"--grid gives {key} twice; list all its values in one --grid")
        grid.append((key, split_values(values)))
    return grid


def _slug(text: str, keep: str = "") -> str:
    return re.sub(rf"[^A-Za-z0-9._+{keep}-]+", "_", text).strip("_") or "run"


NAME_ALIASES = {"class_order_seed": "order", "data.class_order_seed": "order"}  # a key's word in run names


def name_part(key: str, value: str) -> str:
    """The part of a run's name for a grid key's value: the value alone for a ``name`` key (``method.name`` →
    ``finetune``); else the key's word (``class_order_seed`` → ``order``), then the value, joined directly when
    it starts with a digit, ``+`` or ``.`` (``order0``, ``lambda_hkd0.5``), else by ``_`` (``ldc_true``)."""
    value = _slug(value)
    if key.rsplit(".", 1)[-1] == "name":
        return value
    word = NAME_ALIASES.get(key, key)
    return f"{word}{value}" if value[0].isdigit() or value[0] in "+." else f"{word}_{value}"


def _check_dir_name(name: str, assigned: Sequence[tuple[str, str]]) -> None:
    """Refuse a run name that is no directory of its own under the sweep's: ``.`` or ``..`` (a ``name`` key's
    value is the whole name where it alone varies: :func:`name_part`), or one holding a path separator."""
    if name not in (".", "..") and os.sep not in name and not (os.altsep and os.altsep in name):
        return
    cause = " ".join(f"--grid {k}={v}" for k, v in assigned) or "its config's file name"
    fix = "give another value" if assigned else "rename the file"
    raise ConfigError(
        f"{cause} would name a run {name!r}, which is no directory of its own inside the sweep directory ('.' is "
        f"the sweep directory, '..' its parent): {fix}"
    )


def keep_earlier_names(runs: Sequence[SweepRun], out: Path) -> int:
    """Runs that a sweep made before run names lost their ``=`` (``class_order_seed=0``) keep their directories:
    a run whose earlier name holds a run directory in ``out``, and whose new name does not, takes the earlier
    name. Returns how many did."""
    kept = 0
    for r in runs:
        moved = r.earlier_name and r.earlier_name != r.name and not (out / r.name).exists()
        if moved and (out / r.earlier_name / "config.yaml").exists():
            r.name, kept = r.earlier_name, kept + 1
    return kept


def _config_labels(groups: Sequence[Sequence[str]]) -> list[str]:
    """Short distinct names for the config groups: the last file's stem; with its folder where stems repeat; every
    file's stem (``n5+rdfcil``) where those repeat too; and the first file's folder before them (one method over the
    settings of two datasets: ``cifar100-n5+rdfcil``, ``tiny_imagenet200-n5+rdfcil``)."""
    candidates = (
        lambda g: Path(g[-1]).stem,
        lambda g: f"{Path(g[-1]).parent.name}-{Path(g[-1]).stem}",
        lambda g: "+".join(Path(p).stem for p in g),
        lambda g: f"{Path(g[0]).parent.name}-" + "+".join(Path(p).stem for p in g),
    )
    for name in candidates:
        labels = [name(g) for g in groups]
        if len(set(labels)) == len(labels):
            break
    return [_slug(label) for label in labels]


def _say_missing_methods(config_groups: Sequence[Sequence[str]], overrides: Sequence[tuple[str, str]]) -> None:
    """A protocol file with no method file after it (:func:`dfcil.load.protocol_without_method`), said once per
    group as ``dfcil train`` says it; a grid over ``method.name`` names the method too."""
    from dfcil.load import protocol_without_method

    for files in config_groups:
        if note := protocol_without_method(files, overrides):
            log.warning("%s", note)


def plan(
    config_groups: Sequence[Sequence[str]],
    grid: Sequence[tuple[str, Sequence[str]]] = (),
    fixed: Sequence[tuple[str, str]] = (),
    plugins: Sequence[str] = (),
    trust_plugins: bool = False,
) -> list[SweepRun]:
    """Every run of the sweep, validated (a bad key or value fails here, before anything runs). ``plugins``: the
    modules or files every run imports besides its config's (``--plugin``); with them (or ``trust_plugins``), the
    plugins a run directory's ``config.yaml`` given as a config names (:func:`dfcil.load.check_run_records`)."""
    if not config_groups:
        raise ConfigError("dfcil sweep needs at least one --config FILE.yaml (several files of one run: a.yaml+b.yaml)")
    from dfcil.load import check_run_records, load_config, plugin_specs
    from dfcil.methods import build_method
    from dfcil.plugins import Consent

    plugins = plugin_specs(plugins)  # files' paths absolute: the runs need not start where the sweep did
    _say_missing_methods(config_groups, [*fixed, *((key, values[0]) for key, values in grid if values)])
    # a preset's name (cifar100/n10) as its file: the runs are started from the files' paths
    config_groups = [[str(presets.resolve(f)) for f in files] for files in config_groups]
    check_run_records([f for files in config_groups for f in files], Consent(tuple(plugins), trust_plugins))
    labels = _config_labels(config_groups)
    varying = [(k, vs) for k, vs in grid if len(vs) > 1]
    short = [k.rsplit(".", 1)[-1] for k, _ in varying]
    if len(set(short)) < len(short):
        short = [k for k, _ in varying]
    runs, names, configs = [], set(), {}
    for label, files in zip(labels, config_groups, strict=True):
        for values in itertools.product(*(vs for _, vs in grid)) if grid else [()]:
            assigned = list(zip((k for k, _ in grid), values, strict=True))
            overrides = (*fixed, *assigned)
            try:
                cfg, _ = load_config(files, overrides, plugins=plugins)
                build_method(cfg.method, cfg.train)  # the method's own checks (a setting it would ignore)
            except ConfigError as err:
                shown = " ".join(f"{k}={v}" for k, v in assigned)
                raise ConfigError(f"{'+'.join(files)}{' with ' + shown if shown else ''}: {err}") from None
            cfg = with_absolute_paths(cfg)
            if cfg.log:
                from dfcil.training.loggers import LOGGERS

                for logger in cfg.log:
                    LOGGERS.get(logger)  # an unknown logger fails here, not in every run
            chosen = dict(assigned)
            head = [label] if len(config_groups) > 1 else []
            pairs = [(s, chosen[k]) for s, (k, _) in zip(short, varying, strict=True)]
            name = "-".join(head + [name_part(s, v) for s, v in pairs])
            earlier = "-".join(head + [_slug(f"{s}={v}", "=") for s, v in pairs])
            name, earlier = name or label, earlier or label
            _check_dir_name(name, [(k, chosen[k]) for k, _ in varying])
            if name in RESERVED:
                raise ConfigError(f"a run would be named {name!r}, as the sweep's own folder: rename its config")
            if name in names:
                raise ConfigError(
                    f"two runs of the sweep would both be named {name!r}: give distinct configs or values"
                )
            names.add(name)
            config = config_to_dict(cfg)
            same = configs.get(key := json.dumps(config, sort_keys=True))
            if same is not None:  # equal values written differently (0.1 and 1e-1): one run under two names
                raise ConfigError(
                    f"runs {same!r} and {name!r} of the sweep would train the same config (their values or files "
                    f"differ only in how they are written, as 0.1 and 1e-1): give each once"
                )
            configs[key] = name
            runs.append(
                SweepRun(
                    name, tuple(files), tuple(overrides), config, _image_size(cfg), plugins=plugins,
                    earlier_name=earlier,
                )
            )  # fmt: skip
    return runs


NATIVE_SIZES = {"tiny_imagenet200": 64, "imagenet100": 224}  # datasets whose images are not 32 px by default


def _image_size(cfg: RunConfig) -> int:
    """The run's image size (for the GPU memory estimate only), without reading its data."""
    return cfg.data.image_size or NATIVE_SIZES.get(cfg.data.name, 32)


def check_existing(runs: Sequence[SweepRun], out: Path) -> None:
    """Refuse a sweep directory whose run directories hold runs with other configs, or a run of this sweep under
    another name (one clear error, up front)."""
    from dfcil.load import load_run_config
    from dfcil.plugins import Consent

    # the plugins this sweep's runs import are the user's own; a run directory found here may name no others
    consent = Consent(named=tuple(dict.fromkeys(p for r in runs for p in r.config.get("plugins") or ())))

    def saved_config(saved: Path) -> dict[str, Any]:
        try:
            return config_to_dict(with_absolute_paths(load_run_config(saved.parent, consent=consent)))
        except ConfigError as err:
            raise ConfigError(
                f"{saved} cannot be read ({err}); move the directory away or choose another --out"
            ) from None

    for r in runs:
        saved = out / r.name / "config.yaml"
        if not saved.exists():
            continue
        changed = changed_keys(saved_config(saved), r.config)
        if changed:
            raise ConfigError(
                f"{out / r.name} holds a run with another config ({', '.join(changed[:5])}); this is not the sweep "
                f"that made {out}: choose another --out"
            )
    # A sweep names its runs after what varies, so the same runs under a command that varies other things (a
    # config or a grid value added) get other names: they would train again beside the finished ones, and a
    # report would count each twice.
    new = [r for r in runs if not (out / r.name).exists()]
    names = {r.name for r in runs}
    others = sorted(p for p in out.glob("*/config.yaml") if p.parent.name not in names) if new and out.is_dir() else []
    for saved in others:
        try:
            old = saved_config(saved)
        except ConfigError:  # another sweep's run this dfcil cannot read: not one of this sweep's
            continue
        for r in new:
            same_data = old["data"]["root"] == r.config["data"]["root"] or r.config["data"]["name"] in DATASETS
            if same_data and not changed_keys(old, r.config):  # own data: the folder is the dataset
                raise ConfigError(
                    f"{saved.parent} already holds the run this sweep names {r.name!r}: a sweep names its runs after "
                    f"what varies, and this command varies other things than the one that made {out}. Run that "
                    f"command again (a sweep of other configs can share the directory when their names stay the "
                    f"same), or give this sweep its own --out"
                )


def run_status(run_dir: Path) -> str:
    """``done`` (summary written), ``unfinished`` (a run directory without summary) or ``new``."""
    if (run_dir / "summary.json").exists():
        return "done"
    return "unfinished" if (run_dir / "config.yaml").exists() else "new"


def check_sweep_dir(out: Path, names: Sequence[str]) -> None:
    """Refuse an ``--out`` that is a file, a run directory, or a folder holding anything but this sweep's runs."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file; give a directory for the sweep")
    if (out / "config.yaml").exists():
        raise ConfigError(f"--out {out} is a run directory; give a new directory (or an earlier sweep's) instead")
    if out.is_dir() and not (out / "sweep.json").exists():
        ours = {*names, *RESERVED}
        others = sorted(p.name for p in out.iterdir() if p.name not in ours and not p.name.startswith("."))
        if others:
            raise ConfigError(
                f"--out {out} holds no sweep.json and other things than this sweep's runs ({', '.join(others[:3])}): "
                f"choose a new directory for the sweep"
            )
