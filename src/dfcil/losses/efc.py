"""EFC's maths (Magistri et al., ICLR 2024; docs/baselines.md, EFC): self-rotation labels, the Empirical Feature
Matrix of a linear head and the regulariser it weighs, the kernel drift of the old class means, and the asymmetric
CE's batch split. Pure functions of tensors; :mod:`dfcil.methods.efc` composes them."""

from __future__ import annotations

import torch
from torch import Tensor

from dfcil.losses.prototypes import balanced_labels


def rotation_batch(x: Tensor, y: Tensor, n_classes: int) -> tuple[Tensor, Tensor]:
    """Self-rotation label augmentation (PASS, used by EFC's first task): the batch followed by its rotations
    rot90^k, k = 1, 2, 3 (counter-clockwise in the image plane), image y rotated k times labelled n + 3y + k − 1.

    Args:
        x: (B, C, H, H) square images.
        y: (B,) labels in [0, n_classes).
        n_classes: n, the classes of the task (the rotated labels follow them).

    Returns:
        (4B, C, H, H) images and (4B,) labels in [0, 4n): the originals first, then k = 1, 2, 3 in blocks of B.
    """
    images = [x, *(torch.rot90(x, k, dims=(2, 3)) for k in (1, 2, 3))]
    labels = [y, *(n_classes + 3 * y + k - 1 for k in (1, 2, 3))]
    return torch.cat(images), torch.cat(labels)


def empirical_feature_matrix(probs: Tensor, weight: Tensor) -> Tensor:
    """The Empirical Feature Matrix of a linear head (EFC §3.3), in closed form.

    E = (1/N) Σ_x Σ_c p_c(x) g_c(x) g_c(x)ᵀ with g_c = ∂ log p_c / ∂f = Wᵀ(e_c − p), which sums to
    E = Wᵀ [diag(p̄) − (1/N) Σ_x p(x) p(x)ᵀ] W, p̄ the mean of p. PSD, of rank ≤ K − 1 (each diag p − ppᵀ has 1 in
    its kernel).

    Args:
        probs: (N, K) softmax outputs p(x) of the head over the K seen classes.
        weight: (K, d) the head's weights W (bias-free).

    Returns:
        (d, d) float32, symmetric.
    """
    p, w = probs.double(), weight.double()
    inner = torch.diag(p.mean(dim=0)) - p.T @ p / len(p)  # (K, K)
    e = w.T @ inner @ w
    return ((e + e.T) / 2).float()


def efm_penalty(features: Tensor, old_features: Tensor, efm: Tensor, lam: float, eta: float) -> Tensor:
    """EFC's regulariser: the mean over the batch of δᵀ(λE + ηI)δ, δ = f_t(x) − f_{t−1}(x) (EFC Eq. of L_EFM).

    Args:
        features: (B, d) the model's features.
        old_features: (B, d) the frozen old model's features of the same images.
        efm: (d, d) E of the previous task.
        lam, eta: λ and η.

    Returns:
        A scalar.
    """
    delta = features - old_features
    return lam * ((delta @ efm) * delta).sum(dim=1).mean() + eta * delta.pow(2).sum(dim=1).mean()


def drift_weights(old_features: Tensor, means: Tensor, efm: Tensor, sigma: float) -> Tensor:
    """Kernel weights of EFC's prototype drift: how much image i tells about the drift of class c.

    m_{c,i} = (f_i − μ_c)ᵀ E (f_i − μ_c) with f_i the old model's features; m̃ = (m − min m)/(max m − min m), min
    and max over the whole matrix (all 0 when it is constant); w_{c,i} = exp(−m̃_{c,i}/(2σ²)) / Σ_j exp(−m̃_{c,j}/(2σ²)):
    the images nearest to a mean in E's metric weigh most, and each row sums to 1.

    Args:
        old_features: (N, d) the old model's features f_{t−1}(x_i).
        means: (C, d) the old classes' means μ_c (in the old model's feature space).
        efm: (d, d) E of the previous task (the one that regularised the task just trained).
        sigma: σ.

    Returns:
        (C, N) weights, float64.
    """
    f, mu, e = old_features.double(), means.double(), efm.double()
    e = (e + e.T) / 2  # same quadratic form; makes the expansion below exact
    m = ((f @ e) * f).sum(dim=1)[None, :] - 2 * (mu @ e) @ f.T + ((mu @ e) * mu).sum(dim=1)[:, None]  # (C, N)
    span = m.max() - m.min()
    scaled = (m - m.min()) / span if span > 0 else torch.zeros_like(m)
    return torch.softmax(-scaled / (2 * sigma**2), dim=1)


def drift_means(means: Tensor, old_features: Tensor, features: Tensor, efm: Tensor, sigma: float) -> Tensor:
    """EFC's drift update of the old class means: μ_c + Σ_i w_{c,i} (f_t(x_i) − f_{t−1}(x_i)), w from
    :func:`drift_weights`. Covariances are not moved.

    Args:
        means: (C, d) old class means.
        old_features, features: (N, d) the old and the new model's features of the same images.
        efm, sigma: as :func:`drift_weights`.

    Returns:
        (C, d) moved means, in ``means``' dtype.
    """
    w = drift_weights(old_features, means, efm, sigma)
    return (means.double() + w @ (features.double() - old_features.double())).to(means.dtype)


def balanced_counts(n_old: int, n_seen: int, slots: int, generator: torch.Generator, faithful: bool) -> tuple[int, int]:
    """How many old (sampled) and new (real) items the asymmetric CE's batch has: ``slots`` class draws over the
    seen classes, counted by whether they fall among the old ones.

    ``faithful`` (EFC's code): a shuffled list of the seen classes, followed by the same list again, cut to
    ``slots`` items: without replacement when n_seen ≥ slots, and 2·n_seen items (every class twice) when
    2·n_seen ≤ slots. Otherwise: exactly ``slots`` items covering the classes as evenly as possible.

    Returns:
        (n, m): old-class items, new-class items.
    """
    device = generator.device
    if faithful:
        perm = torch.randperm(n_seen, generator=generator, device=device)
        classes = torch.cat([perm, perm])[:slots]
    else:
        classes = balanced_labels(n_seen, slots, generator, device)
    n = int((classes < n_old).sum())
    return n, len(classes) - n
