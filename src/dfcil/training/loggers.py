"""Metric logs beside ``metrics.jsonl``, chosen by name (``dfcil train --log csv,tensorboard``, config key ``log``).

``metrics.jsonl`` stays the source of truth; these are views of the same records for other tools:

* ``csv``: ``metrics.csv`` (a row per epoch: lr, each loss term, speed; epochs counted from 0 within each phase,
  as in ``metrics.jsonl`` and the log) and ``tasks.csv`` (a row per task: A_t, old and new accuracy, the
  accuracy on each task so far, timings);
* ``tensorboard``: ``tensorboard/`` event files with the loss terms, lr, accuracies and the synthetic grids;
* ``wandb``: the same records in a Weights & Biases run (config section ``wandb``; ``WANDB_MODE=offline`` keeps
  it in ``wandb/`` for a later ``wandb sync``).

Each survives a resume without repeating what was logged after the checkpoint the run continues from: the CSV
files are rewritten from ``metrics.jsonl`` (which the checkpointing callback cuts back to the checkpoint),
TensorBoard purges the steps after the checkpoint (``SummaryWriter(purge_step=...)``), and wandb, which cannot take
a step back, continues the same wandb run and sends only the steps it has not sent (a resume recomputes the
others exactly).

A logger is a registered :class:`~dfcil.training.loop.Callback` class built from the run directory and the values
the runner resolved from the run's config (:class:`LoggerSettings`): ``LOGGERS.get(name)(run_dir, settings)``.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import sys
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dfcil.config import WandbConfig
from dfcil.extras import require
from dfcil.io import write_atomic, write_json
from dfcil.registry import Registry
from dfcil.training.grid import synthetic_images_path
from dfcil.training.loop import Callback, Loop
from dfcil.training.protocol import tasks_of
from dfcil.training.state import Position


@dataclasses.dataclass(frozen=True)
class LoggerSettings:
    """What a logger may take from the run's config, resolved by the runner."""

    config: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # the whole config, plain (wandb records it)
    wandb: WandbConfig = WandbConfig()  # where --log wandb logs


# A logger: built from the run directory and its settings; building it writes nothing (a bad name or a missing
# extra is refused before the run directory exists)
LOGGERS: Registry[Callable[[Path, LoggerSettings], Callback]] = Registry("logger", group="dfcil.training.loggers")


def build_loggers(names: Sequence[str], run_dir: Path, settings: LoggerSettings | None = None) -> list[Callback]:
    """The loggers named in ``names`` (each once, in order) for the run directory ``run_dir``."""
    settings = settings or LoggerSettings()
    return [LOGGERS.get(name)(Path(run_dir), settings) for name in dict.fromkeys(names)]


# ------------------------------------------------------------------------------------------------------- CSV


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The records of a JSON-lines file; none if it does not exist."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def loss_terms(records: Sequence[dict[str, Any]]) -> list[str]:
    """The loss terms of epoch records, in the order they first appear."""
    return list(dict.fromkeys(name for r in records for name in r["loss"]))


def epoch_columns(terms: Sequence[str]) -> list[str]:
    return ["task", "phase", "epoch", "epochs", "lr", "loss", *(f"loss_{t}" for t in terms), "time_s", "images_per_s"]


def epoch_row(record: dict[str, Any]) -> dict[str, Any]:
    """An epoch record of ``metrics.jsonl`` as a ``metrics.csv`` row; ``loss`` is the sum of the terms."""
    return {
        **{k: record[k] for k in ("task", "phase", "epoch", "epochs", "lr")}, "loss": sum(record["loss"].values()),
        **{f"loss_{k}": v for k, v in record["loss"].items()}, "time_s": record["time_s"],
        "images_per_s": record["images_per_s"],
    }  # fmt: skip


def task_columns(num_tasks: int) -> list[str]:
    accuracies = [f"acc_task{j}" for j in range(num_tasks)]
    return ["task", "n_seen", "acc", "acc_task_avg", "new_acc", "old_acc", *accuracies, "setup_s", "eval_s"]


