"""AdaGauss's maths (Rypeść et al., NeurIPS 2024; docs/baselines.md, AdaGauss): the anti-collapse term, the
projected feature distillation, the re-estimation of a Gaussian from samples pushed through a map, and the
shrinkage, precisions and scores of its Bayes (Mahalanobis) classifier. Pure functions of tensors; features are
rows, (N, d)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from dfcil.losses.prototypes import gaussian_factors


def batch_cholesky_diagonal(features: Tensor, jitter: float = 1e-4) -> tuple[Tensor, bool]:
    """diag(L) (d,), L the lower Cholesky factor of the unbiased covariance of ``features`` (N, d), in float64.

    A covariance that is not positive definite (fewer samples than dimensions, collapsed features) has no Cholesky
    factor: the authors' code stops with an error there. Here it is factored with ``jitter`` times its mean
    variance (or ``jitter`` where that is 0) added to the diagonal instead, and the second result says so. Features
    that are not finite give a diagonal of NaN (the engine then names the loss term that became non-finite). The
    term is meant for batches of more samples than dimensions (N > d); with fewer the jittered factor has entries near
    √jitter whose gradients are large (:func:`small_batch` says so)."""
    diagonal, jittered = cholesky_diagonal_on_device(features, jitter)
    return diagonal, bool(jittered)


def cholesky_diagonal_on_device(features: Tensor, jitter: float = 1e-4) -> tuple[Tensor, Tensor]:
    """:func:`batch_cholesky_diagonal` without a read back to the host: the plain and the jittered factor are both
    computed and the diagonal chosen on the device (``torch.where``), so a step that uses it can be replayed as a
    CUDA graph; the second result is a boolean tensor. The gradient flows through the chosen factor only (the other
    one's input is the identity, so that its backward pass stays finite)."""
    x = features.double()
    x = x - x.mean(0, keepdim=True)
    cov = x.T @ x / (len(x) - 1)  # torch.cov's unbiased covariance, written out: torch.cov reads back to the host
    eye = torch.eye(cov.shape[0], dtype=cov.dtype, device=cov.device)
    plain = torch.linalg.cholesky_ex(cov.detach()).info == 0  # whether it has a factor
    scale = cov.detach().diagonal().mean()  # a constant of the factorisation, not a path for gradients
    eps = jitter * torch.where(scale > 0, scale, torch.ones_like(scale))
    jittered, info_j = torch.linalg.cholesky_ex(torch.where(plain, eye, cov + eps * eye))
    safe = torch.linalg.cholesky_ex(torch.where(plain, cov, eye))[0]  # the plain factor, finite to differentiate
    # NaN or infinite features: no factor at any jitter (0/0: a NaN without a Python NaN argument, which a graph
    # check cannot compare)
    nan = torch.zeros_like(cov[0]) / 0
    diagonal = torch.where(plain, safe.diagonal(), torch.where(info_j == 0, jittered.diagonal(), nan))
    return diagonal, ~plain


def small_batch(batch: int, dim: int, what: str) -> str | None:
    """Why an anti-collapse term over batches of ``batch`` samples of ``dim``-dimensional features is degraded, or
    None where it is not: a batch covariance has rank at most batch − 1, so with batch ≤ dim it has no Cholesky factor
    (or one with pivots near 0 by rounding): the jittered factor's smallest entries are near √jitter and push hard
    (``what``: the config key of the batch)."""
    if batch > dim:
        return None
    return (
        f"{what} is {batch}: the anti-collapse term factors the covariance of a batch's {dim}-dimensional features, "
        f"of rank at most {batch - 1} here: it has no proper Cholesky factor, and the term's smallest directions push "
        f"hard; set {what} above {dim} (AdaGauss: 256) for the term the authors train with"
    )


def anti_collapse(features: Tensor, beta: float, jitter: float = 1e-4) -> Tensor:
    """AdaGauss's anti-collapse term, −mean_i min(L_ii, β) over the diagonal of the Cholesky factor L of the batch's
    feature covariance Σ = LLᵀ (features (N, d) → a scalar, float32). det Σ = Π L_ii², so the term rewards volume
    in every direction, up to L_ii = β, and is −β once every L_ii ≥ β."""
    diagonal, _ = cholesky_diagonal_on_device(features, jitter)
    return -diagonal.clamp(max=beta).mean().float()


def projected_distillation(projected: Tensor, old: Tensor) -> Tensor:
    """AdaGauss's feature distillation through its distiller g, mean_ij (g(f)_ij − f_old_ij)²: the MSE between the
    new features mapped by g (``projected``, (B, d)) and the old model's features of the same images (``old``,
    (B, d)); a scalar, float32. The map lets the new features move as long as the old ones stay recoverable from
    them (the authors' ``distill_projected``)."""
    return F.mse_loss(projected.float(), old.float())


def pushed_gaussians(
    means: Tensor,
    covs: Tensor,
    fn: Callable[[Tensor], Tensor],
    n: int,
    generator: torch.Generator | None,
    jitter: float = 1e-5,
) -> tuple[Tensor, Tensor]:
    """The Gaussians after a map: per class c, ``n`` samples of N(μ_c, Σ_c + jitter·I) pushed through ``fn``, and
    their mean and unbiased covariance (AdaGauss's adaptation of the stored distributions).

    Args:
        means: (C, d) class means; covs: (C, d, d) their covariances.
        fn: the map, (n, d) → (n, d').
        n: samples per class (the authors' N, 10,000).

    Returns:
        (C, d') means and (C, d', d') covariances, float32 (the moments computed in float64).
    """
    factors = gaussian_factors(covs, jitter)  # (C, d, d)
    new_means, new_covs = [], []
    for mean, factor in zip(means, factors, strict=True):
        eps = torch.randn(n, len(mean), generator=generator, device=mean.device, dtype=torch.float32)
        moved = fn(mean.float() + eps @ factor.T).double()  # (n, d')
        new_means.append(moved.mean(dim=0))
        new_covs.append(torch.cov(moved.T))
    return torch.stack(new_means).float(), torch.stack(new_covs).float()


def shrunk(cov: Tensor, gamma: float, offdiag: float = 0.0) -> Tensor:
    """Σ + γ·V₁·I + γ₂·V₂·(𝟙𝟙ᵀ − I), per matrix: V₁ the mean of its diagonal, V₂ the mean of its off-diagonal entries
    that are not exactly zero (0 if none is). γ₂ = ``offdiag`` 0 is the shrinkage of AdaGauss's classifier (the
    authors' ``shrink_cov(Σ, γ)``); γ₂ = γ is FeCAM's shrinkage (:func:`dfcil.methods.fecam.shrink`), which APR's
    Mahalanobis classifier applies once with γ = 24 on CIFAR-100 (40 on Tiny-ImageNet and ImageNet-subset).
    (..., d, d) → (..., d, d)."""
    eye = torch.eye(cov.shape[-1], dtype=cov.dtype, device=cov.device)
    out = cov + gamma * cov.diagonal(dim1=-2, dim2=-1).mean(-1)[..., None, None] * eye
    if offdiag == 0:
        return out
    off = cov * (1 - eye)
    count = (off != 0).sum(dim=(-2, -1))
    v2 = off.sum(dim=(-2, -1)) / count.clamp(min=1)  # 0 where every off-diagonal entry is 0
    return out + offdiag * v2[..., None, None] * (1 - eye)


def correlation_of(cov: Tensor) -> Tensor:
    """R_ij = Σ_ij / √(Σ_ii·Σ_jj), the covariance scaled to a unit diagonal (the authors' ``norm_cov``).
    (..., d, d) → (..., d, d)."""
    std = cov.diagonal(dim1=-2, dim2=-1).sqrt()
    return cov / (std[..., :, None] * std[..., None, :])


def bayes_precisions(
    covs: Tensor, shrinkage: float, normalize: bool, offdiag: float = 0.0, pseudo_inverse: bool = False
) -> Tensor:
    """The precision of each class in AdaGauss's Bayes classifier: the covariance shrunk, Σ + γ·mean(diag Σ)·I
    (γ = ``shrinkage``, the authors' 3; with ``offdiag`` γ₂ > 0 also FeCAM's off-diagonal term, :func:`shrunk`),
    turned into its correlation matrix where the features are L2-normalised (``normalize``), and inverted, in float64:
    by ``torch.linalg.inv``, or its pseudo-inverse with ``pseudo_inverse`` (APR's and FeCAM's ``pinv``; the same
    matrix where the shrunk one is invertible). (C, d, d) → (C, d, d) float32."""
    s = shrunk(covs.double(), shrinkage, offdiag)
    s = correlation_of(s) if normalize else s
    return (torch.linalg.pinv(s) if pseudo_inverse else torch.linalg.inv(s)).float()


def bayes_log_likelihood(x: Tensor, means: Tensor, precisions: Tensor) -> Tensor:
    """The scores of AdaGauss's Bayes classifier, −(x − μ_c)ᵀ P_c (x − μ_c) for every sample and class: the log
    density of N(μ_c, P_c⁻¹) up to terms the authors drop (−½, the log-determinant and the constant; their
    prediction is the class of least distance). x (B, d), means (C, d), precisions (C, d, d) → (B, C)."""
    diff = x[:, None, :] - means[None]  # (B, C, d)
    return -torch.einsum("bcd,cde,bce->bc", diff, precisions, diff)
