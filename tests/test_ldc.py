"""Class statistics kept across tasks (dfcil.methods.memory): LDC's drift compensation as a switch of LwF and
R-DFCIL, and R-DFCIL+'s Gaussian replay in CHR, against hand-computed values."""

import json

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from conftest import smoke_configs
from dfcil.data.device import Normalizer, TrainBatches
from dfcil.errors import ConfigError
from dfcil.losses.prototypes import balanced_labels, ncm_scores, sample_gaussians
from dfcil.methods import Batch, Phase, TaskContext
from dfcil.methods.memory import ClassMemory, DriftConfig, linear_drift
from dfcil.models.network import NetOutput
from test_methods import _task1_setup, tiny_config


class LinearFeatures(nn.Module):
    """A stand-in network whose features are a fixed linear map of the image's first 4 pixels' red values."""

    def __init__(self, matrix):
        super().__init__()
        self.matrix = matrix

    def forward(self, x):
        f = x[:, 0, 0, :4] @ self.matrix.T
        return NetOutput(f, f, ())


def _ctx(net, task_id=1, n_old=2, n_new=2, n=64):
    g = torch.Generator().manual_seed(3)
    x = torch.randint(0, 256, (n, 8, 8, 3), dtype=torch.uint8, generator=g)
    y = torch.arange(n) % n_new + n_old
    data = TrainBatches(x, y, 16, Normalizer((0.5,) * 3, (0.25,) * 3, torch.device("cpu")), g, augment=False)
    return TaskContext(task_id=task_id, n_old=n_old, n_new=n_new, num_tasks=3, net=net, data=data,
                       rng=torch.Generator().manual_seed(0))  # fmt: skip


def test_add_classes_keeps_the_plain_mean_of_each_new_class():
    net = LinearFeatures(torch.eye(4))
    ctx = _ctx(net, task_id=0, n_old=0)
    memory = ClassMemory(linear_drift(DriftConfig()), covariances=True, augmented=False)
    memory.add_classes(ctx)
    x = ctx.data.normalizer(ctx.data.x)[:, 0, 0, :4]
    for c in range(2):
        assert torch.allclose(memory.means[c], x[ctx.data.y == c].mean(0), atol=1e-5)
        assert torch.allclose(memory.covs[c], torch.cov(x[ctx.data.y == c].T), atol=1e-4)
    assert memory.factors.shape == (2, 4, 4)


@pytest.mark.parametrize("kind", ["lstsq", "ldc"])
def test_compensation_moves_stored_statistics_through_the_drift_it_fits(kind):
    drift = torch.tensor([[1.0, 0.2, 0.0, 0.0], [0.0, 0.9, 0.0, 0.1], [0.0, 0.0, 1.1, 0.0], [0.3, 0.0, 0.0, 1.0]])
    old, new = LinearFeatures(torch.eye(4)), LinearFeatures(drift)
    ctx = _ctx(new)
    memory = ClassMemory(linear_drift(DriftConfig(kind=kind, epochs=300, lr=0.01, passes=2, ridge=1e-9)), True, False)
    means, covs = torch.randn(2, 4), torch.eye(4).repeat(2, 1, 1)
    memory.load_state_dict({"means": means, "covs": covs})
    memory.compensate(ctx, old, None)
    tol = 1e-4 if kind == "lstsq" else 2e-2
    assert torch.allclose(memory.means, means @ drift.T, atol=tol)  # μ ← Pμ
    assert torch.allclose(memory.covs[0], drift @ drift.T, atol=5 * tol)  # Σ ← PΣPᵀ
    assert memory.compensated == 1
    moved = memory.means.clone()
    memory.compensate(ctx, old, None)  # a run resumed from the phase's checkpoint: not again
    assert torch.equal(memory.means, moved)


