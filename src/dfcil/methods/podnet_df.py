"""PODNet-DF: PODNet (Douillard et al., ECCV 2020) with its exemplars replaced by synthetic images from the shared
synthesizer, as the R-DFCIL paper compares against; R-DFCIL released no code for it (docs/reference.md, Baselines)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dfcil.config import Float, MethodConfig, NonNegativeFloat, NonNegativeInt, PositiveFloat, configclass
from dfcil.errors import ConfigError
from dfcil.losses.classification import balanced_class_weights, class_histogram
from dfcil.losses.podnet import nca, pod_flat, pod_spatial
from dfcil.methods.base import Batch, Phase, Task, TaskContext, register_method
from dfcil.methods.lifecycle import ReplayMethod
from dfcil.models.network import IncrementalNet
from dfcil.synthesis.inversion import InversionConfig
from dfcil.synthesis.replay import ReplayBN, student_pass, synthetic_per_step


@configclass
class PODNetDFConfig(MethodConfig):
    name: str = "podnet_df"
    lambda_c: NonNegativeFloat = 3.0  # POD-spatial, × √(n_seen/n_new) (CIFAR CNN config: 3)
    lambda_f: NonNegativeFloat = 1.0  # POD-flat, × √(n_seen/n_new)
    nca_margin: Float = 0.6  # kept for fidelity: the reference's NCA subtracts it from every logit (no effect)
    ft_epochs: NonNegativeInt = 20  # last epochs of train.epochs: balanced head finetuning (0: none)
    ft_lr: PositiveFloat = 0.05  # constant lr of the finetuning
    # BN statistics of the student's real + synthetic batch: "mixed" (one batch, shared statistics: ABD's code) or
    # "separate" (each part its own, as R-DFCIL's code; docs/reference.md, Replay BN statistics)
    replay_bn: ReplayBN = "mixed"
    # synthetic images per step: 0 = one per real image (1:1, as ABD and R-DFCIL); k > 0 = k per old class per
    # epoch, the exemplar-equivalent dose (UCIR and PODNet keep 20 exemplars per class; docs/reference.md)
    synthetic_per_class: NonNegativeInt = 0
    inversion: InversionConfig = dataclasses.field(default_factory=InversionConfig)


def kmeans(x: Tensor, k: int, generator: torch.Generator, iters: int = 20) -> Tensor:
    """k centres of the rows of ``x`` (Lloyd's algorithm from k distinct random rows; rows repeat if too few)."""
    if len(x) < k:
        x = x.repeat(math.ceil(k / len(x)), 1)
    centres = x[torch.randperm(len(x), generator=generator, device=x.device)[:k]].clone()
    for _ in range(iters):
        assign = torch.cdist(x, centres).argmin(dim=1)
        sums = torch.zeros_like(centres).index_add_(0, assign, x)
        counts = torch.zeros(k, device=x.device).index_add_(0, assign, torch.ones(len(x), device=x.device))
        centres = torch.where(counts[:, None] > 0, sums / counts.clamp(min=1)[:, None], centres)
    return centres


@register_method(
    "podnet_df",
    graph_safe=True,  # its step replays as a CUDA graph (checked by tests/test_graphs.py)
    head="lsc",
    grad_clip_value=5.0,  # PODNet clamps every gradient to [-5, 5]
    stores="synthesizer per task",
)
class PODNetDF(ReplayMethod):
    """PODNet-DF: PODNet (Douillard et al., 2020) with synthetic instead of stored exemplars.

    LSC classifier with NCA loss, POD-spatial on stage outputs and POD-flat on features against the old model,
    on real + synthetic data; new proxies imprinted by k-means; then class-balanced head finetuning."""

    Config = PODNetDFConfig

    def __init__(self, cfg: PODNetDFConfig, train) -> None:
        super().__init__(cfg, train)
        if cfg.ft_epochs >= train.epochs:
            raise ConfigError(
                f"method.ft_epochs ({cfg.ft_epochs}) must be smaller than train.epochs ({train.epochs}): train.epochs "
                f"counts the main and the finetuning epochs together; lower method.ft_epochs or raise train.epochs"
            )
        self.class_counts: Tensor | None = None  # real + pseudo-labels per seen class, for the finetuning

    def phases(self, task: Task) -> list[Phase]:
        c, t = self.cfg, self.train
        main = Phase.from_train("train", t, epochs=t.epochs - c.ft_epochs)
        if task.task_id == 0 or not c.ft_epochs:
            return [main]
        # PODNet's finetuning builds a new optimiser over the classifier's weights (not η, which it keeps apart)
        ft = {"epochs": c.ft_epochs, "lr": c.ft_lr, "milestones": (), "trainable": "head", "reset_optimizer": True}
        return [main, Phase.from_train("ft", t, **ft)]

    @torch.no_grad()
    def _imprint(self, ctx: TaskContext) -> None:
        """New proxies: k-means centres of each new class's normalised features times the old proxies' mean norm
        (as PODNet: the centres are not normalised again, so their norms are at most the old mean norm)."""
        net, head = ctx.net, ctx.net.head
        net.eval()
        feats = [[] for _ in range(ctx.n_new)]
        for x, y in ctx.data.plain():
            f = F.normalize(net(x).features.float(), dim=1)
            for c in range(ctx.n_new):
                feats[c].append(f[y == ctx.n_old + c])
        old_norm = head.weight()[: ctx.n_old * head.rows_per_class].norm(dim=1).mean()
        k = head.rows_per_class
        proxies = [kmeans(torch.cat(f), k, ctx.rng) for f in feats]
        head.blocks[-1].weight.copy_(torch.cat(proxies) * old_norm)
        net.train()

    def on_task_start(self, ctx: TaskContext) -> None:
        if ctx.task_id > 0:
            self._imprint(ctx)
            self.class_counts = torch.zeros(ctx.n_seen, device=ctx.device)
        super().on_task_start(ctx)  # then the old model's snapshot and the generator

    def on_task_end(self, ctx: TaskContext) -> None:
        super().on_task_end(ctx)
        self.class_counts = None

    def frozen(self, ctx: TaskContext, phase: Phase) -> list[nn.Module | nn.Parameter]:
        if ctx.task_id == 0:
            return []
        if phase.name == "ft":  # every proxy is finetuned, η is not
            return [ctx.net.head.eta]
        return list(ctx.net.head.blocks)[:-1]  # old proxies stay fixed

    def training_step(self, net: IncrementalNet, batch: Batch, ctx: TaskContext, phase: Phase) -> dict[str, Tensor]:
        c = self.cfg
        if ctx.task_id == 0:
            return {"nca": nca(net(batch.x).logits, batch.y, margin=c.nca_margin)}
        b = len(batch.x)
        x_syn = self.replay.generate(synthetic_per_step(c.synthetic_per_class, ctx, b))  # synthetic "exemplars"
        with torch.no_grad():
            t = self.teacher(torch.cat([batch.x, x_syn]))
        y = torch.cat([batch.y, t.logits[b:].argmax(dim=1)])
        out = student_pass(net, batch.x, x_syn, c.replay_bn, ctx.runtime.merge_student, fmaps=True)
        if phase.name == "ft":  # balanced finetuning: reweight the classes instead of undersampling exemplars
            weights = balanced_class_weights(self.class_counts)
            return {"nca": nca(out.logits, y, margin=c.nca_margin, class_weight=weights)}
        self.class_counts += class_histogram(y, ctx.n_seen)
        factor = math.sqrt(ctx.n_seen / ctx.n_new)
        return {
            "nca": nca(out.logits, y, margin=c.nca_margin),
            "pod_spatial": c.lambda_c * factor * pod_spatial(out.fmaps, t.fmaps),
            "pod_flat": c.lambda_f * factor * pod_flat(out.features, t.features),
        }

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        return state | {"class_counts": self.class_counts} if self.class_counts is not None else state

    def load_state_dict(self, state: dict[str, Any], ctx: TaskContext, static: dict[str, Any] | None = None) -> None:
        super().load_state_dict(state, ctx, static)
        counts = state.get("class_counts")
        self.class_counts = counts.to(ctx.device) if counts is not None else None
