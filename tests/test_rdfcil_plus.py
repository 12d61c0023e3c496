"""R-DFCIL+'s switches from DPCR and AdaGauss (docs/rdfcil-plus.md): the dual projection of its Gaussians, the
Bayes (Mahalanobis) and closed-form ridge classifiers on them, and the anti-collapse term in RRL, against
hand-computed values; each through a whole run, with dfcil eval predicting as the run did."""

import json
import logging

import pytest
import torch
import torch.nn.functional as F

from dfcil.checkpoint import loads
from dfcil.errors import ConfigError
from dfcil.losses.adagauss import bayes_log_likelihood, bayes_precisions
from dfcil.losses.cycle import PairMoments, affine_map, cycle_losses, update_moments
from dfcil.losses.dpcr import ridge_head
from dfcil.methods import Batch, Phase, build_method
from dfcil.methods.memory import ClassMemory, DriftConfig, linear_drift
from dfcil.methods.projection import DualProjectionDrift, RidgeClassifier
from test_ldc import LinearFeatures, _ctx
from test_methods import _task1_setup, tiny_config

DRIFT = torch.tensor([[1.0, 0.2, 0.0, 0.0], [0.0, 0.9, 0.0, 0.1], [0.0, 0.0, 1.1, 0.0], [0.3, 0.0, 0.0, 1.0]])


def _moved(drift, means, covs):
    memory = ClassMemory(drift, covariances=True, augmented=False)
    memory.load_state_dict({"means": means, "covs": covs})
    memory.compensate(_ctx(LinearFeatures(DRIFT)), LinearFeatures(torch.eye(4)), None)
    return memory


def test_the_dual_drift_of_full_rank_classes_is_the_closed_form_map():
    # every class's Gram matrix has full rank: its row-space projector is I, and the dual projection is the map
    means, covs = torch.randn(2, 4), torch.eye(4).repeat(2, 1, 1)
    dual = _moved(DualProjectionDrift(1e-9, relative=True), means, covs)
    lstsq = _moved(linear_drift(DriftConfig(kind="lstsq", ridge=1e-9)), means, covs)
    assert torch.allclose(dual.means, lstsq.means, atol=1e-5) and torch.allclose(dual.covs, lstsq.covs, atol=1e-5)
    assert torch.allclose(dual.means, means @ DRIFT.T, atol=1e-4)  # μ ← Pμ: the pairs' map recovered


def test_the_dual_drift_keeps_a_rank_deficient_class_in_its_row_space():
    # class 0 lies in span(e1, e2): Σ = diag(1, 1, 0, 0), μ = (1, 2, 0, 0); its projector is diag(1, 1, 0, 0), so
    # μ·W = (μ·A)·UUᵀ with A = Pᵀ: Pμ = (1.4, 1.8, 0, 0.3), the last coordinate dropped
    means = torch.tensor([[1.0, 2.0, 0.0, 0.0]])
    covs = torch.diag(torch.tensor([1.0, 1.0, 0.0, 0.0]))[None]
    dual = _moved(DualProjectionDrift(1e-9, relative=True), means, covs)
    assert dual.means[0].tolist() == pytest.approx([1.4, 1.8, 0.0, 0.0], abs=1e-4)
    plain = _moved(linear_drift(DriftConfig(kind="lstsq", ridge=1e-9)), means, covs)
    assert plain.means[0].tolist() == pytest.approx([1.4, 1.8, 0.0, 0.3], abs=1e-4)


def test_rdfcil_plus_builds_the_dual_drift_and_ldc_refuses_it():
    cfg = tiny_config("rdfcil_plus", [("method.drift", "{kind: dual, synthetic: true}")])
    drift = build_method(cfg.method, cfg.train).memory.drift
    assert isinstance(drift, DualProjectionDrift) and drift.relative and drift.synthetic and drift.ridge == 1e-3
    for name in ("lwf", "rdfcil"):
        cfg = tiny_config(name, [("method.ldc", "true"), ("method.drift.kind", "dual")])
        with pytest.raises(ConfigError, match="keeps class means only"):
            build_method(cfg.method, cfg.train)