def test_drift_none_and_synthetic_pairs():
    ctx = _ctx(LinearFeatures(2 * torch.eye(4)))
    memory = ClassMemory(linear_drift(DriftConfig(kind="none")), False, False)
    memory.load_state_dict({"means": torch.ones(2, 4)})
    memory.compensate(ctx, LinearFeatures(torch.eye(4)), None)
    assert torch.equal(memory.means, torch.ones(2, 4))
    calls = []
    memory = ClassMemory(linear_drift(DriftConfig(kind="lstsq", synthetic=True)), False, False)
    memory.load_state_dict({"means": torch.ones(2, 4)})
    memory.compensate(ctx, LinearFeatures(torch.eye(4)), lambda n: calls.append(n) or torch.randn(n, 3, 8, 8))
    assert calls == [16] * 4  # one synthetic batch per real batch
    assert torch.allclose(memory.means, 2 * torch.ones(2, 4), atol=1e-2)


def _run(tmp_path, name, extra):
    from dfcil.runs.runner import train
    from dfcil.training.loop import RunOptions

    cfg = tiny_config(name, extra)
    train(cfg, tmp_path, options=RunOptions(progress=False))
    return json.loads((tmp_path / "summary.json").read_text())


@pytest.mark.parametrize(
    ("name", "head"),
    [("lwf", "linear"), ("lwf", "cosine"), ("rdfcil", "linear")],  # lwf cosine: LDC's own LwF (local CE, cosine)
)
def test_ldc_switch_classifies_by_nearest_mean_and_dfcil_eval_agrees(name, head, tmp_path):
    from dfcil.analysis.tools import evaluate_run
    from dfcil.checkpoint import loads

    extra = [("method.ldc", "true"), ("method.drift.epochs", "2"), ("method.drift.passes", "1")]
    if head == "cosine":
        extra += [("method.head", "cosine"), ("method.ce", "local")]
    summary = _run(tmp_path / "run", name, extra)
    assert summary["stores"] == "class statistics"
    timing = summary["timings"][1]  # the drift compensation has its own entry in the task's timings
    assert timing["drift_s"] > 0 and "drift_s" not in summary["timings"][0]
    saved = loads((tmp_path / "run" / "model.pt").read_bytes())
    assert saved["head"] == head and ("head.sigma" in saved["net"]) == (head == "cosine")
    state = saved["method_state"]
    assert state["means"].shape == (6, 64)  # every class's mean, for dfcil eval
    report = evaluate_run(tmp_path / "run")  # nearest mean again, from model.pt: the run's last row
    assert [t["correct"] for t in report["tasks"]] == summary["correct_matrix"][1]
    if head == "cosine":  # export ships the means beside the weights, its card how to classify with them
        import json

        from safetensors.torch import load_file

        from dfcil.analysis.tools import export_run

        weights, card = export_run(tmp_path / "run")
        about, tensors = json.loads(card.read_text()), load_file(weights)
        assert about["method_state"] == {"method.means": [6, 64]} and "ncm_scores(" in about["classify"]
        assert torch.equal(tensors["method.means"], state["means"])


def test_rdfcil_plus_replays_class_gaussians_in_chr_only():
    cfg, method, net, ctx, batches = _task1_setup(name="rdfcil_plus")
    memory = method.memory
    memory.load_state_dict({"means": torch.randn(3, 64), "covs": torch.eye(64).repeat(3, 1, 1) * 0.1})
    x, y = next(iter(batches))
    rrl = method.training_step(net, Batch(x, y), ctx, Phase("rrl", 1, 0.1))
    assert "replay" not in rrl
    state = ctx.rng.get_state()
    chr_ = method.training_step(net, Batch(x, y), ctx, Phase("chr", 1, 0.005, trainable="head"))
    assert set(chr_) == {"gce", "hkd", "replay"}
    # the same draw by hand: balanced old-class labels, samples μ + Lε, 0.5 · CE of the head on them
    ctx.rng.set_state(state)
    method.replay.generate_share(len(x), ctx.runtime.dist)  # the synthetic batch the step drew first
    labels = balanced_labels(3, len(x), ctx.rng, "cpu")
    z = sample_gaussians(memory.means, memory.factors, labels, ctx.rng)
    assert torch.bincount(labels, minlength=3).tolist() == [3, 3, 2] or sorted(torch.bincount(labels).tolist()) == [
        2,
        3,
        3,
    ]
    with torch.no_grad():
        want = 0.5 * F.cross_entropy(net.head(z), labels)
    assert chr_["replay"].item() == pytest.approx(want.item(), rel=1e-5)