def task_row(record: dict[str, Any]) -> dict[str, Any]:
    """A task record of ``metrics.jsonl`` as a ``tasks.csv`` row: ``acc_task<j>`` is the accuracy on task j's
    classes after this task; an empty cell is a value that does not exist (old accuracy after the first task)."""
    timing = record.get("timing") or {}
    return {
        **{k: record[k] for k in ("task", "n_seen", "acc", "acc_task_avg", "new_acc", "old_acc")},
        **{f"acc_task{j}": a for j, a in enumerate(record["acc_row"])},
        "setup_s": timing.get("setup_s"), "eval_s": timing.get("eval_s"),
    }  # fmt: skip


def csv_cell(value: Any) -> Any:
    """A float as its shortest form at 10 significant digits (an lr of 0.1 * 0.1 is ``0.01``, not
    ``0.010000000000000002``); any other value as it is."""
    return f"{value:.10g}" if isinstance(value, float) else value


def csv_text(columns: Sequence[str], rows: Sequence[dict[str, Any]], header: bool = True) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, columns, lineterminator="\n")
    if header:
        writer.writeheader()
    writer.writerows({k: csv_cell(v) for k, v in row.items()} for row in rows)
    return buf.getvalue()


@LOGGERS.register("csv")
class CsvLogger(Callback):
    """``metrics.csv`` and ``tasks.csv``: a mirror of ``metrics.jsonl``, which :class:`JsonlLogger` writes before
    this logger runs. Each process rewrites both files from ``metrics.jsonl`` at its first record (after a resume
    cut it back to the checkpoint, so no row is repeated) and appends afterwards; an epoch with a loss term not
    seen before (a new column) rewrites ``metrics.csv`` the same way."""

    def __init__(self, run_dir: Path, settings: LoggerSettings | None = None) -> None:
        self.jsonl = run_dir / "metrics.jsonl"
        self.epochs_csv, self.tasks_csv = run_dir / "metrics.csv", run_dir / "tasks.csv"
        self.terms: list[str] | None = None  # metrics.csv's loss columns; None: not mirrored yet by this process

    def on_run_start(self, loop: Loop) -> None:
        self.num_tasks, self.terms = loop.protocol.split.num_tasks, None

    def _mirror(self, latest: dict[str, Any] | None) -> None:
        records = read_jsonl(self.jsonl)
        if latest is not None and (not records or records[-1] != json.loads(json.dumps(latest))):
            records.append(latest)  # no metrics.jsonl beside it (a run without JsonlLogger)
        epochs = [r for r in records if r["type"] == "epoch"]
        self.terms = loss_terms(epochs)
        write_atomic(self.epochs_csv, csv_text(epoch_columns(self.terms), [epoch_row(r) for r in epochs]))
        tasks = [task_row(r) for r in records if r["type"] == "task"]
        write_atomic(self.tasks_csv, csv_text(task_columns(self.num_tasks), tasks))

    @staticmethod
    def _append(path: Path, columns: list[str], row: dict[str, Any]) -> None:
        with open(path, "a", newline="") as f:
            f.write(csv_text(columns, [row], header=False))

    def on_epoch_end(self, record: dict[str, Any]) -> None:
        if self.terms is None or not set(record["loss"]) <= set(self.terms):
            self._mirror({"type": "epoch", **record})
        else:
            self._append(self.epochs_csv, epoch_columns(self.terms), epoch_row(record))

    def on_task_end(self, record: dict[str, Any]) -> None:
        if self.terms is None:
            self._mirror({"type": "task", **record})
        else:
            self._append(self.tasks_csv, task_columns(self.num_tasks), task_row(record))

    def on_run_end(self, summary: dict[str, Any]) -> None:
        if self.terms is None:  # a process that logged nothing (resumed after the last task)
            self._mirror(None)


# ------------------------------------------------------------------------------------------------ TensorBoard


