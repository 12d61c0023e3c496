"""FeCAM: its maths against hand-computed values and an independent numpy formula, and a run end to end (the
generic tests of every method cover its resume)."""

import json

import numpy as np
import pytest
import torch

from dfcil.methods.fecam import FeCAMConfig, class_statistics, correlation, mahalanobis, shrink, tukey
from dfcil.training.callbacks import Callback
from dfcil.training.loop import RunOptions
from test_methods import tiny_config


def test_tukey_relu_and_signed():
    x = torch.tensor([4.0, -9.0, 0.0, 0.25])
    assert torch.equal(tukey(x, 0.5), torch.tensor([2.0, 0.0, 0.0, 0.5]))  # negatives to 0 first, never NaN
    assert torch.equal(tukey(x, 0.5, "signed"), torch.tensor([2.0, -3.0, 0.0, 0.5]))


def test_shrinkage_by_hand_once_and_twice():
    cov = torch.tensor([[4.0, 1.0], [1.0, 2.0]])  # V1 = 3, V2 = 1
    once = torch.tensor([[7.0, 2.0], [2.0, 5.0]])
    assert torch.equal(shrink(cov), once)
    assert torch.equal(shrink(once), torch.tensor([[13.0, 4.0], [4.0, 11.0]]))  # V1 = 6, V2 = 2
    assert torch.equal(shrink(cov, 2.0, 0.5), torch.tensor([[10.0, 1.5], [1.5, 8.0]]))  # γ1 = 2, γ2 = 0.5


def test_shrinkage_averages_only_the_non_zero_off_diagonal_entries():
    cov = torch.tensor([[2.0, 0.0, 0.0], [0.0, 4.0, 1.0], [0.0, 1.0, 6.0]])  # V1 = 4, V2 = mean(1, 1) = 1
    expected = torch.tensor([[6.0, 1.0, 1.0], [1.0, 8.0, 2.0], [1.0, 2.0, 10.0]])
    assert torch.equal(shrink(cov), expected)
    assert torch.equal(shrink(torch.diag(torch.tensor([1.0, 3.0]))), torch.tensor([[3.0, 0.0], [0.0, 5.0]]))


def test_correlation_by_hand():
    r = correlation(torch.tensor([[4.0, 2.0], [2.0, 9.0]]))
    assert torch.allclose(r, torch.tensor([[1.0, 1 / 3], [1 / 3, 1.0]]))


def test_mahalanobis_by_hand_and_against_a_loop():
    x, means = torch.tensor([[1.0, 2.0]]), torch.tensor([[0.0, 0.0], [1.0, 0.0]])
    precisions = torch.stack([torch.eye(2), torch.tensor([[2.0, 1.0], [1.0, 3.0]])])
    # class 0: |(1, 2)|² = 5; class 1: (0, 2) P (0, 2)ᵀ = 4·3 = 12
    assert torch.equal(mahalanobis(x, means, precisions), torch.tensor([[5.0, 12.0]]))
    g = torch.Generator().manual_seed(0)
    x, means = torch.randn(5, 3, generator=g, dtype=torch.float64), torch.randn(4, 3, generator=g, dtype=torch.float64)
    a = torch.randn(4, 3, 3, generator=g, dtype=torch.float64)
    precisions = a @ a.transpose(1, 2)
    loop = torch.tensor([[float((xi - m) @ p @ (xi - m)) for m, p in zip(means, precisions, strict=True)] for xi in x])
    assert torch.allclose(mahalanobis(x, means, precisions), loop.double())


def numpy_statistics(f, beta=0.5, gammas=(1.0, 1.0), times=2):
    """FeCAM's class statistics written out independently in numpy (post-ReLU features)."""
    f = np.maximum(f.astype(np.float64), 0)
    cov = np.cov(f**beta, rowvar=False)  # ddof 1
    for _ in range(times):
        d = len(cov)
        off = cov[~np.eye(d, dtype=bool)]
        v1, v2 = np.mean(np.diag(cov)), np.mean(off[off != 0])
        cov = cov + gammas[0] * v1 * np.eye(d) + gammas[1] * v2 * (np.ones((d, d)) - np.eye(d))
    sd = np.sqrt(np.diag(cov))
    mu = f.mean(axis=0) ** beta
    return mu / np.linalg.norm(mu), np.linalg.pinv(cov / np.outer(sd, sd))


