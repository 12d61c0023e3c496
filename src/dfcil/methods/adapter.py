"""AdaGauss's parts (Rypeść et al., NeurIPS 2024; docs/baselines.md, AdaGauss), each usable by any method that keeps
a :class:`~dfcil.methods.memory.ClassMemory` with covariances:

* :class:`AdapterDrift`, a :class:`~dfcil.methods.memory.Drift`: an MLP adapter from the old model's features to
  the new model's, trained on the task's images (MSE plus the anti-collapse term on its outputs); every stored
  Gaussian is then sampled, the samples pushed through the adapter, and the class's mean and covariance
  re-estimated from them;
* :class:`BayesClassifier`: classification by the least Mahalanobis distance to each class's Gaussian, its
  covariance shrunk (and, with normalised features, turned into a correlation matrix).

The maths is in :mod:`dfcil.losses.adagauss`.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dfcil.compute.precision import full_precision
from dfcil.config import NonNegativeFloat, PositiveFloat, PositiveInt, configclass
from dfcil.context import TaskContext
from dfcil.losses.adagauss import anti_collapse, bayes_log_likelihood, bayes_precisions, pushed_gaussians
from dfcil.losses.prototypes import map_errors
from dfcil.methods.memory import ClassMemory, check_fit
from dfcil.models.network import NetOutput
from dfcil.progress import ProgressLog


def mlp(d: int, hidden: int, device: torch.device | str, rng: torch.Generator | None = None) -> nn.Sequential:
    """AdaGauss's distiller and adapter: Linear(d, hidden), GELU, Linear(hidden, d), each layer initialised as
    nn.Linear's default, U(−1/√fan_in, 1/√fan_in) for weight and bias, drawn from ``rng`` (the method's stream); with
    ``rng`` None left uninitialised (to load a saved state into: nothing drawn from any stream)."""
    net = nn.Sequential(
        nn.utils.skip_init(nn.Linear, d, hidden, device=device),
        nn.GELU(),
        nn.utils.skip_init(nn.Linear, hidden, d, device=device),
    )
    if rng is None:
        return net
    with torch.no_grad():
        for layer in (net[0], net[2]):
            bound = 1 / math.sqrt(layer.in_features)
            for p in layer.parameters():
                p.copy_((torch.rand(p.shape, generator=rng, device=device) * 2 - 1) * bound)
    return net


@configclass
class AdapterConfig:
    """The adapter's fit after each task (the authors' ``adapt_distributions`` and ``get_adapter_optimizer``)."""

    multiplier: PositiveInt = 32  # hidden width = multiplier × d (the authors' --multiplier 32: 2048 at d = 64)
    epochs: PositiveInt = 100  # the authors': nepochs // 2
    lr: PositiveFloat = 0.01  # SGD, the authors' --lr-adapter
    momentum: NonNegativeFloat = 0.9
    weight_decay: NonNegativeFloat = 0.0005
    milestones: tuple[PositiveInt, ...] = (30, 60, 90)  # lr × gamma at these epochs
    gamma: PositiveFloat = 0.1
    batch_size: PositiveInt = 256  # the task's loader's, last incomplete batch dropped
    clip: PositiveFloat = 1.0  # gradient-norm clipping of every step
    # augmented passes of feature pairs; epoch e uses pass e mod passes. The authors draw fresh augmentations every
    # epoch (passes = epochs); fewer passes cost fewer forward passes and less memory
    passes: PositiveInt = 100
    samples: PositiveInt = 10000  # N: samples of each Gaussian pushed through the adapter


ADAPTER_FIX = (
    "It moves the stored Gaussians off their classes (old-class accuracy can fall to 0): raise "
    "method.adapter.epochs (the authors': 100; the fit runs on stored feature pairs, so epochs are cheap)"
)


class AdapterDrift:
    """AdaGauss's adaptation of the stored Gaussians, as a :class:`~dfcil.methods.memory.Drift`.

    A fresh MLP adapter a (d → multiplier·d → d, GELU) is fitted with SGD on the feature pairs (old model's, new
    model's) of the task's augmented images, loss MSE(a(f_old), f_new) + α·anti_collapse(a(f_old), β); then each
    class's Gaussian N(μ_c, Σ_c) gives ``samples`` points whose images under a re-estimate μ_c and Σ_c. The adapter
    is used once and dropped (the authors build one per task), so it has no state to save.

    Args:
        cfg: the fit.
        alpha: the anti-collapse term's weight (the authors' --alpha, 1); beta: its clamp (--beta, 1).
    """

    synthetic = False

    def __init__(self, cfg: AdapterConfig, alpha: float = 1.0, beta: float = 1.0) -> None:
        self.cfg, self.alpha, self.beta = cfg, alpha, beta
        self.passes = cfg.passes

    def fit(self, pairs: list[tuple[Tensor, Tensor]], rng: torch.Generator, desc: str) -> nn.Module:
        """The adapter, trained on ``pairs`` (epoch e on pass e mod len(pairs)); returned in eval mode."""
        c = self.cfg
        d, device = pairs[0][0].shape[1], pairs[0][0].device
        adapter = mlp(d, c.multiplier * d, device, rng)
        opt = torch.optim.SGD(adapter.parameters(), lr=c.lr, momentum=c.momentum, weight_decay=c.weight_decay)
        lines = ProgressLog(f"{desc} adapter fit", c.epochs, parts=min(c.epochs, 5))
        adapter.train()
        for epoch in range(c.epochs):
            for group in opt.param_groups:
                group["lr"] = c.lr * c.gamma ** sum(epoch >= m for m in c.milestones)
            old, new = pairs[epoch % len(pairs)]
            order = torch.randperm(len(old), generator=rng, device=device)
            batch = min(c.batch_size, len(old))
            total, steps = 0.0, 0
            for i in range(0, len(old) - batch + 1, batch):  # the last incomplete batch dropped
                idx = order[i : i + batch]
                out = adapter(old[idx].float())
                loss = F.mse_loss(out, new[idx].float())
                if self.alpha > 0:
                    loss = loss + self.alpha * anti_collapse(out, self.beta)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                nn.utils.clip_grad_norm_(adapter.parameters(), c.clip)
                opt.step()
                total, steps = total + float(loss.detach()), steps + 1
            if lines.due(epoch + 1):
                lines.log(epoch + 1, {"loss": total / max(steps, 1)})
        adapter.eval()
        with torch.no_grad():  # the fit on its last pass, against the least-squares linear map and no move
            errors = map_errors(*pairs[(c.epochs - 1) % len(pairs)], adapter)
        check_fit(errors, desc, "AdaGauss's adapter fit", ADAPTER_FIX, bar="in place")
        return adapter

    def move(
        self, means: Tensor, covs: Tensor | None, pairs: list[tuple[Tensor, Tensor]], rng: torch.Generator, desc: str
    ) -> tuple[Tensor, Tensor | None]:
        if covs is None:
            raise ValueError(f"{desc}: the adapter drift samples each class's Gaussian: a ClassMemory with covariances")
        with torch.enable_grad():  # ClassMemory.compensate runs under no_grad
            adapter = self.fit(pairs, rng, desc)
        with torch.no_grad():
            return pushed_gaussians(means, covs, adapter, self.cfg.samples, rng)


class BayesClassifier:
    """AdaGauss's Bayes classifier: the class of least squared Mahalanobis distance (x − μ_c)ᵀ P_c (x − μ_c), P_c
    from :func:`~dfcil.losses.adagauss.bayes_precisions`; with ``normalize``, x and μ_c L2-normalised first (the
    authors' --normalize). No log-determinant or prior term: the authors' "bayes" is this distance alone.

    ``offdiag`` and ``pseudo_inverse`` make it APR's Mahalanobis classifier (FeCAM's shrinkage Σ + γV₁I +
    γ₂V₂(𝟙𝟙ᵀ − I) once, γ = γ₂ = 24 on CIFAR-100, the pseudo-inverse of the correlation matrix); AdaGauss: 0, False.

    A component (saved at every checkpoint) and a classifier (what the method scores with at evaluation); call
    :meth:`refresh` after the memory changed."""

    def __init__(
        self, shrinkage: float = 3.0, normalize: bool = True, offdiag: float = 0.0, pseudo_inverse: bool = False
    ) -> None:
        self.shrinkage, self.normalize = shrinkage, normalize
        self.offdiag, self.pseudo_inverse = offdiag, pseudo_inverse
        self.means = torch.zeros(0, 0)  # (n_seen, d)
        self.precisions = torch.zeros(0, 0, 0)  # (n_seen, d, d)

    @torch.no_grad()
    def refresh(self, memory: ClassMemory) -> None:
        if memory.covs is None:
            raise ValueError("the Bayes classifier needs every class's covariance (a ClassMemory with them)")
        self.means = memory.means.clone()
        self.precisions = bayes_precisions(
            memory.covs, self.shrinkage, self.normalize, self.offdiag, self.pseudo_inverse
        )

    def scores(self, out: NetOutput) -> Tensor | None:
        """(B, n_seen) negated distances; None before any class has statistics."""
        if not len(self.means):
            return None
        with full_precision(out.features.device.type):
            x, mu = out.features.float(), self.means.to(out.features.device)
            if self.normalize:
                x, mu = F.normalize(x, dim=1), F.normalize(mu, dim=1)
            return bayes_log_likelihood(x, mu, self.precisions.to(x.device))

    def eval_state(self) -> dict[str, Any]:
        return {"means": self.means, "precisions": self.precisions} if len(self.means) else {}

    def recipe(self) -> str:
        norm = "F.normalize(·, dim=1) of both " if self.normalize else ""
        return (
            f"f = net(x).features and mu = state['method.means'] ({norm}then) scores = "
            "dfcil.losses.adagauss.bayes_log_likelihood(f, mu, state['method.precisions']); the prediction is "
            "scores.argmax(1), the class of least squared Mahalanobis distance (output k as in output_names)"
        )

    def load_eval_state(self, state: dict[str, Any]) -> None:
        if "means" in state:
            self.means, self.precisions = state["means"], state["precisions"]

    def state_dict(self) -> dict[str, Any]:
        return self.eval_state()

    def static_state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any], ctx: TaskContext | None = None, static: Any = None) -> None:
        device = ctx.device if ctx is not None else None
        self.means = state.get("means", torch.zeros(0, 0))
        self.precisions = state.get("precisions", torch.zeros(0, 0, 0))
        if device is not None:
            self.means, self.precisions = self.means.to(device), self.precisions.to(device)
