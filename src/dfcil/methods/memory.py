"""Per-class feature statistics kept across tasks, and their drift compensation: LDC's learnable drift compensation
(Gomez-Villa et al., ECCV 2024) as a switch of LwF and R-DFCIL, and the class Gaussians of R-DFCIL+
(docs/baselines.md, LDC; docs/rdfcil-plus.md).

After a task's backbone training, the old model's and the new model's features of the task's own images (both in
eval mode) fit a linear map P with P·f_old ≈ f_new; every stored class mean moves through it (μ ← Pμ; with
covariances, Σ ← PΣPᵀ, our extension). At the task's end the new classes' statistics are computed with the final
backbone. Classification by nearest class mean on the unit sphere (LDC) reads them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Literal

import torch
from torch import Tensor

from dfcil.config import PositiveFloat, PositiveInt, configclass
from dfcil.context import TaskContext
from dfcil.errors import ConfigError
from dfcil.losses.prototypes import (
    class_gaussians,
    fit_projector,
    gaussian_factors,
    lstsq_projector,
    ncm_scores,
    project_statistics,
)
from dfcil.models.network import IncrementalNet


@configclass
class DriftConfig:
    """How stored class statistics follow the backbone from one task to the next."""

    # "ldc": LDC's projector, a bias-free linear map trained with Adam on the MSE; "lstsq": the same map in closed
    # form (ridge least squares, one solve); "none": statistics stay where they were computed
    kind: Literal["ldc", "lstsq", "none"] = "ldc"
    epochs: PositiveInt = 20  # LDC: 20 Adam epochs
    lr: PositiveFloat = 0.001  # LDC: Adam lr 1e-3
    batch_size: PositiveInt = 128  # LDC: 128
    # augmented passes over the task's images that give feature pairs; the fit's epoch e uses pass e mod passes.
    # LDC draws fresh augmentations every epoch (passes = epochs); fewer passes cost fewer forward passes
    passes: PositiveInt = 20
    ridge: PositiveFloat = 0.001  # lstsq: ridge, relative to the mean eigenvalue of the old features' Gram matrix
    # also fit the map on synthetic images of the old classes (methods with a generator; R-DFCIL+): the task's own
    # images only show how the new classes' region moved
    synthetic: bool = False


def check_drift_used(drift: DriftConfig, ldc: bool, generator: bool) -> None:
    """Refuse ``method.drift`` settings that a method would ignore: any, without the ``ldc`` switch that keeps
    class means to move; ``synthetic`` on a method with no generator to draw images from."""
    if not ldc and drift != DriftConfig():
        raise ConfigError(
            "method.drift sets how LDC moves the stored class means, and method.ldc is false, so there are none: "
            "set method.ldc: true, or drop method.drift"
        )
    if drift.synthetic and not generator:
        raise ConfigError(
            "method.drift.synthetic fits the drift on synthetic images too, and this method has no generator to "
            "draw them: drop method.drift.synthetic (rdfcil and rdfcil_plus have one)"
        )


class ClassMemory:
    """Per-class feature means (and covariances) of every class seen so far, in the current feature space.

    A component of its method (:meth:`dfcil.methods.Method.components`): saved at every checkpoint, with the task
    whose drift it last compensated so that a resumed run does not compensate twice.
    """

    def __init__(self, drift: DriftConfig, covariances: bool, augmented: bool) -> None:
        self.drift = drift
        self.covariances = covariances  # keep a covariance per class (Gaussian replay), not only a mean
        self.augmented = augmented  # statistics of one augmented pass (EFC) or of the plain images (LDC)
        self.means = torch.zeros(0, 0)  # (n_classes, d)
        self.covs: Tensor | None = None  # (n_classes, d, d) when covariances
        self.factors: Tensor | None = None  # Cholesky factors of covs + 1e-5·I, derived, for sampling
        self.compensated = -1  # the last task whose drift moved the statistics

    def __len__(self) -> int:
        return len(self.means)

    # -- the task's work -------------------------------------------------------------------------------------

    @torch.no_grad()
    def add_classes(self, ctx: TaskContext) -> None:
        """The statistics of the task's classes, from the network as it is now, in eval mode."""
        feats, labels = features_of(ctx.net, self._images(ctx))
        means, covs = class_gaussians(feats, labels, range(ctx.n_old, ctx.n_seen))
        device = means.device
        self.means = torch.cat([self.means.to(device), means]) if len(self) else means
        if self.covariances:
            self.covs = torch.cat([self.covs.to(device), covs]) if self.covs is not None else covs
            self.factors = gaussian_factors(self.covs)

    @torch.no_grad()
    def compensate(self, ctx: TaskContext, old: IncrementalNet, synthetic: Callable[[int], Tensor] | None) -> None:
        """Move the stored statistics into the current feature space (once per task; again after a resume does
        nothing). ``old``: the frozen old model; ``synthetic(n)``: n synthetic images, used when
        ``drift.synthetic``."""
        d = self.drift
        if ctx.task_id <= self.compensated or not len(self) or d.kind == "none":
            return
        pairs = []
        for _ in range(d.passes if d.kind == "ldc" else 1):
            batches = list(ctx.data)  # one augmented pass (full batches, shuffled)
            if d.synthetic and synthetic is not None:
                batches += [(synthetic(len(x)), None) for x, _ in batches]
            old_f, _ = features_of(old, batches)
            new_f, _ = features_of(ctx.net, batches)
            pairs.append((old_f, new_f))
        if d.kind == "ldc":
            projector = fit_projector(pairs, d.epochs, d.lr, d.batch_size, ctx.rng)
        else:
            projector = lstsq_projector(pairs[0][0], pairs[0][1], d.ridge)
        self.means, self.covs = project_statistics(self.means, self.covs, projector.to(self.means.device))
        if self.covs is not None:
            self.factors = gaussian_factors(self.covs)
        self.compensated = ctx.task_id

    def ncm(self, features: Tensor) -> Tensor:
        """Nearest-class-mean scores (B, n_classes) of ``features`` (LDC's classifier)."""
        return ncm_scores(features, self.means.to(features.device))

    def _images(self, ctx: TaskContext) -> Iterator[tuple[Tensor, Tensor]]:
        return iter(ctx.data) if self.augmented else ctx.data.plain()

    # -- state -----------------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        if not len(self):
            return {}
        state = {"means": self.means, "compensated": self.compensated}
        return state | ({"covs": self.covs} if self.covs is not None else {})

    def static_state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any], ctx: TaskContext | None = None, static: Any = None) -> None:
        self.means = state.get("means", torch.zeros(0, 0))
        self.covs = state.get("covs")
        self.factors = gaussian_factors(self.covs) if self.covs is not None else None
        self.compensated = int(state.get("compensated", -1))


