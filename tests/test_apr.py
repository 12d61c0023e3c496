"""APR (docs/baselines.md, APR): the maths of the pseudo-replay's perturbation and of ADC (the normalised gradient step,
the noise radius, the mean shift, the affine map and the covariance it moves), the shrunk, normalised Mahalanobis
classifier, each against values computed by hand; the fixed views against the training augmentation; the
pseudo-replay's candidates and batches; ADC between a model and itself; the method's terms, an end-to-end smoke run
(--method.name apr) and an exact resume inside an incremental task."""

import json
import math

import pytest
import torch
from torch import nn

from conftest import CONFIGS, StopAfterEpochs
from dfcil.checkpoint import loads
from dfcil.cli import main
from dfcil.context import Batch, Task, TaskContext
from dfcil.data.device import Normalizer, TrainBatches, crop_flip
from dfcil.errors import RunInterrupted
from dfcil.losses.adagauss import bayes_precisions, shrunk
from dfcil.losses.apr import (
    adc_step_size,
    affine_fit_loss,
    fit_affine,
    mean_shift,
    nearest,
    nearest_class,
    noise_radius,
    normalised_step,
    perturb,
)
from dfcil.losses.prototypes import map_covariances
from dfcil.methods import build_method
from dfcil.methods.adapter import BayesClassifier
from dfcil.methods.adversarial import (
    AdversarialDrift,
    AdversarialDriftConfig,
    FixedViews,
    PseudoReplay,
    PseudoReplayConfig,
    crop_flip_at,
)
from dfcil.methods.fecam import shrink
from dfcil.methods.memory import ClassMemory, features_of
from dfcil.models.network import NetOutput, build_network
from dfcil.runs.runner import resume, train
from dfcil.training.loop import RunOptions
from dfcil.training.state import Interrupt
from test_methods import tiny_config

# ---------------------------------------------------------------------------------------------------- the maths


def test_a_step_moves_the_whole_batch_by_its_size_along_the_batchs_gradient():
    # one image: g = (3, 4), ‖g‖ = 5, size 10: x − 10·(0.6, 0.8)
    assert normalised_step(torch.tensor([[1.0, 2.0]]), torch.tensor([[3.0, 4.0]]), 10.0).tolist() == [[-5.0, -6.0]]
    # two images share one norm, ‖(3, 0, 0, 4)‖ = 5: each moves by its own share, 3 and 4, not by 5 each
    step = normalised_step(torch.zeros(2, 2), torch.tensor([[3.0, 0.0], [0.0, 4.0]]), 5.0)
    assert step.tolist() == [[-3.0, 0.0], [0.0, -4.0]]
    assert normalised_step(torch.ones(1, 2), torch.zeros(1, 2), 5.0).tolist() == [[1.0, 1.0]]  # no gradient, no move


def test_perturbation_walks_straight_to_the_target_through_an_identity_feature_map():
    """Features = the input: MSE's gradient points from the target to x, so each step of 2.5 goes 2.5 along the line
    from (0, 0) to (3, 4), 5 away: (1.5, 2), then (3, 4). Clamped at 2: (1.5, 2), then (2, 2)."""
    x, target = torch.zeros(1, 2), torch.tensor([[3.0, 4.0]])
    assert perturb(lambda v: v, x, target, 1, 2.5).tolist() == [pytest.approx([1.5, 2.0])]
    assert perturb(lambda v: v, x, target, 2, 2.5).tolist() == [pytest.approx([3.0, 4.0])]
    assert perturb(lambda v: v, x, target, 2, 2.5, high=2.0).tolist() == [pytest.approx([2.0, 2.0])]
    assert torch.equal(perturb(lambda v: v, x, target, 0, 2.5), x)


def test_perturbation_trains_nothing_of_the_frozen_model():
    """A frozen linear map (3 → 2): the images move toward the target in feature space, the map gets no gradient."""
    torch.manual_seed(0)
    net = nn.Linear(3, 2).requires_grad_(False)
    x, target = torch.randn(4, 3), torch.randn(4, 2)
    moved = perturb(net, x, target, 5, 0.2)
    assert float(((net(moved) - target) ** 2).mean()) < float(((net(x) - target) ** 2).mean())
    assert net.weight.grad is None and not moved.requires_grad


