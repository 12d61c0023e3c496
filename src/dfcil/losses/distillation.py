"""Distillation losses: hard (logit L1) KD, angle-wise relational KD, and the baselines' soft-target KDs."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dfcil.compute.precision import full_precision
from dfcil.models.heads import MASKED_LOGIT


def hkd_l1(student_logits: Tensor, teacher_logits: Tensor, old: int | Tensor | None = None) -> Tensor:
    """Hard knowledge distillation (R-DFCIL eq. 2): mean absolute difference of raw logits.

    L = 1/(B·K) Σ_b Σ_k |s_bk − t_bk| over the K old classes; no temperature or softmax. Shapes (B, K); or, with
    ``old`` = K, the student's first K columns of (B, ≥ K); or, with ``old`` a static head's boolean mask of the K
    old columns, both (B, capacity), the other columns left out.
    """
    if isinstance(old, Tensor):
        diff = torch.where(old, student_logits.float() - teacher_logits.float(), 0.0)
        return diff.abs().sum() / (diff.shape[0] * old.sum())
    if old is not None:
        student_logits = student_logits[:, :old]
    return F.l1_loss(student_logits.float(), teacher_logits.float())


def angle_matrix(e: Tensor) -> Tensor:
    """Cosines of all triplet angles: A[i, j, k] = ⟨e_ij, e_ik⟩ with e_ij = normalise(e_j − e_i).

    Zero differences (j = i) stay zero vectors, so A[i, i, :] = A[i, :, i] = 0, and A[i, j, j] = 1 for j ≠ i.

    Args:
        e: (N, D) embeddings.

    Returns:
        (N, N, N) tensor.
    """
    with full_precision(e.device.type):  # normalised differences need fp32 under bf16 autocast
        e = e.float()
        diff = e.unsqueeze(0) - e.unsqueeze(1)  # (N, N, D): diff[i, j] = e[j] - e[i]
        unit = F.normalize(diff, p=2, dim=2)
        return torch.bmm(unit, unit.transpose(1, 2))


def rkd_angle(student: Tensor, teacher: Tensor) -> Tensor:
    """Angle-wise relational KD (Park et al. 2019; R-DFCIL eq. 5), as cl-lite ``RKDAngleLoss``.

    L = 1/N³ Σ_ijk |A^s_ijk − A^t_ijk|: plain L1 (not smooth-L1) over all N³ entries, degenerate ones included.

    Args:
        student: (N, D) student embeddings.
        teacher: (N, D) teacher embeddings.
    """
    return F.l1_loss(angle_matrix(student), angle_matrix(teacher))


class RelationProjector(nn.Module):
    """The two learned maps of R-DFCIL's RKD: ``student`` (ψ) and ``teacher`` (φ), each Linear(d, 2d) with bias.

    Both are trained by the RKD loss (the teacher's features are constants, its projection is not) and
    re-created at every task, as in the reference.
    """

    def __init__(self, in_dim: int, out_dim: int | None = None) -> None:
        super().__init__()
        out_dim = out_dim or 2 * in_dim
        self.student = nn.Linear(in_dim, out_dim)
        self.teacher = nn.Linear(in_dim, out_dim)

    def forward(self, student_features: Tensor, teacher_features: Tensor) -> tuple[Tensor, Tensor]:
        return self.student(student_features), self.teacher(teacher_features)


def kd_soft_ce(
    student_logits: Tensor, teacher_logits: Tensor, temperature: float = 2.0, old: int | Tensor | None = None
) -> Tensor:
    """Soft-target KD as ABD's code computes it (LwF, DeepInversion): no T² factor, mean over the batch.

    L = −1/B Σ_b Σ_k softmax(t_b / T)_k · log_softmax(s_b / T)_k. When the student has more classes than the
    teacher (DeepInversion's KD on synthetic data), the target is padded with zeros, so the student's extra
    classes are pushed towards zero probability.

    Args:
        student_logits: (B, K_s) student logits, K_s ≥ K_t.
        teacher_logits: (B, K_t) teacher logits.
        old: the old classes only, both softmaxes over them: ``n_old`` = K_t, the student's first K_t columns; or
            a static head's boolean mask of the old columns, student and teacher both (B, capacity), the other
            columns masked out of both softmaxes (the same loss, with shapes that do not depend on the task).
    """
    if isinstance(old, Tensor):  # a masked column's probability is exactly 0, its log-probability finite
        student_logits = student_logits.masked_fill(~old, MASKED_LOGIT)
        teacher_logits = teacher_logits.masked_fill(~old, MASKED_LOGIT)
    elif old is not None:
        student_logits = student_logits[:, :old]
    target = F.softmax(teacher_logits.float() / temperature, dim=1)
    if student_logits.shape[1] > target.shape[1]:
        target = F.pad(target, (0, student_logits.shape[1] - target.shape[1]))
    log_p = F.log_softmax(student_logits.float() / temperature, dim=1)
    return -(target * log_p).sum(dim=1).mean()


def sigmoid_bce_kd(
    logits: Tensor, y: Tensor, teacher_logits: Tensor | None = None, old: int | Tensor | None = None
) -> Tensor:
    """LwF.MC's loss as ABD's code computes it (``LWF_MC``): per-class sigmoids, binary CE summed over classes and
    samples, divided by the batch size.

    The target is one-hot for the label; with a teacher, its K_t old-class entries become the teacher's sigmoid
    outputs (the distillation: no temperature, no weight). L = −1/B Σ_b Σ_k [q_bk log σ(s_bk) + (1 − q_bk)
    log(1 − σ(s_bk))]. Computed from the logits (``binary_cross_entropy_with_logits``): exact where ABD's fp32
    ``BCELoss(sigmoid(s))`` saturates (s ≳ 17: 1 − σ rounds to 0, so the (1 − q) term is clamped at 100 with no
    gradient; s ≲ −28: its backward clamps σ(1 − σ) at 1e-12, shrinking the q term's gradient, ×0.094 at −30).
    Elsewhere the two agree to rounding.

    Args:
        logits: (B, K) student logits over the seen classes.
        y: (B,) labels in [0, K).
        teacher_logits: (B, K_t) the old model's logits, K_t ≤ K, or None on the first task.
        old: a static head's (K,) boolean mask of the old classes' columns (``IncrementalNet.old_and_new``), the
            teacher's logits then (B, K) too: the targets are the teacher's sigmoids where it is set, so that the
            shapes never change between tasks. A masked (unseen) column's logit (``MASKED_LOGIT``) against its
            target 0 adds exactly 0. An int (a growing head's old-column count) or None: the first K_t columns.
    """
    # one-hot without F.one_hot, which reads max(y) on the host (no CUDA graph could capture the step)
    target = (y.unsqueeze(1) == torch.arange(logits.shape[1], device=y.device)).float()
    if teacher_logits is not None:
        soft = torch.sigmoid(teacher_logits.float())
        masked = isinstance(old, Tensor)  # the static head's mask, else the first K_t columns
        target = torch.where(old, soft, target) if masked else torch.cat((soft, target[:, soft.shape[1] :]), dim=1)
    bce = F.binary_cross_entropy_with_logits(logits.float(), target, reduction="sum")
    return bce / logits.shape[0]


def head_feature_kd(student_features: Tensor, teacher_features: Tensor, old_head_weight: Tensor) -> Tensor:
    """ABD's importance-weighted feature distillation: MSE of the old head's logits of the two feature sets.

    d = W_old (f_s − f_t) (a linear head's bias would cancel); L = 1/B Σ_b ‖d_b‖² / K_old.

    Args:
        student_features, teacher_features: (B, D).
        old_head_weight: (K_old, D) the frozen copy of the old classifier.
    """
    d = F.linear(student_features.float() - teacher_features.float(), old_head_weight.float())
    return d.pow(2).mean(dim=1).mean()
