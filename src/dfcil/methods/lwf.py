"""Learning without Forgetting (Li & Hoiem, 2017), as ABD's code runs it: no replay, KD on the new data; with
``ldc``, LwF + LDC (Gomez-Villa et al., 2024): drift-compensated class means and a nearest-mean classifier."""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import torch.nn.functional as F
from torch import Tensor

from dfcil.config import MethodConfig, NonNegativeFloat, PositiveFloat, configclass
from dfcil.losses.classification import local_ce
from dfcil.losses.distillation import kd_soft_ce
from dfcil.methods.base import Batch, Phase, TaskContext, register_method
from dfcil.methods.lifecycle import TeacherMethod
from dfcil.methods.memory import ClassMemory, DriftConfig, NearestMeanClassifier
from dfcil.models.network import IncrementalNet


@configclass
class LwFConfig(MethodConfig):
    name: str = "lwf"
    lambda_kd: NonNegativeFloat = 1.0  # μ
    temperature: PositiveFloat = 2.0  # T (no T² factor, as ABD)
    # the classifier trained: ABD's bias-free linear head, or LDC's (PyCIL) cosine head with one learned scale
    head: Literal["linear", "cosine"] = "linear"
    # the CE's classes: every seen class (ABD's LwF) or the new task's only ("local", LDC's LwF)
    ce: Literal["seen", "local"] = "seen"
    # LDC: keep each class's mean feature (plain images, end of its task), move the stored means through a
    # projector fitted after every later task's training, and classify by nearest mean (docs/baselines.md, LDC)
    ldc: bool = False
    drift: DriftConfig = dataclasses.field(default_factory=DriftConfig)  # the projector's fit (with ldc)


@register_method(
    "lwf",
    graph_safe=True,  # its step replays as a CUDA graph (checked by tests/test_graphs.py)
    static_head=True,  # old and new columns through the head's masks when it is static
    switches={"ldc": "class statistics"},  # method.ldc: true keeps LDC's class means
)
class LwF(TeacherMethod):
    """LwF (Li & Hoiem, 2017): CE on the new data plus soft KD of the old model's outputs.

    With ``ldc``: class means, moved by a projector fitted after each task, and nearest-mean classification (LDC).
    """

    Config = LwFConfig

    def __init__(self, cfg: LwFConfig, train) -> None:
        super().__init__(cfg, train)
        self.memory = ClassMemory.for_switch(cfg.ldc, cfg.drift, generator=False)  # LDC's class means, or None
        self.classifier = NearestMeanClassifier(self.memory) if self.memory is not None else None

    @property
    def head(self) -> str:
        return self.cfg.head  # ABD's linear head, or LDC's cosine one

    def components(self) -> dict[str, Any]:
        return super().components() | ({"memory": self.memory} if self.memory is not None else {})

    def on_phase_end(self, ctx: TaskContext, phase: Phase) -> None:
        if self.memory is not None and self.teacher.net is not None:  # after training, with the old model
            self.memory.compensate(ctx, self.teacher.net, None)

    def on_task_end(self, ctx: TaskContext) -> None:
        if self.memory is not None:
            self.memory.add_classes(ctx)  # the new classes' means, in the final feature space
        super().on_task_end(ctx)

    def training_step(self, net: IncrementalNet, batch: Batch, ctx: TaskContext, phase: Phase) -> dict[str, Tensor]:
        logits = net(batch.x).logits
        old, new = net.old_and_new(ctx.n_old)  # the old and the new classes' logits
        ce = local_ce(logits, batch.y, new) if self.cfg.ce == "local" else F.cross_entropy(logits, batch.y)
        terms = {"ce": ce}
        t = self.teacher.logits(batch.x)  # (B, n_old), or a static head's (B, capacity)
        if t is not None:
            terms["kd"] = self.cfg.lambda_kd * kd_soft_ce(logits, t, self.cfg.temperature, old)
        return terms

    def task0_signature(self) -> str | None:
        return None if self.memory is not None else "ce"  # the class means of task 0 are not in a shared model
