"""What the engine shares with the code around it: :class:`Loop`, the live parts of one run, and :class:`Callback`,
the hooks the engine calls at fixed points (``loop.emit(hook, ...)``), in the order a task meets them.

Below the engine (:mod:`dfcil.training.engine`), the callbacks it runs (:mod:`dfcil.training.callbacks`, the shared
first-task models of :mod:`dfcil.training.task0`, the loggers) and the runner, so that each of them can name these types
without importing the others.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, ClassVar

from dfcil.compute.graphs import StepGraph
from dfcil.compute.runtime import Runtime
from dfcil.methods import Method, Phase, TaskContext
from dfcil.models.network import IncrementalNet
from dfcil.training.budget import Budget
from dfcil.training.guard import LossGuard
from dfcil.training.protocol import Evaluator, Protocol, TaskBatches
from dfcil.training.state import Interrupt, RunState


class Callback:
    """The engine's hook points, in the order a task meets them, and what a callback owns: its state, saved under
    :attr:`state_key` in every checkpoint (as Lightning's callbacks do), and what it adds to each task's record
    (:meth:`task_fields`) and to the run's summary (:meth:`summary_fields`)."""

    # a callback whose state a resumed run needs (a timer's seconds so far) saves it under this key; None: none
    state_key: ClassVar[str | None] = None

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps of this callback (under :attr:`state_key`)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (before ``on_run_start``; ``{}`` from a checkpoint that has none)."""

    def task_fields(self, task: int) -> dict[str, Any]:
        """What this callback adds to finished task ``task``'s record (its ``metrics.jsonl`` line)."""
        return {}

    def summary_fields(self) -> dict[str, Any]:
        """What this callback adds to the run's summary (``summary.json``)."""
        return {}

    def on_run_start(self, loop: Loop) -> None:
        """The run is built (and restored, when resuming); ``loop`` holds its live parts for the other hooks."""

    def on_task_start(self, info: dict[str, Any]) -> None:
        """A task begins (or continues, after a resume): its classes, images and phases."""

    def on_setup_step(self) -> None:
        """A consistent point inside a long task setup (every inversion step)."""

    def on_setup_end(self) -> None:
        """The method's task setup is done; training follows."""

    def on_phase_start(self, phase: Phase) -> None: ...

    def on_step_end(self) -> None:
        """A training step ended; ``loop.state.epoch`` holds the epoch's steps done and their loss terms (on the
        device: reading them is a host sync, so only at a few steps)."""

    def on_epoch_end(self, record: dict[str, Any]) -> None:
        """An epoch ended: its mean loss terms, lr, time and speed."""

    def on_phase_end(self, phase: Phase) -> None: ...

    def on_eval_start(self) -> None: ...

    def on_eval_end(self) -> None: ...

    def on_task_end(self, record: dict[str, Any]) -> None:
        """A task is trained and evaluated: its accuracy row and timings (a line of metrics.jsonl)."""

    def on_interrupt(self) -> None:
        """A stop was requested and the run stops at a point no other hook checkpoints: inside a setup, mid-epoch,
        or at an epoch end inside a phase. At the end of a setup, a phase or a task the run stops right after that
        hook (:meth:`on_setup_end`, :meth:`on_phase_end`, :meth:`on_task_end`) instead."""

    def on_run_end(self, summary: dict[str, Any]) -> None: ...


@dataclasses.dataclass(kw_only=True)
class Loop:
    """The live parts of one run, shared by the engine's functions; callbacks get it in ``on_run_start``. What the
    engine reads of the run's config is resolved into these parts by :func:`dfcil.training.engine.build`; nothing below
    it reads the config."""

    net: IncrementalNet
    method: Method
    state: RunState
    runtime: Runtime = Runtime()  # engine.build() sets the run's; the default computes eagerly on the CPU
    protocol: Protocol | None = None  # set by engine.build(): run_task and restore need them, fit_task does not
    batches: TaskBatches | None = None  # each task's training batches
    evaluator: Evaluator | None = None  # the test set and its batch
    guard: LossGuard = LossGuard()  # what stops a diverged training (train.max_loss)
    callbacks: Sequence[Callback] = ()
    interrupt: Interrupt = dataclasses.field(default_factory=Interrupt)
    budget: Budget | None = None  # the process's time (--budget-s): no task is started that would not end in it
    ctx: TaskContext | None = None  # the running task's
    graph: StepGraph | None = None  # the running phase's step graph (engine.cuda_graphs on or check)

    def emit(self, hook: str, *args: Any) -> None:
        """Call ``hook`` on every callback, in order. If one raises, the rest still run (a failing logger never
        costs a checkpoint) and the first error is raised afterwards."""
        error: Exception | None = None
        for callback in self.callbacks:
            try:
                getattr(callback, hook)(*args)
            except Exception as err:  # noqa: BLE001 - re-raised below, once every callback has run
                error = error or err
        if error is not None:
            raise error

    def fields(self, hook: str, *args: Any) -> dict[str, Any]:
        """What the callbacks add to a record (``hook`` ``"task_fields"`` or ``"summary_fields"``), merged in order."""
        out: dict[str, Any] = {}
        for callback in self.callbacks:
            out |= getattr(callback, hook)(*args)
        return out

    def snapshot(self) -> dict[str, Any]:
        """What a checkpoint holds of the live run, besides the method's static state:
        :func:`dfcil.training.engine.restore` continues from it. The callbacks' states go under their keys."""
        kept = {c.state_key: c.state_dict() for c in self.callbacks if c.state_key is not None}
        return {
            **self.state.state_dict(), "head_sizes": self.net.head.sizes, "net": self.net.state_dict(),
            "method": self.method.state_dict(), "callbacks": kept,
        }  # fmt: skip

    def restore_callbacks(self, payload: dict[str, Any]) -> None:
        """Give each callback with a :attr:`~Callback.state_key` its state from a checkpoint's ``payload``."""
        kept = payload.get("callbacks")
        if kept is None:  # a checkpoint written before callbacks kept their own state: the run state held it
            kept = {"timer": {"timings": payload.get("timings", []), "task": payload.get("task_timing", {})},
                    "diagnostics": {"tasks": payload.get("diagnostics", []),
                                    "task": payload.get("task_diagnostics", {})}}  # fmt: skip
        for callback in self.callbacks:
            if callback.state_key is not None:
                callback.load_state_dict(kept.get(callback.state_key, {}))


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunOptions:
    """How a run is driven, beside its config: none of it changes what the run computes or reaches ``config.yaml``.
    One object from the caller (:func:`dfcil.runs.runner.train`, :func:`dfcil.runs.runner.resume`) to
    :func:`dfcil.training.engine.run`."""

    progress: bool | None = None  # progress bars; None: where the console is a terminal
    callbacks: Sequence[Callback] = ()  # the caller's own, called after the run directory's logs
    interrupt: Interrupt = dataclasses.field(default_factory=Interrupt)  # set it to checkpoint and stop the run
    budget: Budget | None = None  # the process's time: it stops at the last task boundary before the time is up
    argv: Sequence[str] | None = None  # the command line meta.json records; None: this process's
    estimate: bool = False  # a new run logs its expected time first, from a few timed steps (engine.estimate)
