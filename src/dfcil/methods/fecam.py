"""FeCAM (Goswami et al., NeurIPS 2023): train the backbone on the first task only, then classify every class by the
Mahalanobis distance to its own shrunk, normalised feature covariance (docs/baselines.md, FeCAM)."""

from __future__ import annotations

from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from dfcil.compute.precision import full_precision
from dfcil.config import MethodConfig, NonNegativeFloat, NonNegativeInt, PositiveFloat, TrainConfig, configclass
from dfcil.context import Task
from dfcil.methods.base import Batch, Method, Phase, TaskContext, register_method
from dfcil.methods.memory import features_of
from dfcil.models.network import IncrementalNet, NetOutput


@configclass
class FeCAMConfig(MethodConfig):
    name: str = "fecam"
    tukey_beta: PositiveFloat = 0.5  # β of Tukey's ladder, x ↦ x^β, on features and class means (the code: 0.5)
    # How features are made non-negative before x^β (dfcil's backbones end before their last ReLU, FeCAM's after
    # it): "relu" = ReLU(f), the features FeCAM's ResNet-18 gives; "signed" = sign(f)·|f|^β on the raw features
    nonnegative: Literal["relu", "signed"] = "relu"
    shrink_diag: NonNegativeFloat = 1.0  # γ1: times the mean variance added to the diagonal (the code: 1)
    shrink_offdiag: NonNegativeFloat = 1.0  # γ2: times the mean non-zero covariance added off it (the code: 1)
    shrink_times: NonNegativeInt = 2  # shrinkage passes; the code shrinks every covariance twice


def tukey(x: Tensor, beta: float, mode: str = "relu") -> Tensor:
    """Tukey's ladder of powers, element-wise: x^β for β > 0 (FeCAM's Eq. on feature transformation).

    ``mode`` "relu": max(x, 0)^β; "signed": sign(x)·|x|^β. Any shape.
    """
    return x.clamp(min=0).pow(beta) if mode == "relu" else x.sign() * x.abs().pow(beta)


def shrink(cov: Tensor, gamma1: float = 1.0, gamma2: float = 1.0) -> Tensor:
    """Covariance shrinkage S(Σ) = Σ + γ1·V1·I + γ2·V2·(11ᵀ − I): V1 the mean of the diagonal, V2 the mean of the
    off-diagonal entries that are not exactly zero (0 if all are). (d, d) → (d, d)."""
    d = cov.shape[-1]
    eye = torch.eye(d, dtype=cov.dtype, device=cov.device)
    off = cov[~eye.bool()]
    nonzero = off[off != 0]
    v1 = cov.diagonal().mean()
    v2 = nonzero.mean() if nonzero.numel() else cov.new_zeros(())
    return cov + gamma1 * v1 * eye + gamma2 * v2 * (1 - eye)


def correlation(cov: Tensor) -> Tensor:
    """R[i, j] = Σ[i, j] / sqrt(Σ[i, i]·Σ[j, j]): the covariance normalised to unit diagonal. (d, d) → (d, d)."""
    std = cov.diagonal().sqrt()
    return cov / (std[:, None] * std[None, :])


def mahalanobis(x: Tensor, means: Tensor, precisions: Tensor) -> Tensor:
    """Squared Mahalanobis distance of every sample to every class, d_c(x) = (x − μ_c)ᵀ P_c (x − μ_c).

    Args:
        x: (B, d) samples.
        means: (C, d) class centres.
        precisions: (C, d, d) per-class (pseudo-)inverse covariances.

    Returns:
        (B, C) distances.
    """
    diff = x[:, None, :] - means[None]  # (B, C, d)
    return torch.einsum("bcd,cde,bce->bc", diff, precisions, diff)


def class_statistics(features: Tensor, cfg: FeCAMConfig) -> tuple[Tensor, Tensor]:
    """One class's FeCAM statistics from its training features (N, d), as the official code computes them.

    The centre is the mean of the features before the power (made non-negative first under "relu"), then
    transformed as a test feature is: n(μ^β), n the L2 normalisation; it is not the mean of the transformed
    features. The precision is the pseudo-inverse of the correlation matrix of the covariance of the transformed
    features, unbiased, in float64, shrunk ``cfg.shrink_times`` times.

    Returns:
        (d,) float32 centre and (d, d) float32 precision.
    """
    f, beta, mode = features.double(), cfg.tukey_beta, cfg.nonnegative
    cov = torch.cov(tukey(f, beta, mode).T)  # (d, d), divides by N − 1
    for _ in range(cfg.shrink_times):
        cov = shrink(cov, cfg.shrink_diag, cfg.shrink_offdiag)
    mean = (f.clamp(min=0) if mode == "relu" else f).mean(dim=0)
    centre = F.normalize(tukey(mean, beta, mode), dim=0)
    return centre.float(), torch.linalg.pinv(correlation(cov)).float()


