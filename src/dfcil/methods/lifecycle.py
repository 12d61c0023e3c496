"""The two lifecycles several methods share, each a small base class, so that a method keeps only what is its own:

* :class:`TeacherMethod` (LwF, LwF.MC): a frozen copy of the old model from the start of every task to its end,
  ``self.teacher``; none on the first task;
* :class:`ReplayMethod` (DeepInversion, ABD, UCIR-DF, PODNet-DF, R-DFCIL): synthetic replay. At the start of every
  task but the first it snapshots the old model and builds a generator (``self.replay``), trains the generator
  against the snapshot in the task's setup (model inversion), and drops both at the task's end (a persistent
  generator, ABD's, carries over). ``self.teacher`` is the snapshot.

Both keep their parts as :meth:`Method.components`, so checkpoints save and restore them with no code in the
method. A method that does more at a task's start or end overrides the hook and calls ``super()`` where its own
work belongs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from dfcil.config import MethodConfig, TrainConfig
from dfcil.context import TaskContext
from dfcil.methods.base import Method
from dfcil.models.network import IncrementalNet, NetOutput
from dfcil.synthesis.replay import Replay


class Teacher:
    """The old model, frozen from the start of a task to its end; none on the first task. A component: its static
    state is the old model's weights (nothing of it changes during a task)."""

    def __init__(self) -> None:
        self.net: IncrementalNet | None = None

    def begin(self, ctx: TaskContext) -> None:
        self.net = ctx.net.frozen_copy(n_classes=ctx.n_old) if ctx.task_id > 0 else None

    def end(self) -> None:
        self.net = None

    def __call__(self, x: Tensor) -> NetOutput:
        return self.net(x)

    @torch.no_grad()
    def logits(self, x: Tensor) -> Tensor | None:
        """The old classes' logits of ``x`` (B, n_old), or None on the first task. A static head keeps its width:
        (B, capacity), every column after the old classes masked (``MASKED_LOGIT``)."""
        return None if self.net is None else self.net(x).logits

    def state_dict(self) -> dict[str, Any]:
        return {}  # nothing changes during a task

    def static_state_dict(self) -> dict[str, Any]:
        return self.net.state_dict() if self.net is not None else {}

    def load_state_dict(self, state: dict[str, Any], ctx: TaskContext, static: dict[str, Any] | None) -> None:
        self.net = None
        if static:
            self.net = ctx.net.frozen_copy(n_classes=ctx.n_old)
            self.net.load_state_dict(static)


class TeacherMethod(Method):
    """A method that distils from the frozen old model on real data: ``self.teacher`` during every task."""

    def __init__(self, cfg: MethodConfig, train: TrainConfig) -> None:
        super().__init__(cfg, train)
        self.teacher = Teacher()

    def on_task_start(self, ctx: TaskContext) -> None:
        self.teacher.begin(ctx)

    def on_task_end(self, ctx: TaskContext) -> None:
        self.teacher.end()

    def components(self) -> dict[str, Any]:
        return {"teacher": self.teacher}


class ReplayMethod(Method):
    """A method that replays synthetic images of the old classes, from a generator inverted from the old model in
    every task but the first. Its config has an ``inversion`` section (:class:`~dfcil.synthesis.inversion.
    InversionConfig`)."""

    def __init__(self, cfg: MethodConfig, train: TrainConfig) -> None:
        super().__init__(cfg, train)
        self.replay = Replay(cfg.inversion)

    @property
    def teacher(self) -> IncrementalNet | None:
        """The frozen old model the generator is inverted from (logits over the old classes); None on task 0."""
        return self.replay.teacher

    def on_task_start(self, ctx: TaskContext) -> None:
        if ctx.task_id > 0:
            self.replay.begin(ctx)  # the old model's snapshot and the task's generator

    def synthesizer(self) -> Replay:
        return self.replay

    def synthesize(self, ctx: TaskContext, on_step: Callable[[], None]) -> None:
        self.replay.fit(ctx, on_step)  # the generator, trained against the frozen old model

    def on_task_end(self, ctx: TaskContext) -> None:
        self.replay.end()  # nothing of a task's teacher or generator is carried into the next (but ABD's)

    def components(self) -> dict[str, Any]:
        return {"replay": self.replay}
