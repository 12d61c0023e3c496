"""EFC: the Empirical Feature Matrix, the drift kernel, the rotation batch and the regulariser against hand values;
the asymmetric CE's buffer, the frozen BN and the end-of-task updates through the method."""

import copy
import dataclasses
import math
import re

import pytest
import torch
import torch.nn.functional as F

from dfcil.data.device import Normalizer, TrainBatches
from dfcil.losses.efc import (
    balanced_counts,
    drift_means,
    drift_weights,
    efm_penalty,
    empirical_feature_matrix,
    rotation_batch,
)
from dfcil.losses.prototypes import balanced_labels, class_gaussians, sample_gaussians
from dfcil.methods import Batch, TaskContext, build_method
from dfcil.models.network import build_network
from dfcil.training.engine import run
from dfcil.training.loop import RunOptions
from test_methods import Records, fit_phases, tiny_config

NORM = Normalizer((0.5,) * 3, (0.25,) * 3, torch.device("cpu"))


def test_efm_closed_form_is_the_sum_of_per_sample_gradient_outer_products():
    """E = mean_x Σ_c p_c g_c g_cᵀ with g_c = ∂ log p_c / ∂f taken by autograd, one sample at a time."""
    g = torch.Generator().manual_seed(0)
    k, d, n = 4, 6, 5
    weight, feats = torch.randn(k, d, generator=g, dtype=torch.float64), torch.randn(n, d, generator=g).double()
    explicit = torch.zeros(d, d, dtype=torch.float64)
    for f in feats:
        f = f.clone().requires_grad_(True)
        log_p = torch.log_softmax(weight @ f, dim=0)
        for c in range(k):
            (grad,) = torch.autograd.grad(log_p[c], f, retain_graph=True)
            explicit += log_p[c].exp().detach() * torch.outer(grad, grad)
    explicit /= n
    efm = empirical_feature_matrix(torch.softmax(feats @ weight.T, dim=1), weight)
    torch.testing.assert_close(efm.double(), explicit, rtol=1e-5, atol=1e-6)
    eigenvalues = torch.linalg.eigvalsh(efm.double())
    assert eigenvalues.min() > -1e-6 * eigenvalues.max()  # PSD
    assert torch.linalg.matrix_rank(efm.double(), rtol=1e-6) <= k - 1  # 3 of 6 directions


def test_efm_penalty_on_a_hand_case():
    """δ = (1, 2) and (0, −1); E = e₁e₁ᵀ, λ = 10, η = 0.1: 10·1 + 0.1·5 = 10.5 and 0 + 0.1·1 = 0.1, mean 5.3."""
    new = torch.tensor([[1.0, 2.0], [0.0, 0.0]])
    old = torch.tensor([[0.0, 0.0], [0.0, 1.0]])
    efm = torch.tensor([[1.0, 0.0], [0.0, 0.0]])
    assert efm_penalty(new, old, efm, 10.0, 0.1).item() == pytest.approx(5.3)
    assert efm_penalty(old, old, efm, 10.0, 0.1).item() == 0.0  # no drift, no penalty


def test_drift_kernel_on_a_hand_case():
    """Two old means (0, 0) and (2, 0), three images at (0, 0), (1, 0), (2, 0), E = I: distances [0, 1, 4] and
    [4, 1, 0], min-max scaled by 4; with 2σ² = 0.5 the weights are exp(−2·m̃) normalised per class, the nearest
    image weighing most."""
    means = torch.tensor([[0.0, 0.0], [2.0, 0.0]])
    old = torch.tensor([[0.0, 0.0], [1.0, 0.0], [2.0, 0.0]])
    new = old + torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]])  # each image's drift
    eye, sigma = torch.eye(2), 0.5
    z = 1 + math.exp(-0.5) + math.exp(-2)
    w = drift_weights(old, means, eye, sigma)
    want = torch.tensor([[1, math.exp(-0.5), math.exp(-2)], [math.exp(-2), math.exp(-0.5), 1]]) / z
    torch.testing.assert_close(w, want.double())
    moved = drift_means(means, old, new, eye, sigma)
    a, b = math.exp(-0.5) / z, math.exp(-2) / z
    torch.testing.assert_close(moved, torch.tensor([[1 / z, a], [2 + b, a]]))  # Σ_i w_ci·δ_i added
    # EFC's code writes exp(+s/(2σ²)) with s the min-max scaled negative distance (= 1 − m̃): the same weights
    dist = -torch.tensor([[0.0, 1, 4], [4, 1, 0]])
    s = (dist - dist.min()) / (dist.max() - dist.min())
    torch.testing.assert_close(w, torch.softmax(s / (2 * sigma**2), dim=1).double())
    # σ = 0.2: nearest over farthest is e^12.5; constant distances give equal weights
    w = drift_weights(old, means, eye, 0.2)
    assert (w[0, 0] / w[0, 2]).item() == pytest.approx(math.exp(12.5))
    torch.testing.assert_close(drift_weights(old, means, torch.zeros(2, 2), 0.2), torch.full((2, 3), 1 / 3).double())


