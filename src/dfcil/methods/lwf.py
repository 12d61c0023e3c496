"""Learning without Forgetting (Li & Hoiem, 2017), as ABD's code runs it: no replay, KD on the new data."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from dfcil.config import MethodConfig, NonNegativeFloat, PositiveFloat, configclass
from dfcil.losses.distillation import kd_soft_ce
from dfcil.methods.base import Batch, Method, Phase, TaskContext, register_method
from dfcil.models.network import IncrementalNet


@configclass
class LwFConfig(MethodConfig):
    name: str = "lwf"
    lambda_kd: NonNegativeFloat = 1.0  # μ
    temperature: PositiveFloat = 2.0  # T (no T² factor, as ABD)


@register_method("lwf")
class LwF(Method):
    """LwF (Li & Hoiem, 2017): CE on the new data plus soft KD of the old model's outputs."""

    graph_safe = True  # its step replays as a CUDA graph (checked by tests/test_graphs.py)

    Config = LwFConfig

    def __init__(self, cfg: LwFConfig, train) -> None:
        super().__init__(cfg, train)
        self.teacher: IncrementalNet | None = None

    def on_task_start(self, ctx: TaskContext) -> None:
        self.teacher = ctx.net.frozen_copy(n_classes=ctx.n_old) if ctx.task_id > 0 else None

    def on_task_end(self, ctx: TaskContext) -> None:
        self.teacher = None

    def training_step(self, net: IncrementalNet, batch: Batch, ctx: TaskContext, phase: Phase) -> dict[str, Tensor]:
        logits = net(batch.x).logits
        terms = {"ce": F.cross_entropy(logits, batch.y)}
        if self.teacher is not None:
            with torch.no_grad():
                old = self.teacher(batch.x).logits  # (B, n_old)
            terms["kd"] = self.cfg.lambda_kd * kd_soft_ce(logits[:, : ctx.n_old], old, self.cfg.temperature)
        return terms

    def static_state_dict(self) -> dict:  # the teacher is a snapshot: fixed for the whole task
        return {"teacher": self.teacher.state_dict()} if self.teacher is not None else {}

    def load_state_dict(self, state: dict, ctx: TaskContext, static: dict | None = None) -> None:
        self.teacher = None
        if static:
            self.teacher = ctx.net.frozen_copy(n_classes=ctx.n_old)
            self.teacher.load_state_dict(static["teacher"])

    def task0_signature(self) -> str | None:
        return "ce"
