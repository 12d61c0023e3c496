"""The frozen old model of a task, for the methods that distil on real data only (LwF, LwF.MC).

Synthetic-replay methods hold their snapshot in :class:`dfcil.synthesis.replay.Replay` with the generator; this is
the same snapshot without one, as a :meth:`Method.components` part: its static state is the old model's weights.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from dfcil.models.network import IncrementalNet, NetOutput

if TYPE_CHECKING:
    from dfcil.methods.base import TaskContext


class Teacher:
    """The old model, frozen from the start of a task to its end; none on the first task."""

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
        """The old classes' logits of ``x`` (B, n_old), or None on the first task."""
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