def test_rdfcil_plus_switches_and_refusals(tmp_path):
    _, off, net, ctx, batches = _task1_setup([("method.replay", "false")], name="rdfcil_plus")
    off.memory.load_state_dict({"means": torch.randn(3, 64), "covs": torch.eye(64).repeat(3, 1, 1)})
    x, y = next(iter(batches))
    assert "replay" not in off.training_step(net, Batch(x, y), ctx, Phase("chr", 1, 0.005, trainable="head"))
    with pytest.raises(ConfigError, match="method.classifier ncm"):
        tiny_config("rdfcil_plus", [("method.ldc", "true")]) and _task1_setup([("method.ldc", "true")], "rdfcil_plus")


@pytest.mark.parametrize(
    ("name", "extra", "match"),
    [
        ("lwf", [("method.drift.kind", "lstsq")], "method.ldc is false"),  # no means to move
        ("rdfcil", [("method.drift", "{passes: 1}")], "method.ldc is false"),
        ("lwf", [("method.ldc", "true"), ("method.drift.synthetic", "true")], "no generator"),
        ("rdfcil_plus", [("method.chr_epochs", "0"), ("train.epochs", "2")], "would never be used"),
        # a switch's own keys with the switch off, and drift keys the drift kind does not read
        ("rdfcil_plus", [("method.ridge_gamma", "2000")], "method.ridge_gamma is 2000.0, and its switch is off"),
        ("rdfcil_plus", [("method.bayes_shrinkage", "1")], "set method.classifier: bayes"),
        ("rdfcil_plus", [("method.lambda_ac", "0"), ("method.ac_beta", "0.5")], "set method.lambda_ac above 0"),
        ("rdfcil_plus", [("method.replay", "false"), ("method.lambda_replay", "1")], "set method.replay: true"),
        ("rdfcil_plus", [("method.drift", "{kind: none, synthetic: true}")], "kind none does not read it: drop it"),
        ("rdfcil_plus", [("method.drift.passes", "5")], "method.drift.passes is 5, and drift kind lstsq does not"),
        ("lwf", [("method.ldc", "true"), ("method.drift.ridge", "0.1")], "use a kind that reads it: dual, lstsq"),
    ],
)
def test_settings_a_method_would_ignore_are_refused(name, extra, match, tmp_path, capsys):
    from dfcil.cli import main
    from dfcil.methods import build_method

    cfg = tiny_config(name, extra)
    with pytest.raises(ConfigError, match=match):
        build_method(cfg.method, cfg.train)
    args = ["train", *(f"--config={c}" for c in smoke_configs(name)), "--method.name", name, "--out", str(tmp_path)]
    assert main([*args + [f"--{k}={v}" for k, v in extra], "--no-progress"]) == 2  # one line, nothing written
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("dfcil: error: ")]
    assert len(errors) == 1 and match in errors[0]  # after the notes of the method switch, if any
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("name", "extra"),
    [
        ("lwf", [("method.ldc", "true"), ("method.drift.kind", "lstsq")]),
        ("rdfcil", [("method.ldc", "true"), ("method.drift.synthetic", "true")]),
        ("rdfcil_plus", [("method.chr_epochs", "0"), ("train.epochs", "2"), ("method.classifier", "ncm")]),
        ("rdfcil_plus", [("method.chr_epochs", "0"), ("train.epochs", "2"), ("method.replay", "false")]),
        ("rdfcil_plus", [("method.classifier", "ridge"), ("method.ridge_gamma", "2000")]),
        ("rdfcil_plus", [("method.classifier", "bayes"), ("method.bayes_shrinkage", "1")]),
        ("rdfcil_plus", [("method.lambda_ac", "1"), ("method.ac_beta", "0.5")]),
        ("rdfcil_plus", [("method.drift", "{kind: ldc, passes: 5}")]),
        ("rdfcil_plus", [("method.drift", "{kind: dual, synthetic: true, ridge: 0.01}")]),
        ("lwf", [("method.ldc", "true"), ("method.drift", "{kind: lstsq, ridge: 0.1}")]),
    ],
)
def test_the_same_settings_with_what_uses_them_are_accepted(name, extra):
    from dfcil.methods import build_method

    cfg = tiny_config(name, extra)
    build_method(cfg.method, cfg.train)


