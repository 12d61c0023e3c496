"""The maths of DPCR (He et al., ICML 2025: dual-projection shift estimation and classifier reconstruction), pure
and in float64: ridge solves, the task-wise map of old features onto new ones, the class-wise projector onto the
row space of a class's features, the move of class statistics through both, and the closed-form ridge head.

Features are rows, as in the authors' code: a map ``A`` (d, d) sends a feature ``f`` (1, d) to ``f·A`` (dfcil's
:func:`dfcil.losses.prototypes.lstsq_projector` is the transposed convention, ``P·f``). Every function returns
float32, whatever it was given (docs/baselines.md, DPCR).
"""

from __future__ import annotations

import torch
from torch import Tensor


def ridge_solve(gram: Tensor, cross: Tensor, ridge: float) -> Tensor:
    """X = (G + ridge·I)⁻¹ C, the minimiser of ‖F X − Y‖² + ridge·‖X‖² given G = FᵀF (d, d) and C = FᵀY (d, k).

    ``ridge`` is absolute (in the units of G's entries). (d, k) float32, solved in float64."""
    g = gram.double()
    eye = torch.eye(g.shape[0], dtype=g.dtype, device=g.device)
    return torch.linalg.solve(g + ridge * eye, cross.double()).float()


def task_map(old: Tensor, new: Tensor, ridge: float = 1e-9) -> Tensor:
    """DPCR's task-wise projection: A (d, d) with old·A ≈ new, by ridge least squares on feature pairs of the same
    images, A = (XₒᵀXₒ + ridge·I)⁻¹ XₒᵀXₙ (the authors' ``rg_tssp``: 1e-9, absolute).

    Args:
        old: (N, d) the old model's features.
        new: (N, d) the new model's features of the same images.
    """
    o, n = old.double(), new.double()
    return ridge_solve(o.T @ o, o.T @ n, ridge)


def row_space_projector(gram: Tensor, tol: float = 0.0) -> Tensor:
    """U·Uᵀ (d, d) or (C, d, d): the orthogonal projector onto the span of the singular vectors of a Gram matrix
    Φ = XᵀX (one per class, batched) whose singular values exceed ``tol`` times the largest (Φ's row space, which
    is the row space of X). ``tol`` 0 keeps every non-zero singular value, the authors' ``S > 0``: in floating
    point that drops only exactly-zero directions, so a numerically full-rank Φ gives I."""
    u, s, _ = torch.linalg.svd(gram.double())
    keep = (s > tol * s.amax(dim=-1, keepdim=True)).to(u.dtype)  # (..., d)
    return ((u * keep[..., None, :]) @ u.transpose(-1, -2)).float()


def class_maps(task: Tensor, projectors: Tensor) -> Tensor:
    """DPCR's dual projection per class, W_c = A·U_cU_cᵀ (C, d, d): the task-wise map, then the projection onto the
    class's row space (the authors' order: ``W = P @ projector``)."""
    return (task.double() @ projectors.double()).float()


def move_statistics(means: Tensor, second: Tensor, maps: Tensor) -> tuple[Tensor, Tensor]:
    """Each class's statistics through its own linear map: μ_c ← μ_c·W_c, S_c ← W_cᵀ·S_c·W_c, where S_c is the
    uncentred Gram matrix Φ_c (the authors') or the covariance Σ_c (the same formula: a linear map moves both so).

    Args:
        means: (C, d) row means.
        second: (C, d, d) Gram matrices or covariances.
        maps: (C, d, d) the classes' maps W_c.
    """
    w = maps.double()
    moved = (means.double()[:, None, :] @ w)[:, 0]
    return moved.float(), (w.transpose(-1, -2) @ second.double() @ w).float()


def gram_of(means: Tensor, covs: Tensor, counts: Tensor) -> Tensor:
    """The uncentred Gram matrices Φ_c = X_cᵀX_c (C, d, d) of classes kept as a mean μ_c, an unbiased covariance
    Σ_c (÷ (n_c − 1)) and a count n_c: Φ_c = (n_c − 1)·Σ_c + n_c·μ_cᵀμ_c."""
    n = counts.double()[:, None, None]
    mu = means.double()
    return ((n - 1) * covs.double() + n * mu[:, :, None] * mu[:, None, :]).float()


def ridge_head(gram: Tensor, targets: Tensor, gamma: float, normalize: bool = True) -> Tensor:
    """DPCR's classifier reconstruction: W = (Σ_c Φ_c + γ·I)⁻¹ Q (d, C), Q the sum over all samples of fᵀ·onehot
    (column c: n_c·μ_cᵀ), then, with ``normalize``, every class column scaled to unit L2 norm. Logits are f·W.

    Args:
        gram: (d, d) the Gram matrix summed over every class.
        targets: (d, C) Q.
        gamma: the ridge γ (the authors' ``rg``: 200 on CIFAR-100, 2000 on Tiny-ImageNet and ImageNet-100).
    """
    w = ridge_solve(gram, targets, gamma).double()
    return (w / w.norm(dim=0, keepdim=True).clamp_min(1e-12) if normalize else w).float()
