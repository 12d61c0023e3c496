"""DPCR's parts (He et al., ICML 2025), each usable by any method that keeps a :class:`ClassMemory` with
covariances: the dual-projection :class:`DualProjectionDrift` (a :class:`~dfcil.methods.memory.Drift`: a task-wise
ridge map of old features onto new ones, restricted per class to the row space of the class's features) and the
:class:`RidgeClassifier`, a closed-form ridge-regression head rebuilt from every class's statistics after each task
(docs/baselines.md, DPCR). The maths is in :mod:`dfcil.losses.dpcr`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from dfcil.compute.precision import full_precision
from dfcil.context import TaskContext
from dfcil.losses.dpcr import class_maps, gram_of, move_statistics, ridge_head, row_space_projector, task_map
from dfcil.losses.prototypes import lstsq_projector
from dfcil.methods.memory import ClassMemory
from dfcil.models.network import NetOutput


class DualProjectionDrift:
    """DPCR's shift estimation, as a :class:`~dfcil.methods.memory.Drift`: from one pass of feature pairs, the
    task-wise map A (old·A ≈ new, ridge ``ridge``); per class c, W_c = A·U_cU_cᵀ with U_cU_cᵀ the projector onto the
    row space of the class's features (of Φ_c = X_cᵀX_c, singular values above ``tol`` times the largest); then
    μ_c ← μ_c·W_c and Σ_c ← W_cᵀΣ_cW_c, which is Φ_c ← W_cᵀΦ_cW_c for the Gram matrix the class's statistics give.
    The projector is recomputed from the statistics at every move, so from the moved Φ_c (as the authors' code).

    Args:
        ridge: the task-wise map's ridge, absolute (the authors' ``rg_tssp``, 1e-9).
        tol: relative threshold of the class projector's singular values (0: the authors' ``S > 0``).
        task: apply the task-wise map (False: A = I).
        classwise: apply the class-wise projection (False: W_c = A).
        counts: the classes' sample counts n_c, for Φ_c = (n_c − 1)·Σ_c + n_c·μ_cᵀμ_c; None: Σ_c + μ_cᵀμ_c, which has
            the same row space (a sum of two positive semi-definite matrices spans the sum of their ranges).
        relative: ``ridge`` is relative to the mean eigenvalue of the old features' Gram matrix, as the closed-form
            map of :func:`~dfcil.losses.prototypes.lstsq_projector` takes it (R-DFCIL+'s ``drift.kind: dual``), not
            absolute (DPCR's).
        synthetic: the pairs include synthetic images of the old classes (:class:`~dfcil.methods.memory.Drift`).
    """

    passes = 1

    def __init__(
        self,
        ridge: float = 1e-9,
        tol: float = 0.0,
        task: bool = True,
        classwise: bool = True,
        counts: Callable[[], Tensor] | None = None,
        relative: bool = False,
        synthetic: bool = False,
    ) -> None:
        self.ridge, self.tol, self.task, self.classwise, self.counts = ridge, tol, task, classwise, counts
        self.relative, self.synthetic = relative, synthetic

    def move(
        self, means: Tensor, covs: Tensor | None, pairs: list[tuple[Tensor, Tensor]], rng: torch.Generator, desc: str
    ) -> tuple[Tensor, Tensor | None]:
        if covs is None:
            raise ValueError(f"{desc}: the dual projection needs every class's covariance (a ClassMemory with them)")
        old, new = pairs[0]
        d, n = means.shape[1], len(means)
        eye = torch.eye(d, device=means.device)
        if not self.task:
            a = eye
        elif self.relative:  # old·A ≈ new: A = Pᵀ of the closed-form map P·f_old ≈ f_new
            a = lstsq_projector(old, new, self.ridge).T.to(means.device)
        else:
            a = task_map(old, new, self.ridge).to(means.device)
        if self.classwise:
            if self.counts is not None:
                grams = gram_of(means, covs, self.counts()[:n].to(means.device))
            else:
                grams = covs + means[:, :, None] * means[:, None, :]
            maps = class_maps(a, row_space_projector(grams, self.tol))
        else:
            maps = a.expand(n, d, d)
        return move_statistics(means, covs, maps)


class RidgeClassifier:
    """DPCR's classifier reconstruction: a bias-free head W (d, n_seen), logits f·W, solved in closed form after each
    task from the Gram matrices and label products of every class, W = (Σ_c Φ_c + γI)⁻¹ Q, each class column
    L2-normalised (``normalize``). The old classes enter with the (moved) statistics of a :class:`ClassMemory` and
    their counts, Φ_c = (n_c − 1)Σ_c + n_cμ_cᵀμ_c and Q's column n_cμ_cᵀ; the task's classes with the features of a
    pass over their images (the authors': one augmented pass). A component (saved at every checkpoint) and a
    classifier (what the method scores with at evaluation)."""

    def __init__(self, gamma: float, normalize: bool = True) -> None:
        self.gamma, self.normalize = gamma, normalize
        self.weight = torch.zeros(0, 0)  # (d, n_seen)
        self.counts = torch.zeros(0, dtype=torch.long)  # (n_seen,) training images of each class

    def add_counts(self, labels: Tensor, classes: range) -> None:
        """Record the image counts of ``classes`` from their labels (N,)."""
        new = torch.bincount(labels.cpu(), minlength=classes.stop)[classes.start : classes.stop]
        self.counts = torch.cat([self.counts, new])

    @torch.no_grad()
    def fit(self, memory: ClassMemory, n_old: int, features: Tensor, labels: Tensor, n_seen: int) -> None:
        """Solve the head over the first ``n_old`` classes of ``memory`` and the classes of ``features`` (N, d) with
        ``labels`` (N,) in [n_old, n_seen)."""
        f = features.double()
        gram, targets = f.T @ f, f.T @ F.one_hot(labels, n_seen).double()  # (d, d), (d, n_seen)
        if n_old:
            counts = self.counts[:n_old].to(f.device)
            means, covs = memory.means[:n_old].to(f.device), memory.covs[:n_old].to(f.device)
            gram = gram + gram_of(means, covs, counts).double().sum(0)
            targets[:, :n_old] += (counts[:, None].double() * means.double()).T
        self.weight = ridge_head(gram, targets, self.gamma, self.normalize)

    def scores(self, out: NetOutput) -> Tensor | None:
        """(B, n_seen) logits f·W; None before the first task's head."""
        if not self.weight.numel():
            return None
        with full_precision(out.features.device.type):
            return out.features.float() @ self.weight.to(out.features.device)

    def eval_state(self) -> dict[str, Any]:
        return {"ridge_head": self.weight} if self.weight.numel() else {}

    @staticmethod
    def recipe() -> str:
        return (
            "scores = net(x).features @ state['method.ridge_head'] (DPCR's reconstructed ridge head, d × n_seen, "
            "bias-free); the prediction is scores.argmax(1) (output k as in output_names)"
        )

    def load_eval_state(self, state: dict[str, Any]) -> None:
        if "ridge_head" in state:
            self.weight = state["ridge_head"]

    def state_dict(self) -> dict[str, Any]:
        return {"weight": self.weight, "counts": self.counts} if len(self.counts) else {}

    def static_state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any], ctx: TaskContext | None = None, static: Any = None) -> None:
        device = ctx.device if ctx is not None else None
        self.weight = state.get("weight", torch.zeros(0, 0))
        self.weight = self.weight.to(device) if device is not None else self.weight
        self.counts = state.get("counts", torch.zeros(0, dtype=torch.long)).cpu()
