"""Run directories: validate, create the directory, save the resolved config and provenance, train, summarise.

A run directory holds

* ``config.yaml``: the resolved config (``dfcil train --config DIR/config.yaml`` repeats the run);
* ``meta.json``: package, library and git versions, device, command line, the plugins it used (module, file,
  package version, git SHA);
* ``run.log``: the log; ``metrics.jsonl``: one JSON record per epoch and per task;
* ``checkpoints/``: the newest and previous complete checkpoints (see :mod:`dfcil.checkpoint`);
* ``model.pt``: the final network (:mod:`dfcil.model_file`); ``summary.json``: written last, atomically, only when
  every task finished (see :mod:`dfcil.metrics`).

Everything a report needs is in these files; reading them never imports the engine. :func:`train` and
:func:`resume` are the API behind ``dfcil train`` and ``dfcil resume`` (and every run of a sweep); how a run is
driven (progress bars, callbacks, the interrupt, the recorded command line) is one
:class:`~dfcil.training.loop.RunOptions`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import os
import platform
import shutil
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from filelock import FileLock, Timeout

from dfcil.checkpoint import Checkpointer
from dfcil.compute import distributed
from dfcil.compute.distributed import Dist
from dfcil.compute.runtime import resolve_device
from dfcil.config import RUNTIME_KEYS, RunConfig, changed_keys, config_to_dict, dump_config, with_absolute_paths
from dfcil.data.datasets import DATASETS
from dfcil.errors import ConfigError, PluginError, RunInterrupted
from dfcil.io import (
    FOREIGN_DIRS,
    check_creatable_dir,
    check_writable_tree,
    own_copies,
    remove_temporaries,
    shared_lock_note,
    write_atomic,
    write_json,
)
from dfcil.load import load_run_config
from dfcil.methods import METHODS
from dfcil.models.backbones import BACKBONES
from dfcil.plugins import Consent, changed_plugins, module_name
from dfcil.plugins import provenance as plugin_provenance
from dfcil.progress import make_progress
from dfcil.training import engine
from dfcil.training.callbacks import ConsoleLogger, JsonlLogger, SaveModel
from dfcil.training.diagnostics import InversionDiagnostics
from dfcil.training.engine import run
from dfcil.training.grid import SyntheticGrid
from dfcil.training.loggers import LOGGERS, LoggerSettings, build_loggers
from dfcil.training.loop import RunOptions
from dfcil.training.protocol import IDENTITY_KEYS, Protocol, prepare
from dfcil.version import __version__, git, source_revision

log = logging.getLogger("dfcil")


def provenance(cfg: RunConfig, argv: Sequence[str] | None = None) -> dict[str, Any]:
    import numpy

    device, cpu = resolve_device(cfg.device), cpu_name()
    return {
        "dfcil": __version__,
        "code": source_revision(),  # the package's source that computes the run (dfcil.version)
        "git_sha": git("rev-parse", "HEAD"),
        "git_diff_stat": git("diff", "--stat", "HEAD"),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "platform": platform.platform(),
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else cpu,
        "cpu": cpu,  # the host's, on a GPU run too: timings of data and host work depend on it
        "torch_threads": torch.get_num_threads(),
        "processes": distributed.current().world,  # torchrun: the run's processes (docs/distributed.md)
        "argv": list(argv) if argv is not None else sys.argv,
        "plugins": [plugin_provenance(module) for module in plugin_modules(cfg)],
    }


def cpu_name(cpuinfo: str | Path = "/proc/cpuinfo") -> str:
    """The host's processor, in words: its model name (Linux's ``/proc/cpuinfo``, else ``platform.processor()``),
    the logical CPUs and the vector instructions PyTorch uses: ``Intel(R) Xeon(R) Processor, 2 CPUs, AVX512``. The
    model name alone can be as generic as that, so the instructions tell machines apart too."""
    name = ""
    try:
        for line in Path(cpuinfo).read_text().splitlines():
            if line.startswith("model name"):
                name = line.partition(":")[2].strip()
                break
    except OSError:  # not Linux
        pass
    name = name or platform.processor() or platform.machine() or "unknown processor"
    return f"{name}, {os.cpu_count()} CPUs, {torch.backends.cpu.get_cpu_capability()}"


def plugin_modules(cfg: RunConfig) -> list[str]:
    """The modules outside dfcil that the run imports: its config's ``plugins``, and those that define what it names
    (its method, dataset, backbone and loggers: a plugin's, when an entry point brought it in)."""
    used = [METHODS.get(cfg.method.name), DATASETS.get(cfg.data.name), *(LOGGERS.get(n) for n in cfg.log)]
    if cfg.model.backbone in BACKBONES.names():  # "auto" stands for a built-in one
        used.append(BACKBONES.get(cfg.model.backbone))
    modules = [module_name(spec) for spec in cfg.plugins] + [getattr(item, "__module__", "") for item in used]
    return [m for m in dict.fromkeys(modules) if m and m != "dfcil" and not m.startswith("dfcil.")]


def check_new_run_dir(out: Path) -> None:
    """Refuse an ``--out`` that is a file or a directory holding anything (but the lock file of a run that failed
    before its first checkpoint), or that cannot be created."""
    if out.is_dir() and not (out / "config.yaml").exists():
        entries = [p.name for p in out.iterdir() if p.name != ".lock"]
        if entries and all(name.startswith(".") and name.endswith(".tmp") for name in entries):  # write_atomic's
            raise ConfigError(
                f"another dfcil process is starting a run in {out} (its config.yaml is being written); choose "
                f"another --out (or, once it stops, continue it with `dfcil resume {out}`)"
            )
    if out.exists() and (not out.is_dir() or any(p.name != ".lock" for p in out.iterdir())):
        raise ConfigError(
            f"{out} exists and is not a dfcil run directory (no config.yaml); choose another --out"
            if not (out / "config.yaml").exists()
            else f"run directory {out} already exists"
        )
    try:
        check_creatable_dir(out, "run directory", "choose another --out")
    except ValueError as err:
        raise ConfigError(str(err)) from None


# What a continued run writes into in place, besides new files in the run directory: the folders it adds files to
# and the files it appends to (or, .lock, opens for writing)
WRITTEN_DIRS = ("checkpoints", "tensorboard", "wandb")
APPENDED_FILES = ("metrics.jsonl", "run.log", "metrics.csv", "tasks.csv", ".lock")


def check_writable_run_dir(run_dir: Path) -> None:
    """Refuse, before any work, an existing run directory that a continued run could not write, or whose writes
    would leave it: a read-only one, or one received with links to files or folders elsewhere
    (:func:`dfcil.io.check_writable_tree`)."""
    fix = f"or copy the run elsewhere (`cp -rL {run_dir} NEW` copies what links point to) and resume the copy"
    try:
        check_writable_tree(run_dir, "run directory", fix, WRITTEN_DIRS, APPENDED_FILES, FOREIGN_DIRS)
    except ValueError as err:
        raise ConfigError(str(err)) from None


@contextlib.contextmanager
def locked(run_dir: Path) -> Iterator[None]:
    """Hold ``run_dir/.lock`` so that two processes never write the same run directory."""
    lock = FileLock(run_dir / ".lock")
    try:
        lock.acquire(timeout=0)
    except Timeout:
        raise ConfigError(
            f"run directory {run_dir} is in use by another dfcil process; wait for it or stop it first"
            f"{shared_lock_note(run_dir / '.lock')}"
        ) from None
    try:
        yield
    finally:
        lock.release()


def train(
    cfg: RunConfig,
    out: str | os.PathLike,
    options: RunOptions | None = None,
    protocol: Protocol | None = None,
    consent: Consent = Consent(),  # noqa: B008 - frozen
) -> dict[str, Any]:
    """Train ``cfg`` into the run directory ``out`` and return the summary.

    A new directory is created only after all validation (config, data, protocol) passed, so bad input leaves
    nothing behind. If ``out`` is an unfinished run with the same config (runtime keys such as ``device`` may
    differ), it is resumed. ``protocol``: the prepared data, where the caller has it already. The plugins of
    ``cfg`` are the caller's own; an existing ``out`` may name others only with ``consent``
    (:func:`dfcil.load.load_run_config`).
    """
    out, options = Path(out), options or RunOptions()
    cfg = with_absolute_paths(cfg)
    dist = distributed.start(resolve_device(cfg.device).type)  # torchrun: join the other processes
    if dist.main and (out / "config.yaml").exists():
        consent = dataclasses.replace(consent, named=(*cfg.plugins, *consent.named))
        try:
            saved = load_run_config(out, consent=consent)
        except PluginError:
            raise
        except ConfigError as err:
            raise ConfigError(
                f"--out {out} holds a config.yaml that dfcil cannot use ({err}); choose another --out"
            ) from None
        changed = changed_keys(config_to_dict(saved), config_to_dict(cfg))
        if changed:
            finished = (out / "summary.json").exists()
            fix = "choose another --out" if finished else f"resume it with `dfcil resume {out}` or choose another --out"
            what = "a finished run" if finished else "a run"
            raise ConfigError(f"{out} holds {what} with a different config ({', '.join(changed)}); {fix}")
        if (out / "summary.json").exists():
            return _finished(out)
        runtime = {key: functools.reduce(getattr, key.split("."), cfg) for key in RUNTIME_KEYS}
        return resume(out, runtime, options, consent)
    if dist.main:
        check_new_run_dir(out)
    return _start(cfg, out, options, dist, protocol, new=True)


def _finished(out: Path) -> dict[str, Any]:
    """The summary of the run ``out`` holds, finished with the config given again: nothing to train, and no error
    (the same command run twice, a quick start run again), said on the log."""
    try:
        summary = json.loads((out / "summary.json").read_text())
        acc = f"A_N {float(summary['last_acc']):.2f}%"
    except (OSError, ValueError, TypeError, KeyError):
        raise ConfigError(
            f"{out} holds this run, finished, but its summary.json cannot be read; give another --out to train it again"
        ) from None
    log.warning(
        "%s holds this run, finished (summary.json exists, %s): nothing to train or resume; evaluate it with "
        "`dfcil eval %s`, or give another --out to train it again", out, acc, out,
    )  # fmt: skip
    return summary


def resume(
    run_dir: str | os.PathLike,
    overrides: dict[str, Any] | None = None,
    options: RunOptions | None = None,
    consent: Consent = Consent(),  # noqa: B008 - frozen
) -> dict[str, Any]:
    """Continue the unfinished run in ``run_dir`` from its newest usable checkpoint (a finished run: its summary,
    nothing trained, as :func:`train` of it).

    Only runtime keys (``device``, ``engine.cuda_graphs``, ...: ``config.RUNTIME_KEYS``) may be overridden; a
    change to anything that shapes the protocol or the model is refused. The plugin code the run names is imported
    only with ``consent`` (``--plugin``, ``--trust-plugins``: :func:`dfcil.load.load_run_config`).
    """
    run_dir, options = Path(run_dir), options or RunOptions()
    if not (run_dir / "config.yaml").exists():
        raise ConfigError(f"{run_dir} is not a dfcil run directory (no config.yaml)")
    if (run_dir / "summary.json").exists():  # as `dfcil train` of it: nothing to do, no error (a retry loop ends)
        return _finished(run_dir)
    check_writable_run_dir(run_dir)
    saved = load_run_config(run_dir, consent=consent)
    cfg = load_run_config(run_dir, [(k, json.dumps(v)) for k, v in (overrides or {}).items()], consent)
    cfg = with_absolute_paths(cfg)
    changed = changed_keys(config_to_dict(saved), config_to_dict(cfg))
    if changed:
        raise ConfigError(
            f"cannot change {', '.join(changed)} when resuming {run_dir}: these keys shape the protocol or the "
            f"model. Only {', '.join(sorted(RUNTIME_KEYS))} may change; start a new run for the rest"
        )
    dist = distributed.start(resolve_device(cfg.device).type)  # torchrun: join the other processes
    return _start(cfg, run_dir, options, dist, None, new=False)


def _start(
    cfg: RunConfig, out: Path, options: RunOptions, dist: Dist, protocol: Protocol | None, new: bool
) -> dict[str, Any]:
    """What a new run and a resumed one share: the data prepared and the ``--log`` loggers built (a bad name or a
    missing extra refused) before anything is written, then the run directory locked and the run trained. Under
    torchrun the other processes follow the first (:func:`_follow`)."""
    if not dist.main:
        return _follow(cfg, out, dist, options)
    protocol = protocol or prepare(cfg, make_progress(options.progress))
    options = dataclasses.replace(
        options,
        callbacks=[*build_loggers(cfg.log, out, LoggerSettings(config_to_dict(cfg), cfg.wandb)), *options.callbacks],
    )
    if not new:
        data_changed = check_same_data(out, cfg, protocol)
        with locked(out):
            if (out / "summary.json").exists():  # finished by another process since resume() looked
                return _finished(out)
            has_checkpoint = Checkpointer(out).exists()
            for folder in (out, out / "checkpoints"):  # what a killed process was writing (the run is locked)
                remove_temporaries(folder)
            # appended to or cut back in place: files with other names (a `cp -al` copy) get an inode of their own
            shared = own_copies(out, tuple(f for f in APPENDED_FILES if f != ".lock"))  # the lock is held now
            notes = _record_resume(out, options, data_changed)
            if shared:
                notes.append(
                    f"{', '.join(shared)} had other names (hard links, as `cp -al` makes): each is now a copy of its "
                    f"own, and what this run writes leaves the other names as they were"
                )
            dist.barrier()  # the other processes follow from the same checkpoint (_follow)
            if not has_checkpoint:  # stopped before its first checkpoint: start over in place
                metrics = out / "metrics.jsonl"
                if metrics.exists() and metrics.stat().st_size:
                    log.warning("%s has no checkpoint (deleted?): the run starts over from its first task", out)
                metrics.unlink(missing_ok=True)
            return _execute(cfg, out, protocol, has_checkpoint, options, notes)
    created = _make_run_dir(out)
    with locked(out):  # before the first write: a process that cannot lock the directory writes and removes nothing
        if (out / "config.yaml").exists():
            raise ConfigError(
                f"another dfcil process started a run in {out} meanwhile; choose another --out (or, once it stops, "
                f"continue it with `dfcil resume {out}`)"
            )
        try:
            write_atomic(out / "config.yaml", dump_config(cfg))
            meta = {"run_id": uuid.uuid4().hex, **provenance(cfg, options.argv), "data": data_of(cfg, protocol)}
            write_json(out / "meta.json", meta)
            dist.barrier()  # the other processes follow once the run directory exists (_follow)
            return _execute(cfg, out, protocol, False, options)
        except BaseException:
            if not Checkpointer(out).exists():  # failed before its first checkpoint: nothing to resume, leave nothing
                _remove_new_run_dir(out, created)
            raise


def data_of(cfg: RunConfig, protocol: Protocol) -> dict[str, Any]:
    """What the run trains on, wherever it lies (:meth:`Protocol.data_identity`), recorded in ``meta.json``."""
    return protocol.data_identity(cfg.data.train_per_class)


def check_same_data(out: Path, cfg: RunConfig, protocol: Protocol) -> list[str]:
    """Refuse to continue a run on other data than it started on. ``data.root`` may change on resume (the data
    moved to another disk or machine), but on own data the folder is the dataset: another folder would continue
    the run on other images. Images that differ only in their pixels (changed in place, or decoded by another
    Pillow) are allowed: returns what of the data's record differs (``images``, ``mean``, ...), which the resume
    warns about and records (:func:`_record_resume`). Runs whose ``meta.json`` predates the record are not
    checked."""
    try:
        saved = json.loads((out / "meta.json").read_text()).get("data")
    except (OSError, ValueError, AttributeError):
        return []
    if not saved:
        return []
    now = data_of(cfg, protocol)
    differ = [key for key in now if now[key] != saved.get(key)]
    if any(key in IDENTITY_KEYS for key in differ):
        raise ConfigError(
            f"{out} was trained on other data than {protocol.dataset.source} holds (its {', '.join(differ)} "
            f"differ): resume it with --data.root pointing at the data it started on, or start a new run"
        )
    return differ


def _record_resume(out: Path, options: RunOptions, data_changed: Sequence[str] = ()) -> list[str]:
    """Add this continuation to ``meta.json``'s ``resumes`` (when, by which code, with which command), so that a run
    continued by other code or on changed images says so: the plugin files that changed since the run started
    (their new SHA-256 in the entry) and what of the data's record differs (``data_changed``, from
    :func:`check_same_data`). Returns the warnings to log, which :func:`_execute` writes to ``run.log`` too."""
    notes = []
    if data_changed:
        notes.append(
            f"{out}: the data's {', '.join(data_changed)} differ from what the run started on (the same classes and "
            f"image count: images changed in place, or decoded by another version of Pillow?); continuing, and "
            f"recorded in meta.json's resumes"
        )
    path = out / "meta.json"
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError):
        return notes  # a run without its record: nothing to add to
    if not isinstance(meta, dict):
        return notes
    entry: dict[str, Any] = {"at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "code": source_revision()}
    entry |= {"data_changed": list(data_changed)} if data_changed else {}
    changed = changed_plugins(meta.get("plugins"))
    if changed:
        notes.append(
            f"{out}: the plugin file{'s' * (len(changed) > 1)} {', '.join(changed)} changed since the run started "
            f"(another SHA-256 than meta.json records): the run continues with the edited code; the new hashes are "
            f"recorded in meta.json's resumes"
        )
        entry["plugins"] = [plugin_provenance(m.split(" (")[0]) for m in changed]
    earlier = meta.get("resumes") if isinstance(meta.get("resumes"), list) else []
    meta["resumes"] = [*earlier, entry | {"argv": list(options.argv or sys.argv)}]
    write_json(path, meta)
    return notes


def _make_run_dir(out: Path) -> bool:
    """Create the run directory ``out`` (and its parents); True if this process created it, False if it existed
    (an empty directory given as ``--out``, or one another process has just made)."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        try:
            out.mkdir()  # atomic: of two processes creating it at once, one gets True
        except FileExistsError:
            return False
    except OSError as err:
        raise ConfigError(f"cannot create run directory {out} ({err.strerror}); choose another --out") from None
    return True


def _remove_new_run_dir(out: Path, created: bool) -> None:
    """Remove what a new run wrote into ``out`` (and ``out`` itself if the run created it). Called only by the
    process that holds the directory's lock, so what it removes is its own."""
    if created:
        shutil.rmtree(out, ignore_errors=True)
        return
    for child in out.iterdir():  # an empty directory given as --out: empty it again, but for the lock it holds
        if child.name == ".lock":
            continue
        if child.is_dir():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)


