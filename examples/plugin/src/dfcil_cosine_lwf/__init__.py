"""LwF with a cosine classifier: an example dfcil plugin (docs/extending.md, "Plugins").

Installed (``pip install -e examples/plugin``), its package declares this module as the entry point ``cosine_lwf``
of the group ``dfcil.methods``: a dfcil command that meets ``method.name: cosine_lwf`` imports it, and the
decorator below registers the method. Nothing in dfcil names it.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from dfcil.config import MethodConfig, NonNegativeFloat, PositiveFloat, configclass
from dfcil.context import Batch, Phase, TaskContext
from dfcil.losses.distillation import kd_soft_ce
from dfcil.methods import register_method
from dfcil.methods.lifecycle import TeacherMethod
from dfcil.models.network import IncrementalNet


@configclass
class CosineLwFConfig(MethodConfig):
    name: str = "cosine_lwf"
    lambda_kd: NonNegativeFloat = 1.0  # weight of the KD term
    temperature: PositiveFloat = 2.0  # T of the softened outputs (no T² factor, as dfcil's LwF)


# head: logits = σ · cos(f, w_c), one learned scale σ (dfcil.models.heads); what it keeps: the defaults (nothing)
@register_method("cosine_lwf", head="cosine")
class CosineLwF(TeacherMethod):
    """LwF with a cosine classifier (UCIR's head): CE on the new data plus soft KD of the old model's outputs."""

    Config = CosineLwFConfig

    def training_step(self, net: IncrementalNet, batch: Batch, ctx: TaskContext, phase: Phase) -> dict[str, Tensor]:
        logits = net(batch.x).logits  # (B, n_seen)
        terms = {"ce": F.cross_entropy(logits, batch.y)}
        old = self.teacher.logits(batch.x)  # (B, n_old); None on the first task
        if old is not None:
            terms["kd"] = self.cfg.lambda_kd * kd_soft_ce(logits[:, : ctx.n_old], old, self.cfg.temperature)
        return terms
