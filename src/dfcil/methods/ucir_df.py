"""UCIR-DF: UCIR (Hou et al., CVPR 2019) with its exemplars replaced by synthetic images from the shared
synthesizer, as the R-DFCIL paper compares against; R-DFCIL released no code for it (docs/reference.md, Baselines)."""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dfcil.config import MethodConfig, NonNegativeFloat, NonNegativeInt, PositiveInt, configclass
from dfcil.losses.ucir import less_forget, margin_ranking
from dfcil.methods.base import Batch, Phase, TaskContext, register_method
from dfcil.methods.lifecycle import ReplayMethod
from dfcil.models.network import IncrementalNet
from dfcil.synthesis.inversion import InversionConfig
from dfcil.synthesis.replay import ReplayBN, student_pass, synthetic_per_step


@configclass
class UCIRDFConfig(MethodConfig):
    name: str = "ucir_df"
    lambda_base: NonNegativeFloat = 5.0  # less-forget weight λ_base; λ = λ_base·√(n_old/n_new) (CIFAR: 5)
    margin: NonNegativeFloat = 0.5  # margin ranking m
    hard_negatives: PositiveInt = 2  # K new-class scores per old-class sample
    # BN statistics of the student's real + synthetic batch: "mixed" (one batch, shared statistics: ABD's code) or
    # "separate" (each part its own, as R-DFCIL's code; docs/reference.md, Replay BN statistics)
    replay_bn: ReplayBN = "mixed"
    # synthetic images per step: 0 = one per real image (1:1, as ABD and R-DFCIL); k > 0 = k per old class per
    # epoch, the exemplar-equivalent dose (UCIR and PODNet keep 20 exemplars per class; docs/reference.md)
    synthetic_per_class: NonNegativeInt = 0
    inversion: InversionConfig = dataclasses.field(default_factory=InversionConfig)


@torch.no_grad()
def class_mean_features(net: IncrementalNet, ctx: TaskContext) -> Tensor:
    """(n_new, d) mean of the L2-normalised features of each new class's training images (eval mode)."""
    was_training = net.training
    net.eval()
    sums = torch.zeros(ctx.n_new, net.feature_dim, device=ctx.device)
    for x, y in ctx.data.plain():
        sums.index_add_(0, y - ctx.n_old, F.normalize(net(x).features.float(), dim=1))
    net.train(was_training)
    return sums


@register_method(
    "ucir_df",
    graph_safe=True,  # its step replays as a CUDA graph (checked by tests/test_graphs.py)
    head="cosine",
    stores="synthesizer per task",
)
class UCIRDF(ReplayMethod):
    """UCIR-DF: UCIR (Hou et al., 2019) with synthetic instead of stored exemplars.

    Cosine classifier; CE over the seen classes on real + synthetic data, less-forget constraint on the features,
    margin ranking on the synthetic (old-class) samples; new weights imprinted, old weights frozen."""

    Config = UCIRDFConfig

    def on_task_start(self, ctx: TaskContext) -> None:
        if ctx.task_id > 0:  # imprint the new classes' weights: their mean features, at the old weights' mean norm
            head = ctx.net.head
            old_norm = head.weight()[: ctx.n_old].norm(dim=1).mean()
            means = F.normalize(class_mean_features(ctx.net, ctx), dim=1)
            with torch.no_grad():
                head.blocks[-1].weight.copy_(means * old_norm)
        super().on_task_start(ctx)  # then the old model's snapshot and the generator

    def frozen(self, ctx: TaskContext, phase: Phase) -> list[nn.Module | nn.Parameter]:
        return list(ctx.net.head.blocks)[:-1] if ctx.task_id > 0 else []  # old class weights stay fixed

    def training_step(self, net: IncrementalNet, batch: Batch, ctx: TaskContext, phase: Phase) -> dict[str, Tensor]:
        if ctx.task_id == 0:
            return {"ce": F.cross_entropy(net(batch.x).logits.float(), batch.y)}
        c, b, n_old = self.cfg, len(batch.x), ctx.n_old
        x_syn = self.replay.generate(synthetic_per_step(c.synthetic_per_class, ctx, b))  # synthetic "exemplars"
        with torch.no_grad():
            t = self.teacher(torch.cat([batch.x, x_syn]))
        y = torch.cat([batch.y, t.logits[b:].argmax(dim=1)])
        out = student_pass(net, batch.x, x_syn, c.replay_bn, ctx.runtime.merge_student)
        lam = c.lambda_base * math.sqrt(n_old / ctx.n_new)
        cosine = net.head.cosine(out.features)
        return {
            "ce": F.cross_entropy(out.logits.float(), y),
            "less_forget": lam * less_forget(out.features, t.features),
            "margin": margin_ranking(cosine, y, n_old, c.hard_negatives, c.margin),
        }
