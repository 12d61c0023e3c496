"""DPCR's maths on matrices small enough to solve by hand (dfcil.losses.dpcr), its drift and head as parts
(dfcil.methods.projection), and the method's config checks."""

import math

import pytest
import torch

from dfcil.errors import ConfigError
from dfcil.load import load_config
from dfcil.losses.dpcr import (
    class_maps,
    gram_of,
    move_statistics,
    ridge_head,
    ridge_solve,
    row_space_projector,
    task_map,
)
from dfcil.methods.memory import ClassMemory
from dfcil.methods.projection import DualProjectionDrift, RidgeClassifier
from dfcil.models.network import NetOutput

T = torch.tensor


def test_ridge_solve_by_hand():
    # (G + I)⁻¹ = [[3, 1], [1, 3]]⁻¹ = 1/8 [[3, −1], [−1, 3]]
    x = ridge_solve(T([[2.0, 1.0], [1.0, 2.0]]), T([[1.0], [0.0]]), ridge=1.0)
    assert torch.allclose(x, T([[3 / 8], [-1 / 8]]))
    assert torch.allclose(ridge_solve(T([[2.0, 0.0], [0.0, 4.0]]), T([[2.0], [4.0]]), 2.0), T([[0.5], [4 / 6]]))


def test_task_map_by_hand():
    old = T([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])  # XₒᵀXₒ = [[2, 1], [1, 2]]
    swap = T([[0.0, 1.0], [1.0, 0.0]])
    new = old @ swap  # XₒᵀXₙ = [[1, 2], [2, 1]]
    assert torch.allclose(task_map(old, new), swap, atol=1e-6)  # the authors' ridge 1e-9: the exact map
    # ridge 1: 1/8 [[3, −1], [−1, 3]] · [[1, 2], [2, 1]] = 1/8 [[1, 5], [5, 1]]
    assert torch.allclose(task_map(old, new, ridge=1.0), T([[1.0, 5.0], [5.0, 1.0]]) / 8)


def test_row_space_projector_by_hand():
    # X = [[1, 1]]: Φ = [[1, 1], [1, 1]], its row space the diagonal, projector ½·11ᵀ
    assert torch.allclose(row_space_projector(T([[1.0, 1.0], [1.0, 1.0]]), tol=1e-9), torch.full((2, 2), 0.5))
    assert torch.equal(row_space_projector(T([[4.0, 0.0], [0.0, 0.0]])), T([[1.0, 0.0], [0.0, 0.0]]))  # S > 0
    full = row_space_projector(T([[[2.0, 1.0], [1.0, 2.0]], [[4.0, 0.0], [0.0, 1e-3]]]))  # batched, full rank
    assert torch.allclose(full, torch.eye(2).expand(2, 2, 2), atol=1e-6)
    # a relative threshold drops the small direction that S > 0 keeps
    assert torch.equal(row_space_projector(T([[4.0, 0.0], [0.0, 1e-3]]), tol=1e-2), T([[1.0, 0.0], [0.0, 0.0]]))


def test_class_maps_and_move_by_hand():
    a = T([[1.0, 2.0], [3.0, 4.0]])
    maps = class_maps(a, T([[[1.0, 0.0], [0.0, 0.0]]]))  # A·diag(1, 0): keeps A's first column
    assert torch.equal(maps, T([[[1.0, 0.0], [3.0, 0.0]]]))
    means, grams = move_statistics(T([[1.0, 2.0]]), torch.eye(2)[None], maps)
    assert torch.equal(means, T([[7.0, 0.0]]))  # [1, 2]·[[1, 0], [3, 0]]
    assert torch.equal(grams, T([[[10.0, 0.0], [0.0, 0.0]]]))  # WᵀW = [[1, 3], [0, 0]]·[[1, 0], [3, 0]]


def test_gram_of_a_mean_and_covariance_is_the_uncentred_gram():
    x = T([[1.0, 0.0], [3.0, 2.0]])  # μ = [2, 1], Σ = [[2, 2], [2, 2]] (÷ 1), XᵀX = [[10, 6], [6, 4]]
    assert torch.equal(gram_of(T([[2.0, 1.0]]), T([[[2.0, 2.0], [2.0, 2.0]]]), T([2])), (x.T @ x)[None])


