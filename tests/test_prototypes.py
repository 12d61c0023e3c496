"""Class statistics in feature space (dfcil.losses.prototypes) against hand values and numpy."""

import numpy as np
import pytest
import torch

from dfcil.losses.prototypes import (
    balanced_labels,
    class_gaussians,
    fit_projector,
    gaussian_factors,
    lstsq_projector,
    ncm_scores,
    project_statistics,
    sample_gaussians,
)


def test_class_gaussians_are_numpys_mean_and_unbiased_covariance_per_class():
    g = torch.Generator().manual_seed(0)
    f, y = torch.randn(40, 3, generator=g), torch.arange(40) % 2
    means, covs = class_gaussians(f, y, [1, 0])
    for row, c in enumerate([1, 0]):
        x = f[y == c].numpy().astype(np.float64)
        assert np.allclose(means[row].numpy(), x.mean(0), atol=1e-6)
        assert np.allclose(covs[row].numpy(), np.cov(x.T, ddof=1), atol=1e-6)
    assert means.dtype == covs.dtype == torch.float32
    with pytest.raises(ValueError, match="class 5 has 0 feature"):
        class_gaussians(f, y, [5])


def test_hand_computed_two_point_class():
    # two points (0, 0) and (2, 4): mean (1, 2), covariance [[2, 4], [4, 8]] (÷ N − 1 = 1)
    means, covs = class_gaussians(torch.tensor([[0.0, 0.0], [2.0, 4.0]]), torch.tensor([0, 0]), [0])
    assert means.tolist() == [[1.0, 2.0]] and covs.tolist() == [[[2.0, 4.0], [4.0, 8.0]]]


def test_gaussian_factors_square_to_the_jittered_covariance_even_when_singular():
    full = torch.tensor([[[4.0, 2.0], [2.0, 3.0]]])
    lower = gaussian_factors(full, jitter=1e-5)
    assert torch.allclose(lower @ lower.transpose(-1, -2), full + 1e-5 * torch.eye(2), atol=1e-5)
    singular = torch.tensor([[[1.0, 1.0], [1.0, 1.0]]]) * -1  # negative definite: Cholesky fails
    root = gaussian_factors(torch.cat([full, singular]), jitter=1e-2)
    assert torch.allclose(root[0] @ root[0].T, full[0] + 1e-2 * torch.eye(2), atol=1e-4)  # the good one unchanged
    # the bad one: eigenvalues (−2, 0) clipped to the jitter, so L·Lᵀ = 0.01·I
    assert torch.allclose(root[1] @ root[1].T, 1e-2 * torch.eye(2), atol=1e-6)


def test_samples_follow_their_class_gaussian_and_the_generator():
    means = torch.tensor([[0.0, 0.0], [10.0, -5.0]])
    covs = torch.tensor([[[1.0, 0.0], [0.0, 1.0]], [[4.0, 1.5], [1.5, 1.0]]])
    factors = gaussian_factors(covs, jitter=0.0)
    labels = torch.ones(20000, dtype=torch.long)
    z = sample_gaussians(means, factors, labels, torch.Generator().manual_seed(1))
    assert torch.allclose(z.mean(0), means[1], atol=0.05)
    assert torch.allclose(torch.cov(z.T), covs[1], atol=0.1)
    again = sample_gaussians(means, factors, labels, torch.Generator().manual_seed(1))
    assert torch.equal(again, z)


def test_balanced_labels_cover_every_class_evenly():
    labels = balanced_labels(7, 64, torch.Generator().manual_seed(0), "cpu")
    counts = torch.bincount(labels, minlength=7)
    assert len(labels) == 64 and counts.sum() == 64 and counts.max() - counts.min() <= 1 and counts.min() == 9
    assert sorted(balanced_labels(3, 3, None, "cpu").tolist()) == [0, 1, 2]


def test_ncm_scores_are_negative_squared_distances_on_the_unit_sphere():
    # f = (1, 0); means (2, 0) → same direction, distance 0; (0, 3) → orthogonal, ‖(1,0) − (0,1)‖² = 2
    scores = ncm_scores(torch.tensor([[1.0, 0.0]]), torch.tensor([[2.0, 0.0], [0.0, 3.0]]))
    assert torch.allclose(scores, torch.tensor([[0.0, -2.0]]), atol=1e-6)


def test_projectors_recover_a_known_linear_drift():
    g = torch.Generator().manual_seed(0)
    true = torch.tensor([[1.0, 0.5, 0.0], [0.0, 1.0, -0.3], [0.2, 0.0, 0.8]])
    old = torch.randn(512, 3, generator=g)
    new = old @ true.T
    assert torch.allclose(lstsq_projector(old, new, ridge=0.0), true, atol=1e-4)
    fitted = fit_projector([(old, new)], epochs=200, lr=1e-2, batch_size=128, generator=g)
    assert torch.allclose(fitted, true, atol=1e-2)
    # ridge shrinks toward zero: a large ridge gives a smaller map
    assert lstsq_projector(old, new, ridge=10.0).norm() < true.norm()


def test_fit_projector_uses_pass_e_mod_passes_and_is_reproducible():
    g = torch.Generator().manual_seed(0)
    old = torch.randn(64, 2, generator=g)
    pairs = [(old, old * 2), (old, old * 2)]
    a = fit_projector(pairs, 3, 1e-3, 32, torch.Generator().manual_seed(5))
    b = fit_projector(pairs[:1], 3, 1e-3, 32, torch.Generator().manual_seed(5))
    assert torch.equal(a, b)  # equal passes: same fit


def test_project_statistics_moves_means_and_covariances_through_the_map():
    p = torch.tensor([[2.0, 0.0], [1.0, 1.0]])
    means, covs = project_statistics(torch.tensor([[1.0, 1.0]]), torch.tensor([[[1.0, 0.0], [0.0, 4.0]]]), p)
    assert means.tolist() == [[2.0, 2.0]]  # P·(1, 1)
    # P Σ Pᵀ = [[2,0],[1,1]] [[1,0],[0,4]] [[2,1],[0,1]] = [[4, 2], [2, 5]]
    assert covs.tolist() == [[[4.0, 2.0], [2.0, 5.0]]]
    assert project_statistics(torch.ones(1, 2), None, p)[1] is None