def _follow(cfg: RunConfig, out: Path, dist: Dist, options: RunOptions) -> dict[str, Any]:
    """A process other than the first of a run over several: it validates as the first does, waits until the first
    has created or locked the run directory, then trains its share, reading checkpoints but writing nothing."""
    protocol = prepare(cfg, make_progress(False))
    dist.barrier()
    resuming = Checkpointer(out).exists()
    quiet = logging.Filter("dfcil.quiet")  # the first process logs for the run
    log.addFilter(quiet)
    try:
        return run(cfg, out, resuming, dataclasses.replace(options, progress=False), protocol)
    finally:
        log.removeFilter(quiet)


def run_id(out: Path) -> str:
    """The run's id, from ``meta.json`` (written when the run started); a run started by a dfcil before run ids gets
    one now, added to its ``meta.json``. ``model.pt`` and ``summary.json`` carry it, so that a ``model.pt`` copied from
    another run is told apart (:class:`dfcil.analysis.tools.FinishedRun`)."""
    path = out / "meta.json"
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError):
        meta = None
    if isinstance(meta, dict) and isinstance(meta.get("run_id"), str) and meta["run_id"]:
        return meta["run_id"]
    new = uuid.uuid4().hex
    if isinstance(meta, dict):
        write_json(path, {"run_id": new, **meta})
    return new


