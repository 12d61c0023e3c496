"""Run directories: validate, create the directory, save the resolved config and provenance, train, summarise.

A run directory holds

* ``config.yaml``: the resolved config (``dfcil train --config DIR/config.yaml`` repeats the run);
* ``meta.json``: package, library and git versions, device, command line;
* ``run.log``: the log; ``metrics.jsonl``: one JSON record per epoch and per task;
* ``summary.json``: written last, atomically, only when every task finished (see :mod:`dfcil.metrics`).

Everything a report needs is in these files; reading them never imports the engine.
"""

from __future__ import annotations

import logging
import os
import platform
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from dfcil.callbacks import Callback, ConsoleLogger, JsonlLogger
from dfcil.config import ConfigError, RunConfig, dump_config
from dfcil.engine import Protocol, prepare, resolve_device, run
from dfcil.io import write_atomic, write_json

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
        "argv": list(argv) if argv is not None else sys.argv,
    }


def check_new_run_dir(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"run directory {out} already exists and is not empty; choose another --out")


def train(
    cfg: RunConfig,
    out: str | os.PathLike,
    progress: bool | None = None,
    argv: Sequence[str] | None = None,
    callbacks: Sequence[Callback] = (),
    protocol: Protocol | None = None,
) -> dict[str, Any]:
    """Train ``cfg`` into the new run directory ``out`` and return the summary.

    All validation (config, data, protocol, directory) happens before anything is written, so bad input
    leaves no directory behind.
    """
    out = Path(out)
    check_new_run_dir(out)
    protocol = protocol or prepare(cfg)
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "config.yaml", dump_config(cfg))
    write_json(out / "meta.json", provenance(cfg, argv))
    handler = logging.FileHandler(out / "run.log")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    log.addHandler(handler)
    try:
        split = protocol.split
        log.info("run directory %s", out)
        log.info(
            "%s on %s: %d tasks of %s classes, class order %s",
            cfg.method.name,
            protocol.dataset.name,
            split.num_tasks,
            list(split.task_sizes),
            list(split.class_order),
        )
        summary = run(
            cfg,
            callbacks=[ConsoleLogger(), JsonlLogger(out / "metrics.jsonl"), *callbacks],
            progress=progress,
            protocol=protocol,
        )
        write_json(out / "summary.json", summary)
        return summary
    except BaseException:
        log.exception("run failed")
        raise
    finally:
        log.removeHandler(handler)
        handler.close()