def test_nearest_rows_and_nearest_class_by_hand():
    feats = torch.tensor([[0.0, 0.0], [3.0, 0.0], [1.0, 0.0], [0.0, 2.0]])  # from (0.9, 0): 0.9, 2.1, 0.1, 2.19
    assert nearest(feats, torch.tensor([0.9, 0.0]), 2).tolist() == [2, 0]
    assert nearest(feats, torch.tensor([0.9, 0.0]), 10).tolist() == [2, 0, 1, 3]  # all of them, nearest first
    means = torch.tensor([[1.0, 0.0], [0.0, 2.0], [0.0, 0.0]])
    assert nearest_class(torch.tensor([[0.9, 0.0], [0.0, 1.8], [0.1, 0.2]]), means).tolist() == [0, 1, 2]


def test_noise_radius_is_the_root_of_the_mean_variance_per_dimension():
    covs = torch.stack([torch.diag(torch.tensor([1.0, 3.0])), torch.tensor([[2.0, 1.0], [1.0, 2.0]])])
    assert float(noise_radius(covs)) == pytest.approx(math.sqrt(2.0))  # traces 4 and 4 over d = 2: mean 2


def test_adcs_step_scales_with_the_root_of_the_batch():
    assert adc_step_size(25.0, 64) == pytest.approx(25 * math.sqrt(0.064))  # 6.3246: the authors' CIFAR-100 setting
    assert adc_step_size(25.0, 1000) == pytest.approx(25.0)


def test_mean_shift_by_hand():
    # the features moved by (1, 1) and (1, 3): the prototype (1, 1) moves by their mean (1, 2)
    old, new = torch.tensor([[0.0, 0.0], [2.0, 0.0]]), torch.tensor([[1.0, 1.0], [3.0, 3.0]])
    assert mean_shift(torch.tensor([1.0, 1.0]), old, new).tolist() == [2.0, 3.0]


def test_the_maps_loss_is_the_mean_euclidean_distance_and_finite_at_zero():
    pred = torch.tensor([[0.0, 0.0], [1.0, 1.0]], requires_grad=True)
    loss = affine_fit_loss(pred, torch.tensor([[3.0, 4.0], [1.0, 1.0]]))  # (5 + 0) / 2
    assert float(loss.detach()) == pytest.approx(2.5)
    loss.backward()  # the second row's distance is 0: gradient 0, not NaN
    assert pred.grad.tolist() == [pytest.approx([-0.3, -0.4]), [0.0, 0.0]]


def test_the_affine_map_starts_at_the_identity_and_takes_adams_first_step_by_hand():
    """One pair, f_old = (1, 0), f_new = (2, 0): the residual of the identity is (−1, 0), so the loss's gradient is
    −1 on W₁₁ and b₁ and 0 elsewhere; Adam's first step moves each by lr·sign(gradient): W₁₁ = 1.1, b₁ = 0.1."""
    w, b = fit_affine(torch.tensor([[1.0, 0.0]]), torch.tensor([[2.0, 0.0]]), 0, 0.1, 16, None)
    assert torch.equal(w, torch.eye(2)) and torch.equal(b, torch.zeros(2))
    w, b = fit_affine(torch.tensor([[1.0, 0.0]]), torch.tensor([[2.0, 0.0]]), 1, 0.1, 16, None)
    assert w.tolist() == [pytest.approx([1.1, 0.0]), pytest.approx([0.0, 1.0])]
    assert b.tolist() == pytest.approx([0.1, 0.0])


def test_the_affine_map_fits_an_affine_drift():
    g = torch.Generator().manual_seed(0)
    old = torch.randn(64, 2, generator=g)
    a, shift = torch.tensor([[1.5, 0.5], [0.0, 0.8]]), torch.tensor([0.3, -0.2])
    w, b = fit_affine(old, old @ a.T + shift, 300, 0.01, 16, g)
    assert torch.allclose(w, a, atol=0.05) and torch.allclose(b, shift, atol=0.05)


def test_a_covariance_moves_by_the_linear_part_of_the_map():
    # W = [[1, 1], [0, 2]], Σ = diag(1, 2): WΣ = [[1, 2], [0, 4]], WΣWᵀ = [[3, 4], [4, 8]]
    w = torch.tensor([[1.0, 1.0], [0.0, 2.0]])
    assert map_covariances(torch.diag(torch.tensor([1.0, 2.0])), w).tolist() == [[3.0, 4.0], [4.0, 8.0]]


