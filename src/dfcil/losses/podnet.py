"""PODNet's losses (Douillard et al., ECCV 2020), as its official code computes them, quirks included."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor


def pod_spatial(student_maps: Sequence[Tensor], teacher_maps: Sequence[Tensor]) -> Tensor:
    """POD-spatial: for each stage, the width- and height-pooled squared activations, L2-normalised per sample;
    the mean over the batch of the Euclidean distance between student and teacher, averaged over stages.

    Each map (B, C, H, W) becomes concat(Σ_w a², Σ_h a²) of length C·(H + W).
    """
    losses = []
    for a, b in zip(student_maps, teacher_maps, strict=True):
        a, b = a.float().pow(2), b.float().pow(2)
        a = torch.cat([a.sum(dim=3).flatten(1), a.sum(dim=2).flatten(1)], dim=1)
        b = torch.cat([b.sum(dim=3).flatten(1), b.sum(dim=2).flatten(1)], dim=1)
        losses.append((F.normalize(a, dim=1) - F.normalize(b, dim=1)).norm(dim=1).mean())
    return torch.stack(losses).mean()


def pod_flat(student_features: Tensor, teacher_features: Tensor) -> Tensor:
    """POD-flat: mean over the batch of 1 − cos between the pooled features."""
    return (1.0 - F.cosine_similarity(student_features.float(), teacher_features.float(), dim=1)).mean()


def nca(
    similarities: Tensor,
    y: Tensor,
    scale: Tensor | float = 1.0,
    margin: float = 0.6,
    class_weight: Tensor | None = None,
) -> Tensor:
    """PODNet's NCA loss exactly as its code computes it (and PyCIL's and cl-lite's copies).

    s = scale · (similarities − margin) — the margin is subtracted from *every* logit, so it cancels after the
    max-shift and has no effect; then L = −mean_b [s_b,y − log Σ_c exp(s_b,c − [c = y]·s_b,y)], i.e. the positive
    term in the denominator becomes exp(0) = 1 instead of being removed. ``class_weight`` is PODNet-DF's own
    addition (PODNet's balanced finetuning undersamples instead): the mean is weighted by the weight of each
    sample's class and normalised by the summed weights, as a weighted CE.
    """
    s = scale * (similarities.float() - margin)
    s = s - s.max(dim=1, keepdim=True).values
    rows = torch.arange(len(y), device=y.device)
    positive = s[rows, y]
    denominator = s.scatter(1, y[:, None], 0.0)  # not an indexed assignment of a Python number: graph-safe
    losses = -(positive - torch.logsumexp(denominator, dim=1))
    if class_weight is None:
        return losses.mean()
    w = class_weight[y]
    return (losses * w).sum() / w.sum()
