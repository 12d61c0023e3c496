"""DeepInversion as a DFCIL baseline, as ABD's code runs it (``DeepInversionGenBN``): synthetic replay with
soft KD, CE on real data only, real and synthetic images in one batch (shared BN statistics)."""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import Tensor

from dfcil.config import MethodConfig, NonNegativeFloat, PositiveFloat, configclass
from dfcil.losses.distillation import kd_soft_ce
from dfcil.methods.base import Batch, Phase, TaskContext, register_method
from dfcil.methods.lifecycle import ReplayMethod
from dfcil.models.network import IncrementalNet
from dfcil.synthesis.inversion import InversionConfig
from dfcil.synthesis.replay import ReplayBN, student_pass


@configclass
class DeepInversionConfig(MethodConfig):
    name: str = "deepinversion"
    lambda_kd: NonNegativeFloat = 1.0  # μ of both KD terms
    temperature: PositiveFloat = 2.0  # T (no T² factor, as ABD)
    # BN statistics of the student's real + synthetic batch: "mixed" (one batch, shared statistics: ABD's code) or
    # "separate" (each part its own, as R-DFCIL's code; docs/reference.md, Replay BN statistics)
    replay_bn: ReplayBN = "mixed"
    inversion: InversionConfig = dataclasses.field(default_factory=InversionConfig)


@register_method(
    "deepinversion",
    graph_safe=True,  # its step replays as a CUDA graph (checked by tests/test_graphs.py)
    stores="synthesizer per task",
)
class DeepInversion(ReplayMethod):
    """DeepInversion (Yin et al., 2020) for DFCIL: CE on real data, soft KD on real and synthetic data.

    CE over the seen classes on real data, KD of the old outputs on real data, and KD on synthetic data against
    the old model's outputs padded with zeros for the new classes."""

    Config = DeepInversionConfig

    def training_step(self, net: IncrementalNet, batch: Batch, ctx: TaskContext, phase: Phase) -> dict[str, Tensor]:
        if ctx.task_id == 0:
            return {"ce": F.cross_entropy(net(batch.x).logits, batch.y)}
        b, c, n_old = len(batch.x), self.cfg, ctx.n_old
        x_syn = self.replay.generate(b)
        with torch.no_grad():
            old = self.teacher(torch.cat([batch.x, x_syn])).logits  # (2B, n_old)
        logits = student_pass(net, batch.x, x_syn, c.replay_bn, ctx.runtime.merge_student).logits
        return {
            "ce": F.cross_entropy(logits[:b], batch.y),
            "kd_real": c.lambda_kd * kd_soft_ce(logits[:b, :n_old], old[:b], c.temperature),
            "kd_syn": c.lambda_kd * kd_soft_ce(logits[b:], old[b:], c.temperature),  # new classes pushed to 0
        }

    def task0_signature(self) -> str | None:
        return "ce"