def test_the_ridge_head_from_the_statistics_alone_is_the_ridge_regression_on_the_features():
    # Φ_c = (n_c − 1)Σ_c + n_c μ_cᵀμ_c and Q's column n_c μ_c are XᵀX and XᵀY exactly: the head from the memory
    # equals the ridge regression on the features themselves
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(60, 5, generator=g, dtype=torch.float64).float(), torch.arange(60) % 3
    memory = ClassMemory(None, covariances=True, augmented=False)
    memory.add(x, y, range(3))
    ridge = RidgeClassifier(gamma=2.0)
    ridge.add_counts(y, range(3))
    ridge.fit(memory, 3, x.new_zeros(0, 5), y.new_zeros(0), 3)
    xd = x.double()
    expected = ridge_head(xd.T @ xd, xd.T @ F.one_hot(y, 3).double(), 2.0, True)
    assert torch.allclose(ridge.weight.double(), expected.double(), atol=1e-5)


def test_the_anti_collapse_term_joins_rrl_only_where_it_is_weighted(caplog):
    # with β below every Cholesky pivot, −mean min(L_ii, β) = −β: the term is −λ·β by hand
    caplog.set_level(logging.WARNING, logger="dfcil")
    extra = [("method.lambda_ac", "0.5"), ("method.ac_beta", "1e-6"), ("train.batch_size", "8")]
    _, method, net, ctx, batches = _task1_setup(extra, name="rdfcil_plus")
    x, y = next(iter(batches))
    terms = method.training_step(net, Batch(x, y), ctx, Phase("rrl", 1, 0.1))
    assert float(terms["ac"].detach()) == pytest.approx(-0.5e-6, rel=1e-4)
    assert "2 × train.batch_size is 16" in caplog.text  # 16 rows of 64-dimensional features: said once
    assert "ac" not in method.training_step(net, Batch(x, y), ctx, Phase("chr", 1, 0.005, trainable="head"))
    _, on, net, ctx, batches = _task1_setup(name="rdfcil_plus")  # on by default (λ = β = 1)
    assert "ac" in on.training_step(net, Batch(x, y), ctx, Phase("rrl", 1, 0.1))
    _, off, net, ctx, batches = _task1_setup([("method.lambda_ac", "0")], name="rdfcil_plus")
    assert "ac" not in off.training_step(net, Batch(x, y), ctx, Phase("rrl", 1, 0.1))


@pytest.mark.parametrize("classifier", ["bayes", "ridge"])
def test_a_run_classified_by_its_gaussians_and_dfcil_eval_agree(classifier, tmp_path):
    from dfcil.analysis.tools import evaluate_run
    from dfcil.runs.runner import train
    from dfcil.training.loop import RunOptions

    cfg = tiny_config("rdfcil_plus", [("method.classifier", classifier), ("method.lambda_ac", "0.1")])
    train(cfg, tmp_path / "run", options=RunOptions(progress=False))
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    saved = loads((tmp_path / "run" / "model.pt").read_bytes())
    state = saved["method_state"]
    if classifier == "bayes":
        assert state["precisions"].shape == (6, 64, 64) and state["means"].shape == (6, 64)
    else:
        assert state["ridge_head"].shape == (64, 6)
        assert torch.allclose(state["ridge_head"].norm(dim=0), torch.ones(6), atol=1e-5)  # columns normalised
    report = evaluate_run(tmp_path / "run")  # the same classifier again, from model.pt: the run's last row
    assert [t["correct"] for t in report["tasks"]] == summary["correct_matrix"][1]
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert any("ac" in r["loss"] for r in records if r["type"] == "epoch" and r["task"] == 1)