@dataclasses.dataclass(frozen=True)
class StepAxis:
    """TensorBoard's global step over a run. Each task takes a slot for its setup (the synthetic grid), one per
    epoch of each phase and one for its evaluation, so that the position of any checkpoint is a step:
    everything logged from that step on was logged after the checkpoint, and a resumed process purges it."""

    epochs: tuple[tuple[int, ...], ...]  # epochs of each phase of each task

    @classmethod
    def of(cls, loop: Loop) -> StepAxis:
        return cls(tuple(tuple(p.epochs for p in loop.method.phases(task)) for task in tasks_of(loop.protocol.split)))

    def setup(self, task: int) -> int:
        return sum(sum(e) + 2 for e in self.epochs[:task])

    def epoch(self, task: int, phase: int, epoch: int) -> int:
        return self.setup(task) + 1 + sum(self.epochs[task][:phase]) + epoch

    def evaluation(self, task: int) -> int:
        return self.setup(task) + 1 + sum(self.epochs[task])

    def resume(self, position: Position) -> int:
        """The first step not logged before a checkpoint at ``position``."""
        if position.stage == "train":
            return self.epoch(position.task, position.phase, position.epoch)
        return self.setup(position.task)


@LOGGERS.register("tensorboard")
class TensorBoardLogger(Callback):
    """``tensorboard/``: per epoch each loss term, their sum, the lr and images/s; per task A_t (sample-weighted
    and task-averaged), new and old accuracy and the accuracy on each task so far; the synthetic grid of each
    inversion. The x axis is :class:`StepAxis`: epochs over the run, plus a setup and an evaluation slot per task."""

    def __init__(self, run_dir: Path, settings: LoggerSettings | None = None) -> None:
        tensorboard = require("torch.utils.tensorboard", "tensorboard", "--log tensorboard", "tensorboard")
        self.summary_writer = tensorboard.SummaryWriter
        self.run_dir, self.dir = Path(run_dir), Path(run_dir) / "tensorboard"

    def on_run_start(self, loop: Loop) -> None:
        self.loop, self.steps = loop, StepAxis.of(loop)
        self.writer = self.summary_writer(str(self.dir), purge_step=self.steps.resume(loop.state.position))

    def on_setup_end(self) -> None:
        task = self.loop.state.position.task
        grid = synthetic_grid(self.run_dir, task)  # the grid the run directory holds, if any
        if grid is not None:
            self.writer.add_image(f"synthetic/task{task}", grid, self.steps.setup(task), dataformats="HWC")
            self.writer.flush()

    def on_epoch_end(self, record: dict[str, Any]) -> None:
        step = self.steps.epoch(record["task"], self.loop.state.position.phase, record["epoch"])
        for name, value in epoch_values(record).items():
            self.writer.add_scalar(name, value, step)
        self.writer.flush()  # what a checkpoint follows is on disk: a resume never re-logs it

    def on_task_end(self, record: dict[str, Any]) -> None:
        step = self.steps.evaluation(record["task"])
        for name, value in task_values(record).items():
            self.writer.add_scalar(name, value, step)
        self.writer.flush()

    def on_interrupt(self) -> None:
        self.writer.flush()

    def on_run_end(self, summary: dict[str, Any]) -> None:
        self.writer.close()


# ------------------------------------------------------------------------------------------ Weights & Biases


def synthetic_grid(run_dir: Path, task: int) -> np.ndarray | None:
    """The synthetic grid the run directory holds for ``task`` (dfcil.training.grid) as an RGB array, or None."""
    path = synthetic_images_path(run_dir, task)
    if not path.exists():
        return None
    from PIL import Image

    with Image.open(path) as image:
        return np.asarray(image.convert("RGB"))


def epoch_values(record: dict[str, Any]) -> dict[str, float]:
    """An epoch record as the scalars TensorBoard and wandb show: each loss term, their sum, lr and speed."""
    values = {f"loss/{name}": value for name, value in record["loss"].items()}
    values |= {"loss/total": sum(record["loss"].values()), "lr": record["lr"]}
    return values | {"speed/images_per_s": record["images_per_s"]}


