"""CRD and CRCD (dfcil.losses.contrastive): each piece against numbers worked out by hand, the bank's state, and
where the gradient goes."""

import math

import pytest
import torch
from torch import nn

from dfcil.losses.contrastive import (
    EPS,
    ContrastMemory,
    crcd_scores,
    crd_scores,
    draw_negatives,
    momentum_rows,
    nce_loss,
)

E = math.e


def nce_by_hand(rows, n_data):
    """Eq. 18 written out: rows of normalised scores, the first of each the positive."""
    total = 0.0
    for row in rows:
        noise = (len(row) - 1) / n_data
        total += math.log(row[0] / (row[0] + noise + EPS))
        total += sum(math.log(noise / (p + noise + EPS)) for p in row[1:])
    return -total / len(rows)


def test_nce_loss_by_hand():
    # K = 2 negatives over N = 4 images: K/N = 0.5
    # row 0: −[log(0.5 / 1.0) + 2·log(0.5 / 0.75)] = log 2 + 2·log 1.5 = 1.5041
    # row 1: −[log(1.5 / 2.0) + log(0.5 / 0.6) + log(0.5 / 1.5)] = 0.2877 + 0.1823 + 1.0986 = 1.5686
    p = torch.tensor([[0.5, 0.25, 0.25], [1.5, 0.1, 1.0]])
    want = (math.log(2) + 2 * math.log(1.5) + math.log(2 / 1.5) + math.log(0.6 / 0.5) + math.log(3)) / 2
    assert nce_loss(p, 4).item() == pytest.approx(want, rel=1e-5)
    assert nce_loss(p, 4).item() == pytest.approx(nce_by_hand(p.tolist(), 4), rel=1e-6)


BANK = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [0.0, -1.0]])  # N = 4 rows, D = 2


def test_crd_scores_by_hand():
    """exp(⟨w, v⟩ / T) at T = 0.5, three samples, their own rows first, then two negatives."""
    v = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])
    rows = torch.tensor([[0, 1, 2], [1, 2, 3], [2, 3, 0]])
    want = torch.tensor(
        [
            [E**2, 1.0, E**-2],  # ⟨w0, v0⟩ = 1, ⟨w1, v0⟩ = 0, ⟨w2, v0⟩ = −1, over T = 0.5
            [E**2, 1.0, E**-2],
            [E**-1.2, E**-1.6, E**1.2],  # ⟨w2, v2⟩ = −0.6, ⟨w3, v2⟩ = −0.8, ⟨w0, v2⟩ = 0.6
        ]
    )
    torch.testing.assert_close(crd_scores(v, BANK, rows, 0.5), want)


def test_crcd_scores_by_hand():
    """exp(cos(v_b − c_a, w_bk − c_a) / T) at T = 1 for the pairs a ≠ b, c_a = the bank row of sample a's image."""
    v = torch.tensor([[0.6, 0.8], [-0.8, 0.6], [0.0, -1.0]])
    rows = torch.tensor([[0, 3, 1], [1, 3, 2], [2, 3, 0]])  # centres c0 = w0, c1 = w1, c2 = w2
    bank = BANK.tolist()

    def cos(p, q):
        n = math.sqrt(p[0] ** 2 + p[1] ** 2) * math.sqrt(q[0] ** 2 + q[1] ** 2)
        return 0.0 if n == 0 else (p[0] * q[0] + p[1] * q[1]) / n

    want = []
    for b in range(3):
        for a in range(3):
            if a == b:
                continue
            c = bank[rows[a][0]]
            rel_v = (v[b][0].item() - c[0], v[b][1].item() - c[1])
            want.append([math.exp(cos(rel_v, (bank[k][0] - c[0], bank[k][1] - c[1]))) for k in rows[b].tolist()])
    got = crcd_scores(v, BANK, rows, 1.0)
    assert got.shape == (6, 3)
    torch.testing.assert_close(got, torch.tensor(want))
    # row (b 0, a 1), positive: v0 − c1 = (0.6, −0.2), w0 − c1 = (1, −1): cos = 0.8 / (√0.4·√2) = √0.8
    assert got[0, 0].item() == pytest.approx(math.exp(math.sqrt(0.8)), rel=1e-6)
    # row (b 1, a 2), second negative: w2 is centre 2 itself, a zero difference: cosine 0
    assert got[3, 2].item() == pytest.approx(1.0)


