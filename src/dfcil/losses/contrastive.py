"""Contrastive distillation against a memory bank: CRD (Tian et al., ICLR 2020) and the relation critic of CRCD
(Zhu et al., CVPR 2021), which R-DFCIL's supplement tried in place of RKD on the new data.

The maths are pure functions: the two critics, the NCE objective, the bank's momentum update and the draw of
negatives. :class:`ContrastMemory` holds one task's state: the two embedding heads (trained with the network), a
bank of student and of teacher embeddings with a row per training image of the task, and the NCE normalisers.
docs/baselines.md ("CRD and CRCD in place of RKD") says what follows the authors' code and what departs from it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dfcil.compute.precision import full_precision

EPS = 1e-7  # added to the NCE denominators, as RepDistiller's ContrastLoss


def nce_loss(p: Tensor, n_data: int) -> Tensor:
    """CRD's NCE objective (Tian et al. 2020, eq. 18, as RepDistiller's ``ContrastLoss``) over rows of scores.

    Row r holds p_r0 for its positive pair, then p_r1 … p_rK for K negatives; the noise distribution is uniform
    over the N images of the bank, P_n = 1/N:
    L = −1/R Σ_r [log(p_r0 / (p_r0 + K/N + ε)) + Σ_{k≥1} log((K/N) / (p_rk + K/N + ε))], ε = 1e-7.

    Args:
        p: (R, 1 + K) critic scores divided by their normaliser Z; column 0 is the positive.
        n_data: N, the images the bank holds.
    """
    noise = (p.shape[1] - 1) / n_data  # K · P_n
    log_pos = torch.log(p[:, 0] / (p[:, 0] + noise + EPS))
    log_neg = torch.log(noise / (p[:, 1:] + noise + EPS))
    return -(log_pos.sum() + log_neg.sum()) / p.shape[0]


def crd_scores(anchor: Tensor, bank: Tensor, rows: Tensor, temperature: float) -> Tensor:
    """CRD's critic before normalisation: h_bk = exp(⟨w_bk, v_b⟩ / T), w_bk = bank[rows[b, k]] (RepDistiller's
    ``ContrastMemory``).

    The inner products are taken with the whole bank, then picked: (B, N) numbers, fewer than the (B, 1 + K, D)
    gathered rows wherever N < K·D, as a task's bank is.

    Args:
        anchor: (B, D) one side's unit embeddings of the batch.
        bank: (N, D) the other side's bank.
        rows: (B, 1 + K) bank rows per sample: column 0 the image's own row (the positive), then its K negatives.
        temperature: T.

    Returns:
        (B, 1 + K) scores.
    """
    return torch.exp((anchor @ bank.T).gather(1, rows) / temperature)


def crcd_scores(anchor: Tensor, bank: Tensor, rows: Tensor, temperature: float) -> Tensor:
    """CRCD's relation critic before normalisation (Zhu et al. 2021; Lechatelia/CRCD ``crcd/memory.py``): CRD's
    critic on differences to the batch's centres c_a = w_a0 (the bank rows of the batch's own images) instead of
    on the embeddings themselves.

    For a sample b and a centre a ≠ b: h_bak = exp(cos(v_b − c_a, w_bk − c_a) / T), w_bk = bank[rows[b, k]]. Its
    positive (k = 0) is the bank's relation c_b − c_a of the same two images. A zero difference (a negative that is
    centre a's own image) has cosine 0, as F.normalize makes it a zero vector. Rows a = b are left out: their
    positive, c_b − c_b, is zero (the authors' code adds 1e-6 to every coordinate, which makes it the constant
    direction (1, …, 1)/√D there).

    Computed from inner products, ⟨v − c, w − c⟩ = ⟨v, w⟩ − ⟨v, c⟩ − ⟨w, c⟩ + ‖c‖², so that it holds (B, 1 + K, B)
    numbers instead of the (B, B, 1 + K, D) differences; the lengths ‖w − c‖ are computed as differences (exactly
    zero for equal rows).

    Args:
        anchor: (B, D) one side's unit embeddings of the batch, B ≥ 2.
        bank: (N, D) the other side's bank.
        rows: (B, 1 + K) bank rows per sample, column 0 the image's own row.
        temperature: T.

    Returns:
        (B·(B − 1), 1 + K) scores: row b·(B − 1) + j for sample b and the j-th centre a ≠ b, in order of a.
    """
    b = anchor.shape[0]
    centres = bank[rows[:, 0]]  # (B, D)
    vw = (anchor @ bank.T).gather(1, rows)  # (B, 1+K): ⟨v_b, w_bk⟩
    vc = anchor @ centres.T  # (B, B): ⟨v_b, c_a⟩
    wc = (bank @ centres.T)[rows]  # (B, 1+K, B): ⟨w_bk, c_a⟩
    dot = vw.unsqueeze(2) - vc.unsqueeze(1) - wc + centres.pow(2).sum(dim=1)  # (B, 1+K, B): ⟨v_b − c_a, w_bk − c_a⟩
    v_len = (anchor.unsqueeze(1) - centres.unsqueeze(0)).norm(dim=2).clamp_min(1e-12)  # (B, B): ‖v_b − c_a‖
    with torch.no_grad():  # bank rows: constants
        w_len = torch.cdist(bank, centres, compute_mode="donot_use_mm_for_euclid_dist")[rows]  # (B, 1+K, B)
    nonzero = w_len > 0
    cos = dot / (v_len.unsqueeze(1) * torch.where(nonzero, w_len, 1.0)) * nonzero
    scores = torch.exp(cos / temperature).transpose(1, 2).reshape(b * b, -1)  # row b·B + a
    # drop the rows a = b without a boolean mask (no host sync): flattened, the diagonal is every (B+1)-th row
    return scores[1:].reshape(b - 1, b + 1, -1)[:, :-1].reshape(b * (b - 1), -1)


def momentum_rows(rows: Tensor, new: Tensor, momentum: float) -> Tensor:
    """The bank's update (RepDistiller's ``ContrastMemory``): normalise(m·rows + (1 − m)·new), rows to unit length.

    Args:
        rows: (B, D) the bank's rows of the batch's images.
        new: (B, D) their embeddings of this step.
        momentum: m.
    """
    return F.normalize(rows * momentum + new * (1 - momentum), dim=1)


def draw_negatives(first: Tensor, count: Tensor, order: Tensor, k: int, generator: torch.Generator) -> Tensor:
    """K bank rows per sample, uniform with replacement among the images of the other classes (RepDistiller's
    "exact" mode draws them from ``cls_negative[target]``).

    ``order`` lists the bank's rows sorted by class, so that a sample's class is the block [first, first + count)
    of it: a draw u, uniform in [0, N − count), skips that block (u ≥ first moves on by count).

    Args:
        first: (B,) where each sample's class starts in ``order``.
        count: (B,) the images of each sample's class.
        order: (N,) the bank's rows sorted by class.
        k: K, negatives per sample.
        generator: the random stream to draw from, on ``order``'s device.

    Returns:
        (B, K) int64 bank rows.
    """
    pool = (order.numel() - count).unsqueeze(1)  # (B, 1) images of the other classes
    u = torch.rand(len(first), k, generator=generator, device=order.device, dtype=torch.float64)
    u = torch.minimum((u * pool).long(), pool - 1)  # (B, K) in [0, pool)
    return order[u + count.unsqueeze(1) * (u >= first.unsqueeze(1))]


@dataclasses.dataclass(frozen=True)
class Critic:
    scores: Callable[[Tensor, Tensor, Tensor, float], Tensor]  # (anchor, bank, rows, temperature) → (R, 1 + K)
    unit_init: bool  # the bank starts with unit rows (CRCD's code) rather than raw uniform ones (RepDistiller's)


CRITICS = {"crd": Critic(crd_scores, unit_init=False), "crcd": Critic(crcd_scores, unit_init=True)}


class ContrastMemory(nn.Module):
    """One task's CRD or CRCD state: the embedding heads (trained), the banks and the NCE normalisers.

    ``embed_s`` and ``embed_t`` map the student's and the teacher's features to unit embeddings (Linear(d, D), then
    L2 normalisation; RepDistiller's ``Embed``). ``bank_s`` and ``bank_t`` hold a momentum average of each side's
    embedding of every training image of the task (row i: the task's image i, ``Batch.index``), initialised
    uniform in ±1/√(D/3) (unit rows for CRCD). ``z`` holds the two NCE normalisers, set at the task's first step to
    mean(h)·N as RepDistiller sets them (0: not set yet).

    Args:
        kind: the critic, a key of :data:`CRITICS`.
        in_dim: d, the feature size of student and teacher.
        labels: (N,) the labels of the task's training images, row i the bank's row i.
        feat_dim: D, the embedding size.
        negatives: K, negatives per image.
        temperature: T.
        momentum: m, the bank's momentum.
    """

    def __init__(
        self, kind: str, in_dim: int, labels: Tensor, feat_dim: int, negatives: int, temperature: float, momentum: float
    ) -> None:
        super().__init__()
        if kind not in CRITICS:
            raise ValueError(f"unknown contrastive critic {kind!r}; expected one of {sorted(CRITICS)}")
        labels = labels.cpu()
        if labels.unique().numel() < 2:
            raise ValueError(f"{kind} draws its negatives from other classes: the task's images need two classes")
        self.critic, self.negatives, self.temperature, self.momentum = CRITICS[kind], negatives, temperature, momentum
        self.embed_s = nn.Linear(in_dim, feat_dim)
        self.embed_t = nn.Linear(in_dim, feat_dim)
        bound = 1 / math.sqrt(feat_dim / 3)
        banks = torch.rand(2, len(labels), feat_dim) * (2 * bound) - bound
        if self.critic.unit_init:
            banks = F.normalize(banks, dim=2)
        self.register_buffer("bank_s", banks[0].clone())  # (N, D) student embeddings
        self.register_buffer("bank_t", banks[1].clone())  # (N, D) teacher embeddings
        self.register_buffer("z", torch.zeros(2))  # normalisers of the student- and the teacher-anchored scores
        # where each image's class lies in the rows sorted by class (from the labels: rebuilt, not saved)
        order = torch.argsort(labels, stable=True)
        first = torch.searchsorted(labels[order], labels)
        count = torch.searchsorted(labels[order], labels, right=True) - first
        self.register_buffer("order", order, persistent=False)
        self.register_buffer("first", first, persistent=False)
        self.register_buffer("count", count, persistent=False)

    def forward(self, f_s: Tensor, f_t: Tensor, index: Tensor, generator: torch.Generator) -> Tensor:
        """The loss of one batch, both directions summed (RepDistiller's ``CRDLoss``); then the banks' rows of the
        batch move towards its embeddings.

        Args:
            f_s: (B, d) the student's features of the batch.
            f_t: (B, d) the teacher's features of the same images.
            index: (B,) their bank rows.
            generator: the random stream the negatives are drawn from.
        """
        with full_precision(f_s.device.type):  # exp(s/T) with T = 0.07 needs fp32 under bf16 autocast
            e_s = F.normalize(self.embed_s(f_s.float()), dim=1)  # (B, D)
            e_t = F.normalize(self.embed_t(f_t.float()), dim=1)
            negatives = draw_negatives(self.first[index], self.count[index], self.order, self.negatives, generator)
            rows = torch.cat([index.unsqueeze(1), negatives], dim=1)  # (B, 1+K): the positive first
            # each side's embedding against the other side's bank as it was before this step's update (RepDistiller);
            # copies, which the backward reads after the update below
            h_s = self.critic.scores(e_s, self.bank_t.clone(), rows, self.temperature)
            h_t = self.critic.scores(e_t, self.bank_s.clone(), rows, self.temperature)
            n = self.bank_s.shape[0]
            first_step = torch.stack([h_s.detach().mean(), h_t.detach().mean()]) * n
            z = torch.where(self.z > 0, self.z, first_step)  # in place and on the device: a graph replays it
            self.z.copy_(z)
            loss = nce_loss(h_s / z[0], n) + nce_loss(h_t / z[1], n)
            with torch.no_grad():
                self.bank_s.index_copy_(0, index, momentum_rows(self.bank_s[index], e_s, self.momentum))
                self.bank_t.index_copy_(0, index, momentum_rows(self.bank_t[index], e_t, self.momentum))
        return loss