def task_values(record: dict[str, Any]) -> dict[str, float]:
    """A task record as the accuracies TensorBoard and wandb show (no old accuracy after the first task)."""
    values = {"A_t": record["acc"], "A_t_task_avg": record["acc_task_avg"], "new": record["new_acc"]}
    values |= {"old": record["old_acc"]} if record["old_acc"] is not None else {}
    return {f"accuracy/{k}": v for k, v in values.items()} | {
        f"accuracy/task{j}": a for j, a in enumerate(record["acc_row"])
    }


WANDB_STATE = "wandb.json"  # in the run directory: the wandb run's id and the last step sent to it


@LOGGERS.register("wandb")
class WandbLogger(Callback):
    """A Weights & Biases run with TensorBoard's records on the same step axis (:class:`StepAxis`): per epoch each
    loss term, their sum, lr and images/s; per task the accuracies; the synthetic grid of each inversion; the run's
    config as the wandb run's config. The wandb run's id is kept in ``wandb.json`` in the run directory, so a resumed
    run continues the same wandb run; wandb cannot take a step back, so the steps it was sent before (which a
    resume recomputes exactly) are not sent again. Project, entity, name and group: the config's ``wandb`` section,
    else wandb's environment variables; the name defaults to the run directory's."""

    def __init__(self, run_dir: Path, settings: LoggerSettings | None = None) -> None:
        self.wandb = require("wandb", "wandb", "--log wandb", "wandb")
        self.run_dir = Path(run_dir)
        settings = settings or LoggerSettings()
        self.settings, self.config = settings.wandb, dict(settings.config)
        self.run: Any = None

    def _state(self) -> dict[str, Any]:
        try:
            state = json.loads((self.run_dir / WANDB_STATE).read_text())
        except (OSError, ValueError):
            return {}
        return state if isinstance(state, dict) else {}

    def on_run_start(self, loop: Loop) -> None:
        import os

        self.loop, self.steps = loop, StepAxis.of(loop)
        state = self._state()
        self.run_id = str(state.get("id") or uuid.uuid4().hex[:16])
        self.sent = int(state.get("last_step", -1))  # the last step the wandb run holds
        s = self.settings
        # wandb.init replaces sys.exit and sys.excepthook with its own hooks for as long as the process lives; the
        # process's own are put back when the wandb run ends (_finish), so nothing else in it sees wandb's frames
        self.process_hooks = (sys.exit, sys.excepthook)
        self.run = self.wandb.init(
            id=self.run_id, resume="allow", dir=str(self.run_dir), project=s.project, entity=s.entity,
            name=s.name or os.environ.get("WANDB_NAME") or self.run_dir.name, group=s.group, config=self.config,
        )  # fmt: skip
        write_json(self.run_dir / WANDB_STATE, {"id": self.run_id, "last_step": self.sent})

    def _log(self, values: dict[str, Any], step: int) -> None:
        if step <= self.sent:  # sent by the process before this resume, with the same values
            return
        self.run.log(values, step=step)
        self.sent = step
        write_json(self.run_dir / WANDB_STATE, {"id": self.run_id, "last_step": step})

    def on_setup_end(self) -> None:
        task = self.loop.state.position.task
        grid = synthetic_grid(self.run_dir, task)
        if grid is not None:
            self._log({f"synthetic/task{task}": self.wandb.Image(grid)}, self.steps.setup(task))

    def on_epoch_end(self, record: dict[str, Any]) -> None:
        self._log(
            epoch_values(record), self.steps.epoch(record["task"], self.loop.state.position.phase, record["epoch"])
        )

    def on_task_end(self, record: dict[str, Any]) -> None:
        self._log(task_values(record), self.steps.evaluation(record["task"]))

    def on_interrupt(self) -> None:
        self._finish()

    def on_run_end(self, summary: dict[str, Any]) -> None:
        if self.run is not None:
            self.run.summary.update({k: summary[k] for k in ("last_acc", "avg_inc_acc", "forgetting") if k in summary})
        self._finish()

    def _finish(self) -> None:
        if self.run is not None:
            self.run.finish()
            self.run = None
            sys.exit, sys.excepthook = self.process_hooks