def test_rdfcil_plus_ncm_classifier_scores_by_the_stored_means():
    _, method, net, ctx, _ = _task1_setup([("method.classifier", "ncm")], name="rdfcil_plus")
    method.memory.load_state_dict({"means": torch.randn(6, 64), "covs": torch.eye(64).repeat(6, 1, 1)})
    out = net(torch.randn(4, 3, 32, 32))
    assert torch.equal(method.eval_logits(out), ncm_scores(out.features, method.memory.means))
    assert set(method.eval_state()) == {"means"}


# ---------------------------------------------------------------------- the parts, each on its own


def test_the_memory_moves_its_means_with_efcs_kernel_drift_and_keeps_the_covariances():
    """EFC's drift as a part of the one ClassMemory: the same numbers as its pure function, covariances kept."""
    from dfcil.losses.efc import drift_means
    from dfcil.methods.memory import KernelDrift

    torch.manual_seed(0)
    efm = torch.randn(4, 4)
    efm = efm @ efm.T
    memory = ClassMemory(KernelDrift(0.2, lambda: efm), covariances=True, augmented=True)
    feats, labels = torch.randn(40, 4), torch.arange(40) % 2
    memory.add(feats, labels, range(2))
    covs = memory.covs.clone()
    old, new = torch.randn(30, 4), torch.randn(30, 4)
    expected = drift_means(memory.means, old, new, efm, 0.2)
    memory.move([(old, new)], torch.Generator())
    assert torch.equal(memory.means, expected) and torch.equal(memory.covs, covs)
    assert memory.factors.shape == (2, 4, 4)
    state = memory.state_dict()
    again = ClassMemory(KernelDrift(0.2, lambda: efm), covariances=True, augmented=True)
    again.load_state_dict(state)
    assert torch.equal(again.means, memory.means) and torch.equal(again.factors, memory.factors)


def test_the_nearest_mean_classifier_scores_by_the_memory_and_hands_its_means_to_model_pt():
    from dfcil.methods.memory import NearestMeanClassifier
    from dfcil.models.network import NetOutput

    memory = ClassMemory(None, covariances=False, augmented=False)
    classifier = NearestMeanClassifier(memory)
    out = NetOutput(torch.zeros(2, 2), torch.tensor([[1.0, 0.1], [0.0, 2.0]]), ())
    assert classifier.scores(out) is None  # no statistics yet: the network's logits decide
    memory.load_state_dict({"means": torch.tensor([[3.0, 0.0], [0.0, 5.0]])})
    assert classifier.scores(out).argmax(dim=1).tolist() == [0, 1]  # cosine: the scale of a mean does not count
    fresh = NearestMeanClassifier(ClassMemory(None, False, False))
    fresh.load_eval_state(classifier.eval_state())
    assert torch.equal(fresh.scores(out), classifier.scores(out))


