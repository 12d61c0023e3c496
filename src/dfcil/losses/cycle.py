"""The maths of BiCyc's cycle-consistent distillation (ICLR 2026; docs/rdfcil-plus.md, "The cycle switch") as
R-DFCIL+ takes it: a streaming estimate of the affine old → new feature map from the step's feature pairs, and the
two terms that train the new → old distiller D. Pure functions of tensors; features are rows, (N, d).

The affine map is GATF's "prior" (centred ridge least squares of new on old features, z ≈ z°·P + b), estimated
here from exponentially weighted moments of every step's pairs instead of a pass over the task every 10 epochs."""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor


class PairMoments(NamedTuple):
    """Exponentially weighted sums of feature pairs (old z°, new z): ``weight`` = Σ w_k, and Σ w_k·E_k[·] of z°, z,
    z°ᵀz° and z°ᵀz over the steps k (E_k the mean over step k's rows). Divided by ``weight`` they are weighted
    means, unbiased from the first step on (an EMA started at 0, corrected)."""

    weight: Tensor  # () float
    old: Tensor  # (d,)
    new: Tensor  # (d,)
    old_old: Tensor  # (d, d)
    old_new: Tensor  # (d, d)

    @staticmethod
    def zeros(d: int, device: torch.device | str | None = None) -> PairMoments:
        z = torch.zeros(d, d, device=device)
        return PairMoments(torch.zeros((), device=device), z[0].clone(), z[0].clone(), z, z.clone())


def update_moments(m: PairMoments, old: Tensor, new: Tensor, momentum: float) -> PairMoments:
    """``m`` after one step's pairs ``old``, ``new`` (N, d): each sum ← momentum·sum + (1 − momentum)·the step's
    mean (momentum 0 keeps the step's pairs alone). float32; nothing is read back to the host."""
    old, new = old.detach().float(), new.detach().float()
    n, keep, add = len(old), momentum, 1.0 - momentum
    step = (torch.ones((), device=old.device), old.mean(0), new.mean(0), old.T @ old / n, old.T @ new / n)
    return PairMoments(*(keep * s + add * x for s, x in zip(m, step, strict=True)))


def affine_map(m: PairMoments, ridge: float) -> tuple[Tensor, Tensor]:
    """(P, b), z ≈ z°·P + b: the centred ridge least squares of new on old features under the weighted moments,
    P = (Σ°° + ridge·I)⁻¹ Σ°ⁿ with Σ°° and Σ°ⁿ the (population) covariance of z° and cross-covariance of z° and
    z, b = μⁿ − μ°·P. ``ridge`` is absolute (GATF's 10⁻²). A solve without a check read back to the host (a CUDA
    graph replays it); the ridge keeps the system positive definite."""
    w = m.weight
    mu_o, mu_n = m.old / w, m.new / w
    cov = m.old_old / w - torch.outer(mu_o, mu_o)
    cross = m.old_new / w - torch.outer(mu_o, mu_n)
    eye = torch.eye(len(mu_o), device=cov.device, dtype=cov.dtype)
    p = torch.linalg.solve_ex((cov + cov.T) / 2 + ridge * eye, cross).result
    return p, mu_n - mu_o @ p


def cycle_losses(distilled: Tensor, cycled: Tensor, old: Tensor) -> tuple[Tensor, Tensor]:
    """BiCyc's two distiller terms: the new → old distillation MSE(D(z), z°), which trains the backbone and D, and
    the old-side cycle MSE(D(A(z°)), z°), with A(z°) given detached (``cycled`` = D of it), which trains D alone: D
    learns to undo the drift map on the old features, so that the distillation asks the backbone for features the
    map explains. float32 scalars."""
    old = old.detach().float()
    return F.mse_loss(distilled.float(), old), F.mse_loss(cycled.float(), old)