# A run of fewer training and inversion steps is over in seconds: no estimate at its start
ESTIMATE_MIN_STEPS = 100


def _estimate(cfg: RunConfig, protocol: Protocol) -> dict[str, float] | None:
    """A new run's expected time, logged before it starts (:func:`dfcil.training.engine.estimate`), and each kind's
    seconds per step, which the console's time left uses until the run has timed that kind. Several processes
    (torchrun) skip it: each would time its own copy at once; so does a run of under :data:`ESTIMATE_MIN_STEPS`."""
    if distributed.current().active:
        return None
    found = engine.estimate(cfg, protocol, ESTIMATE_MIN_STEPS)
    if found is None:
        return None
    for line in found.lines():
        log.info("%s", line.strip())
    return found.step_s


def _execute(
    cfg: RunConfig, out: Path, protocol: Protocol, resuming: bool, options: RunOptions, notes: Sequence[str] = ()
) -> dict[str, Any]:
    """Train with the run directory's logs, under its ``run.log``; ``summary.json`` last. ``notes``: warnings
    found before the run started (a resume's), logged first."""
    handler = logging.FileHandler(out / "run.log")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    log.addHandler(handler)
    try:
        split = protocol.split
        log.info("%s run directory %s", "resuming" if resuming else "new", out)
        for note in notes:
            log.warning("%s", note)
        log.info(
            "%s on %s: %d tasks of %s classes, class order %s",
            cfg.method.name,
            protocol.dataset.name,
            split.num_tasks,
            list(split.task_sizes),
            list(split.class_order),
        )
        step_s = _estimate(cfg, protocol) if options.estimate and not resuming else None
        logs = [ConsoleLogger(estimate=step_s), JsonlLogger(out / "metrics.jsonl")]
        callbacks = [*logs, SyntheticGrid(out, cfg.seed), InversionDiagnostics(cfg.seed), *options.callbacks]
        about_run = {"id": run_id(out), "dir": str(out.absolute()), "method": cfg.method.name, "dataset": cfg.data.name}
        callbacks.append(SaveModel(out / "model.pt", cfg.model.backbone, about_run))
        summary = run(cfg, out, resuming, dataclasses.replace(options, callbacks=callbacks), protocol)
        summary["run_id"] = about_run["id"]  # what model.pt carries too
        write_json(out / "summary.json", summary)  # last: a run directory with a summary is complete
        return summary
    except RunInterrupted:
        log.warning("interrupted: checkpoint written; continue with `dfcil resume %s`", out)
        raise
    except BaseException:
        # the traceback goes to run.log only: the console gets the command line's one-line error (a user's mistake)
        # or Python's own traceback (anything else), not both
        handler.handle(log.makeRecord(log.name, logging.ERROR, __file__, 0, "run failed", (), sys.exc_info()))
        raise
    finally:
        log.removeHandler(handler)
        handler.close()