def test_rotation_batch_labels_and_images():
    x = torch.arange(2 * 3 * 2 * 2, dtype=torch.float32).view(2, 3, 2, 2)
    y = torch.tensor([0, 2])
    x4, y4 = rotation_batch(x, y, n_classes=3)
    assert y4.tolist() == [0, 2, 3, 9, 4, 10, 5, 11]  # |C| + 3y + k − 1 for k = 1, 2, 3
    assert x4.shape == (8, 3, 2, 2) and torch.equal(x4[:2], x)
    for k in (1, 2, 3):
        assert torch.equal(x4[2 * k : 2 * k + 2], torch.rot90(x, k, dims=(2, 3)))
    a = x[0, 0]  # [[0, 1], [2, 3]] turned a quarter counter-clockwise
    assert x4[2, 0].tolist() == [[a[0, 1].item(), a[1, 1].item()], [a[0, 0].item(), a[1, 0].item()]]


def test_balanced_counts():
    g = torch.Generator().manual_seed(0)
    for _ in range(5):  # faithful, 20 seen classes and 64 slots: every class twice, 20 old + 20 new
        assert balanced_counts(10, 20, 64, g, faithful=True) == (20, 20)
        n, m = balanced_counts(10, 40, 64, g, faithful=True)  # every class once, then 24 more
        assert n + m == 64 and 10 <= n <= 20
        n, m = balanced_counts(50, 100, 64, g, faithful=True)  # without replacement
        assert n + m == 64
        n, m = balanced_counts(10, 20, 64, g, faithful=False)  # every class 3 times, then 4 more
        assert n + m == 64 and 30 <= n <= 34


def _task1(extra=(), old=3, new=3, n=24):
    """EFC after a real first-task end (statistics and EFM of a random network) and the start of task 1."""
    cfg = tiny_config("efc", extra)
    method = build_method(cfg.method, cfg.train)
    torch.manual_seed(0)
    net = build_network("resnet8", "linear")
    rng = torch.Generator().manual_seed(0)

    def context(task, lo, hi):
        x = torch.randint(0, 256, (n, 32, 32, 3), dtype=torch.uint8)
        data = TrainBatches(x, lo + torch.arange(n) % (hi - lo), 8, NORM, torch.Generator().manual_seed(task))
        return TaskContext(task_id=task, n_old=lo, n_new=hi - lo, num_tasks=2, net=net, data=data, rng=rng)

    net.expand(old)
    ctx0 = context(0, 0, old)
    method.on_task_start(ctx0)
    net.train()
    with torch.no_grad():
        for _ in range(3):
            net(torch.randn(16, 3, 32, 32))  # BN statistics of its own
    method.on_task_end(ctx0)
    net.expand(new)
    ctx1 = context(1, old, old + new)
    method.on_task_start(ctx1)
    return cfg, method, net, ctx1