@pytest.mark.parametrize("head", ["adagauss", "apr"])
def test_the_bayes_scores_are_the_mahalanobis_distances_to_the_stored_gaussians(head):
    # AdaGauss's head (γ = 3), or APR's: FeCAM's shrinkage of the off-diagonal too, the pseudo-inverse
    shrink = {"adagauss": (3.0, 0.0, False), "apr": (24.0, 24.0, True)}[head]
    keys = ("method.bayes_shrinkage", "method.bayes_offdiag", "method.bayes_pseudo_inverse")
    extra = [("method.classifier", "bayes"), *((k, str(v).lower()) for k, v in zip(keys, shrink, strict=True))]
    _, method, net, ctx, _ = _task1_setup(extra, name="rdfcil_plus")
    g = torch.Generator().manual_seed(1)
    a = torch.randn(6, 64, 64, generator=g)
    method.memory.load_state_dict({"means": torch.randn(6, 64, generator=g), "covs": a @ a.transpose(1, 2) / 64})
    method.classifier.refresh(method.memory)
    out = net(torch.randn(4, 3, 32, 32))
    f, mu = F.normalize(out.features, dim=1), F.normalize(method.memory.means, dim=1)
    expected = bayes_log_likelihood(f, mu, bayes_precisions(method.memory.covs, shrink[0], True, *shrink[1:]))
    assert torch.allclose(method.eval_logits(out), expected, atol=1e-4)
    assert set(method.eval_state()) == {"means", "precisions"} and "classifier" in method.components()


def _pseudo_setup(mode, pseudo="{per_class: 4, batch_size: 5, noise: 0}"):
    """Task 1 of rdfcil_plus with the pseudo-replay ``mode`` and three old classes' Gaussians stored, its candidates
    drawn as a run's task start draws them."""
    extra = [("method.pseudo_replay", mode), ("method.pseudo", pseudo), ("train.batch_size", "8")]
    extra += [("method.inversion.steps", "0")] if mode == "only" else []
    _, method, net, ctx, batches = _task1_setup(extra, name="rdfcil_plus")
    assert method.pseudo is not None and not len(method.pseudo) and not method.graph_safe  # nothing stored yet
    assert method.eager_reason == f"method.pseudo_replay {mode} does host work in every step of rdfcil_plus"
    g = torch.Generator().manual_seed(1)
    a = torch.randn(3, 64, 64, generator=g)
    method.memory.load_state_dict({"means": torch.randn(3, 64, generator=g), "covs": a @ a.transpose(1, 2) / 64})
    method.pseudo.begin(ctx, method.teacher, method.memory.means, method.memory.covs)
    return method, net, ctx, batches


def _distances(method, x, labels):
    with torch.no_grad():
        return (method.teacher(x).features - method.memory.means[labels]).norm(dim=1)


@pytest.mark.parametrize("mode", ["extra", "only"])
def test_the_pseudo_replay_adds_moved_views_of_the_task_to_the_old_classes_images(mode):
    method, net, ctx, batches = _pseudo_setup(mode)
    p = method.pseudo
    assert len(p) == 3 * 4 and p.labels.tolist() == [0] * 4 + [1] * 4 + [2] * 4  # 4 candidates per old class
    pick = p.order[:5].clone()
    views, labels = p.views.load(p.index[pick]), p.labels[pick]
    x = method.old_inputs(8, ctx)
    assert len(x) == {"extra": 8 + 5, "only": 5}[mode] and p.position == 5
    moved = x[-5:]  # pushed toward their classes' means through the old model: nearer each, image by image
    assert bool((_distances(method, moved, labels) < _distances(method, views, labels)).all())
    x, y = next(iter(batches))  # a step counts the old images' pseudo-labels beside the real ones (CHR's weights)
    before = method.class_counts.sum().item()
    assert set(method.training_step(net, Batch(x, y), ctx, Phase("rrl", 1, 0.1))) == {"lce", "hkd", "rkd", "ac"}
    assert method.class_counts.sum().item() - before == len(x) + {"extra": 8 + 5, "only": 5}[mode]


def test_the_pseudo_replay_without_steps_replays_the_fixed_views_themselves():
    method, _, ctx, _ = _pseudo_setup("only", "{per_class: 4, batch_size: 5, noise: 0, steps: 0}")
    p = method.pseudo
    pick = p.order[:5].clone()
    assert torch.equal(method.old_inputs(8, ctx), p.views.load(p.index[pick]))


