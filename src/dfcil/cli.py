"""Command line: parsing only; the work is done by :mod:`dfcil.runs.runner` and :mod:`dfcil.training.engine` (training)
and by :mod:`dfcil.analysis.tools` and :mod:`dfcil.analysis.features` (finished runs).

dfcil train --config FILE.yaml [--config MORE.yaml] [--section.key VALUE ...] [--out DIR] [--plugin MODULE ...]
            [--device DEV] [--log csv,tensorboard] [--print-config] [--dry-run] [--progress | --no-progress]
dfcil resume DIR [--device DEV] [--data.root DIR] [--log NAME ...]
dfcil sweep --config FILE.yaml[+MORE.yaml] [--config ...] [--grid KEY=V1,V2 ...] [--section.key VALUE ...]
            --out DIR [--jobs K] [--dry-run] [--launcher local|slurm] [--slurm.KEY VALUE ...] [--no-wait]
            [--plugin MODULE ...]
dfcil report PATH... [--format md|csv|latex] [--by ROWS,COLS] [--metric M] [--against METHOD] [--exclude GLOB ...]
             [--std population|sample] [--plots DIR]
dfcil eval DIR [--data.root DIR] [--classes ID... | --tasks T...] [--device DEV] [--json]
dfcil export DIR [--format FORMAT] [--out FILE]
dfcil inspect DIR [DIR_B] [--features | --synthetic] [--embedding joint|independent] [--out DIR] [--data.root DIR]
              [--device DEV]   (default --features; DIR_B: a second run beside the first, --features only)
dfcil methods [--plugin MODULE ...]
dfcil datasets
"""

from __future__ import annotations

import argparse
import errno
import json
import logging
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from dfcil.analysis import report
from dfcil.config import RUNTIME_KEYS, TOP_LEVEL_SCALARS, RunConfig, dump_config, parse_value, quoted
from dfcil.errors import (
    EXIT_BAD_INPUT,
    EXIT_BUDGET,
    EXIT_DIVERGED,
    BudgetSpent,
    CheckpointError,
    ConfigError,
    DatasetError,
    DivergedError,
    RegistryError,
    RunInterrupted,
    SplitError,
)
from dfcil.progress import log_to_console
from dfcil.training.budget import Budget

log = logging.getLogger("dfcil")

EPILOG = """\
Any config key can be set with a dotted option, LightningCLI style: --train.epochs 3, --data.root DIR,
--method.name finetune (switches the method; file keys the new method lacks are dropped), --data.class_order
"[3, 1, 2]", --seed 2, --task0_cache DIR. Values are parsed as YAML.
"""
RUN_DIR_HELP = "a run directory: it holds config.yaml and checkpoints/ (dfcil train --out)"
FINISHED_RUN_HELP = "a finished run directory: it holds config.yaml and model.pt (dfcil train --out)"
LOG_HELP = "also log to csv or tensorboard (repeatable, or a comma list; config key `log`); metrics.jsonl stays"
PLUGIN_HELP = (
    "a module name or .py file to import first, e.g. one that registers a method (repeatable; adds to the config key "
    "`plugins`, saved with the run; a later command on the run names a plugin file again: docs/extending.md)"
)
RUN_PLUGIN_HELP = (
    "allow a plugin the run directory's config.yaml names (a .py file, or a module no installed package holds), "
    "after reading it: it is imported only when named again (repeatable)"
)
TRUST_HELP = "import every plugin the run directory names, without naming each (only for runs you trust)"


def _add_consent(parser: argparse.ArgumentParser) -> None:
    """The options that allow a run directory's plugin code to be imported (dfcil.plugins.check_consent)."""
    parser.add_argument("--plugin", action="append", default=[], metavar="FILE", help=RUN_PLUGIN_HELP)
    parser.add_argument("--trust-plugins", action="store_true", help=TRUST_HELP)


def _consent(args: argparse.Namespace) -> Any:
    from dfcil.plugins import Consent

    return Consent(named=tuple(args.plugin), everything=args.trust_plugins)


def _split_overrides(tokens: Sequence[str]) -> list[tuple[str, str]]:
    """``--a.b V`` / ``--a.b=V`` pairs from the tokens argparse did not recognise."""
    out, i = [], 0
    while i < len(tokens):
        token = tokens[i]
        name = token.split("=", 1)[0][2:]
        if not token.startswith("--") or ("." not in name and name not in TOP_LEVEL_SCALARS):
            raise ConfigError(f"unrecognised argument {token!r}; config keys are given as --section.key VALUE")
        if "=" in token:
            key, value = token[2:].split("=", 1)
            i += 1
        else:
            if i + 1 >= len(tokens):
                raise ConfigError(f"option {token} needs a value")
            key, value = token[2:], tokens[i + 1]
            i += 2
        out.append((key, value))
    return out