def test_task_start_initialises_the_new_head_uniformly_and_task0_has_a_rotation_head():
    cfg, method, net, ctx = _task1()
    bound = 1 / math.sqrt(net.feature_dim)
    block = net.head.blocks[-1].weight
    assert block.abs().max() <= bound and block.std() > 0.3 * bound  # U(−1/√d, 1/√d), not N(0, 0.001²)
    assert method.rotation is None and method.extra_modules(ctx) == []
    ctx0 = TaskContext(task_id=0, n_old=0, n_new=3, num_tasks=2, net=net, data=ctx.data, rng=ctx.rng)
    fresh = build_method(cfg.method, cfg.train)
    fresh.on_task_start(ctx0)
    assert fresh.rotation.weight.shape == (9, net.feature_dim) and fresh.extra_modules(ctx0) == [fresh.rotation]
    again = build_method(cfg.method, cfg.train)
    again.load_state_dict(fresh.state_dict(), ctx0)  # a run resumed inside the first task
    assert all(torch.equal(p, q) for p, q in zip(again.rotation.parameters(), fresh.rotation.parameters(), strict=True))


def test_the_buffer_joins_the_asymmetric_ce_from_the_second_step():
    """Step 1: 64 Gaussian samples only. Step 2: the split of 8 class slots over 3 old and 3 new classes, old
    samples through the head and the first m images of step 1's batch through the network."""
    cfg, method, net, ctx = _task1()
    net.set_trainable("frozen_bn")
    (x1, y1), (x2, y2) = list(ctx.data)[:2]
    stream = torch.Generator()

    def samples(n):
        labels = balanced_labels(3, 64, stream, "cpu")[:n]
        return net.head(sample_gaussians(method.memory.means, method.memory.factors, labels, stream)), labels

    stream.set_state(ctx.rng.get_state())
    logits, labels = samples(64)
    first = method.training_step(net, Batch(x1, y1), ctx, method.phases(ctx)[0])
    assert set(first) == {"ce", "efm", "ace"}
    torch.testing.assert_close(first["ace"], F.cross_entropy(logits, labels))
    assert first["efm"].item() == pytest.approx(0.0, abs=1e-6)  # the model still equals the old one
    torch.testing.assert_close(first["ce"], F.cross_entropy(net(x1).logits[:, 3:], y1 - 3))
    assert torch.equal(method.buffer[0], x1) and torch.equal(method.buffer[1], y1)

    stream.set_state(ctx.rng.get_state())
    n, m = balanced_counts(3, 6, 8, stream, faithful=True)
    assert n + m == 8 and m >= 3
    logits, labels = samples(n)
    want = F.cross_entropy(torch.cat([logits, net(x1[:m]).logits]), torch.cat([labels, y1[:m]]))
    second = method.training_step(net, Batch(x2, y2), ctx, method.phases(ctx)[0])
    torch.testing.assert_close(second["ace"], want)
    assert torch.equal(method.buffer[0], x2)
    state = method.state_dict()  # a run stopped here resumes with this batch as the buffer
    assert torch.equal(state["buffer"][0], x2)


def test_later_tasks_keep_bn_statistics_and_affine_parameters():
    cfg, method, net, ctx = _task1()
    (phase,) = method.phases(ctx)
    assert (phase.optimizer, phase.trainable, phase.lr, phase.milestones) == ("adam", "frozen_bn", cfg.method.lr, ())
    before = copy.deepcopy(net.state_dict())
    fit_phases(cfg, method, ctx, [dataclasses.replace(phase, epochs=1)])  # 3 steps
    after = net.state_dict()
    bn = [k for k in before if any(s in k for s in ("bn", "running", "num_batches"))]
    assert bn and all(torch.equal(after[k], before[k]) for k in bn), bn
    assert not torch.equal(after["backbone.conv_1.weight"], before["backbone.conv_1.weight"])
    assert not torch.equal(after["head.blocks.0.weight"], before["head.blocks.0.weight"])  # old heads train too


