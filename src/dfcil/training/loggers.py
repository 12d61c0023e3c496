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
a step back, continues the same wandb run and sends only the steps that wandb does not hold already (see
:class:`WandbLogger`: a killed process's last steps are sent again).

A logger is a registered :class:`~dfcil.training.loop.Callback` class built from the run directory and the values
the runner resolved from the run's config (:class:`LoggerSettings`): ``LOGGERS.get(name)(run_dir, settings)``.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import logging
import struct
import sys
import uuid
import zlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dfcil.config import WandbConfig
from dfcil.errors import ConfigError
from dfcil.extras import require
from dfcil.io import write_atomic, write_json
from dfcil.registry import Registry
from dfcil.training.budget import end_work, task_seconds
from dfcil.training.grid import synthetic_images_path
from dfcil.training.loop import Callback, Loop
from dfcil.training.protocol import tasks_of
from dfcil.training.state import Position

log = logging.getLogger("dfcil")


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
    seconds = ["setup_s", "train_s", "end_s", "eval_s", "task_s"]
    return ["task", "n_seen", "acc", "acc_task_avg", "new_acc", "old_acc", *accuracies, *seconds]


def task_row(record: dict[str, Any]) -> dict[str, Any]:
    """A task record of ``metrics.jsonl`` as a ``tasks.csv`` row: ``acc_task<j>`` is the accuracy on task j's
    classes after this task; an empty cell is a value that does not exist (old accuracy after the first task).
    Seconds: the setup (R-DFCIL's inversion), the training phases, the method's own work at the task's end (drift
    compensation, ADC; :func:`~dfcil.training.budget.end_work`), the evaluation, and the task's whole."""
    timing = record.get("timing") or {}
    train = sum(float(p.get("time_s", 0.0)) for p in timing.get("phases", {}).values()) if timing else None
    return {
        **{k: record[k] for k in ("task", "n_seen", "acc", "acc_task_avg", "new_acc", "old_acc")},
        **{f"acc_task{j}": a for j, a in enumerate(record["acc_row"])},
        "setup_s": timing.get("setup_s"), "train_s": train,
        "end_s": sum(end_work(timing).values()) if timing else None,
        "eval_s": timing.get("eval_s"), "task_s": task_seconds(timing) if timing else None,
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
    names: tuple[tuple[str, ...], ...] = ()  # the name of each phase of each task (an epoch record names its phase)

    @classmethod
    def of(cls, loop: Loop) -> StepAxis:
        phases = [loop.method.phases(task) for task in tasks_of(loop.protocol.split)]
        epochs, names = (tuple(tuple(getattr(p, key) for p in ps) for ps in phases) for key in ("epochs", "name"))
        return cls(epochs, names)

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

    def record(self, record: dict[str, Any]) -> int:
        """The step of a ``metrics.jsonl`` record: an epoch's (its phase found by name, as the task timings key
        phases) or a task's (its evaluation)."""
        task = record["task"]
        if record["type"] == "task":
            return self.evaluation(task)
        return self.epoch(task, self.names[task].index(record["phase"]), record["epoch"])


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


WANDB_STATE = "wandb.json"  # in the run directory: the wandb run's id and the last step wandb is known to hold

# wandb's transaction log (a run's ``.wandb`` file, what ``wandb sync`` uploads): after this header (its name, the
# magic number 0xBEE1, format version 0), LevelDB's log format: 32 KiB blocks of chunks, each a CRC-32 of its kind
# and data, the data's length, its kind (a whole record, or a record's first, middle or last part) and the data; a
# block's tail too short for a chunk header is zeros. A record is a protobuf ``Record`` (wandb.proto).
WANDB_LOG_HEADER, WANDB_LOG_BLOCK, WANDB_CHUNK_HEADER = b":W&B\xe1\xbe\x00", 32768, 7


def wandb_history_steps(path: Path) -> list[int] | None:
    """The steps of the history rows in the wandb transaction log ``path``, up to its first chunk that is not whole
    (where a killed process's last write ended); None: a file of a format this does not read."""
    try:
        from wandb.proto import wandb_internal_pb2
    except ImportError:  # a wandb that keeps its records elsewhere: read as a format this does not know
        return None
    data = path.read_bytes()
    if not data.startswith(WANDB_LOG_HEADER):
        return None
    steps, pos, parts = [], len(WANDB_LOG_HEADER), b""
    while True:
        left = WANDB_LOG_BLOCK - pos % WANDB_LOG_BLOCK
        if left < WANDB_CHUNK_HEADER:
            pos += left
        if pos + WANDB_CHUNK_HEADER > len(data):
            return steps
        crc, length, kind = struct.unpack_from("<IHB", data, pos)
        end = pos + WANDB_CHUNK_HEADER + length
        if end > len(data) or zlib.crc32(data[pos + WANDB_CHUNK_HEADER - 1 : end]) != crc:
            return steps  # cut short by a kill: what follows is not on disk either
        chunk, pos = data[end - length : end], end
        parts = chunk if kind in (1, 2) else parts + chunk  # 1: whole, 2: first part; 3: middle, 4: last
        if kind in (1, 4):
            record = wandb_internal_pb2.Record.FromString(parts)
            if record.WhichOneof("record_type") == "history":
                steps.append(record.history.step.num)


@LOGGERS.register("wandb")
class WandbLogger(Callback):
    """A Weights & Biases run with TensorBoard's records on the same step axis (:class:`StepAxis`): per epoch each
    loss term, their sum, lr and images/s; per task the accuracies; the synthetic grid of each inversion; the run's
    config as the wandb run's config. Project, entity, name and group: the config's ``wandb`` section, else wandb's
    environment variables; the name defaults to the run directory's.

    The wandb run's id is kept in ``wandb.json`` in the run directory, so that a resumed run continues the same wandb
    run. wandb cannot take a step back, and what ``log()`` was given is not yet durable when it returns: wandb's
    service process holds it in memory and a SIGKILL of the run (an OOM kill, a preemption) loses it, whether it
    came before the last checkpoint or after. So a resumed run starts from the last step wandb is known to hold
    (``held``, below) and sends every later one once: those before the checkpoint it continues from again from
    ``metrics.jsonl`` and the run directory's grids (the values the killed process logged), those after it as it
    computes them again.

    What wandb holds, over the earlier processes of the run: in offline mode, the history rows of the wandb run's
    ``.wandb`` files in ``wandb/`` as far as they are whole on disk (wandb writes a file when a 32 KiB block of it
    fills, when the run finishes and, in recent versions, every ``x_transaction_log_flush_interval`` seconds, 15 by
    default; ``wandb sync`` uploads each file as it is, duplicates included); online, the wandb server's history (a
    resumed wandb run's ``run.step`` is the step after the server's last row); and the last step sent before a
    process's own ``finish()`` returned (``wandb.json``'s ``held_step``). Tested: offline, by SIGKILLing real
    processes and reading wandb's files back (tests/test_tools.py). Reasoned only, from wandb's source (no network
    in the tests): online, that a resumed run's ``run.step`` follows the server's history, which the killed
    process's uploads reached in order."""

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
        s = self.settings
        # wandb.init replaces sys.exit and sys.excepthook with its own hooks for as long as the process lives; the
        # process's own are put back when the wandb run ends (_finish), so nothing else in it sees wandb's frames
        self.process_hooks = (sys.exit, sys.excepthook)
        try:
            self.run = self.wandb.init(
                id=self.run_id, resume="allow", dir=str(self.run_dir), project=s.project, entity=s.entity,
                name=s.name or os.environ.get("WANDB_NAME") or self.run_dir.name, group=s.group, config=self.config,
            )  # fmt: skip
        except self.wandb.errors.UsageError as err:  # no API key, a bad entity...: wandb's words, and the ways on
            sys.exit, sys.excepthook = self.process_hooks
            raise ConfigError(
                f"--log wandb: {err} (log in with `wandb login` or set WANDB_API_KEY; or set WANDB_MODE=offline to "
                f"keep the records in {self.run_dir / 'wandb'} for a later `wandb sync`)"
            ) from None
        # the last step the wandb run holds, and the first one this process computes (what comes before it and
        # after the held one is sent again, from the run directory, before the first step this process logs)
        self.sent = max(int(state.get("held_step", -1)), self.run.step - 1, self._offline_held())
        self.resume_step, self.caught_up = self.steps.resume(loop.state.position), False
        self._keep()

    def _keep(self) -> None:
        write_json(self.run_dir / WANDB_STATE, {"id": self.run_id, "held_step": self.sent})

    def _offline_held(self) -> int:
        """The last step of this wandb run on disk in its offline files (-1: none); this process's own, when offline,
        holds no step yet."""
        held = -1
        for path in Path(self.run.settings.wandb_dir).glob(f"offline-run-*/run-{self.run_id}.wandb"):
            steps = wandb_history_steps(path)
            if steps is None:
                log.warning("wandb: %s is not a wandb file this version of dfcil reads; its steps are sent again", path)
                continue
            held = max([held, *steps])
        return held

    def _send(self, values: dict[str, Any], step: int) -> None:
        self.run.log(values, step=step, commit=True)  # commit: the row goes to wandb's file now, not with the next
        self.sent = step

    def _catch_up(self) -> None:
        """Send what earlier processes logged before the checkpoint this one continues from and wandb does not hold
        (its process was killed before wandb wrote it), with the values they logged: the records of metrics.jsonl
        and the grids of the run directory."""
        if self.caught_up:
            return
        self.caught_up = True
        if self.sent + 1 >= self.resume_step:
            return
        logged = read_jsonl(self.run_dir / "metrics.jsonl")
        records = {self.steps.record(r): r for r in logged if r["type"] in ("epoch", "task")}
        grids = {self.steps.setup(task): task for task in range(len(self.steps.epochs))}
        for step in sorted(s for s in records.keys() | grids.keys() if self.sent < s < self.resume_step):
            if step in grids:
                values = self._grid_values(grids[step])
            else:
                values = (task_values if records[step]["type"] == "task" else epoch_values)(records[step])
            if values is not None:
                self._send(values, step)

    def _grid_values(self, task: int) -> dict[str, Any] | None:
        grid = synthetic_grid(self.run_dir, task)
        return {f"synthetic/task{task}": self.wandb.Image(grid)} if grid is not None else None

    def _log(self, values: dict[str, Any], step: int) -> None:
        self._catch_up()
        if step > self.sent:  # else wandb holds it: logged by an earlier process, with the same values
            self._send(values, step)

    def on_setup_end(self) -> None:
        task = self.loop.state.position.task
        values = self._grid_values(task)
        if values is not None:
            self._log(values, self.steps.setup(task))

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
            self._catch_up()
            self.run.summary.update({k: summary[k] for k in ("last_acc", "avg_inc_acc", "forgetting") if k in summary})
        self._finish()

    def _finish(self) -> None:
        if self.run is not None:
            self._catch_up()
            self.run.finish()  # returns once wandb holds every step sent (on disk offline, uploaded online)
            self.run = None
            sys.exit, sys.excepthook = self.process_hooks
            self._keep()