def version_text() -> str:
    """``dfcil --version``: dfcil's version and source revision, and the installed torch's (read from its
    metadata: torch is not imported)."""
    import importlib.metadata

    from dfcil.version import __version__, source_revision

    try:
        torch = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch = "not installed"
    revision = source_revision()
    code = f" (source {revision})" if revision != __version__ else ""
    return f"dfcil {__version__}{code}, torch {torch}, python {sys.version.split()[0]}"


class _Version(argparse.Action):
    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, help="print dfcil's, torch's and python's versions and exit")

    def __call__(self, parser: argparse.ArgumentParser, *args: Any) -> None:
        print(version_text())
        parser.exit()


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dfcil", description="Data-free class-incremental learning.")
    parser.add_argument("--version", action=_Version)
    sub = parser.add_subparsers(dest="command", required=True)
    parser.set_defaults(commands=sub.choices)  # each command's own parser: its usage on a mistake (_main)
    train = sub.add_parser(
        "train",
        help="train a method through a protocol into a run directory",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    train.add_argument("--config", action="append", default=[], metavar="FILE", help="YAML config (repeatable)")
    train.add_argument("--out", metavar="DIR", help="run directory to create (default runs/<method>-<time>)")
    train.add_argument("--device", help="auto, cpu, cuda or cuda:N (same as --device in the config)")
    train.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    train.add_argument(
        "--dry-run", action="store_true",
        help="validate config and data, print the protocol and the run's expected time on this machine, exit",
    )  # fmt: skip
    train.add_argument(
        "--no-estimate", dest="estimate", action="store_false",
        help="skip the expected time that a dry run prints and a new run of 100 steps or more logs first (it times "
        "a few steps of each kind, and a method's task-end work once: seconds, or minutes where that work is long, "
        "as APR's ADC)",
    )  # fmt: skip
    train.add_argument("--log", action="append", metavar="NAME", help=LOG_HELP)
    train.add_argument("--plugin", action="append", default=[], metavar="MODULE", help=PLUGIN_HELP)
    train.add_argument(
        "--trust-plugins", action="store_true",
        help="import every plugin that a run directory (--out, or a --config that is a run's config.yaml) names",
    )  # fmt: skip
    train.add_argument("--budget-s", dest="budget_s", type=_seconds, metavar="S", help=BUDGET_HELP)
    bars = train.add_mutually_exclusive_group()
    bars.add_argument("--progress", dest="progress", action="store_true", default=None, help="force progress bars")
    bars.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bars")
    resume = sub.add_parser(
        "resume", help="continue an unfinished run from its newest checkpoint", epilog=RESUME_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    resume.add_argument("run_dir", metavar="DIR", help=RUN_DIR_HELP)
    resume.add_argument("--device", help="run on another device than the one the run started on")
    resume.add_argument("--data.root", dest="data_root", metavar="DIR", help="where the run's data lies now")
    resume.add_argument(
        "--engine.cuda_graphs", dest="cuda_graphs", choices=("on", "off", "check"),
        help="switch CUDA graphs on or off (e.g. off after a failed capture); the results do not change",
    )  # fmt: skip
    resume.add_argument("--log", action="append", metavar="NAME", help=LOG_HELP)
    resume.add_argument("--budget-s", dest="budget_s", type=_seconds, metavar="S", help=BUDGET_HELP)
    _add_consent(resume)
    bars = resume.add_mutually_exclusive_group()
    bars.add_argument("--progress", dest="progress", action="store_true", default=None, help="force progress bars")
    bars.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bars")
    _add_sweep_parser(sub)
    report.add_parser(sub)
    methods = sub.add_parser("methods", help="list the registered methods (name, summary, [not data-free]) and plugins")
    methods.add_argument("--plugin", action="append", default=[], metavar="MODULE", help="import it first (repeatable)")
    sub.add_parser("datasets", help="list the registered datasets")
    presets_ = sub.add_parser(
        "presets", help="list the presets (the configs that ship with dfcil, by name), or copy one to start your own",
        epilog=PRESETS_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    presets_.add_argument(
        "args", nargs="*", metavar="[PREFIX] | copy NAME DIR",
        help="the presets whose names start with PREFIX (default: all); copy NAME DIR: the preset (or a folder of "
        "them, e.g. cifar100) into DIR",
    )  # fmt: skip
    _add_run_tools(sub)
    return parser


BUDGET_HELP = (
    "seconds this process may train: the run stops at the end of a task, checkpointed, rather than start one it is "
    "not expected to finish in the time left (judged by the run's own timed tasks), exit status 4; the same "
    "command continues it"
)


def _seconds(text: str) -> float:
    """``--budget-s``'s value: seconds, a positive number."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds above 0")
    return value


RESUME_EPILOG = f"""\
A resume may change the runtime keys, which never change the results, with --KEY VALUE as dfcil train takes them:
  {", ".join(sorted(RUNTIME_KEYS))}
Everything else shapes the protocol or the model: start a new run to change it.
"""

SWEEP_EPILOG = """\
Each --config is one row of runs (several files of one run: a.yaml+b.yaml, merged in order); each --grid multiplies
the runs; other --section.key VALUE options apply to every run, as in dfcil train. Example, the three class orders of
two presets:
  dfcil sweep --config cifar100/n5+cifar100/rdfcil --config cifar100/n5+cifar100/abd \\
      --grid data.class_order_seed=0,1,2 --data.root DATA --out runs/t1-n5
Running the same command again skips finished runs, resumes unfinished ones and retries failed ones.
"""


def _add_sweep_parser(sub) -> None:
    from dfcil.sweep.slurm import SLURM_OPTIONS

    sweep = sub.add_parser(
        "sweep", help="many runs from one command: configs x grid, restartable", epilog=SWEEP_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    sweep.add_argument("--config", action="append", default=[], metavar="FILE[+FILE]", help="a row of runs")
    sweep.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2", help="values to sweep")
    sweep.add_argument("--out", required=True, metavar="DIR", help="the sweep directory (runs, sweep.json, logs)")
    sweep.add_argument(
        "--jobs", type=int, metavar="K", help="runs at once (default: 1 on the CPU, else from GPU memory)"
    )
    sweep.add_argument("--device", help="auto, cpu, cuda (as --device in the config), for every run")
    sweep.add_argument("--log", action="append", metavar="NAME", help="logs for every run, as dfcil train's --log")
    sweep.add_argument("--plugin", action="append", default=[], metavar="MODULE", help=PLUGIN_HELP)
    sweep.add_argument(
        "--trust-plugins", action="store_true", help="import every plugin a run's config.yaml given as --config names"
    )
    sweep.add_argument("--dry-run", action="store_true", help="print the runs and their states, run nothing")
    sweep.add_argument(
        "--budget-s", dest="budget_s", type=_seconds, metavar="S",
        help="the sweep's time: no run starts after it, and each run is given what is left as its --budget-s",
    )  # fmt: skip
    sweep.add_argument(
        "--mps", choices=("auto", "on", "off"), default="auto",
        help="CUDA MPS for runs sharing a GPU: auto (where the driver's MPS control program works; its daemon "
        "started and stopped by the sweep if none runs), on (an error where it cannot), off",
    )  # fmt: skip
    sweep.add_argument("--launcher", choices=("local", "slurm"), default="local", help="processes here, or SLURM")
    sweep.add_argument("--no-wait", dest="wait", action="store_false", help="slurm: submit and return")
    for key, (kind, _, text) in SLURM_OPTIONS.items():
        sweep.add_argument(f"--slurm.{key}", dest=f"slurm_{key}", type=kind, help=text)
    sweep.add_argument(
        "--slurm.array", dest="slurm_array", type=lambda v: v.lower() in ("1", "true", "yes"), default=True,
        help="one job array (default true) or one job per run (false)",
    )  # fmt: skip
    sweep.add_argument("--slurm.cluster", dest="slurm_cluster", help=argparse.SUPPRESS)  # "local": submitit's local


def _sweep(args: argparse.Namespace, unknown: Sequence[str], argv: Sequence[str]) -> int:
    from dfcil.sweep import SweepSpec, sweep
    from dfcil.sweep.plan import parse_grid
    from dfcil.sweep.slurm import SLURM_OPTIONS

    overrides = _split_overrides(unknown)
    if args.device:
        overrides.append(("device", args.device))
    if args.log is not None:
        overrides.append(("log", json.dumps(_log_names(args.log))))
    slurm = {key: getattr(args, f"slurm_{key}") for key in (*SLURM_OPTIONS, "array", "cluster")}
    spec = SweepSpec(
        configs=[part.split("+") for part in args.config], grid=parse_grid(args.grid), fixed=overrides,
        out=Path(args.out), jobs=args.jobs, dry_run=args.dry_run, launcher=args.launcher, slurm=slurm,
        wait=args.wait, command=["dfcil", *argv], plugins=args.plugin, trust_plugins=args.trust_plugins, mps=args.mps,
        budget_s=args.budget_s,
    )  # fmt: skip
    return sweep(spec)


# ------------------------------------------------------------------------- eval, export, inspect, --log


def _log_names(values: list[str] | None) -> list[str] | None:
    """``--log a --log b,c`` → ``[a, b, c]``; None when not given."""
    return None if values is None else [name.strip() for v in values for name in v.split(",") if name.strip()]


def _add_run_tools(sub: argparse._SubParsersAction) -> None:
    """The commands on a finished run directory (dfcil.analysis.tools, dfcil.analysis.features)."""
    ev = sub.add_parser("eval", help="evaluate a finished run's final model (model.pt) on the test set")
    ev.add_argument("run_dir", metavar="DIR", help=FINISHED_RUN_HELP)
    ev.add_argument("--data.root", dest="data_root", metavar="DIR", help="where the run's data lies now")
    which = ev.add_mutually_exclusive_group()
    which.add_argument(
        "--classes", nargs="+", metavar="ID",
        help="raw class ids or names, several or a comma list: --classes 3 7, or red,blue (default: every class)",
    )  # fmt: skip
    which.add_argument("--tasks", nargs="+", metavar="T", help="tasks whose classes to evaluate: --tasks 0 1, or 0,1")
    ev.add_argument("--device", help="auto, cpu, cuda or cuda:N (default: the run's)")
    ev.add_argument("--json", action="store_true", help="print the result as JSON")
    ev.add_argument(
        "--confusion", action="store_true",
        help="also where each task's images go: accuracy among the task's own classes, and the shares predicted "
        "into earlier, own and later tasks' classes",
    )  # fmt: skip
    _add_consent(ev)
    ex = sub.add_parser("export", help="export a finished run's final network (weights + a JSON model card)")
    ex.add_argument("run_dir", metavar="DIR", help=FINISHED_RUN_HELP)
    ex.add_argument(
        "--format", dest="fmt", default="safetensors", choices=_ExportFormats(), metavar="FORMAT",
        help="export format, one of: %(choices)s (default %(default)s)",
    )  # fmt: skip
    ex.add_argument("--out", metavar="FILE", help="weights file (default DIR/model.<format>); the card goes beside")
    ex.add_argument("--data.root", dest="data_root", metavar="DIR", help="only for runs saved before model cards")
    _add_consent(ex)
    ins = sub.add_parser("inspect", help="plots of a run's final features (default), or its inversions (--synthetic)")
    ins.add_argument("run_dir", metavar="DIR", help=FINISHED_RUN_HELP)
    ins.add_argument("against", metavar="DIR_B", nargs="?", help="--features: a second run, drawn beside the first")
    mode = ins.add_mutually_exclusive_group()
    mode.add_argument(
        "--features", dest="mode", action="store_const", const="features", default="features",
        help="t-SNE of the features of real and synthetic images (the default)",
    )  # fmt: skip
    mode.add_argument(
        "--synthetic", dest="mode", action="store_const", const="synthetic",
        help="each task's inversion statistics, table and figure",
    )  # fmt: skip
    ins.add_argument("--out", metavar="DIR", help="where to write the plots (default DIR/inspect)")
    ins.add_argument("--data.root", dest="data_root", metavar="DIR", help="where the run's data lies now")
    ins.add_argument("--device", help="auto, cpu, cuda or cuda:N (default: the run's)")
    ins.add_argument("--per-class", type=int, default=30, help="real test images per class (default 30)")
    ins.add_argument("--synthetic-images", type=int, default=200, help="--features: synthetic images (default 200)")
    ins.add_argument(
        "--embedding", default="joint", metavar="NAME",
        help="--features: joint (one t-SNE of real and synthetic features together, the default) or independent "
        "(one t-SNE each, side by side)",
    )  # fmt: skip
    ins.add_argument(
        "--inversion-steps", type=int, default=200,
        help="steps of the fresh inversion for runs that kept no generator (default 200)",
    )  # fmt: skip
    _add_consent(ins)


class _ExportFormats:
    """``dfcil export --format``'s choices: the names in :data:`dfcil.analysis.tools.EXPORT_FORMATS`, read when argparse
    reads the choices (``dfcil export`` parsing its options or printing its help), so that building the parser
    imports neither dfcil.analysis.tools nor torch."""

    def __iter__(self) -> Iterator[str]:
        from dfcil.analysis.tools import EXPORT_FORMATS

        return iter(EXPORT_FORMATS.names())

    def __contains__(self, name: object) -> bool:
        return name in list(self)


EVAL_SELECTIONS = {  # dfcil eval's options that select classes: what each takes
    "--classes": ("raw class ids or names", "class id or name", "--classes 3 7, or 3,7"),
    "--tasks": ("task numbers", "task number", "--tasks 0 1, or 0,1"),
}


def _ids(option: str, values: Sequence[str] | None, kind: type = str) -> list | None:
    """``--classes a b,c`` → ``[a, b, c]``; None when not given. An empty item (``--classes ""``, ``--tasks 1,,2``:
    a shell variable left unset) or, for ``--tasks``, one that is not a number is refused, naming the option."""
    if values is None:
        return None
    takes, item, example = EVAL_SELECTIONS[option]
    shown = " ".join(values) if "".join(values).strip() else quoted(" ".join(values))  # --classes '' shows ''
    items = [t.strip() for v in values for t in v.split(",")]
    if "" in items:
        raise ConfigError(
            f"{option} {shown}: an empty {item} (a shell variable left unset?); give {takes}, e.g. {example}"
        )
    try:
        return [kind(t) for t in items]
    except ValueError:
        raise ConfigError(f"{option} {shown}: give {takes}, e.g. {example}") from None


def _eval(args: argparse.Namespace) -> int:
    from dfcil.analysis.tools import evaluate_run, format_report

    tasks, classes = _ids("--tasks", args.tasks, int), _ids("--classes", args.classes)
    consent, confusion = _consent(args), args.confusion
    report = evaluate_run(args.run_dir, args.data_root, classes, tasks, args.device, consent, confusion)
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 0


def _export(args: argparse.Namespace) -> int:
    from dfcil.analysis.tools import export_run

    for path in export_run(args.run_dir, args.fmt, args.out, args.data_root, _consent(args)):
        print(path)
    return 0


def _inspect(args: argparse.Namespace) -> int:
    if args.mode == "synthetic":
        if args.against is not None:
            raise ConfigError(f"--synthetic reads one run, got two ({args.run_dir}, {args.against}); give one DIR")
        from dfcil.analysis.inversions import inspect_synthetic

        table, paths, missing = inspect_synthetic(args.run_dir, args.out)
        print(table)
        for path in paths:
            print(path)
        if missing:
            print(missing, file=sys.stderr)
        return 0
    from dfcil.analysis.features import FeatureOptions, inspect_features

    options = FeatureOptions(args.per_class, args.synthetic_images, args.inversion_steps, embedding=args.embedding)
    table, paths = inspect_features(
        args.run_dir, args.out, args.data_root, args.device, options, _consent(args), args.against
    )
    print(table)
    for path in paths:
        print(path)
    return 0


def _methods(args: argparse.Namespace) -> int:
    from dfcil.catalogue import method_entries, plugin_entries, plugin_of, switch_entries

    if args.plugin:  # their methods are listed from the registry, which importing them fills (and torch)
        from dfcil.methods import METHODS  # noqa: F401 - the built-in methods first: a plugin may build on them
        from dfcil.plugins import import_plugins

        import_plugins(args.plugin)
    entries = method_entries()  # without plugins given: read from the methods' source, no torch
    plugins = plugin_entries(e.name for e in entries)  # installed, not imported: from their packages' metadata
    width = max(len(e.name) for e in [*entries, *plugins])
    keeps = max(len(e.stores) for e in entries)
    print(f"{'method':{width}s}  {'keeps between tasks':{keeps}s}  summary")
    for entry in entries:
        note = "" if entry.data_free else "  [not data-free]"
        module = plugin_of(entry)
        note += f"  [plugin: {module}]" if module else ""
        print(f"{entry.name:{width}s}  {entry.stores:{keeps}s}  {entry.summary}{note}")
    for plugin in plugins:
        what = f"(imported when a config names it; dfcil methods --plugin {plugin.module} describes it)"
        if plugin.outside:  # a config naming it is refused (plugins.load_entry_point): say so here, not at the run
            what = f"(not imported by its name alone: it {plugin.outside}; allow it with --plugin {plugin.module})"
        print(f"{plugin.name:{width}s}  {'?':{keeps}s}  {what}  [plugin: {plugin.package}]")
    print("\nswitches that change what a method keeps:")
    for switch in switch_entries(entries):
        print(f"  method.{switch.key} true ({', '.join(switch.methods)}): keeps {switch.stores}. {switch.summary}")
    print("\ndata-free: nothing kept between tasks holds or generates earlier images (README: What each method keeps)")
    return 0


PRESETS_EPILOG = """\
A preset is given to --config by its name, from any folder and any install (a path that exists wins):
  dfcil train --config smoke --out runs/smoke
  dfcil train --config cifar100/n10 --config cifar100/rdfcil --data.root DATA
  dfcil presets copy cifar100/rdfcil my-configs    # then: --config my-configs/rdfcil.yaml
"""


def _presets(args: argparse.Namespace) -> int:
    from dfcil import presets

    if args.args[:1] == ["copy"]:
        if len(args.args) != 3:
            raise ConfigError("dfcil presets copy NAME DIR: give a preset's name (or a folder of them) and a folder")
        name, dest = args.args[1:]
        try:
            written = presets.copy(name, dest)
        except FileNotFoundError:
            raise ConfigError(f"no preset or folder of presets is named {name!r}; `dfcil presets` lists them") from None
        except FileExistsError as err:
            raise ConfigError(f"{err} exists: nothing copied; give another DIR, or move that file away") from None
        for path in written:
            print(path)
        return 0
    if len(args.args) > 1:
        raise ConfigError(f"dfcil presets takes one PREFIX, or copy NAME DIR; got {' '.join(args.args)}")
    prefix = args.args[0].removesuffix(".yaml") if args.args else ""
    names = [n for n in presets.names() if n.startswith(prefix)]
    if not names:
        raise ConfigError(f"no preset's name starts with {prefix!r}; `dfcil presets` lists them all")
    width = max(len(n) for n in names)
    for name in names:
        path = presets.preset_file(name)
        paper = presets.paper_numbers(path)
        shown = f"  (paper A_N: {', '.join(f'{k} {v}' for k, v in paper.items())})" if paper else ""
        print(f"{name:{width}s}  {presets.summary(path)}{shown}")
    print(f"\n{len(names)} presets in {presets.root()}; `dfcil presets --help`: how to use and copy them")
    return 0


def _datasets(args: argparse.Namespace) -> int:
    from dfcil.data.datasets import DATASETS

    width = max(len(name) for name in DATASETS.names())
    for name in DATASETS.names():
        doc = (DATASETS.get(name).__doc__ or "").strip().splitlines()
        print(f"{name:{width}s}  {doc[0] if doc else ''}")
    return 0


def _print_protocol(cfg: RunConfig, estimate: bool = True) -> None:
    from dfcil.compute.runtime import resolve_device
    from dfcil.methods import Task, build_method
    from dfcil.progress import make_progress
    from dfcil.training import engine
    from dfcil.training.protocol import prepare

    protocol = prepare(cfg, make_progress(None))
    split, ds = protocol.split, protocol.dataset
    method = build_method(cfg.method, cfg.train)
    print(f"method:      {cfg.method.name}")
    print(f"dataset:     {ds.name} ({ds.num_classes} classes, {ds.image_size}x{ds.image_size}) from {ds.source}")
    print(f"device:      {resolve_device(cfg.device)}")
    print(f"tasks:       {split.num_tasks}, classes per task {list(split.task_sizes)}")
    print(f"class order: {list(split.class_order)}")
    if any(isinstance(m, float) for m in cfg.train.milestones):
        print(f"milestones:  {list(cfg.train.milestones)} of each phase, at epoch round(f x phase epochs) (below)")
    for t, classes in enumerate(split.tasks):
        task = Task(task_id=t, n_old=split.offsets[t], n_new=len(classes), num_tasks=split.num_tasks)
        phases = "; ".join(p.describe() for p in method.phases(task)) or "no training"
        shown = f"{', '.join(map(ds.class_label, classes[:5]))}{', ...' * (len(classes) > 5)}"
        named = f" ({shown})" if ds.classes or ds.words else ""
        count = f"{len(classes)} class{'es' * (len(classes) != 1)}"
        print(
            f"  task {t}: {count}, {protocol.train_images[t]} train / {protocol.test_images[t]} test "
            f"images; {phases}; classes {classes}{named}"
        )
    if estimate:  # a few steps of each kind timed on a throwaway build of the run (seconds)
        sys.stdout.flush()
        found = engine.estimate(cfg, protocol)  # no min_steps: every dry run's
        print(*(found.lines() if found else ()), sep="\n")


def _unread_note(cfg: RunConfig, dry_run: bool) -> str:
    """What a switch of method also changes: the train keys its phases do not read (EFC's Adam: train.lr)."""
    from dfcil.methods import build_method
    from dfcil.training.protocol import stand_in_tasks, unread_schedule_keys

    try:
        method = build_method(cfg.method, cfg.train)
    except (ConfigError, ValueError):  # refused later, with the run's other problems
        return ""
    unread = unread_schedule_keys(cfg, method, stand_in_tasks(cfg.data.num_tasks))
    keys = ", ".join(f"train.{k}" for k in unread)
    phases = "its phases are listed below" if dry_run else "--dry-run prints its phases"  # not a dry run's advice
    return f"; {cfg.method.name} does not read {keys} (its own keys set them: {phases})" * bool(keys)


def _train(args: argparse.Namespace, unknown: Sequence[str], argv: Sequence[str]) -> int:
    overrides = _split_overrides(unknown)
    if args.device:
        overrides.append(("device", args.device))
    if args.log is not None:
        overrides.append(("log", json.dumps(_log_names(args.log))))
    if not args.config:
        raise ConfigError(
            "dfcil train needs --config FILE.yaml or a preset's name (try --config smoke; `dfcil presets` lists them)"
        )
    from dfcil.load import check_run_records, load_config, protocol_without_method

    check_run_records(args.config, _consent(args))  # a received run's config.yaml: its plugin files need consent
    cfg, dropped = load_config(args.config, overrides, plugins=args.plugin)
    if note := protocol_without_method(args.config, overrides):  # before the checks its defaults may fail
        log.warning("%s", note)
    if dropped:
        log.warning("method switched to %r: %s%s", cfg.method.name, "; ".join(dropped), _unread_note(cfg, args.dry_run))
    if args.print_config:  # a config that cannot run is refused as --dry-run refuses it (no data read)
        from dfcil.training.protocol import validate

        validate(cfg)
        print(dump_config(cfg), end="")
        return 0
    if args.dry_run:
        from dfcil.training.loggers import LOGGERS

        for name in cfg.log:  # the run refuses an unknown logger before it starts (runner._start): so does this
            LOGGERS.get(name)
        _print_protocol(cfg, args.estimate)
        return 0
    from dfcil.runs import runner

    out = args.out or f"runs/{cfg.method.name}-{datetime.now():%Y%m%d-%H%M%S}"
    options = runner.RunOptions(
        progress=args.progress, argv=argv, budget=Budget.of(args.budget_s), estimate=args.estimate
    )
    consent = _consent(args)
    return _interruptible(out, options, lambda: runner.train(cfg, Path(out), options, consent=consent))


def _resume(args: argparse.Namespace, unknown: Sequence[str], argv: Sequence[str]) -> int:
    from dfcil.runs import runner

    overrides = {}
    for key, text in _split_overrides(unknown):  # any runtime key, as --KEY VALUE
        if key not in RUNTIME_KEYS:
            raise ConfigError(
                f"--{key}: dfcil resume may change only the runtime keys ({', '.join(sorted(RUNTIME_KEYS))}); the "
                f"others shape the run: start a new run to change them"
            )
        overrides[key] = parse_value(text)
    if args.device:
        overrides["device"] = args.device
    if args.cuda_graphs:
        overrides["engine.cuda_graphs"] = args.cuda_graphs
    if args.data_root:
        overrides["data.root"] = args.data_root
    if args.log is not None:
        overrides["log"] = _log_names(args.log)
    options = runner.RunOptions(progress=args.progress, argv=argv, budget=Budget.of(args.budget_s))
    consent = _consent(args)
    return _interruptible(args.run_dir, options, lambda: runner.resume(args.run_dir, overrides, options, consent))


def _interruptible(run_dir: str, options: Any, work: Callable[[], object]) -> int:
    """Run ``work()`` so that the first Ctrl-C or SIGTERM stops it cleanly after a checkpoint (exit 130)."""
    from tqdm.contrib.logging import logging_redirect_tqdm

    from dfcil.runs.signals import stop_on_signals

    try:
        with stop_on_signals(options.interrupt), logging_redirect_tqdm(loggers=[log]):
            work()
    except BudgetSpent as err:
        print(f"dfcil: {err}. Continue with: dfcil resume {run_dir}", file=sys.stderr)
        return EXIT_BUDGET
    except RunInterrupted as err:
        print(f"dfcil: {err}; checkpoint written. Continue with: dfcil resume {run_dir}", file=sys.stderr)
        return 130
    return 0


# The commands that take config keys (--section.key VALUE) besides their own options, and the others.
KEYED_COMMANDS: dict[str, Callable[[argparse.Namespace, Sequence[str], Sequence[str]], int]] = {
    "train": _train, "resume": _resume, "sweep": _sweep,
}  # fmt: skip
COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "report": report.main, "eval": _eval, "export": _export, "inspect": _inspect, "methods": _methods,
    "datasets": _datasets, "presets": _presets,
}  # fmt: skip

SIGPIPE_STATUS = 141  # 128 + SIGPIPE: what a shell reports for a writer whose reader went away, e.g. `yes | head -1`


def restore_ctrl_c() -> None:
    """A shell script's ``dfcil train ... &`` starts with SIGINT ignored (a non-interactive shell does that to its
    background jobs), so Ctrl-C, or ``kill -INT``, would do nothing until a run installs its own handler. Put
    Python's default back, so that SIGINT stops every command at any time, as in the foreground."""
    import signal

    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def main(argv: Sequence[str] | None = None) -> int:
    restore_ctrl_c()
    try:
        status = _main(argv)
        sys.stdout.flush()  # a reader that went away shows here, inside the handler below
        return status
    except BrokenPipeError:  # `dfcil eval RUN | head -1`: the reader has what it wanted
        _discard_stdout()
        return SIGPIPE_STATUS
    except KeyboardInterrupt:  # also while the first imports (torch) load, before any run exists
        print("dfcil: interrupted", file=sys.stderr)
        return 130
    finally:
        if "dfcil.compute.distributed" in sys.modules:  # a run over several processes (torchrun) leaves its group
            sys.modules["dfcil.compute.distributed"].stop()


def _discard_stdout() -> None:
    """Point file descriptor 1 at /dev/null, so that the interpreter's last flush of what stdout still buffers
    does not raise BrokenPipeError again (and print "Exception ignored ...") at exit."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout is no file (a test's capture): nothing is flushed to it at exit
        pass


def _main(argv: Sequence[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _build_parser()
    args, unknown = parser.parse_known_args(argv)
    log_to_console()
    try:
        for option in ("out", "plots"):  # "" would mean the current directory (or, for train, the default name)
            if (value := getattr(args, option, None)) is not None and not value.strip():
                raise ConfigError(f"--{option} is empty; give a path (a shell variable left unset?)")
        if args.command in KEYED_COMMANDS:
            return KEYED_COMMANDS[args.command](args, unknown, argv)
        if unknown:  # the command's own usage, not dfcil's
            args.commands[args.command].error(f"unrecognized arguments: {' '.join(unknown)}")
        return COMMANDS[args.command](args)
    except (ConfigError, SplitError, DatasetError, RegistryError, CheckpointError) as err:
        print(f"dfcil: error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except DivergedError as err:
        print(f"dfcil: training stopped: {err}", file=sys.stderr)
        return EXIT_DIVERGED
    except OSError as err:
        if err.errno not in STORAGE_ERRORS or (err.errno in ACCESS_ERRORS and not err.filename):
            raise  # a refusal that names no file: not the user's disk
        print(f"dfcil: error: {storage_error(err)}", file=sys.stderr)
        return 2


# What the disk refused (full, over a quota, a file past the size limit, read-only, no permission): the user's
# environment, not a bug, so one line rather than a traceback; every file dfcil writes is written whole
# (checkpoints, caches, summaries), so whatever stopped continues from what it holds
STORAGE_ERRORS = {
    errno.ENOSPC: "no space left on the disk", errno.EDQUOT: "the disk quota is exceeded",
    errno.EFBIG: "a file would grow past the largest size allowed (the file system's, or the shell's `ulimit -f`)",
    errno.EROFS: "the file system is read-only", errno.EACCES: "permission denied", errno.EPERM: "not permitted",
}  # fmt: skip


ACCESS_ERRORS = (errno.EROFS, errno.EACCES, errno.EPERM)


def storage_error(err: OSError) -> str:
    """The one-line message for an ``OSError`` of :data:`STORAGE_ERRORS`: what happened, where, and what to do."""
    where = f": {err.filename}" if err.errno in ACCESS_ERRORS else f" writing {err.filename}"
    where = where if err.filename else ""
    return (
        f"{STORAGE_ERRORS[err.errno]}{where}; free space, raise the limit or fix the permissions, or point --out, "
        f"data.cache or task0_cache at another disk, then run the same command again: a run continues from its last "
        f"checkpoint, a decoded-image cache from the images it holds"
    )


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