def test_pseudo_replay_only_skips_the_inversion_and_its_refusals():
    method, _, ctx, _ = _pseudo_setup("only")
    assert method.replay.synth.step == 0  # never inverted
    extra, _, _, _ = _pseudo_setup("extra")
    assert extra.replay.synth.step > 0
    with pytest.raises(ConfigError, match="set method.inversion.steps 0"):
        build_method(
            tiny_config("rdfcil_plus", [("method.pseudo_replay", "only")]).method, tiny_config("rdfcil_plus").train
        )
    with pytest.raises(ConfigError, match="method.pseudo is .* its switch is off"):
        build_method(
            tiny_config("rdfcil_plus", [("method.pseudo", "{steps: 2}")]).method, tiny_config("rdfcil_plus").train
        )
    only_syn = [("method.pseudo_replay", "only"), ("method.inversion.steps", "0"), ("method.drift.synthetic", "true")]
    with pytest.raises(ConfigError, match="drop method.drift.synthetic"):
        build_method(tiny_config("rdfcil_plus", only_syn).method, tiny_config("rdfcil_plus").train)


SWITCHES = {
    "bayes": [("method.classifier", "bayes")],
    "ridge": [("method.classifier", "ridge")],
    "ridge_no_chr": [("method.classifier", "ridge"), ("method.chr_epochs", "0")],
    "dual_syn": [("method.drift", "{kind: dual, synthetic: true}")],
    "no_ac": [("method.lambda_ac", "0")],  # the term is on by default
    # checkpointed at every setup step, as a long inversion is: the views are static state from the task's start,
    # the generator only after the inversion, and the checkpoint in RRL must find both
    "pseudo_extra": [
        ("method.pseudo_replay", "extra"),
        ("method.pseudo", "{per_class: 8, batch_size: 4}"),
        ("checkpoint_interval_s", "0"),
    ],
    "pseudo_only": [("method.pseudo_replay", "only"), ("method.inversion.steps", "0")],
    "cycle": [("method.cycle", "true"), ("method.cycle_multiplier", "2")],
    "mahalanobis": [
        ("method.classifier", "bayes"),
        ("method.bayes_offdiag", "24"),
        ("method.bayes_pseudo_inverse", "true"),
    ],
}


@pytest.mark.parametrize("switch", list(SWITCHES))
def test_each_switch_resumes_exactly_from_inside_rrl(switch, tmp_path):
    """Stopped after the first RRL epoch of task 1 and resumed: the same accuracies, weights and classifier state
    (ridge head and counts, Bayes means and precisions) as the run that never stopped."""
    from conftest import StopAfterEpochs
    from dfcil.errors import RunInterrupted
    from dfcil.methods import Task
    from dfcil.runs.runner import resume, train
    from dfcil.training.loop import RunOptions
    from dfcil.training.state import Interrupt

    extra = [("method.inversion.zdim", "32"), ("train.epochs", "3"), *SWITCHES[switch]]
    cfg = tiny_config("rdfcil_plus", extra)
    train(cfg, tmp_path / "a", options=RunOptions(progress=False))
    interrupt = Interrupt()
    task0 = Task(task_id=0, n_old=0, n_new=3, num_tasks=2)
    epochs0 = sum(p.epochs for p in build_method(cfg.method, cfg.train).phases(task0))
    stop = StopAfterEpochs(interrupt, epochs0 + 1)
    with pytest.raises(RunInterrupted):
        train(cfg, tmp_path / "b", options=RunOptions(progress=False, interrupt=interrupt, callbacks=[stop]))
    position = loads((tmp_path / "b" / "checkpoints" / "last.pt").read_bytes())["position"]
    assert position["task"] == 1 and position["stage"] == "train"
    resume(tmp_path / "b", options=RunOptions(progress=False))
    a, b = (json.loads((tmp_path / d / "summary.json").read_text()) for d in "ab")
    assert a["correct_matrix"] == b["correct_matrix"]
    # a static file replaced inside a task (pseudo_extra's: views, then the generator) is gone after the task's end
    assert not [p.name for d in "ab" for p in (tmp_path / d / "checkpoints").glob("*.prev.pt")]
    ma, mb = (loads((tmp_path / d / "model.pt").read_bytes()) for d in "ab")
    assert all(torch.equal(ma["net"][k], mb["net"][k]) for k in ma["net"])
    sa, sb = ma.get("method_state", {}), mb.get("method_state", {})
    assert set(sa) == set(sb) and (switch not in ("bayes", "ridge", "ridge_no_chr", "mahalanobis") or sa)
    assert all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.mark.parametrize("switch", [[], SWITCHES["cycle"]], ids=["default", "cycle"])