@torch.no_grad()
def features_of(net: IncrementalNet, batches: Any) -> tuple[Tensor, Tensor | None]:
    """The pooled features (N, d) of ``batches`` of (images, labels or None) under ``net`` in eval mode (its mode
    restored after), with the labels concatenated where every batch has them."""
    was_training = net.training
    net.eval()
    feats, labels = [], []
    for x, y in batches:
        feats.append(net(x).features.float())
        labels.append(y)
    net.train(was_training)
    return torch.cat(feats), (torch.cat(labels) if all(y is not None for y in labels) else None)


class NCMClassifier:
    """What a method that classifies by nearest class mean adds to itself (LwF and R-DFCIL with ``ldc``): the
    memory as a component, NCM scores at evaluation, and the means in ``model.pt`` for ``dfcil eval``. The method
    sets ``self.memory`` (a :class:`ClassMemory` or None) and ``self.classify_by_means`` in its ``__init__``."""

    memory: ClassMemory | None
    classify_by_means: bool

    def components(self) -> dict[str, Any]:
        return super().components() | ({"memory": self.memory} if self.memory is not None else {})

    def eval_logits(self, out: Any) -> Tensor:
        if self.classify_by_means and self.memory is not None and len(self.memory):
            return self.memory.ncm(out.features)
        return super().eval_logits(out)

    def eval_state(self) -> dict[str, Any]:
        return {"means": self.memory.means} if self.classify_by_means and self.memory is not None else {}

    def load_eval_state(self, state: dict[str, Any]) -> None:
        if self.memory is not None and "means" in state:
            self.memory.means = state["means"]
