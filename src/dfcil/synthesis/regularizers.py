"""The four loss terms of generative model inversion (ABD; R-DFCIL reference §5). Pure functions."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from dfcil.compute.precision import full_precision
from dfcil.models.batchnorm import BNStats


def content_loss(logits: Tensor, tau: float) -> Tensor:
    """CE of the teacher's tempered logits against their own argmax: CE(z / τ, argmax z). (B, K) → scalar."""
    return F.cross_entropy(logits / tau, logits.argmax(dim=1))


def diversity_loss(logits: Tensor, columns: Tensor | None = None, dist=None) -> Tensor:  # noqa: ANN001
    """1 − normalised entropy of the batch-mean prediction (temperature 1; τ is not used here).

    p̄ = mean_b softmax(z_b); L = 1 + Σ_k p̄_k log p̄_k / log K. Zero when p̄ is uniform; 0 for K = 1.
    ``xlogy`` gives 0·log 0 = 0 where the reference would produce NaN. ``columns``: a static head's boolean mask
    of the K real classes (the other columns are masked logits, whose probability is exactly 0). ``dist``: a
    :class:`dfcil.compute.distributed.Dist` whose processes each hold a share of the batch: p̄ over the global batch.
    """
    split = dist is not None and dist.active
    if columns is not None or split:  # K as a tensor: the same computation for every K, without a host sync
        probs = F.softmax(logits.float(), dim=1)
        p = dist.all_sum(probs.sum(dim=0)) / (probs.shape[0] * dist.world) if split else probs.mean(dim=0)
        if columns is None:  # filled on the device: a tensor made from Python data is a copy a graph cannot hold
            k = torch.full((), float(logits.shape[1]), device=logits.device)
        else:
            k = columns.sum().float()
            # masked columns' p is exactly 0, where xlogy's gradient is 0/0: take p log p = 1 log 1 = 0 there
            p = torch.where(columns, p, 1.0)
        return torch.where(k > 1, 1.0 + torch.special.xlogy(p, p).sum() / k.clamp(min=2).log(), 0.0)
    k = logits.shape[1]
    if k < 2:
        return logits.new_zeros(())
    p = F.softmax(logits.float(), dim=1).mean(dim=0)
    return 1.0 + torch.special.xlogy(p, p).sum() / math.log(k)


def gaussian_kernel(size: int = 5, sigma: float = 1.0) -> Tensor:
    """The reference's 2-D smoothing kernel, bug included: taps ∝ exp(−((i − m) / (2σ))²), so the effective σ is
    σ√2. For size 5, σ 1 the 1-D taps are about 0.112, 0.237, 0.304, 0.237, 0.112. Shape (size, size), sums to 1."""
    i = torch.arange(size, dtype=torch.float64)
    taps = torch.exp(-(((i - (size - 1) / 2) / (2 * sigma)) ** 2))
    kernel = torch.outer(taps, taps)
    return (kernel / kernel.sum()).float()


def smoothness_prior(x: Tensor, kernel: Tensor) -> Tensor:
    """MSE between images and their Gaussian-blurred copy (reflect-pad, depthwise conv). Not total variation.

    Args:
        x: (B, C, H, W) images.
        kernel: (k, k) smoothing kernel, see :func:`gaussian_kernel`.
    """
    with full_precision(x.device.type):  # fp32 even under bf16 autocast
        x = x.float()
        c, k = x.shape[1], kernel.shape[-1]
        weight = kernel.to(x).expand(c, 1, k, k)
        blurred = F.conv2d(F.pad(x, (k // 2,) * 4, mode="reflect"), weight, groups=c)
        return F.mse_loss(x, blurred)


def bn_kl(stats: BNStats, eps: float = 1e-8) -> Tensor:
    """KL(N(μ_r, σ_r²) ‖ N(μ, σ²)) per channel, averaged over channels (the last dimension): a scalar for one BN
    layer's (C,) statistics, one value per layer for statistics stacked to (L, C).

    ½·mean_c[log(σ²/(σ_r² + ε)) + (σ_r² + ε + (μ_r − μ)²)/σ² − 1], with σ² the biased batch variance + ε.
    """
    var = stats.var + eps
    running_var = stats.running_var.float() + eps
    ratio = (running_var + (stats.running_mean.float() - stats.mean) ** 2) / var
    return 0.5 * (torch.log(var / running_var) + ratio - 1.0).mean(dim=-1)


def bn_statistics_loss(stats: Sequence[BNStats]) -> Tensor:
    """Mean of :func:`bn_kl` over BN layers (ABD's ``5e1 / L`` per layer is 50 × this mean).

    Layers of equal width are stacked and computed together (ResNet-32: three groups instead of 31 layers, about a
    third of an inversion step's operators fewer); equal to the per-layer loop within rounding.
    """
    if not stats:
        raise ValueError("no BN statistics were recorded: the teacher has no BatchNorm2d layers")
    groups: dict[int, list[BNStats]] = {}
    for layer in stats:
        groups.setdefault(layer.mean.shape[-1], []).append(layer)
    total = sum(
        bn_kl(BNStats(*(torch.stack(column) for column in zip(*g, strict=True)))).sum() for g in groups.values()
    )
    return total / len(stats)