def test_rdfcil_plus_on_the_static_head_keeps_its_graph_promise(switch):
    """With model.static_head (what engine.compile: step needs) the CUDA-graph check records and compares every
    step, CHR's replay of the memory and the cycle switch's in-place moments included, and the checked run equals
    the eager one bit for bit on the CPU."""
    from dfcil.training.engine import run
    from dfcil.training.loop import RunOptions

    extra = [("model.static_head", "true"), ("train.epochs", "3"), ("train.milestones", "[1]"), *switch]
    eager = run(tiny_config("rdfcil_plus", extra), options=RunOptions(progress=False))
    checked = run(
        tiny_config("rdfcil_plus", [*extra, ("engine.cuda_graphs", "check")]), options=RunOptions(progress=False)
    )
    assert checked["accuracy_matrix"] == eager["accuracy_matrix"]
    phases = {name: p for t in checked["timings"] for name, p in t["phases"].items()}
    assert set(phases) == {"base", "rrl", "chr"} and all(p["cuda_graphs"] == "check" for p in phases.values())


def test_the_cycle_map_is_the_centred_ridge_fit_of_the_weighted_pairs():
    # by hand, one dimension: z° = (0, 2), z = (1, 5): means 1 and 3, variance 1, cross-covariance 2, so with ridge 1
    # P = 2 / (1 + 1) = 1 and b = 3 - 1·1 = 2
    m = update_moments(PairMoments.zeros(1), torch.tensor([[0.0], [2.0]]), torch.tensor([[1.0], [5.0]]), 0.99)
    p, b = affine_map(m, 1.0)
    assert (float(p), float(b)) == pytest.approx((1.0, 2.0), abs=1e-6)
    # an exact affine relation is recovered; two steps weigh as rows of weights ρ : 1 (the EMA, corrected)
    g = torch.Generator().manual_seed(0)
    M, c = torch.randn(4, 4, generator=g), torch.randn(4, generator=g)
    x1, x2 = torch.randn(16, 4, generator=g), torch.randn(8, 4, generator=g) + 1
    m = update_moments(update_moments(PairMoments.zeros(4), x1, x1 @ M + c, 0.5), x2, x2 @ M + c, 0.5)
    p, b = affine_map(m, 1e-6)
    assert torch.allclose(p, M, atol=1e-3) and torch.allclose(b, c, atol=1e-3)
    y1, y2 = torch.randn(16, 4, generator=g), torch.randn(8, 4, generator=g)  # not affine: the weighted ridge fit
    m = update_moments(update_moments(PairMoments.zeros(4), x1, y1, 0.5), x2, y2, 0.5)
    p, b = affine_map(m, 0.3)
    x, y = torch.cat([x1, x2]).double(), torch.cat([y1, y2]).double()
    w = torch.cat([torch.full((16,), 0.5 / 16), torch.full((8,), 1 / 8)]).double()
    w = w / w.sum()
    mx, my = w @ x, w @ y
    xc, yc = x - mx, y - my
    expected = torch.linalg.solve(
        xc.T @ (w[:, None] * xc) + 0.3 * torch.eye(4, dtype=x.dtype), xc.T @ (w[:, None] * yc)
    )
    assert torch.allclose(p.double(), expected, atol=1e-5) and torch.allclose(b.double(), my - mx @ expected, atol=1e-5)
    d, o = torch.tensor([[1.0, 2.0]]), torch.tensor([[0.0, 0.0]])  # MSE by hand: (1 + 4) / 2
    assert [float(t) for t in cycle_losses(d, 2 * d, o)] == [2.5, 10.0]


