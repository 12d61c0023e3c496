"""Learning without Forgetting (Li & Hoiem, 2017), as ABD's code runs it: no replay, KD on the new data."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from dfcil.config import MethodConfig, NonNegativeFloat, PositiveFloat, configclass
from dfcil.losses.distillation import kd_soft_ce
from dfcil.methods.base import Batch, Phase, TaskContext, register_method
from dfcil.methods.lifecycle import TeacherMethod
from dfcil.models.network import IncrementalNet


@configclass
class LwFConfig(MethodConfig):
    name: str = "lwf"
    lambda_kd: NonNegativeFloat = 1.0  # μ
    temperature: PositiveFloat = 2.0  # T (no T² factor, as ABD)


@register_method("lwf")
class LwF(TeacherMethod):
    """LwF (Li & Hoiem, 2017): CE on the new data plus soft KD of the old model's outputs."""

    graph_safe = True  # its step replays as a CUDA graph (checked by tests/test_graphs.py)

    Config = LwFConfig

    def training_step(self, net: IncrementalNet, batch: Batch, ctx: TaskContext, phase: Phase) -> dict[str, Tensor]:
        logits = net(batch.x).logits
        terms = {"ce": F.cross_entropy(logits, batch.y)}
        old = self.teacher.logits(batch.x)  # (B, n_old)
        if old is not None:
            terms["kd"] = self.cfg.lambda_kd * kd_soft_ce(logits[:, : ctx.n_old], old, self.cfg.temperature)
        return terms

    def task0_signature(self) -> str | None:
        return "ce"