@pytest.mark.parametrize("times", [1, 2])
def test_class_statistics_match_an_independent_numpy_formula(times):
    f = np.random.default_rng(0).normal(0.3, 1.0, size=(40, 5))  # some features negative: ReLU first
    centre, precision = class_statistics(torch.from_numpy(f).float(), FeCAMConfig(shrink_times=times))
    mu, p = numpy_statistics(f.astype(np.float32), times=times)
    assert centre.dtype == precision.dtype == torch.float32
    np.testing.assert_allclose(centre.numpy(), mu, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(precision.numpy(), p, rtol=1e-4, atol=1e-5)


def test_the_second_shrinkage_changes_the_statistics():
    f = torch.from_numpy(np.random.default_rng(1).normal(size=(30, 4))).float()
    once = class_statistics(f, FeCAMConfig(shrink_times=1))[1]
    twice = class_statistics(f, FeCAMConfig())[1]
    assert not torch.allclose(once, twice)


class Watch(Callback):
    """The backbone's weights and buffers after task 0, and the method and network at the end of the run."""

    def on_run_start(self, loop):
        self.loop = loop

    def on_task_end(self, record):
        if record["task"] == 0:
            self.backbone0 = {k: v.clone() for k, v in self.loop.net.backbone.state_dict().items()}


def test_a_run_trains_task_0_only_and_classifies_by_mahalanobis_distance(tmp_path, caplog):
    caplog.set_level("INFO", logger="dfcil")
    from dfcil.analysis.tools import evaluate_run, export_run
    from dfcil.runs.runner import train

    watch = Watch()
    summary = train(tiny_config("fecam"), tmp_path / "run", options=RunOptions(progress=False, callbacks=[watch]))
    loop, method = watch.loop, watch.loop.method
    after = loop.net.backbone.state_dict()
    assert all(torch.equal(watch.backbone0[k], after[k]) for k in after)  # weights and BN statistics unchanged
    assert method.tasks == 2 and method.means.shape == (6, loop.net.feature_dim)
    assert method.precisions.shape == (6, loop.net.feature_dim, loop.net.feature_dim)
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert {r["task"] for r in records if r["type"] == "epoch"} == {0}
    log = caplog.text  # the log says that the later task trains nothing
    assert "(6 seen), 144 training images, phases none: no training in this task" in log, log
    # the last accuracy row is the argmin of the Mahalanobis distances, recomputed here from the stored statistics
    test, net = loop.evaluator.test, loop.net.eval()
    n = int(test.seen[-1])
    with torch.no_grad():
        x = torch.nn.functional.normalize(net(test.normalizer(test.x[:n])).features.clamp(min=0).sqrt(), dim=1)
        pred = mahalanobis(x, method.means, method.precisions).argmin(dim=1)
    correct = [int(((pred == test.y[:n]) & (test.task_of_label[test.y[:n]] == t)).sum()) for t in range(2)]
    assert summary["correct_matrix"][1] == correct
    # dfcil eval reproduces the run's last row from the statistics in model.pt
    report = evaluate_run(tmp_path / "run")
    assert [t["correct"] for t in report["tasks"]] == correct
    # export ships them beside the weights, and its card says how to classify: followed here, it predicts as the run
    from safetensors.torch import load_file

    from dfcil.methods.fecam import tukey
    from dfcil.models.network import build_network

    weights, card_path = export_run(tmp_path / "run")
    card, state = json.loads(card_path.read_text()), load_file(weights)
    assert card["method_state"] == {"method.means": [6, 64], "method.precisions": [6, 64, 64]}
    assert card["method_values"] == {"tasks": 2} and "mahalanobis(z, state['method.means']" in card["classify"]
    shipped = build_network(card["backbone"], card["head"])
    for size in card["head_sizes"]:
        shipped.expand(size)
    assert "net.load_state_dict({k: v for k, v in state.items() if not k.startswith('method.')})" in card["build"]
    shipped.load_state_dict({k: v for k, v in state.items() if not k.startswith("method.")})  # as the card says
    with torch.no_grad():
        feats = shipped.eval()(test.normalizer(test.x[:n])).features
        z = torch.nn.functional.normalize(tukey(feats, 0.5, "relu"), dim=1)
        scores = -mahalanobis(z, state["method.means"], state["method.precisions"])
    assert torch.equal(scores.argmax(1), pred)


def test_the_first_task_is_evaluated_with_the_cosine_classifier():
    from dfcil.methods.fecam import FeCAM
    from dfcil.models.network import NetOutput

    method = FeCAM(FeCAMConfig(), tiny_config("fecam").train)
    out = NetOutput(torch.randn(4, 3), torch.randn(4, 8), ())
    assert method.eval_logits(out) is out.logits  # no statistics of a second task yet
