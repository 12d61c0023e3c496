"""ABD, "Always Be Dreaming" (Smith et al., ICCV 2021), as its code runs it (``learners/datafree.py``)."""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import Tensor

from dfcil.config import MethodConfig, NonNegativeFloat, configclass
from dfcil.losses.classification import task_balance_weights
from dfcil.losses.distillation import head_feature_kd
from dfcil.methods.base import Batch, Phase, TaskContext, register_method
from dfcil.methods.lifecycle import ReplayMethod
from dfcil.models.network import IncrementalNet
from dfcil.synthesis.inversion import InversionConfig
from dfcil.synthesis.replay import ReplayBN, student_pass


@configclass
class ABDConfig(MethodConfig):
    name: str = "abd"
    mu: NonNegativeFloat = 0.1  # weight of the importance-weighted feature KD
    # BN statistics of the student's real + synthetic batch: "mixed" (one batch, shared statistics: ABD's code) or
    # "separate" (each part its own, as R-DFCIL's code; docs/reference.md, Replay BN statistics)
    replay_bn: ReplayBN = "mixed"
    inversion: InversionConfig = dataclasses.field(default_factory=lambda: InversionConfig(persistent=True))


@register_method(
    "abd",
    graph_safe=True,  # its step replays as a CUDA graph (checked by tests/test_graphs.py)
    stores="synthesizer per task",
)
class ABD(ReplayMethod):
    """ABD (Smith et al., 2021): local CE, task-balanced head CE, feature KD through the old head.

    Local CE on the new data over the new-class logits; a task-balanced CE that trains only the head on real +
    synthetic data; feature KD through the frozen old head; real and synthetic images in one batch (``replay_bn``).

    Not replicated: ABD's first-task and head CE run over all C outputs of a pre-allocated head, unseen classes
    included; here they run over the classes seen so far."""

    Config = ABDConfig

    def training_step(self, net: IncrementalNet, batch: Batch, ctx: TaskContext, phase: Phase) -> dict[str, Tensor]:
        if ctx.task_id == 0:
            return {"ce": F.cross_entropy(net(batch.x).logits, batch.y)}
        b, n_old, teacher = len(batch.x), ctx.n_old, self.teacher
        x_syn = self.replay.generate(b)
        x = torch.cat([batch.x, x_syn])
        with torch.no_grad():
            t = teacher(x)  # eval mode: features of both halves, pseudo-labels of the synthetic half
        y = torch.cat([batch.y, t.logits[b:].argmax(dim=1)])
        w = task_balance_weights(y, n_old, ctx.n_seen)
        out = student_pass(net, batch.x, x_syn, self.cfg.replay_bn, ctx.runtime.merge_student)
        local = F.cross_entropy(out.logits[:b, n_old:].float(), batch.y - n_old, reduction="none") * w[:b]
        with torch.no_grad():  # ABD recomputes the features (a second train-mode pass: BN statistics move twice)
            features = student_pass(net, batch.x, x_syn, self.cfg.replay_bn, ctx.runtime.merge_student).features
        head_ce = F.cross_entropy(net.head(features.detach()).float(), y, reduction="none") * w
        return {
            "local_ce": local.mean(),
            "head_ce": head_ce.mean(),
            "kd": self.cfg.mu * head_feature_kd(out.features, t.features, teacher.head.weight()),
        }

    def task0_signature(self) -> str | None:
        return "ce"
