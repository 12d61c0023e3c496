"""Run directories: validate, create the directory, save the resolved config and provenance, train, summarise.

A run directory holds

* ``config.yaml``: the resolved config (``dfcil train --config DIR/config.yaml`` repeats the run);
* ``meta.json``: package, library and git versions, device, command line;
* ``run.log``: the log; ``metrics.jsonl``: one JSON record per epoch and per task;
* ``checkpoints/``: the newest and previous complete checkpoints (see :mod:`dfcil.checkpoint`);
* ``model.pt``: the final network; ``summary.json``: written last, atomically, only when every task finished
  (see :mod:`dfcil.metrics`).

Everything a report needs is in these files; reading them never imports the engine.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from filelock import FileLock, Timeout

from dfcil import distributed
from dfcil.callbacks import Callback, ConsoleLogger, JsonlLogger
from dfcil.checkpoint import FORMAT, Checkpointer, dumps, loads
from dfcil.config import (
    RUNTIME_KEYS,
    ConfigError,
    RunConfig,
    changed_keys,
    config_to_dict,
    dump_config,
    load_config,
    with_absolute_paths,
)
from dfcil.engine import Interrupt, Loop, RunInterrupted, run
from dfcil.grid import SyntheticGrid
from dfcil.io import check_creatable_dir, write_atomic, write_json
from dfcil.loggers import build_loggers
from dfcil.methods import METHODS
from dfcil.models.network import IncrementalNet, backbone_for, build_network
from dfcil.progress import make_progress
from dfcil.protocol import Protocol, prepare
from dfcil.runtime import resolve_device

log = logging.getLogger("dfcil")


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", *args], cwd=Path(__file__).parent, capture_output=True, text=True, timeout=10, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def provenance(cfg: RunConfig, argv: Sequence[str] | None = None) -> dict[str, Any]:
    import numpy

    from dfcil import __version__

    device = resolve_device(cfg.device)
    return {
        "dfcil": __version__,
        "git_sha": _git("rev-parse", "HEAD"),
        "git_diff_stat": _git("diff", "--stat", "HEAD"),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "platform": platform.platform(),
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor(),
        "torch_threads": torch.get_num_threads(),
        "processes": distributed.current().world,  # torchrun: the run's processes (docs/distributed.md)
        "argv": list(argv) if argv is not None else sys.argv,
    }


def check_new_run_dir(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(
            f"{out} exists and is not a dfcil run directory (no config.yaml); choose another --out"
            if not (out / "config.yaml").exists()
            else f"run directory {out} already exists"
        )
    try:
        check_creatable_dir(out, "run directory", "choose another --out")
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
        ) from None
    try:
        yield
    finally:
        lock.release()


def train(
    cfg: RunConfig,
    out: str | os.PathLike,
    progress: bool | None = None,
    argv: Sequence[str] | None = None,
    callbacks: Sequence[Callback] = (),
    protocol: Protocol | None = None,
    interrupt: Interrupt | None = None,
) -> dict[str, Any]:
    """Train ``cfg`` into the run directory ``out`` and return the summary.

    A new directory is created only after all validation (config, data, protocol) passed, so bad input leaves
    nothing behind. If ``out`` is an unfinished run with the same config (runtime keys such as ``device`` may
    differ), it is resumed.
    """
    out = Path(out)
    cfg = with_absolute_paths(cfg)
    dist = distributed.start(resolve_device(cfg.device).type)  # torchrun: join the other processes
    if not dist.main:
        return _follow(cfg, out, dist, progress, callbacks, interrupt)
    if (out / "config.yaml").exists():
        saved = load_config([out / "config.yaml"])[0]
        changed = changed_keys(config_to_dict(saved), config_to_dict(cfg))
        if changed:
            finished = (out / "summary.json").exists()
            fix = "choose another --out" if finished else f"resume it with `dfcil resume {out}` or choose another --out"
            what = "a finished run" if finished else "a run"
            raise ConfigError(f"{out} holds {what} with a different config ({', '.join(changed)}); {fix}")
        runtime = {key: functools.reduce(getattr, key.split("."), cfg) for key in RUNTIME_KEYS}
        return resume(out, runtime, progress, argv, callbacks, interrupt)
    check_new_run_dir(out)
    protocol = protocol or prepare(cfg, make_progress(progress))
    callbacks = [*build_loggers(cfg.log, out), *callbacks]  # unknown names, missing extras: refused here
    created = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigError(f"cannot create run directory {out} ({err.strerror}); choose another --out") from None
    try:
        with locked(out):
            write_atomic(out / "config.yaml", dump_config(cfg))
            write_json(out / "meta.json", provenance(cfg, argv))
            dist.barrier()  # the other processes follow once the run directory exists (_follow)
            return _execute(cfg, out, protocol, False, progress, callbacks, interrupt)
    except BaseException:
        if not Checkpointer(out).exists():  # failed before its first checkpoint: nothing to resume, leave nothing
            _remove_new_run_dir(out, created)
        raise


def _remove_new_run_dir(out: Path, created: bool) -> None:
    """Remove what a new run wrote into ``out`` (and ``out`` itself if the run created it)."""
    if created:
        shutil.rmtree(out, ignore_errors=True)
        return
    for child in out.iterdir():  # an empty directory given as --out: empty it again
        if child.is_dir():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)


def resume(
    run_dir: str | os.PathLike,
    overrides: dict[str, Any] | None = None,
    progress: bool | None = None,
    argv: Sequence[str] | None = None,
    callbacks: Sequence[Callback] = (),
    interrupt: Interrupt | None = None,
) -> dict[str, Any]:
    """Continue the unfinished run in ``run_dir`` from its newest usable checkpoint.

    Only runtime keys (``device``, ``engine.cuda_graphs``, ...: ``config.RUNTIME_KEYS``) may be overridden; a
    change to anything that shapes the protocol or the model is refused.
    """
    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").exists():
        raise ConfigError(f"{run_dir} is not a dfcil run directory (no config.yaml)")
    if (run_dir / "summary.json").exists():
        raise ConfigError(f"the run in {run_dir} is complete (summary.json exists); nothing to resume")
    saved = load_config([run_dir / "config.yaml"])[0]
    cfg = load_config([run_dir / "config.yaml"], [(k, json.dumps(v)) for k, v in (overrides or {}).items()])[0]
    cfg = with_absolute_paths(cfg)
    changed = changed_keys(config_to_dict(saved), config_to_dict(cfg))
    if changed:
        raise ConfigError(
            f"cannot change {', '.join(changed)} when resuming {run_dir}: these keys shape the protocol or the "
            f"model. Only {', '.join(sorted(RUNTIME_KEYS))} may change; start a new run for the rest"
        )
    dist = distributed.start(resolve_device(cfg.device).type)  # torchrun: join the other processes
    if not dist.main:
        return _follow(cfg, run_dir, dist, progress, callbacks, interrupt)
    protocol = prepare(cfg, make_progress(progress))
    callbacks = [*build_loggers(cfg.log, run_dir), *callbacks]
    with locked(run_dir):
        has_checkpoint = Checkpointer(run_dir).exists()
        dist.barrier()  # the other processes follow from the same checkpoint (_follow)
        if not has_checkpoint:  # stopped before its first checkpoint: start over in place
            metrics = run_dir / "metrics.jsonl"
            if metrics.exists() and metrics.stat().st_size:
                log.warning("%s has no checkpoint (deleted?): the run starts over from its first task", run_dir)
            metrics.unlink(missing_ok=True)
        return _execute(cfg, run_dir, protocol, has_checkpoint, progress, callbacks, interrupt)


def _follow(
    cfg: RunConfig,
    out: Path,
    dist: distributed.Dist,
    progress: bool | None,
    callbacks: Sequence[Callback],
    interrupt: Interrupt | None,
) -> dict[str, Any]:
    """A process other than the first of a run over several: it validates as the first does, waits until the first
    has created or locked the run directory, then trains its share, reading checkpoints but writing nothing."""
    protocol = prepare(cfg, make_progress(False))
    dist.barrier()
    resuming = Checkpointer(out).exists()
    quiet = logging.Filter("dfcil.quiet")  # the first process logs for the run
    log.addFilter(quiet)
    try:
        return run(cfg, callbacks, out, resuming, protocol=protocol, progress=False, interrupt=interrupt)
    finally:
        log.removeFilter(quiet)


def _execute(
    cfg: RunConfig,
    out: Path,
    protocol: Protocol,
    resuming: bool,
    progress: bool | None,
    callbacks: Sequence[Callback],
    interrupt: Interrupt | None,
) -> dict[str, Any]:
    handler = logging.FileHandler(out / "run.log")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    log.addHandler(handler)
    try:
        split = protocol.split
        log.info("%s run directory %s", "resuming" if resuming else "new", out)
        log.info(
            "%s on %s: %d tasks of %s classes, class order %s",
            cfg.method.name,
            protocol.dataset.name,
            split.num_tasks,
            list(split.task_sizes),
            list(split.class_order),
        )
        loggers = [ConsoleLogger(), JsonlLogger(out / "metrics.jsonl"), SyntheticGrid(out), *callbacks]
        loggers.append(SaveModel(out / "model.pt", cfg))
        summary = run(cfg, loggers, out, resuming, protocol=protocol, progress=progress, interrupt=interrupt)
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


class SaveModel(Callback):
    """Writes the final network to ``path`` when the run ends (:func:`save_model`)."""

    def __init__(self, path: Path, cfg: RunConfig) -> None:
        self.path, self.cfg = path, cfg

    def on_run_start(self, loop: Loop) -> None:
        self.loop = loop

    def on_run_end(self, summary: dict[str, Any]) -> None:
        dataset, split = self.loop.protocol.dataset, self.loop.protocol.split
        backbone = backbone_for(self.cfg.model.backbone, dataset.image_size)
        about = {
            "inputs": {"image_size": dataset.image_size, "mean": list(dataset.mean), "std": list(dataset.std)},
            "class_order": list(split.class_order), "task_sizes": list(split.task_sizes),
            "class_names": [dataset.classes[c] for c in split.class_order] if dataset.classes else [],
        }  # fmt: skip
        save_model(self.path, self.loop.net, self.cfg, backbone, about)


def save_model(
    path: Path, net: IncrementalNet, cfg: RunConfig, backbone: str, about: dict[str, Any] | None = None
) -> None:
    """The final network: weights, head block sizes and the backbone name, in the safe checkpoint format; ``about``:
    what its inputs and outputs mean (``inputs``: image size, normalisation; ``class_order``: the raw class of each
    output; ``task_sizes``; ``class_names`` by output, where the dataset names its classes)."""
    payload = {
        "format": FORMAT, "net": net.state_dict(), "head_sizes": net.head.sizes,
        "head": METHODS.get(cfg.method.name).head, "backbone": backbone,
    }  # fmt: skip
    write_atomic(path, dumps(payload | (about or {})))


def load_model(path: str | os.PathLike) -> IncrementalNet:
    """Rebuild the network saved by :func:`save_model` (weights-only load; refuses anything else)."""
    return network_from(loads(Path(path).read_bytes(), str(path)))


def network_from(payload: dict[str, Any]) -> IncrementalNet:
    """The network of a :func:`save_model` payload, in eval mode."""
    net = build_network(payload["backbone"], payload["head"])
    for n in payload["head_sizes"]:
        net.expand(n)
    net.load_state_dict(payload["net"])
    return net.eval()