def test_fecams_shrinkage_batched_by_hand_and_equal_to_fecams():
    """Σ + γV₁I + γ₂V₂(𝟙𝟙ᵀ − I): [[2, 1], [1, 4]] has V₁ = 3, V₂ = 1, so γ = γ₂ = 1 gives [[5, 2], [2, 7]]; in 3×3,
    diag(2, 4, 3) has V₁ = 3 too, and with two zero off-diagonal pairs V₂ is the mean of the non-zero ones only (1)."""
    two = torch.tensor([[2.0, 1.0], [1.0, 4.0]])
    three = torch.tensor([[2.0, 1.0, 0.0], [1.0, 4.0, 0.0], [0.0, 0.0, 3.0]])
    assert shrunk(two[None], 1.0, 1.0)[0].tolist() == [[5.0, 2.0], [2.0, 7.0]]
    assert shrunk(three[None], 1.0, 1.0)[0].tolist() == [[5.0, 2.0, 1.0], [2.0, 7.0, 1.0], [1.0, 1.0, 6.0]]
    assert shrunk(two[None], 1.0)[0].tolist() == [[5.0, 1.0], [1.0, 7.0]]  # AdaGauss's: the diagonal only
    for cov, gamma in ((two, 24.0), (three, 24.0), (torch.eye(3), 2.0)):  # FeCAM's own (one matrix at a time)
        assert torch.allclose(shrunk(cov[None].double(), gamma, gamma)[0], shrink(cov.double(), gamma, gamma))


def test_the_mahalanobis_classifier_by_hand():
    """Σ = [[2, 1], [1, 4]] shrunk (γ = γ₂ = 1) to [[5, 2], [2, 7]], correlation r = 2/√35, its inverse
    35/31·[[1, −r], [−r, 1]]; x = (1, 0) and μ = (3, 4) normalised differ by d = (0.4, −0.8): the score is
    −35/31·(d₁² + d₂² − 2r·d₁d₂) = −35/31·(0.8 + 0.64r)."""
    r = 2 / math.sqrt(35)
    cov = torch.tensor([[[2.0, 1.0], [1.0, 4.0]]])
    want = 35 / 31 * torch.tensor([[1.0, -r], [-r, 1.0]])
    assert torch.allclose(bayes_precisions(cov, 1.0, True, 1.0, pseudo_inverse=True)[0], want, atol=1e-6)
    assert torch.allclose(bayes_precisions(cov, 1.0, True, 1.0)[0], want, atol=1e-6)  # inv: the same here
    memory = ClassMemory(None, covariances=True, augmented=False)
    memory.means, memory.covs = torch.tensor([[3.0, 4.0]]), cov
    head = BayesClassifier(1.0, True, offdiag=1.0, pseudo_inverse=True)
    head.refresh(memory)
    score = head.scores(NetOutput(torch.zeros(1, 0), torch.tensor([[1.0, 0.0]]), ()))
    assert float(score[0, 0]) == pytest.approx(-35 / 31 * (0.8 + 0.64 * r), rel=1e-5)


# ------------------------------------------------------------------------------------------------------ the parts

NORM = Normalizer((0.5,) * 3, (0.25,) * 3, torch.device("cpu"))


def test_fixed_views_by_hand_and_as_the_training_augmentation_draws_them():
    """A 2×2 image padded by 1 and cropped at (0, 0) shows the zero border above and left of its first pixel; flipped,
    the other way round. Drawn from a generator, the views are those the training batches' crop and flip give."""
    x = torch.tensor([[1.0, 2.0], [3.0, 4.0]]).reshape(1, 2, 2, 1)
    zero, one = torch.zeros(1, dtype=torch.long), torch.ones(1, dtype=torch.long)
    assert crop_flip_at(x, 1, zero, zero, torch.tensor([False]))[0, :, :, 0].tolist() == [[0.0, 0.0], [0.0, 1.0]]
    assert crop_flip_at(x, 1, zero, zero, torch.tensor([True]))[0, :, :, 0].tolist() == [[0.0, 0.0], [1.0, 0.0]]
    assert torch.equal(crop_flip_at(x, 1, one, one, torch.tensor([False])), x)
    images = torch.randint(0, 256, (6, 8, 8, 3), dtype=torch.uint8)
    data = TrainBatches(images, torch.zeros(6, dtype=torch.long), 3, NORM, torch.Generator())
    views = FixedViews.draw(data, torch.Generator().manual_seed(5))
    expected = crop_flip(NORM.nhwc(images), 4, torch.Generator().manual_seed(5))
    assert torch.equal(views.load(torch.arange(6)), NORM.to_nchw(expected))
    assert torch.equal(views.load(torch.tensor([4, 1])), views.load(torch.arange(6))[[4, 1]])  # the same each time


