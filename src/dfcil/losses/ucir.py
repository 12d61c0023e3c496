"""UCIR's losses (Hou et al., CVPR 2019), as its official code computes them."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor


def less_forget(student_features: Tensor, teacher_features: Tensor) -> Tensor:
    """Less-forget constraint: mean over the batch of 1 − cos(f_student, f_teacher) (cosine embedding, target 1)."""
    return (1.0 - F.cosine_similarity(student_features.float(), teacher_features.float(), dim=1)).mean()


def margin_ranking(cosine: Tensor, y: Tensor, n_old: int, k: int = 2, margin: float = 0.5) -> Tensor:
    """Inter-class separation on old-class samples: for each sample whose label is an old class, hinge
    max(0, m − s_gt + s_new) against its ``k`` highest new-class cosine scores, averaged over the hard pairs.

    Args:
        cosine: (B, n_seen) cosine scores before the learned scale σ.
        y: (B,) labels.
        n_old: old classes; new classes are columns n_old..n_seen-1.
        k: hard negatives per sample (UCIR: 2).
        margin: m (UCIR: 0.5).

    Returns:
        The mean hinge over (old-label samples × k); 0 when the batch has no old-label sample.
    """
    cosine = cosine.float()
    old = y < n_old  # boolean mask; no host sync
    gt = cosine.gather(1, y[:, None])  # (B, 1)
    k = min(k, cosine.shape[1] - n_old)
    hard = cosine[:, n_old:].topk(k, dim=1).values  # (B, k)
    hinge = F.relu(margin - gt + hard) * old[:, None]
    return hinge.sum() / (old.sum() * k).clamp(min=1)
