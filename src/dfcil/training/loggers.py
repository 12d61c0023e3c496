"""Metric logs beside ``metrics.jsonl``, chosen by name (``dfcil train --log csv,tensorboard``, config key ``log``).

``metrics.jsonl`` stays the source of truth; these are views of the same records for other tools:

* ``csv``: ``metrics.csv`` (a row per epoch: lr, each loss term, speed; epochs counted from 0 within each phase,
  as in ``metrics.jsonl`` and the log) and ``tasks.csv`` (a row per task: A_t, old and new accuracy, the
  accuracy on each task so far, timings);
* ``tensorboard``: ``tensorboard/`` event files with the loss terms, lr, accuracies and the synthetic grids.

Both survive a resume without repeating what was logged after the checkpoint the run continues from: the CSV
files are rewritten from ``metrics.jsonl`` (which the checkpointing callback cuts back to the checkpoint) and
TensorBoard purges the steps after the checkpoint (``SummaryWriter(purge_step=...)``).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dfcil.extras import require
from dfcil.io import write_atomic
from dfcil.registry import Registry
from dfcil.training.grid import synthetic_images_path
from dfcil.training.loop import Callback, Loop
from dfcil.training.protocol import tasks_of
from dfcil.training.state import Position

# A logger: built from the run directory; building it writes nothing (a bad name or a missing extra is refused
# before the run directory exists)
LOGGERS: Registry[Callable[[Path], Callback]] = Registry("logger", group="dfcil.training.loggers")


def build_loggers(names: Sequence[str], run_dir: Path) -> list[Callback]:
    """The loggers named in ``names`` (each once, in order) for the run directory ``run_dir``."""
    return [LOGGERS.get(name)(Path(run_dir)) for name in dict.fromkeys(names)]


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

    def __init__(self, run_dir: Path) -> None:
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

    def __init__(self, run_dir: Path) -> None:
        tensorboard = require("torch.utils.tensorboard", "tensorboard", "--log tensorboard", "tensorboard")
        self.summary_writer = tensorboard.SummaryWriter
        self.run_dir, self.dir = Path(run_dir), Path(run_dir) / "tensorboard"

    def on_run_start(self, loop: Loop) -> None:
        self.loop, self.steps = loop, StepAxis.of(loop)
        self.writer = self.summary_writer(str(self.dir), purge_step=self.steps.resume(loop.state.position))

    def on_setup_end(self) -> None:
        task = self.loop.state.position.task
        path = synthetic_images_path(
            self.run_dir, task
        )  # the grid the run directory holds (dfcil.training.grid), if any
        if path.exists():
            from PIL import Image

            with Image.open(path) as image:
                grid = np.asarray(image.convert("RGB"))
            self.writer.add_image(f"synthetic/task{task}", grid, self.steps.setup(task), dataformats="HWC")
            self.writer.flush()

    def on_epoch_end(self, record: dict[str, Any]) -> None:
        step = self.steps.epoch(record["task"], self.loop.state.position.phase, record["epoch"])
        for name, value in record["loss"].items():
            self.writer.add_scalar(f"loss/{name}", value, step)
        self.writer.add_scalar("loss/total", sum(record["loss"].values()), step)
        self.writer.add_scalar("lr", record["lr"], step)
        self.writer.add_scalar("speed/images_per_s", record["images_per_s"], step)
        self.writer.flush()  # what a checkpoint follows is on disk: a resume never re-logs it

    def on_task_end(self, record: dict[str, Any]) -> None:
        step = self.steps.evaluation(record["task"])
        values = {"A_t": record["acc"], "A_t_task_avg": record["acc_task_avg"], "new": record["new_acc"]}
        values |= {"old": record["old_acc"]} if record["old_acc"] is not None else {}
        values |= {f"task{j}": a for j, a in enumerate(record["acc_row"])}
        for name, value in values.items():
            self.writer.add_scalar(f"accuracy/{name}", value, step)
        self.writer.flush()

    def on_interrupt(self) -> None:
        self.writer.flush()

    def on_run_end(self, summary: dict[str, Any]) -> None:
        self.writer.close()