def _ctx(n=40, old=3, seed=0):
    """Task 1 of a resnet8 that has seen a little data: 3 old classes' statistics from random images, 3 new ones."""
    torch.manual_seed(seed)
    net = build_network("resnet8", "cosine")
    net.expand(old)
    net.train()
    with torch.no_grad():
        for _ in range(3):
            net(torch.randn(16, 3, 16, 16))
    x = torch.randint(0, 256, (n, 16, 16, 3), dtype=torch.uint8)
    data = TrainBatches(x, torch.randint(old, 2 * old, (n,)), 8, NORM, torch.Generator().manual_seed(1))
    ctx = TaskContext(task_id=1, n_old=old, n_new=old, num_tasks=2, net=net, data=data,
                      rng=torch.Generator().manual_seed(2))  # fmt: skip
    feats = features_of(net, data.plain())[0]
    memory = ClassMemory(None, covariances=True, augmented=False)
    memory.add(feats, torch.arange(n) % old, range(old))
    return ctx, memory


def test_the_pseudo_replay_takes_each_old_classs_nearest_views_and_cycles_through_them():
    ctx, memory = _ctx()
    old = ctx.net.frozen_copy()
    replay = PseudoReplay(PseudoReplayConfig(per_class=5, batch_size=4, steps=2, noise=0.0))
    replay.begin(ctx, old, memory.means, memory.covs)
    views = FixedViews.draw(ctx.data, torch.Generator().manual_seed(2))  # the same draw: the method's stream
    feats = views.features(old)
    assert replay.index.tolist() == [i for m in memory.means for i in nearest(feats, m, 5).tolist()]
    assert replay.labels.tolist() == [0] * 5 + [1] * 5 + [2] * 5
    assert float(replay.radius) == pytest.approx(float(noise_radius(memory.covs)), rel=1e-5)
    seen = []
    for _ in range(3):  # 15 candidates, batches of 4: three batches, the remaining 3 dropped, then a new order
        x = replay.sample(ctx, old)
        seen.append(replay.order[replay.position - 4 : replay.position])
        assert x.shape == (4, 3, 16, 16) and torch.isfinite(x).all()
    assert len(torch.cat(seen).unique()) == 12 and replay.position == 12
    replay.sample(ctx, old)
    assert replay.position == 4  # reshuffled
    # perturbed toward the prototype: nearer in the old model's features than where they started (no noise)
    pick = replay.order[:4]
    start, moved = views.load(replay.index[pick]), replay.views.load(replay.index[pick])
    assert torch.equal(start, moved)
    targets = replay.targets[replay.labels[pick]]
    after = perturb(lambda v: old(v).features, moved, targets, 2, 1.0)
    before_d = (features_of(old, [(start, None)])[0] - targets).norm(dim=1).mean()
    after_d = (features_of(old, [(after, None)])[0] - targets).norm(dim=1).mean()
    assert after_d < before_d


def test_adc_between_a_model_and_itself_moves_nothing():
    """The same network before and after: every feature drift is 0, so the prototypes stay; the affine map stays at
    the identity but for Adam's steps along rounding-level residuals (a batch and its successes give features equal
    to within 1e-7, and Adam's first steps have the size of its lr whatever the gradient's), so the covariances stay
    to within a few 1e-6 (at most 0.03 here)."""
    ctx, memory = _ctx()
    drift = AdversarialDrift(AdversarialDriftConfig(samples=16, batch_size=8, steps=2, rounds=3, map_epochs=2))
    memory.drift = drift
    same = ctx.net.frozen_copy()
    means, covs = memory.means.clone(), memory.covs.clone()
    memory.compensate(ctx, same, None)
    assert memory.compensated == 1 and memory.seconds > 0
    assert torch.allclose(memory.means, means, atol=1e-6) and torch.allclose(memory.covs, covs, rtol=0, atol=1e-5)
    memory.compensate(ctx, same, None)  # once a task: a resumed run's second call does nothing
    assert memory.compensated == 1


