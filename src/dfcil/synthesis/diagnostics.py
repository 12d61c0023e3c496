"""How well an inverted generator stands in for the old classes: statistics of a synthetic batch as the frozen
teacher sees it. Pure functions of tensors; :mod:`dfcil.training.diagnostics` draws the batch after each task's
inversion and records them with the task.

For diagnosis only: the real images they are compared with (the test set's old classes) never reach training.
How to read them: ``docs/diagnostics.md``. Each refuses non-finite input (``ValueError``): statistics of NaNs would
read as numbers ("confidence nan", "100 % nearest their own").
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor


def require_finite(x: Tensor, what: str) -> None:
    """Raise ``ValueError`` naming ``what`` if ``x`` holds a NaN or an infinity."""
    if not bool(torch.isfinite(x).all()):
        raise ValueError(f"{what} are not all finite ({int((~torch.isfinite(x)).sum())} of {x.numel()} values)")


def top1_confidence(logits: Tensor) -> float:
    """Mean over the batch of the largest softmax probability: near 1 when the teacher is sure of every synthetic
    image (what the inversion's content loss asks), 1/K for a teacher that cannot tell K classes apart."""
    require_finite(logits, "the logits")
    return float(logits.float().softmax(dim=1).max(dim=1).values.mean())


def prediction_spread(pred: Tensor, n_classes: int) -> dict[str, float | list[int]]:
    """How the teacher's predicted classes ``pred`` (B,) spread over its ``n_classes`` classes: the count of
    each, ``coverage`` (the share of classes predicted at least once) and ``entropy`` of the predicted-class
    histogram over log K (1: every class equally often; 0: one class for every image)."""
    counts = torch.bincount(pred.long().cpu(), minlength=n_classes)[:n_classes]
    p = counts.double() / max(int(counts.sum()), 1)
    entropy = max(float(-(p[p > 0] * p[p > 0].log()).sum()), 0.0) + 0.0  # one class: 0, not -0 (max keeps -0.0)
    return {
        "counts": counts.tolist(),
        "coverage": float((counts > 0).double().mean()),
        "entropy": entropy / math.log(n_classes) if n_classes > 1 else 1.0,
    }


def pixel_statistics(x: Tensor, mean: Sequence[float], std: Sequence[float]) -> dict[str, list[float]]:
    """Per-channel mean and (population) std of normalised images ``x`` (B, 3, H, W) in pixel units, ``x · std +
    mean`` in [0, 1] (not clipped): to compare with the dataset's own ``mean`` and ``std``."""
    require_finite(x, "the images")
    m = torch.as_tensor(mean, dtype=torch.float64)[None, :, None, None]
    s = torch.as_tensor(std, dtype=torch.float64)[None, :, None, None]
    pixels = x.detach().double().cpu() * s + m
    return {
        "mean": [round(float(v), 4) for v in pixels.mean(dim=(0, 2, 3))],
        "std": [round(float(v), 4) for v in pixels.std(dim=(0, 2, 3), unbiased=False)],
    }


def class_mean_gap(
    synthetic: Tensor, synthetic_class: Tensor, real: Tensor, real_class: Tensor, n_classes: int
) -> dict[str, float | int]:
    """How far the synthetic images of each class lie from the real ones, in a feature space (the teacher's).

    Class means of the ``real`` features (N, D) by ``real_class``, and of the ``synthetic`` features (M, D) by
    ``synthetic_class`` (the teacher's predictions). Over the classes with both:

    * ``distance``: the mean L2 distance between a class's synthetic and real means, over the mean distance between
      two different real class means (0: on the real mean; 1: as far from it as another class is);
    * ``nearest_own``: the share of those classes whose synthetic mean is nearer to their own real mean than to
      any other class's;
    * ``classes``: how many classes were compared.
    """
    require_finite(synthetic, "the synthetic features")
    require_finite(real, "the real features")
    d = real.shape[1]

    def means(f: Tensor, c: Tensor) -> tuple[Tensor, Tensor]:
        sums = torch.zeros(n_classes, d, dtype=torch.float64).index_add_(0, c.long().cpu(), f.double().cpu())
        counts = torch.bincount(c.long().cpu(), minlength=n_classes)[:n_classes]
        return sums / counts.clamp(min=1)[:, None], counts > 0

    real_mean, has_real = means(real, real_class)
    syn_mean, has_syn = means(synthetic, synthetic_class)
    both = has_real & has_syn
    reals = real_mean[has_real]
    if int(both.sum()) == 0 or len(reals) < 2:
        return {"distance": float("nan"), "nearest_own": float("nan"), "classes": int(both.sum())}
    between = torch.cdist(reals, reals)
    spacing = between.sum() / (len(reals) * (len(reals) - 1))  # mean over ordered pairs of distinct classes
    gaps = torch.cdist(syn_mean[both], real_mean)  # (classes with both, n_classes)
    gaps[:, ~has_real] = float("inf")
    own = gaps[torch.arange(len(gaps)), torch.nonzero(both).squeeze(1)]
    return {
        "distance": float(own.mean() / spacing),
        "nearest_own": float((gaps.argmin(dim=1) == torch.nonzero(both).squeeze(1)).double().mean()),
        "classes": int(both.sum()),
    }