def test_task_end_drifts_old_means_with_the_previous_efm_then_replaces_it():
    """One augmented pass (drawn from the method's stream, model in eval mode): the old means move by the kernel
    drift under the EFM that regularised the task; then E is the new model's; the new classes' Gaussians follow."""
    cfg, method, net, ctx = _task1()
    teacher, efm, means = method.teacher.net, method.efm.clone(), method.memory.means.clone()
    stream = torch.Generator()
    stream.set_state(ctx.rng.get_state())
    views = TrainBatches(ctx.data.x, ctx.data.y, 500, NORM, stream)
    x, y = views.load(torch.arange(len(ctx.data.x)))
    with torch.no_grad():
        out, old = net.eval()(x), teacher(x).features
    net.train()
    method.on_task_end(ctx)
    torch.testing.assert_close(method.memory.means[:3], drift_means(means, old, out.features, efm, 0.2))
    torch.testing.assert_close(method.efm, empirical_feature_matrix(torch.softmax(out.logits, 1), net.head.weight()))
    new_means, new_covs = class_gaussians(out.features, y, range(3, 6))
    torch.testing.assert_close(method.memory.means[3:], new_means)
    torch.testing.assert_close(method.memory.covs[3:], new_covs)
    assert method.teacher.net is None and method.buffer is None


def test_two_task_run_names_its_terms_per_task():
    rec = Records()
    run(tiny_config("efc", [("train.epochs", "1")]), options=RunOptions(progress=False, callbacks=[rec]))
    assert [(r["task"], set(r["loss"])) for r in rec.epochs] == [(0, {"ce"}), (1, {"ce", "efm", "ace"})]
    first, later = (s["phases"][0] for s in rec.starts)
    c = tiny_config("efc").method  # the smoke overlay's rates (EFC's own are 1e-3 and 1e-4)
    assert (first["name"], first["optimizer"], first["lr"], first["weight_decay"]) == ("base", "adam", c.first_lr, 2e-4)
    assert (later["name"], later["trainable"], later["lr"]) == ("efc", "frozen_bn", c.lr)


def test_a_run_stopped_inside_the_first_task_resumes_exactly(tmp_path):
    """The rotation head and its Adam moments travel with the checkpoint (the generic test stops in task 1)."""
    import json

    from conftest import StopAfterEpochs
    from dfcil.checkpoint import loads
    from dfcil.errors import RunInterrupted
    from dfcil.runs.runner import resume, train
    from dfcil.training.state import Interrupt

    cfg = tiny_config("efc")
    train(cfg, tmp_path / "a", options=RunOptions(progress=False))
    interrupt = Interrupt()
    with pytest.raises(RunInterrupted, match="task 0"):
        train(cfg, tmp_path / "b", options=RunOptions(interrupt=interrupt, callbacks=[StopAfterEpochs(interrupt, 1)]))
    assert "rotation" in loads((tmp_path / "b" / "checkpoints" / "last.pt").read_bytes())["method"]
    resume(tmp_path / "b", options=RunOptions(progress=False))
    a, b = (json.loads((tmp_path / d / "summary.json").read_text()) for d in "ab")
    assert a["correct_matrix"] == b["correct_matrix"]
    wa, wb = (loads((tmp_path / d / "model.pt").read_bytes())["net"] for d in "ab")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.parametrize(
    ("extra", "refused"),
    [
        ([("train.lr", "0.01")], "train.lr (0.01)"),
        ([("train.momentum", "0.5")], "train.momentum (0.5)"),
        ([("train.weight_decay", "0.001")], "train.weight_decay (0.001)"),
        ([("train.lr", "0.001"), ("train.weight_decay", "0.0002")], None),  # the presets' copy of the first task's
        ([("method.first_lr", "0.01"), ("train.lr", "0.01")], None),
    ],
)
def test_train_keys_efc_never_reads_are_refused(extra, refused):
    """EFC's phases say they train with Adam at its own lr and weight decay: the train keys no phase reads are
    found, as for every method, by the protocol's one check (dfcil.training.protocol.unread_problems)."""
    from dfcil.errors import ConfigError
    from dfcil.training.protocol import prepare

    defaults = [("method.first_lr", "0.001"), ("method.lr", "0.0001")]  # EFC's own, not its smoke overlay's
    cfg = tiny_config("efc", [*defaults, *extra])
    if refused is None:
        prepare(cfg)
        return
    with pytest.raises(ConfigError, match=re.escape(refused) + " changes nothing: no phase of efc reads it"):
        prepare(cfg)