@register_method(
    "fecam",
    head="cosine",
    stores="class statistics",
    scoring="task 0 is scored by its cosine head, later tasks by Mahalanobis distances to the class statistics: "
    "its forgetting compares two classifiers and can be negative",
    graph_safe=True,  # its only step, the first task's CE, replays as a CUDA graph (tests/test_graphs.py)
)
class FeCAM(Method):
    """FeCAM (Goswami et al., 2023): the first task's backbone, frozen; a Mahalanobis classifier per class.

    A cosine classifier is trained with CE on the first task; then the backbone stays fixed, and after every task
    each new class gets its statistics (:func:`class_statistics`). From the second task on a test image goes to the
    class of least Mahalanobis distance; after the first, to the cosine classifier's class."""

    Config = FeCAMConfig

    def __init__(self, cfg: FeCAMConfig, train: TrainConfig) -> None:
        super().__init__(cfg, train)
        self.means = torch.zeros(0, 0)  # (n_seen, d) transformed, normalised class centres
        self.precisions = torch.zeros(0, 0, 0)  # (n_seen, d, d) pseudo-inverse correlation matrices
        self.tasks = 0  # tasks whose classes have statistics

    def phases(self, task: Task) -> list[Phase]:
        return super().phases(task) if task.task_id == 0 else []  # no training after the first task

    def training_step(self, net: IncrementalNet, batch: Batch, ctx: TaskContext, phase: Phase) -> dict[str, Tensor]:
        return {"ce": F.cross_entropy(net(batch.x).logits.float(), batch.y)}

    @torch.no_grad()
    def on_task_end(self, ctx: TaskContext) -> None:
        feats, labels = features_of(ctx.net, ctx.data.plain())  # eval mode, the un-augmented images
        stats = [class_statistics(feats[labels == k], self.cfg) for k in range(ctx.n_old, ctx.n_seen)]
        centres, precisions = (torch.stack(s) for s in zip(*stats, strict=True))  # (n_new, d), (n_new, d, d)
        if self.tasks:  # the earlier classes' statistics stay as they are: the backbone has not changed
            centres = torch.cat([self.means.to(centres.device), centres])
            precisions = torch.cat([self.precisions.to(precisions.device), precisions])
        self.means, self.precisions, self.tasks = centres, precisions, ctx.task_id + 1

    def eval_logits(self, out: NetOutput) -> Tensor:
        if self.tasks < 2:  # one task seen: the cosine classifier decides (its scale σ is positive)
            return out.logits
        with full_precision(out.features.device.type):
            x = F.normalize(tukey(out.features.float(), self.cfg.tukey_beta, self.cfg.nonnegative), dim=1)
            return -mahalanobis(x, self.means.to(x.device), self.precisions.to(x.device))

    def eval_state(self) -> dict[str, Any]:
        return {"means": self.means, "precisions": self.precisions, "tasks": self.tasks} if self.tasks else {}

    def eval_recipe(self) -> str:
        c = self.cfg
        return (
            "after one task: net(x).logits (the cosine head); after more: z = F.normalize(dfcil.methods.fecam.tukey("
            f"net(x).features, {c.tukey_beta!r}, {c.nonnegative!r}), dim=1); scores = -dfcil.methods.fecam.mahalanobis("
            "z, state['method.means'], state['method.precisions']); the prediction is scores.argmax(1), the class "
            "of least squared Mahalanobis distance (output k as in output_names)"
        )

    def load_eval_state(self, state: dict[str, Any]) -> None:
        self.means, self.precisions, self.tasks = state["means"], state["precisions"], int(state["tasks"])

    def state_dict(self) -> dict[str, Any]:
        return self.eval_state()

    def load_state_dict(self, state: dict[str, Any], ctx: TaskContext, static: dict[str, Any] | None = None) -> None:
        empty = {
            "means": torch.zeros(0, 0),
            "precisions": torch.zeros(0, 0, 0),
            "tasks": 0,
        }  # before the first task's end
        self.load_eval_state(state or empty)