def test_the_cycle_switch_trains_the_distiller_and_reaches_the_backbone_through_its_distillation_alone():
    extra = [("method.cycle", "true"), ("method.lambda_cycle_kd", "3"), ("method.lambda_cycle", "0.5")]
    extra += [("method.cycle_momentum", "0"), ("method.lambda_ac", "0"), ("train.batch_size", "8")]
    _, method, net, ctx, batches = _task1_setup(extra, name="rdfcil_plus")
    d = method.cycle
    assert d is not None and method.teacher_on_real and d.net in method.extra_modules(ctx)
    assert [m.out_features for m in d.net if hasattr(m, "out_features")] == [32 * 64, 64]
    x, y = next(iter(batches))
    terms = method.training_step(net, Batch(x, y), ctx, Phase("rrl", 1, 0.1))
    assert terms["cycle_kd"].requires_grad and terms["cycle"].requires_grad
    backbone = [p for n, p in net.named_parameters() if not n.startswith("head")]
    for name, reaches_backbone in (("cycle_kd", True), ("cycle", False)):
        net.zero_grad(), d.net.zero_grad()
        terms = method.training_step(net, Batch(x, y), ctx, Phase("rrl", 1, 0.1))
        terms[name].backward()
        assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in d.net.parameters())
        assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in backbone) == reaches_backbone
    assert float(d.moments.weight) == pytest.approx(1.0)  # momentum 0: the last step's pairs alone
    chr_terms = method.training_step(net, Batch(x, y), ctx, Phase("chr", 1, 0.005, trainable="head"))
    assert not {"cycle_kd", "cycle"} & set(chr_terms)
    method.on_task_end(ctx)
    assert method.cycle is None
    with pytest.raises(ConfigError, match="method.cycle_ridge is 0.5, and its switch is off"):
        build_method(
            tiny_config("rdfcil_plus", [("method.cycle_ridge", "0.5")]).method, tiny_config("rdfcil_plus").train
        )
    _, off, net, ctx, batches = _task1_setup([("method.lambda_ac", "0")], name="rdfcil_plus")
    assert off.cycle is None and not {"cycle_kd", "cycle"} & set(
        off.training_step(net, Batch(x, y), ctx, Phase("rrl", 1, 0.1))
    )


def test_the_cycle_distiller_adds_the_pairs_then_scores_d_through_the_fitted_map():
    from dfcil.methods.cycle import CycleDistiller

    part = CycleDistiller(4, 2, 0.1, 0.0, "cpu", torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(1)
    new, old = torch.randn(10, 4, generator=g, requires_grad=True), torch.randn(10, 4, generator=g)
    distill, cycle = part.losses(new, old)
    p, b = affine_map(update_moments(PairMoments.zeros(4), old, new, 0.0), 0.1)  # momentum 0: this step alone
    assert torch.allclose(distill, F.mse_loss(part.net(new), old)) and torch.allclose(
        cycle, F.mse_loss(part.net(old @ p + b), old), atol=1e-6
    )
    saved = part.state_dict()
    other = CycleDistiller(4, 2, 0.1, 0.0, "cpu", None)
    other.load_state_dict(saved)
    assert all(torch.equal(u, v) for u, v in zip(part.moments, other.moments, strict=True))
    assert all(torch.equal(u, v) for u, v in zip(part.net.parameters(), other.net.parameters(), strict=True))


def test_the_cycle_map_is_fitted_in_fp32_under_a_bf16_step():
    # features far from 0 (means 3): E[xxᵀ] − μμᵀ in bf16 loses the covariance, and the solve returns a wrong map
    from dfcil.methods.cycle import CycleDistiller

    g = torch.Generator().manual_seed(2)
    old = torch.randn(64, 8, generator=g) * 0.3 + 3
    new = old @ (torch.eye(8) + 0.1 * torch.randn(8, 8, generator=g)) + 0.5
    parts = [CycleDistiller(8, 2, 0.01, 0.0, "cpu", torch.Generator().manual_seed(0)) for _ in range(2)]
    parts[0].losses(new, old)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        parts[1].losses(new, old)
    (p0, b0), (p1, b1) = (affine_map(part.moments, 0.01) for part in parts)
    assert all(t.dtype == torch.float32 for t in parts[1].moments)
    assert torch.allclose(p0, p1, atol=1e-5) and torch.allclose(b0, b1, atol=1e-5)