def test_drift_settings_without_the_switch_are_refused_by_the_part():
    from dfcil.errors import ConfigError

    assert ClassMemory.for_switch(False, DriftConfig(), generator=False) is None
    with pytest.raises(ConfigError, match="method.drift sets how LDC moves the stored class means"):
        ClassMemory.for_switch(False, DriftConfig(kind="lstsq"), generator=False)
    with pytest.raises(ConfigError, match="drift.synthetic fits the drift on synthetic images too"):
        ClassMemory.for_switch(True, DriftConfig(synthetic=True), generator=False)
    memory = ClassMemory.for_switch(True, DriftConfig(kind="lstsq"), generator=True)
    assert memory is not None and memory.drift.passes == 1 and not memory.covariances


def test_the_projector_fit_reports_each_epoch_and_starts_where_asked():
    from dfcil.losses.prototypes import fit_projector

    g = torch.Generator().manual_seed(0)
    old = torch.randn(256, 4, generator=g)
    seen = []
    fitted = fit_projector([(old, old)], 3, 1e-9, 64, torch.Generator().manual_seed(1), "identity",
                           lambda e, mse: seen.append((e, mse)))  # fmt: skip
    assert torch.allclose(fitted, torch.eye(4), atol=1e-6)  # the identity already maps old onto old: MSE 0
    assert [e for e, _ in seen] == [1, 2, 3] and all(mse < 1e-12 for _, mse in seen)
    random = fit_projector([(old, old)], 1, 1e-9, 64, torch.Generator().manual_seed(1))  # nn.Linear's init, LDC's
    assert (random - torch.eye(4)).abs().max() > 0.1 and random.abs().max() <= 0.5  # U(-1/2, 1/2) for d = 4


def test_map_errors_and_the_warning_of_an_unconverged_fit(caplog):
    from dfcil.losses.prototypes import map_errors
    from dfcil.methods.memory import check_fit

    old = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    new = 2 * old
    errors = map_errors(old, new, torch.eye(2))
    # leaving them: mean((2x - x)^2) = mean(x^2) = (1 + 0 + 0 + 1 + 1 + 1) / 6; the map 2I is exact
    assert errors["stay"] == pytest.approx(4 / 6) and errors["fit"] == pytest.approx(4 / 6)
    assert errors["best"] == pytest.approx(0.0, abs=1e-6)
    assert map_errors(old, new, 2 * torch.eye(2))["fit"] == pytest.approx(0.0)
    caplog.set_level("INFO", logger="dfcil")
    check_fit({"fit": 0.10, "best": 0.09, "stay": 0.5}, "task 1 drift")  # within 1.25 times the best: no warning
    assert "projector fit MSE 0.1 (least squares 0.09" in caplog.text and "WARNING" not in caplog.text
    check_fit({"fit": 0.6, "best": 0.1, "stay": 0.5}, "task 2 drift")
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warned) == 1 and "task 2 drift: LDC's projector fit has not converged" in warned[0]
    assert "6.0 times the least-squares map's" in warned[0]
    assert "worse than leaving the statistics in place" in warned[0]
    assert "method.drift.init: identity" in warned[0]


def test_an_identity_start_keeps_ldc_from_losing_the_old_classes_on_the_smoke_preset(tmp_path):
    """The smoke preset's tasks give LDC's fit 2 Adam steps an epoch: from nn.Linear's random start it moves the old
    means far off (old accuracy 0); from the identity the old classes are kept."""
    from dfcil.load import load_config
    from dfcil.runs.runner import train
    from dfcil.training.loop import RunOptions

    def old_accuracy(init):
        cfg, _ = load_config(smoke_configs("lwf"), [("method.name", "lwf"), ("method.ldc", "true"),
                                                    ("method.drift.init", init)])  # fmt: skip
        return train(cfg, tmp_path / init, options=RunOptions(progress=False))["old_acc"][-1]

    assert old_accuracy("random") < 10 and old_accuracy("identity") > 80  # measured: 0.00 and 95.00
