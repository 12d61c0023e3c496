import math

import pytest
import torch

from dfcil.losses.classification import balanced_class_weights, class_histogram, local_ce
from dfcil.losses.distillation import RelationProjector, angle_matrix, hkd_l1, rkd_angle
from dfcil.methods.rdfcil import rdfcil_loss_weights


def test_local_ce_uses_new_logits_only():
    logits = torch.tensor([[1.0, 2.0, 3.0, 0.5], [9.0, 9.0, 0.0, 1.0]], requires_grad=True)
    y = torch.tensor([2, 3])
    # row 0: CE([3, .5], 0) = log(1 + e^-2.5); row 1: CE([0, 1], 1) = log(1 + e^-1)
    expected = (math.log(1 + math.exp(-2.5)) + math.log(1 + math.exp(-1))) / 2
    loss = local_ce(logits, y, 2)
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    loss.backward()
    assert torch.all(logits.grad[:, :2] == 0)  # old classifiers get no gradient


def test_hkd_l1_hand_value_and_zero_at_identity():
    s = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    t = torch.tensor([[0.0, 2.0], [5.0, 4.0]])
    assert hkd_l1(s, t).item() == pytest.approx(0.75)
    assert hkd_l1(t, t).item() == 0


def test_angle_matrix_hand_values():
    e = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    a = angle_matrix(e)
    assert a.shape == (3, 3, 3)
    assert a[0, 1, 2].item() == pytest.approx(0.0, abs=1e-7)  # right angle at vertex 0
    assert a[1, 0, 2].item() == pytest.approx(1 / math.sqrt(2), rel=1e-6)
    assert a[2, 0, 1].item() == pytest.approx(1 / math.sqrt(2), rel=1e-6)
    for i in range(3):  # degenerate entries (j = i or k = i) are 0
        assert torch.all(a[i, i, :] == 0) and torch.all(a[i, :, i] == 0)
    assert a[1, 2, 2].item() == pytest.approx(1.0)


def test_rkd_angle_hand_value():
    s = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    t = torch.tensor([[0.0, 0.0], [2.0, 0.0], [0.0, 3.0]])
    # only the angles at vertices 1 and 2 differ: cos 45° vs 2/√13 and 3/√13, each entry twice (j,k swapped)
    r2 = 1 / math.sqrt(2)
    expected = 2 * (abs(r2 - 2 / math.sqrt(13)) + abs(r2 - 3 / math.sqrt(13))) / 27
    assert rkd_angle(s, t).item() == pytest.approx(expected, rel=1e-5)
    assert rkd_angle(s, 5 * s + 1).item() == pytest.approx(0, abs=1e-6)  # angles are scale/shift invariant


def test_relation_projector_trains_both_sides():
    proj = RelationProjector(4)
    assert proj.student.weight.shape == (8, 4) and proj.teacher.bias is not None
    s, t = proj(torch.randn(6, 4, requires_grad=True), torch.randn(6, 4))
    rkd_angle(s, t).backward()
    assert proj.teacher.weight.grad.abs().sum() > 0 and proj.student.weight.grad.abs().sum() > 0


def test_class_histogram_and_balanced_weights():
    y = torch.tensor([0, 0, 3, 1, 3, 3])
    assert class_histogram(y, 4).tolist() == [2, 1, 0, 3]
    w = balanced_class_weights(torch.tensor([10.0, 5.0, 0.0, 20.0]))
    # total 35 / [10, 5, max(0,1), 20] = [3.5, 7, 35, 1.75], divided by the minimum
    assert w.tolist() == pytest.approx([2.0, 4.0, 20.0, 1.0])


@pytest.mark.parametrize(
    ("n_old", "n_new", "expected"),
    [
        (10, 10, (2.585, 0.693, 0.388, 1.292)),  # CIFAR-100 10 tasks, task 1 (reference §6)
        (90, 10, (2.585, 0.231, 1.163, 3.877)),  # 10 tasks, task 9
        (20, 20, (3.459, 0.645, 0.519, 1.730)),  # 5 tasks, task 1
        (95, 5, (1.807, 0.178, 1.182, 3.939)),  # 20 tasks, task 19
        (50, 2, (1.000, 0.200, 0.750, 2.500)),  # base-50 protocol, 2 classes per task
    ],
)
def test_adaptive_weights_match_the_reference_examples(n_old, n_new, expected):
    w = rdfcil_loss_weights(0.5, 0.15, 0.5, n_old, n_new)
    assert (w.alpha, w.lce, w.hkd, w.rkd) == pytest.approx(expected, abs=1e-3)
