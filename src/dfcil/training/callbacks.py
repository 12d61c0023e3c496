"""The engine's own callbacks: what happens around the training loop (logs, metric records, timings, checkpoints)
without living in it. The engine calls every hook (:class:`~dfcil.training.loop.Callback`) of every callback in order,
at fixed points (``loop.emit``); records are plain JSON-able dicts. :class:`Timer` runs first and :class:`Checkpointing`
after the user's callbacks (only the shared first-task cache follows it), so that a checkpoint holds what the others did
at the same point (a metrics line, a timing)."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from dfcil.checkpoint import Checkpointer, static_parts
from dfcil.compute.graphs import StepGraph
from dfcil.compute.runtime import peak_memory_mb
from dfcil.config import check_unchanged, config_to_dict
from dfcil.context import Phase
from dfcil.errors import CheckpointError
from dfcil.load import build_config
from dfcil.model_file import save_model
from dfcil.models.network import backbone_for
from dfcil.progress import ProgressLog, run_left
from dfcil.training.budget import end_work, units_of
from dfcil.training.estimate import END, EVALUATION, INVERSION, SETUP, RunClock, kind_of
from dfcil.training.loop import Callback, Loop

log = logging.getLogger("dfcil")


class ConsoleLogger(Callback):
    """One log line per epoch and per task (to the console and, when configured, ``run.log``), and progress lines
    inside a task's first epoch when it is slow; each of them, and a line after each task's inversion, ends with the
    run's time left.

    The first epoch a process trains in a task (the one a resumed run continues, included) is timed up to its first
    tenth of steps; if its steps so far project it past ``slow_epoch_s``, a line follows at that tenth and every
    later one but the last (the epoch's own line follows at once), with the mean loss terms so far, the speed and
    the time left. A fast epoch, and every epoch of the smoke preset, gets no extra line; later epochs have the
    line of the one before to show how long they take.

    The run's time left is its work left (:func:`~dfcil.training.estimate.plan`: every remaining inversion step,
    training step, task end and evaluation) times the seconds each kind of step took so far in the run, on this
    clock (:class:`~dfcil.training.estimate.RunClock`; a resumed run's earlier processes' timings included). Until
    every kind left has run (a run's first incremental task: its inversion, its phases), the time counts only the
    kinds that have: "run: over 2.5 min left".

    Args:
        slow_epoch_s: the projected seconds of an epoch above which it gets progress lines.
        clock: seconds, monotonic (a test's fake clock).
        estimate: each kind's seconds per step before the run has timed it (a run's :func:`estimate` at its start).
    """

    def __init__(
        self,
        slow_epoch_s: float = 30.0,
        clock: Callable[[], float] = time.perf_counter,
        estimate: Mapping[str, float] | None = None,
    ) -> None:
        self.slow_epoch_s, self.clock = slow_epoch_s, clock
        self.first_epoch = False  # from a task's start to the end of its first epoch here
        self.lines: ProgressLog | None = None  # the first epoch's schedule while it may still need lines
        self.slow = False  # whether the first epoch turned out slow at its first tenth
        self.run = RunClock(fallback=estimate, clock=clock)  # the run's time left; it gets every hook below first
        self.phase = ""  # the running phase's name

    def on_run_start(self, loop: Loop) -> None:
        self.loop = loop
        self.run.on_run_start(loop)
        timer = next((c for c in loop.callbacks if isinstance(c, Timer)), None)
        if timer is not None:  # what the run's earlier processes timed
            self.run.load_timings(timer.timings, loop.method.batch_size)
        inversion = sum(s.steps for s in self.run.plan if s.kind == kind_of(s.task, INVERSION))
        training = sum(s.steps for s in self.run.plan if s.part not in (SETUP, INVERSION, END, EVALUATION))
        source = "the estimate's times, then their times so far" if self.run.fallback else "their times so far"
        log.info(
            "run: %d training and %d inversion steps in %d tasks; its time left follows from %s",
            training,
            inversion,
            loop.protocol.split.num_tasks,
            source,
        )

    def _run_left(self, task: int, part: str, done: int | None = None) -> str:
        return run_left(*self.run.left(task, part, done))

    def on_task_start(self, info: dict[str, Any]) -> None:
        self.run.on_task_start(info)
        self.first_epoch = True
        log.info(
            "task %d (of 0..%d): %d new classes (%d seen), %d training images, phases %s",
            info["task"],
            info["num_tasks"] - 1,
            info["n_new"],
            info["n_seen"],
            info["train_images"],
            ", ".join(f"{p['name']}×{p['epochs']}" for p in info["phases"]) or "none: no training in this task",
        )

    def on_setup_step(self) -> None:
        self.run.on_setup_step()

    def on_setup_end(self) -> None:
        self.run.on_setup_end()
        task, steps, seconds = self.run.task, self.run.setup_steps, self.run.setup_s
        if steps:
            log.info(
                "task %d inversion: %d steps in %.1fs (%.3fs each); %s",
                task,
                steps,
                seconds,
                seconds / steps,
                self._run_left(task, INVERSION),
            )

    def on_phase_start(self, phase: Phase) -> None:
        self.run.on_phase_start(phase)
        self.phase = phase.name
        if self.first_epoch:  # the epoch starts now: at the step of a resumed one (fit_task set the position)
            position, ctx = self.loop.state.position, self.loop.ctx
            desc = f"task {ctx.task_id} {phase.name} epoch {position.epoch} (of 0..{phase.epochs - 1})"  # as below
            self.lines, self.slow = ProgressLog(desc, len(ctx.data), position.step, clock=self.clock), False

    def on_step_end(self) -> None:
        if self.lines is None:
            return
        epoch = self.loop.state.epoch
        if not self.lines.due(epoch.step) or epoch.step == self.lines.total:
            return
        if not self.slow and self.lines.projected_s(epoch.step) <= self.slow_epoch_s:
            self.lines = None  # fast: its epoch line comes soon enough
            return
        self.slow = True
        self.run.time_steps(epoch.step)  # the run's time left with this epoch's speed so far
        position, steps = self.loop.state.position, len(self.loop.ctx.data)
        run = self._run_left(position.task, self.phase, position.epoch * steps + epoch.step)
        self.lines.log(epoch.step, epoch.means(), " (epoch means so far)", run)  # the one device sync of a logged step

    def on_epoch_end(self, record: dict[str, Any]) -> None:
        self.run.on_epoch_end(record)
        self.first_epoch, self.lines = False, None
        task, steps = record["task"], len(self.loop.ctx.data)
        losses = " ".join(f"{k}={v:.4f}" for k, v in record["loss"].items())
        log.info(
            "task %d %s epoch %d (of 0..%d) lr=%.4g %s (%.1fs, %.0f img/s; %s)",
            task,
            record["phase"],
            record["epoch"],  # counted from 0, as in metrics.jsonl and metrics.csv (docs/metrics.md)
            record["epochs"] - 1,
            record["lr"],
            losses,
            record["time_s"],
            record["images_per_s"],
            self._run_left(task, record["phase"], (record["epoch"] + 1) * steps),
        )

    def on_phase_end(self, phase: Phase) -> None:
        self.run.on_phase_end(phase)

    def on_eval_start(self) -> None:
        self.run.on_eval_start()

    def on_eval_end(self) -> None:
        self.run.on_eval_end()

    def on_task_end(self, record: dict[str, Any]) -> None:
        old = "" if record["old_acc"] is None else f", old {record['old_acc']:.2f}"
        log.info(
            "task %d: accuracy on %d seen classes %.2f%% (new %.2f%s); row %s",
            record["task"],
            record["n_seen"],
            record["acc"],
            record["new_acc"],
            old,
            [round(a, 2) for a in record["acc_row"]],
        )
        t = record["timing"]
        phases = ", ".join(f"{k} {v['time_s']:.1f}s ({v['images_per_s']:.0f} img/s)" for k, v in t["phases"].items())
        phases += "".join(f", {k} {v:.1f}s" for k, v in end_work(t).items())  # the method's own: LDC's drift
        last = record["task"] + 1 == self.loop.protocol.split.num_tasks
        log.info(
            "task %d time: setup %.1fs, %s, eval %.1fs; peak memory %.0f MB%s",
            record["task"],
            t.get("setup_s", 0.0),
            phases or "no training",
            t["eval_s"],
            t["peak_memory_mb"],
            "" if last else f"; {self._run_left(record['task'], EVALUATION)}",
        )

    def on_run_end(self, summary: dict[str, Any]) -> None:
        log.info(
            "done: last accuracy A_N %.2f%%, average incremental accuracy %.2f%% (%.0fs)",
            summary["last_acc"],
            summary["avg_inc_acc"],
            summary["wall_time_s"],
        )


class JsonlLogger(Callback):
    """Appends every epoch and task record to ``metrics.jsonl`` (one JSON object per line, crash-safe)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _write(self, record: dict[str, Any]) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")

    def on_epoch_end(self, record: dict[str, Any]) -> None:
        self._write({"type": "epoch", **record})

    def on_task_end(self, record: dict[str, Any]) -> None:
        self._write({"type": "task", **record})


class PhaseClock:
    """A phase's timing record over all the processes of a run: its time (what earlier processes kept in
    ``record`` plus this one's), images trained, and how its steps ran when CUDA graphs are on or checked."""

    def __init__(self, record: dict[str, Any]) -> None:
        self.record = record
        self.kept = {k: record.get(k, 0) for k in ("time_s", "captures", "capture_s")}
        self.started = time.perf_counter()

    def update(self, images: int, graph: StepGraph | None, graphs: str) -> None:
        """Write the record: ``images`` trained in the phase so far, ``graph`` the phase's step graph (None:
        eager) under the configured mode ``graphs``."""
        dt = self.kept["time_s"] + time.perf_counter() - self.started
        self.record.update(time_s=round(dt, 3), images=images, images_per_s=round(images / dt, 1) if dt > 0 else 0.0)
        if graphs == "off":
            return
        mode = graph.mode if graph is not None else "off"  # how this process, the last, ran the phase's steps
        self.record.update(cuda_graphs=mode, captures=self.kept["captures"] + (graph.captures if graph else 0))
        if mode == "on":
            self.record["capture_s"] = round(self.kept["capture_s"] + graph.capture_s, 3)
        if graph is not None and graph.failure:
            self.record["graph_failure"] = graph.failure
        else:  # the failure of an earlier process, which this one's mode replaces
            self.record.pop("graph_failure", None)


class Timer(Callback):
    """Each task's timings: setup seconds, per phase time, images and images per second, evaluation seconds, and
    peak memory (CUDA: since the task started; CPU: the process's). Its own state, kept across processes by the
    checkpoints: the finished tasks' timings and the running task's so far. Each task's record gets its
    ``timing``, the summary every task's (``timings``)."""

    state_key = "timer"

    def __init__(self) -> None:
        self.timings: list[dict[str, Any]] = []  # finished tasks'
        self.timing: dict[str, Any] = {}  # the running task's, so far

    def state_dict(self) -> dict[str, Any]:
        return {"timings": self.timings, "task": self.timing}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.timings, self.timing = list(state.get("timings", [])), dict(state.get("task", {}))

    def task_fields(self, task: int) -> dict[str, Any]:
        return {"timing": self.timings[task]}

    def summary_fields(self) -> dict[str, Any]:
        return {"timings": self.timings}

    def on_run_start(self, loop: Loop) -> None:
        self.loop = loop
        self.setup: tuple[float, float] | None = None  # while a setup runs: (its start here, seconds kept before)
        # the compiler's totals at the task's start, and what earlier processes recorded for this task
        self.compiled: tuple[tuple[int, float, int], tuple[int, float, int]] | None = None
        self.phase: PhaseClock | None = None
        self.eval_started = 0.0

    def _note_memory(self) -> None:
        peak = peak_memory_mb(self.loop.runtime.device)
        self.timing["peak_memory_mb"] = max(self.timing.get("peak_memory_mb", 0.0), peak)

    def _note_compile(self) -> None:
        """engine.compile: step: graphs compiled in this task and the seconds of the steps that compiled them."""
        compiler = self.loop.runtime.compiler
        if compiler is not None and self.compiled is not None:
            (count, seconds, loaded), (kept_count, kept_s, kept_loaded) = self.compiled
            self.timing["compiles"] = kept_count + compiler.compiles - count
            self.timing["compile_s"] = round(kept_s + compiler.seconds - seconds, 3)
            self.timing["compile_cache_hits"] = kept_loaded + compiler.loaded - loaded

    def _note_setup(self) -> None:
        started, kept = self.setup
        self.timing["setup_s"] = round(kept + time.perf_counter() - started, 3)
        self._note_memory()
        self._note_compile()

    def _note_phase(self) -> None:
        state, data = self.loop.state, self.loop.ctx.data
        images = (state.position.epoch * len(data) + state.position.step) * data.batch_size
        self.phase.update(images, self.loop.graph, self.loop.runtime.graphs)

    def on_task_start(self, info: dict[str, Any]) -> None:
        state, device = self.loop.state, self.loop.runtime.device
        if self.timing.get("task") != info["task"]:  # else: what earlier processes spent on this task
            self.timing = {"task": info["task"]}
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        if state.position.stage == "setup":
            self.setup = (time.perf_counter(), self.timing.get("setup_s", 0.0))
        compiler = self.loop.runtime.compiler
        if compiler is not None:  # what this process compiles from here, plus what earlier ones did in this task
            self.compiled = (
                (compiler.compiles, compiler.seconds, compiler.loaded),
                (
                    self.timing.get("compiles", 0),
                    self.timing.get("compile_s", 0.0),
                    self.timing.get("compile_cache_hits", 0),
                ),
            )

    def on_setup_step(self) -> None:
        self._note_setup()

    def on_setup_end(self) -> None:
        device = self.loop.runtime.device
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        self._note_setup()
        self.setup = None
        self.timing["phases"] = self.timing.get("phases", {})

    def on_phase_start(self, phase: Phase) -> None:
        self.phase = PhaseClock(self.timing["phases"].setdefault(phase.name, {}))

    def on_epoch_end(self, record: dict[str, Any]) -> None:
        self._note_phase()
        self._note_memory()
        self._note_compile()

    def on_phase_end(self, phase: Phase) -> None:
        # the phase's time stands as its last epoch left it: the method's work at its end has an entry of its own
        self._note_method()
        self.phase = None

    def _note_method(self) -> None:
        for name, seconds in self.loop.method.task_seconds(self.loop.ctx.task_id).items():
            self.timing[f"{name}_s"] = round(seconds, 3)

    def on_interrupt(self) -> None:
        if self.setup is not None:
            self._note_setup()
        if self.phase is not None:
            self._note_phase()

    def on_eval_start(self) -> None:
        self._note_method()  # the method's work at the task's end (none yet: each method's is at a phase's end)
        self.eval_started = time.perf_counter()

    def on_eval_end(self) -> None:
        self.timing["eval_s"] = round(time.perf_counter() - self.eval_started, 3)
        # how the method's own work at the task's end grows (Method.end_units): what the report's and the budget's
        # estimates of later tasks scale that work by (APR's ADC: per old class)
        self.timing["end_units"] = units_of(self.loop.method, self.loop.ctx)
        self._note_memory()
        self.timings.append(self.timing)
        self.timing = {}


class Checkpointing(Callback):
    """Writes the run's checkpoints (:mod:`dfcil.checkpoint`): after each task's setup, at the end of every
    phase and task, and on an interrupt; at epoch ends at most every ``epoch_checkpoint_interval_s`` (0: every epoch);
    inside a setup at most every ``checkpoint_interval_s``. :meth:`load` finds the newest usable checkpoint to resume
    from (the engine restores the run from it, :func:`dfcil.training.engine.restore`); what is about the files stays
    here: the task's static-state file it refers to, and ``metrics.jsonl``, cut back to its length at that
    checkpoint."""

    def __init__(
        self, run_dir: Path, config: dict[str, Any], setup_interval_s: float = 60.0, epoch_interval_s: float = 0.0
    ) -> None:
        """``config``: the run's config as plain data (saved in every checkpoint, and compared with the one a
        resumed checkpoint holds); ``setup_interval_s`` and ``epoch_interval_s``: ``checkpoint_interval_s`` and
        ``epoch_checkpoint_interval_s``."""
        self.files = Checkpointer(run_dir)
        self.metrics = Path(run_dir) / "metrics.jsonl"
        self.config = config
        self.setup_interval_s, self.epoch_interval_s = setup_interval_s, epoch_interval_s
        self.static_ref: dict[str, Any] | None = None  # the running task's static state file and its digest
        self.resumed_bytes: int | None = None  # metrics.jsonl's length at the checkpoint resumed from
        self.last_save = time.monotonic()

    def load(self) -> dict[str, Any]:
        """The newest usable checkpoint's payload, refused if it was written under another config."""
        payload = self.files.load_latest()
        # the checkpoint's plugins first, as plain data: building its config imports them, and only the run's own
        # (which the user allowed: dfcil.load.load_run_config) may be imported
        saved_plugins = payload["config"].get("plugins") if isinstance(payload["config"], dict) else None
        plugins = list(self.config.get("plugins") or ())
        if list(saved_plugins or ()) != plugins:
            raise CheckpointError(
                f"the newest checkpoint in {self.files.dir} names other plugins ({list(saved_plugins or ())}) "
                f"than the run's config.yaml ({plugins}): it is not this run's; restore the run's own "
                f"checkpoints/, or start a new run"
            )
        # the saved config as this version of dfcil reads it: keys added since it was written take their defaults
        # (which keep the behaviour of the version that wrote it) and are not changes
        check_unchanged(config_to_dict(build_config(payload["config"])), self.config)
        self.static_ref, self.resumed_bytes = payload["static"], payload["metrics_bytes"]
        return payload

    def on_run_start(self, loop: Loop) -> None:
        self.loop = loop
        if self.resumed_bytes is not None:
            rewind_log(self.metrics, self.resumed_bytes)

    def save(self, boundary: bool = False) -> None:
        payload = self.loop.snapshot() | {"config": self.config}
        static = self.loop.method.static_state_dict()  # frozen teacher, trained generator: written once per task,
        task = self.loop.state.position.task  # and again where a part's appeared since (a generator after views)
        parts = static_parts(static)
        ref = self.static_ref
        if static and (ref is None or ref["task"] != task or ref.get("parts") != parts):
            referred = ref["digest"] if ref is not None and ref["task"] == task else None
            digest = self.files.save_static(task, static, referred)
            self.static_ref = {"task": task, "digest": digest, "parts": parts}
        payload["static"] = self.static_ref if static else None
        payload["metrics_bytes"] = self.metrics.stat().st_size if self.metrics.exists() else 0
        self.files.save(payload, boundary)
        if boundary and not static:  # a task's end: neither checkpoint refers to an earlier task's replaced static file
            self.files.drop_replaced_static(task)
        self.last_save = time.monotonic()

    def _due(self, every: float) -> bool:
        return time.monotonic() - self.last_save >= every

    def on_setup_step(self) -> None:
        if self._due(self.setup_interval_s):
            self.save()

    def on_setup_end(self) -> None:
        self.save()

    def on_phase_start(self, phase: Phase) -> None:
        self.trained = False  # whether this process trained an epoch of the phase

    def on_epoch_end(self, record: dict[str, Any]) -> None:
        # the phase's last epoch is saved by on_phase_end, an interrupted one by on_interrupt
        self.trained = True
        last = record["epoch"] + 1 == record["epochs"]
        if not last and not self.loop.interrupt.requested and self._due(self.epoch_interval_s):
            self.save()

    def on_phase_end(self, phase: Phase) -> None:
        if self.trained:  # a phase finished before a resume has its checkpoint already
            self.save()

    def on_task_end(self, record: dict[str, Any]) -> None:
        self.save(boundary=True)  # also kept apart: the run's smallest state, which a run is carried with

    def on_interrupt(self) -> None:
        self.save()


def rewind_log(path: Path, size: int) -> None:
    """Cut the JSON-lines log ``path`` back to ``size`` bytes, its length at the checkpoint a run resumes from.

    A log found shorter (cut or deleted since) cannot be made whole again: keep its complete lines and say so.
    """
    found = path.stat().st_size if path.exists() else 0
    if found < size:
        log.warning(
            "%s holds %d bytes, fewer than the %d it held at the checkpoint: the records it lost are not restored "
            "(the accuracies in summary.json come from the checkpoint and are complete)",
            path,
            found,
            size,
        )
        size = path.read_bytes().rfind(b"\n") + 1 if found else 0  # whole records only: the next starts a line
    if found:
        with open(path, "r+b") as f:  # drop records written after the checkpoint
            f.truncate(size)


class SaveModel(Callback):
    """Writes the final network to ``path`` when the run ends (:func:`dfcil.model_file.save_model`), with the
    method's :meth:`~dfcil.methods.Method.eval_state` where it has one (FeCAM's class statistics).

    Args:
        path: the file (``RUN/model.pt``).
        backbone: ``model.backbone`` (``"auto"``: the one the image size selects).
        run: which run writes it: its id, directory, method and dataset (``model.pt``'s ``run``).
    """

    def __init__(self, path: Path, backbone: str, run: dict[str, Any]) -> None:
        self.path, self.backbone, self.run = path, backbone, run

    def on_run_start(self, loop: Loop) -> None:
        self.loop = loop

    def on_run_end(self, summary: dict[str, Any]) -> None:
        dataset, split = self.loop.protocol.dataset, self.loop.protocol.split
        backbone = backbone_for(self.backbone, dataset.image_size)
        about = {
            "inputs": {"image_size": dataset.image_size, "mean": list(dataset.mean), "std": list(dataset.std)},
            "class_order": list(split.class_order), "task_sizes": list(split.task_sizes),
            "class_names": [dataset.classes[c] for c in split.class_order] if dataset.classes else [],
        }  # fmt: skip
        about["run"] = self.run  # which run wrote the file: its id (as meta.json's and summary.json's), ...
        if method_state := self.loop.method.eval_state():  # what the method classifies with besides the network
            about["method_state"] = method_state
        save_model(self.path, self.loop.net, self.loop.method.head, backbone, about)
