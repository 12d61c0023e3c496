"""R-DFCIL+: R-DFCIL with per-class Gaussian feature statistics, drift-compensated between tasks and replayed as
sampled features in the head refinement (docs/rdfcil-plus.md). dfcil's own combination of R-DFCIL with EFC++'s
prototype re-balancing and LDC's drift compensation; each addition is a switch, for the ablation table."""

from __future__ import annotations

import dataclasses
from typing import Literal

import torch.nn.functional as F
from torch import Tensor

from dfcil.config import NonNegativeFloat, configclass
from dfcil.errors import ConfigError
from dfcil.losses.prototypes import balanced_labels, sample_gaussians
from dfcil.methods.base import Batch, Phase, TaskContext, register_method
from dfcil.methods.memory import ClassMemory, DriftConfig, NearestMeanClassifier, linear_drift
from dfcil.methods.rdfcil import RDFCIL, RDFCILConfig
from dfcil.models.network import IncrementalNet


@configclass
class RDFCILPlusConfig(RDFCILConfig):
    name: str = "rdfcil_plus"
    # CHR also trains the head on features sampled from the old classes' Gaussians N(μ_c, Σ_c + 1e-5·I), class-
    # uniform, replay_ratio per real image, with a plain CE over the seen classes weighted lambda_replay
    replay: bool = True
    replay_ratio: NonNegativeFloat = 1.0
    lambda_replay: NonNegativeFloat = 0.5
    # drift of the stored statistics at the end of each RRL (kind "none": they stay where they were computed): the
    # closed-form least-squares map on one augmented pass of feature pairs by default, which moves stored means
    # closer to the true ones than LDC's Adam fit at a fraction of its cost (docs/rdfcil-plus.md, measured)
    drift: DriftConfig = dataclasses.field(default_factory=lambda: DriftConfig(kind="lstsq", passes=1))
    # which classifier evaluates: the refined head ("head") or nearest class mean on the statistics ("ncm")
    classifier: Literal["head", "ncm"] = "head"


@register_method(
    "rdfcil_plus",
    stores="class statistics",  # and, as R-DFCIL, a synthesizer per task, dropped after it
    static_head=False,  # the replayed features go through the growing head
    distributed=False,  # the statistics are computed by one process
    graph_safe=True,  # its step replays as a CUDA graph (checked by tests/test_graphs.py)
)
class RDFCILPlus(RDFCIL):
    """R-DFCIL+ (dfcil's): R-DFCIL plus class Gaussians, moved with the features and replayed to the head in CHR.

    A Gaussian per class (mean and covariance of one augmented pass of its images, after its task) is moved into
    each new feature space at the end of RRL, and replayed as sampled features to the head during CHR."""

    Config = RDFCILPlusConfig

    def __init__(self, cfg: RDFCILPlusConfig, train) -> None:
        if cfg.ldc:
            raise ConfigError(
                "method.ldc is R-DFCIL's nearest-mean switch; rdfcil_plus keeps class statistics always: drop "
                "method.ldc and set method.classifier ncm to classify by the means"
            )
        if cfg.chr_epochs == 0 and cfg.replay and cfg.classifier == "head":
            raise ConfigError(
                "rdfcil_plus replays its class statistics in CHR, and method.chr_epochs is 0: they would never be "
                "used. Give CHR epochs, classify by the means (method.classifier: ncm), or train rdfcil"
            )
        super().__init__(cfg, train)
        self.classifier = NearestMeanClassifier(self.memory) if cfg.classifier == "ncm" else None

    def build_memory(self, cfg: RDFCILPlusConfig) -> ClassMemory:
        return ClassMemory(linear_drift(cfg.drift), covariances=True, augmented=True)  # Gaussians, always

    def training_step(self, net: IncrementalNet, batch: Batch, ctx: TaskContext, phase: Phase) -> dict[str, Tensor]:
        terms = super().training_step(net, batch, ctx, phase)
        c, memory = self.cfg, self.memory
        n = round(c.replay_ratio * len(batch.x))
        if phase.name == "chr" and c.replay and n and len(memory):  # the old classes' Gaussians, class-uniform
            labels = balanced_labels(ctx.n_old, n, ctx.rng, ctx.device)
            z = sample_gaussians(memory.means.to(ctx.device), memory.factors.to(ctx.device), labels, ctx.rng)
            terms["replay"] = c.lambda_replay * F.cross_entropy(net.head(z).float(), labels)
        return terms