def test_momentum_rows_by_hand():
    rows = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    new = torch.tensor([[0.0, 1.0], [0.0, 3.0]])
    # 0.5·(1, 0) + 0.5·(0, 1) = (0.5, 0.5) → (1, 1)/√2;  0.5·(0, 1) + 0.5·(0, 3) = (0, 2) → (0, 1)
    s = 1 / math.sqrt(2)
    torch.testing.assert_close(momentum_rows(rows, new, 0.5), torch.tensor([[s, s], [0.0, 1.0]]))


def test_negatives_are_drawn_from_every_other_class_and_never_the_own():
    labels = torch.tensor([2, 0, 1, 0, 2, 1, 1])  # rows of classes 0: {1, 3}, 1: {2, 5, 6}, 2: {0, 4}
    order = torch.argsort(labels, stable=True)
    first = torch.searchsorted(labels[order], labels)
    count = torch.searchsorted(labels[order], labels, right=True) - first
    index = torch.arange(7)
    rows = draw_negatives(first, count, order, 2000, torch.Generator().manual_seed(0))
    assert rows.shape == (7, 2000)
    for i in range(7):
        others = {j for j in range(7) if labels[j] != labels[i]}
        assert set(rows[i].tolist()) == others  # all of them drawn, nothing else
    again = draw_negatives(first, count, order, 2000, torch.Generator().manual_seed(0))
    assert torch.equal(rows, again) and not (labels[rows] == labels[index].unsqueeze(1)).any()


def _identity_memory(kind, bank_s, bank_t, labels, temperature=1.0, negatives=2):
    memory = ContrastMemory(kind, 2, labels, 2, negatives, temperature, 0.5)
    with torch.no_grad():
        for head in (memory.embed_s, memory.embed_t):
            head.weight.copy_(torch.eye(2))
            head.bias.zero_()
        memory.bank_s.copy_(bank_s)
        memory.bank_t.copy_(bank_t)
    return memory


def test_crd_memory_loss_normalisers_and_update_by_hand():
    """The whole CRD step: three images of class 0 whose only other-class image is row 3, so both negatives of each
    are row 3; identity heads, T = 1, N = 4, K = 2. The normalisers are set at the first step to mean(h)·N."""
    labels = torch.tensor([0, 0, 0, 1])
    bank_t = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8], [-1.0, 0.0]])
    bank_s = torch.tensor([[0.0, 1.0], [1.0, 0.0], [0.8, 0.6], [0.0, 1.0]])
    memory = _identity_memory("crd", bank_s, bank_t, labels)
    f_s = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])  # unit already: the heads' normalisation keeps them
    f_t = torch.tensor([[0.0, 1.0], [1.0, 0.0], [0.8, 0.6]])
    loss = memory(f_s, f_t, torch.tensor([0, 1, 2]), torch.Generator())
    # student embeddings against the teacher's bank: ⟨t_i, v_i⟩ = 1 each; ⟨t3, v⟩ = −1, 0, −0.6
    h_s = [[E, E**-1, E**-1], [E, 1.0, 1.0], [E, E**-0.6, E**-0.6]]
    # teacher embeddings against the student's bank: ⟨s_i, u_i⟩ = 1 each; ⟨s3, u⟩ = 1, 0, 0.6
    h_t = [[E, E, E], [E, 1.0, 1.0], [E, E**0.6, E**0.6]]
    z_s = (3 * E + 2 * E**-1 + 2 + 2 * E**-0.6) / 9 * 4
    z_t = (5 * E + 2 + 2 * E**0.6) / 9 * 4
    want = nce_by_hand([[h / z_s for h in r] for r in h_s], 4) + nce_by_hand([[h / z_t for h in r] for r in h_t], 4)
    assert loss.item() == pytest.approx(want, rel=1e-5)
    torch.testing.assert_close(memory.z, torch.tensor([z_s, z_t]))
    # rows 0-2 moved halfway to this step's embeddings, back to unit length: teacher row 2, ½(0.6, 0.8) + ½(0.8,
    # 0.6) = (0.7, 0.7) → (1, 1)/√2, and so on; row 3 (not in the batch) kept
    s = 1 / math.sqrt(2)
    torch.testing.assert_close(memory.bank_t[:3], torch.full((3, 2), s))
    torch.testing.assert_close(memory.bank_s[:3], torch.full((3, 2), s))
    assert torch.equal(memory.bank_t[3], bank_t[3]) and torch.equal(memory.bank_s[3], bank_s[3])
    memory(f_s, f_t, torch.tensor([0, 1, 2]), torch.Generator())
    torch.testing.assert_close(memory.z, torch.tensor([z_s, z_t]))  # set once per task