# ------------------------------------------------------------------------------------------------------ the method


def test_the_steps_terms_the_first_tasks_schedule_and_batch():
    cfg = tiny_config("apr", [("method.first", json.dumps({"epochs": 3, "lr": 0.2, "milestones": [2],
                                                           "batch_size": 16}))])  # fmt: skip
    method = build_method(cfg.method, cfg.train)
    (first,) = method.phases(Task(task_id=0, n_old=0, n_new=3, num_tasks=2))
    (later,) = method.phases(Task(task_id=1, n_old=3, n_new=3, num_tasks=2))
    assert (first.epochs, first.lr, first.milestones, first.weight_decay) == (3, 0.2, (2,), 0.0005)
    assert (later.epochs, later.lr) == (cfg.train.epochs, cfg.train.lr)
    assert (method.batch_size(0), method.batch_size(1)) == (16, cfg.train.batch_size)
    ctx, memory = _ctx()
    method.memory = memory  # the old classes' statistics
    ctx.net.expand(3)
    method.on_task_start(ctx)
    x, y = next(iter(ctx.data))
    terms = method.training_step(ctx.net, Batch(x, y), ctx, later)
    assert list(terms) == ["ce", "kd"] and all(torch.isfinite(t) for t in terms.values())
    assert len(method.replay) == 3 * 40  # per_class 200 of 40 images: every view for each old class


def test_a_smoke_run_with_method_name_apr_trains_and_classifies_by_mahalanobis_distance(tmp_path, capfd):
    out = tmp_path / "run"
    argv = ["train", "--config", str(CONFIGS / "smoke.yaml"), "--method.name", "apr", "--out", str(out)]
    assert main([*argv, "--method.drift.map_epochs", "2", "--no-progress"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert len(summary["acc_per_task"]) == 2 and summary["stores"] == "class statistics"
    # each task records how its end work grows (ADC per old class), what the report's and budget's estimates scale by
    assert [t["end_units"] for t in summary["timings"]] == [1, 5]
    model = loads((out / "model.pt").read_bytes())
    assert set(model["method_state"]) == {"means", "precisions"} and model["method_state"]["means"].shape[0] == 10
    assert main(["eval", str(out)]) == 0  # dfcil eval scores with the stored statistics
    log = capfd.readouterr().err
    assert "pseudo-replay: 1000 candidates of 5 old classes" in log and "ADC kept" in log


# stopped after task 1's first epoch (task 0 has 2): the candidates, their views and the replay's order are in the
# checkpoint; after task 0's first epoch: the statistics are not there yet
@pytest.mark.parametrize("epochs", [3, pytest.param(1, marks=pytest.mark.slow)])
def test_apr_resumes_exactly_inside_a_task(tmp_path, epochs):
    cfg = tiny_config("apr", [("method.drift.map_epochs", "2")])
    train(cfg, tmp_path / "a", options=RunOptions(progress=False))
    interrupt = Interrupt()
    options = RunOptions(progress=False, interrupt=interrupt, callbacks=[StopAfterEpochs(interrupt, epochs)])
    with pytest.raises(RunInterrupted):
        train(cfg, tmp_path / "b", options=options)
    position = loads((tmp_path / "b" / "checkpoints" / "last.pt").read_bytes())["position"]
    assert (position["task"], position["epoch"]) == (epochs // 2, 1)
    resume(tmp_path / "b", options=RunOptions(progress=False))
    a, b = (json.loads((tmp_path / d / "summary.json").read_text()) for d in "ab")
    assert a["correct_matrix"] == b["correct_matrix"]
    ma, mb = (loads((tmp_path / d / "model.pt").read_bytes()) for d in "ab")
    assert all(torch.equal(ma["net"][k], mb["net"][k]) for k in ma["net"])
    sa, sb = ma["method_state"], mb["method_state"]  # the Mahalanobis classifier's statistics, moved by ADC
    assert set(sa) == {"means", "precisions"} and all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.mark.parametrize("classifier", ["ncm", "linear"])
def test_the_other_heads_of_the_authors_code(classifier):
    cfg = tiny_config("apr", [("method.classifier", classifier)])
    method = build_method(cfg.method, cfg.train)
    assert (method.classifier is None) == (classifier == "linear") and method.bayes is None
    assert "bayes" not in method.components()
