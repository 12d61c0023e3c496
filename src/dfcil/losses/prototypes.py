"""Class statistics in feature space, as the prototype-based methods keep them (docs/baselines.md, EFC, LDC and
R-DFCIL+): per-class Gaussians, sampling from them, NCM scores, and the linear maps that carry stored statistics
into a newer feature space (drift compensation). Pure functions of tensors; features are rows, (N, d)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor


def class_gaussians(features: Tensor, labels: Tensor, classes: range | list[int]) -> tuple[Tensor, Tensor]:
    """Mean and unbiased covariance (÷ (N − 1)) of the features of each class in ``classes``.

    Args:
        features: (N, d) features.
        labels: (N,) their classes.
        classes: the classes to describe, in the order of the result; each needs two samples at least.

    Returns:
        (C, d) means and (C, d, d) covariances, in float32 (computed in float64).
    """
    means, covs = [], []
    for c in classes:
        f = features[labels == c].double()
        if len(f) < 2:
            raise ValueError(f"class {c} has {len(f)} feature(s): a covariance needs two at least")
        means.append(f.mean(dim=0))
        covs.append(torch.cov(f.T))
    return torch.stack(means).float(), torch.stack(covs).float()


def gaussian_factors(covs: Tensor, jitter: float = 1e-5) -> Tensor:
    """Lower Cholesky factors L of Σ + jitter·I (C, d, d), so that μ + L·ε, ε ~ N(0, I), samples N(μ, Σ + jitter·I).

    EFC samples from Σ + 1e-5·I. A covariance that is not positive definite even so (a class with fewer samples
    than dimensions, rounded) takes the symmetric square root of its eigenvalues clipped at the jitter instead.
    """
    eye = torch.eye(covs.shape[-1], dtype=torch.float64, device=covs.device)
    sym = (covs.double() + covs.double().transpose(-1, -2)) / 2 + jitter * eye
    factors, info = torch.linalg.cholesky_ex(sym)
    if bool((info != 0).any()):
        vals, vecs = torch.linalg.eigh(sym)
        root = vecs @ torch.diag_embed(vals.clamp(min=jitter).sqrt()) @ vecs.transpose(-1, -2)
        factors = torch.where((info != 0)[:, None, None], root, factors)
    return factors.float()


def sample_gaussians(means: Tensor, factors: Tensor, labels: Tensor, generator: torch.Generator | None) -> Tensor:
    """One sample μ_y + L_y·ε per entry of ``labels`` (n,), ε ~ N(0, I) drawn from ``generator``.

    Args:
        means: (C, d) class means; ``labels`` index their rows.
        factors: (C, d, d) from :func:`gaussian_factors`.

    Returns:
        (n, d) samples.
    """
    eps = torch.randn(len(labels), means.shape[1], generator=generator, device=means.device, dtype=means.dtype)
    return means[labels] + torch.einsum("nij,nj->ni", factors[labels], eps)


def balanced_labels(classes: int, n: int, generator: torch.Generator | None, device: torch.device | str) -> Tensor:
    """``n`` class indices in [0, ``classes``) that cover the classes as evenly as possible, shuffled: every class
    ⌊n/C⌋ times, and a random subset of them once more."""
    reps = torch.arange(classes, device=device).repeat(n // classes)
    extra = torch.randperm(classes, generator=generator, device=device)[: n % classes]
    labels = torch.cat([reps, extra])
    return labels[torch.randperm(n, generator=generator, device=device)]


def ncm_scores(features: Tensor, means: Tensor) -> Tensor:
    """Nearest-class-mean scores on the unit sphere, −‖n(f) − n(μ_c)‖² (B, C): the argmax is the class of largest
    cosine similarity (LDC's classifier; n the L2 normalisation)."""
    return -torch.cdist(F.normalize(features.float(), dim=1), F.normalize(means.float(), dim=1)).pow(2)


def fit_projector(
    pairs: list[tuple[Tensor, Tensor]],
    epochs: int,
    lr: float,
    batch_size: int,
    generator: torch.Generator | None,
    init: Literal["random", "identity"] = "random",
    on_epoch: Callable[[int, float], None] | None = None,
) -> Tensor:
    """LDC's forward projector: a bias-free linear map P (d, d) with P·f_old ≈ f_new, trained with Adam (default
    betas, no weight decay) on the MSE (mean over samples and dimensions).

    Args:
        pairs: feature pairs (old model's, new model's), each (N, d), one per pass over the task's images; epoch e
            uses pass e mod len(pairs) (LDC draws fresh augmentations every epoch: as many passes as epochs).
        epochs, lr, batch_size: the fit (LDC: 20, 1e-3, 128).
        generator: the random stream for the initialisation and the batch order.
        init: "random", PyTorch's default initialisation of ``nn.Linear`` (LDC's); "identity", P = I: the fit
            starts from leaving the features where they are.
        on_epoch: called after every epoch with (epochs done, the epoch's mean MSE over its batches).

    Returns:
        P as a (d, d) matrix acting on column vectors: map rows with ``f @ P.T``.
    """
    d = pairs[0][0].shape[1]
    device = pairs[0][0].device
    bound = 1 / d**0.5  # nn.Linear's default: kaiming_uniform(a=√5) gives U(−1/√d, 1/√d)
    weight = (torch.rand(d, d, generator=generator, device=device) * 2 - 1) * bound  # drawn either way: one stream
    if init == "identity":
        weight = torch.eye(d, device=device)
    weight.requires_grad_(True)
    opt = torch.optim.Adam([weight], lr=lr)
    with torch.enable_grad():
        for epoch in range(epochs):
            old, new = pairs[epoch % len(pairs)]
            perm = torch.randperm(len(old), generator=generator, device=device)
            losses = []
            for i in range(0, len(old), batch_size):
                idx = perm[i : i + batch_size]
                loss = F.mse_loss(old[idx].float() @ weight.T, new[idx].float())
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                losses.append(loss.detach())
            if on_epoch is not None:
                on_epoch(epoch + 1, float(torch.stack(losses).mean()))
    return weight.detach()


def map_errors(
    old: Tensor, new: Tensor, projector: Tensor | Callable[[Tensor], Tensor], ridge: float = 1e-6
) -> dict[str, float]:
    """How well a map carries ``old`` features (N, d) onto ``new`` ones, as MSEs (mean over samples and
    dimensions): ``fit``, of the map (a matrix P, f ↦ Pf, or any function of the (N, d) features, such as
    AdaGauss's adapter); ``best``, of the least-squares linear map (:func:`lstsq_projector`, the least any linear
    map reaches up to its small ridge); ``stay``, of leaving the features where they are (P = I)."""
    fo, fn = old.float(), new.float()
    best = lstsq_projector(fo, fn, ridge)
    mapped = fo @ projector.T.to(fo.device) if isinstance(projector, Tensor) else projector(fo)
    return {
        "fit": float(F.mse_loss(mapped.float(), fn)),
        "best": float(F.mse_loss(fo @ best.T, fn)),
        "stay": float(F.mse_loss(fo, fn)),
    }


def lstsq_projector(old: Tensor, new: Tensor, ridge: float = 1e-3) -> Tensor:
    """The least-squares map P (d, d) with P·f_old ≈ f_new in closed form, ridge-regularised:
    P = Fnᵀ Fo (Foᵀ Fo + ridge·tr(Foᵀ Fo)/d · I)⁻¹ (float64). The cheap alternative to :func:`fit_projector`."""
    fo, fn = old.double(), new.double()
    gram = fo.T @ fo
    d = gram.shape[0]
    gram = gram + ridge * gram.trace() / d * torch.eye(d, dtype=gram.dtype, device=gram.device)
    return torch.linalg.solve(gram, fo.T @ fn).T.float()  # solves gram·Pᵀ = Foᵀ Fn (gram symmetric)


def project_statistics(means: Tensor, covs: Tensor | None, projector: Tensor) -> tuple[Tensor, Tensor | None]:
    """Carry class statistics through a linear map P: μ ← Pμ, and Σ ← PΣPᵀ (exact for a linear map; LDC moves
    only means, covariances are our extension)."""
    means = means @ projector.T
    return means, (map_covariances(covs, projector) if covs is not None else None)


def map_covariances(covs: Tensor, projector: Tensor) -> Tensor:
    """Σ ← PΣPᵀ, the covariance of P·f for f of covariance Σ (exact for a linear map; an affine map's offset does not
    move it). (..., d, d) covariances and a (d', d) map → (..., d', d')."""
    return projector @ covs @ projector.T