def test_crcd_memory_loss_by_hand():
    """The CRCD step on the same images: the relation scores of both sides, normalised and scored by NCE."""
    labels = torch.tensor([0, 0, 0, 1])
    bank_t = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8], [-1.0, 0.0]])
    bank_s = torch.tensor([[0.0, 1.0], [1.0, 0.0], [0.8, 0.6], [0.0, -1.0]])
    memory = _identity_memory("crcd", bank_s, bank_t, labels)
    f_s = torch.tensor([[0.6, -0.8], [0.0, 1.0], [-1.0, 0.0]])
    f_t = torch.tensor([[0.0, -1.0], [1.0, 0.0], [0.8, -0.6]])
    loss = memory(f_s, f_t, torch.tensor([0, 1, 2]), torch.Generator())

    def cos(p, q):
        return (p[0] * q[0] + p[1] * q[1]) / math.hypot(*p) / math.hypot(*q)

    def scores(v, bank):
        out = []
        for b in range(3):
            for a in range(3):
                if a != b:
                    c = bank[a]
                    rel = (v[b][0] - c[0], v[b][1] - c[1])
                    out.append([math.exp(cos(rel, (bank[k][0] - c[0], bank[k][1] - c[1]))) for k in (b, 3, 3)])
        return out

    want = 0.0
    for h in (scores(f_s.tolist(), bank_t.tolist()), scores(f_t.tolist(), bank_s.tolist())):
        z = sum(map(sum, h)) / 18 * 4
        want += nce_by_hand([[x / z for x in r] for r in h], 4)
    assert loss.item() == pytest.approx(want, rel=1e-5)


@pytest.mark.parametrize("kind", ["crd", "crcd"])
def test_gradient_reaches_the_student_and_both_heads_never_the_teacher_or_the_bank(kind):
    torch.manual_seed(0)
    student, teacher = nn.Linear(5, 4), nn.Linear(5, 4)
    labels = torch.tensor([0, 1, 0, 1, 2, 2])
    memory = ContrastMemory(kind, 4, labels, 3, 4, 0.07, 0.5)
    x = torch.randn(4, 5)
    with torch.no_grad():  # the frozen old model, as R-DFCIL's teacher pass
        f_t = teacher(x)
    loss = memory(student(x), f_t, torch.tensor([5, 0, 3, 2]), torch.Generator().manual_seed(1))
    loss.backward()
    assert torch.isfinite(loss)
    for part in (student, memory.embed_s, memory.embed_t):
        assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in part.parameters())
    assert all(p.grad is None for p in teacher.parameters())
    assert not memory.bank_s.requires_grad and not memory.bank_t.requires_grad


def test_a_task_of_one_class_has_no_negatives():
    with pytest.raises(ValueError, match="two classes"):
        ContrastMemory("crd", 4, torch.zeros(5, dtype=torch.long), 3, 4, 0.07, 0.5)
