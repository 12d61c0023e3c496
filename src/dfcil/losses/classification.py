"""Classification losses."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from dfcil.models.heads import MASKED_LOGIT


def local_ce(logits: Tensor, y: Tensor, new: int | Tensor) -> Tensor:
    """Local cross-entropy: CE over the new classes' logits only (R-DFCIL eq. 3).

    L = mean_b CE(softmax(logits[b, n_old:]), y[b] - n_old). Old classifiers receive no gradient.

    Args:
        logits: (B, n_seen) logits over all seen classes, or (B, capacity) of a static head.
        y: (B,) labels, all in ``[n_old, n_seen)``.
        new: ``n_old``, the classes learned before the current task (the new ones are the columns after them);
            or a static head's boolean mask of the new columns, whose complement is masked out of the softmax
            (the same loss, with shapes that do not depend on the task).
    """
    if isinstance(new, Tensor):
        return F.cross_entropy(logits.masked_fill(~new, MASKED_LOGIT).float(), y)
    return F.cross_entropy(logits[:, new:].float(), y - new)


def class_histogram(y: Tensor, n_classes: int) -> Tensor:
    """Counts of each label in ``y`` as a float vector of length ``n_classes``.

    Uses ``index_add`` rather than ``bincount``, whose output size depends on the data and forces a host sync on
    CUDA. Labels must lie in ``[0, n_classes)``.
    """
    ones = torch.ones(y.shape, dtype=torch.float32, device=y.device)
    return torch.zeros(n_classes, dtype=torch.float32, device=y.device).index_add_(0, y, ones)


def task_balance_weights(y: Tensor, n_old: int, n_seen: int) -> Tensor:
    """ABD's per-sample weights (also its DGR): r = n_old / n_seen for old-class labels, 1 − r for new ones.

    With as many replayed as real samples per batch, every seen class gets the same total weight in expectation.
    """
    r = n_old / n_seen
    return torch.where(y < n_old, r, 1.0 - r)


def balanced_class_weights(counts: Tensor) -> Tensor:
    """Class-balanced CE weights from cumulative label counts (R-DFCIL reference §7).

    w_c = (Σ_k n_k) / max(n_c, 1), then divided by min_c w_c: the most frequent class gets 1 and class c gets
    max_k n_k / n_c. A class never seen gets max_k n_k (its count is taken as 1).
    """
    w = counts.sum() / counts.clamp(min=1)
    return w / w.min()