def test_moving_mean_and_covariance_moves_the_gram_as_the_authors_do():
    """Φ ← WᵀΦW (the authors' update of the Gram matrix) equals the Gram matrix of the moved mean and covariance."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(7, 3, generator=g, dtype=torch.float64)
    w = torch.randn(1, 3, 3, generator=g, dtype=torch.float64)
    mean, cov, n = x.mean(0)[None], torch.cov(x.T)[None], T([7])
    moved_mean, moved_cov = move_statistics(mean, cov, w)
    _, moved_gram = move_statistics(mean, (x.T @ x)[None], w)
    assert torch.allclose(gram_of(moved_mean, moved_cov, n), moved_gram, rtol=1e-5, atol=1e-5)
    assert torch.allclose(moved_mean, (x @ w[0]).mean(0)[None].float(), atol=1e-6)


def test_ridge_head_by_hand_and_its_column_normalisation():
    # (G + I)⁻¹ Q = 1/8 [[3, −1], [−1, 3]] · [[1, 0], [0, 2]] = 1/8 [[3, −2], [−1, 6]]
    g, q = T([[2.0, 1.0], [1.0, 2.0]]), T([[1.0, 0.0], [0.0, 2.0]])
    assert torch.allclose(ridge_head(g, q, gamma=1.0, normalize=False), T([[3.0, -2.0], [-1.0, 6.0]]) / 8)
    r = math.sqrt(10)
    assert torch.allclose(ridge_head(g, q, gamma=1.0), T([[3 / r, -1 / r], [-1 / r, 3 / r]]))


def test_dual_projection_drift_follows_an_exact_linear_shift():
    """New features = old·M: the task-wise map recovers M, and a class of full rank moves to the statistics of its
    new features; a class living on one axis is projected back onto it."""
    g = torch.Generator().manual_seed(1)
    old = torch.randn(200, 3, generator=g)
    m = T([[1.0, 0.5, 0.0], [0.0, 1.0, 0.2], [0.3, 0.0, 1.0]])
    cls = torch.randn(40, 3, generator=g)
    axis = torch.zeros(40, 3)
    axis[:, 0] = torch.randn(40, generator=g) + 2
    means = torch.stack([cls.mean(0), axis.mean(0)])
    covs = torch.stack([torch.cov(cls.T), torch.cov(axis.T)])
    counts = T([40, 40])
    drift = DualProjectionDrift(tol=1e-6, counts=lambda: counts)
    moved, moved_covs = drift.move(means, covs, [(old, old @ m)], torch.Generator(), "test")
    assert torch.allclose(moved[0], (cls @ m).mean(0), atol=1e-4)
    assert torch.allclose(moved_covs[0], torch.cov((cls @ m).T), atol=1e-4)
    # the axis class: μ·M·e₁e₁ᵀ, only the first coordinate of its mapped mean stays
    assert torch.allclose(moved[1], T([(axis.mean(0) @ m)[0].item(), 0.0, 0.0]), atol=1e-4)
    task_only = DualProjectionDrift(classwise=False).move(means, covs, [(old, old @ m)], torch.Generator(), "t")[0]
    assert torch.allclose(task_only[1], axis.mean(0) @ m, atol=1e-4) and task_only[1, 1].abs() > 0.1
    with pytest.raises(ValueError, match="covariance"):
        drift.move(means, None, [(old, old)], torch.Generator(), "test")


def test_ridge_classifier_from_stored_statistics_equals_the_head_of_the_features():
    """The old classes enter through (mean, covariance, count), the new ones through their features: the head is
    the ridge solve of all the features at once (the authors' accumulation), and it scores features by f·W."""
    g = torch.Generator().manual_seed(2)
    feats = torch.randn(30, 4, generator=g)
    labels = torch.repeat_interleave(torch.arange(3), torch.tensor([8, 8, 14]))
    memory = ClassMemory(None, covariances=True, augmented=False)
    memory.add(feats[:16], labels[:16], range(2))  # classes 0 and 1 stored as mean and covariance
    head = RidgeClassifier(gamma=5.0)
    head.add_counts(labels[:16], range(2))
    head.add_counts(labels[16:], range(2, 3))
    assert head.counts.tolist() == [8, 8, 14]
    head.fit(memory, 2, feats[16:], labels[16:], 3)
    want = ridge_head(feats.T @ feats, feats.T @ torch.nn.functional.one_hot(labels, 3).float(), 5.0)
    assert torch.allclose(head.weight, want, atol=1e-5)
    assert torch.allclose(head.weight.norm(dim=0), torch.ones(3))
    out = NetOutput(logits=torch.zeros(2, 3), features=feats[:2], fmaps=())
    assert torch.allclose(head.scores(out), feats[:2] @ want, atol=1e-5)
    restored = RidgeClassifier(gamma=5.0)
    restored.load_state_dict(head.state_dict())
    assert torch.equal(restored.weight, head.weight) and torch.equal(restored.counts, head.counts)


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ([("method.ldc", "true")], "dual projection"),
        ([("method.task_projection", "false")], "moves nothing"),
    ],
)
def test_dpcr_refuses_settings_it_would_ignore(overrides, match):
    with pytest.raises(ConfigError, match=match):
        load_config([], [("method.name", "dpcr"), *overrides])


def test_dpcr_switches_and_first_task_schedule():
    from dfcil.context import Task
    from dfcil.methods import build_method

    cfg, _ = load_config([], [("method.name", "dpcr"), ("method.first", '{"epochs": 4, "milestones": [2]}')])
    method = build_method(cfg.method, cfg.train)
    (first,) = method.phases(Task(task_id=0, n_old=0, n_new=5, num_tasks=2))
    (later,) = method.phases(Task(task_id=1, n_old=5, n_new=5, num_tasks=2))
    assert (first.epochs, first.lr, first.milestones, first.weight_decay) == (4, 0.1, (2,), 0.0005)
    assert (later.epochs, later.lr) == (cfg.train.epochs, cfg.train.lr)
    assert isinstance(method.memory.drift, DualProjectionDrift) and method.memory.drift.classwise
    assert method.stores == "class statistics" and method.head == "cosine"
    off = [("method.name", "dpcr"), ("method.task_projection", "false"), ("method.class_projection", "false")]
    cfg, _ = load_config([], off)
    assert build_method(cfg.method, cfg.train).memory.drift is None  # the ridge head alone: statistics stay
