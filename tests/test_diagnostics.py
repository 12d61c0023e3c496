"""Inversion diagnostics: the statistics on hand-made tensors, their record in a run, and dfcil inspect --synthetic;
the feature analysis of dfcil inspect --features: its numbers on hand-made features, its embeddings, two runs."""

import json
import math
import os
import shutil

import numpy as np
import pytest
import torch

from conftest import CONFIGS
from dfcil.analysis import inversions
from dfcil.analysis.separation import separation_numbers
from dfcil.cli import main
from dfcil.errors import ConfigError, MissingExtraError
from dfcil.synthesis.diagnostics import class_mean_gap, pixel_statistics, prediction_spread, top1_confidence

SMOKE = str(CONFIGS / "smoke.yaml")


def test_top1_confidence_is_the_mean_largest_probability():
    logits = torch.tensor([[0.0, 0.0], [math.log(3.0), 0.0]])  # softmax maxima 1/2 and 3/4
    assert top1_confidence(logits) == pytest.approx(0.625)
    assert top1_confidence(torch.zeros(7, 4)) == pytest.approx(0.25)  # no preference: 1/K


def test_prediction_spread_counts_coverage_and_normalised_entropy():
    s = prediction_spread(torch.tensor([0, 0, 1, 3]), 4)
    assert s["counts"] == [2, 1, 0, 1] and s["coverage"] == 0.75
    # p = (1/2, 1/4, 1/4): H = 1.5 ln 2, over ln 4
    assert s["entropy"] == pytest.approx(0.75)
    collapsed = prediction_spread(torch.tensor([2, 2, 2]), 3)["entropy"]  # collapsed onto one class
    assert collapsed == 0.0 and math.copysign(1.0, collapsed) == 1.0 and f"{collapsed:.2f}" == "0.00"  # not -0.00
    assert prediction_spread(torch.arange(5), 5)["entropy"] == pytest.approx(1.0)  # every class alike


def test_pixel_statistics_undo_the_normalisation():
    x = torch.zeros(2, 3, 2, 2)
    x[0, 0] = -1.0  # with mean 0.5 and std 0.5: pixels 0 in one image, 1 in the other
    x[1, 0] = 1.0
    stats = pixel_statistics(x, (0.5, 0.4, 0.3), (0.5, 0.2, 0.1))
    assert stats == {"mean": [0.5, 0.4, 0.3], "std": [0.5, 0.0, 0.0]}


def test_class_mean_gap_relative_to_the_spacing_of_the_real_means():
    # real class means at (0, 0), (2, 0), (0, 2): mean distance between two of them (2 + 2 + 2√2) / 3
    real = torch.tensor([[0.0, 0.0], [0.0, 0.0], [2.0, 0.0], [0.0, 2.0]])
    real_class = torch.tensor([0, 0, 1, 2])
    # synthetic class 0 at (0.5, 0): its own mean is nearest; synthetic class 1 at (0, 1.8): class 2's is nearest
    synthetic = torch.tensor([[0.25, 0.0], [0.75, 0.0], [0.0, 1.8]])
    synthetic_class = torch.tensor([0, 0, 1])
    gap = class_mean_gap(synthetic, synthetic_class, real, real_class, 3)
    spacing = (4 + 2 * math.sqrt(2)) / 3
    assert gap["classes"] == 2 and gap["nearest_own"] == 0.5
    assert gap["distance"] == pytest.approx((0.5 + math.sqrt(4 + 1.8**2)) / 2 / spacing)
    same = class_mean_gap(real, real_class, real, real_class, 3)
    assert same == {"distance": 0.0, "nearest_own": 1.0, "classes": 3}
    none = class_mean_gap(synthetic[:0], synthetic_class[:0], real, real_class, 3)
    assert none["classes"] == 0 and math.isnan(none["distance"])


# smoke_run: the session's shared smoke run (conftest), read only


def test_each_inversion_is_recorded_with_its_task(smoke_run):
    summary = json.loads((smoke_run / "summary.json").read_text())
    first, second = summary["diagnostics"]
    assert first == {}  # task 0 inverts nothing
    inv = second["inversion"]
    assert inv["old_classes"] == 5 and inv["images"] == 256 and sum(inv["counts"]) == 256
    assert 0.2 <= inv["confidence"] <= 1 and 0 <= inv["entropy"] <= 1 and 0 < inv["coverage"] <= 1
    assert set(inv["loss_terms"]) == {"content", "diversity", "bn", "prior"}
    assert inv["data_pixels"] == {"mean": [0.5] * 3, "std": [0.25] * 3} and len(inv["pixels"]["std"]) == 3
    assert set(inv["feature_gap"]) == {"distance", "nearest_own", "classes"}
    records = [json.loads(line) for line in (smoke_run / "metrics.jsonl").read_text().splitlines()]
    tasks = [r for r in records if r["type"] == "task"]
    assert tasks[1]["diagnostics"] == second and tasks[0]["diagnostics"] == {}
    assert "task 1 inversion: teacher confidence" in (smoke_run / "run.log").read_text()


def test_inspect_synthetic_prints_and_plots_them(smoke_run, tmp_path, capsys):
    assert main(["inspect", str(smoke_run), "--synthetic", "--out", str(tmp_path / "out")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:5] == ["task", "old", "confidence", "coverage", "entropy"]
    assert lines[1].split()[:2] == ["1", "5"]
    assert lines[2:] == [
        str(tmp_path / "out" / "synthetic_diagnostics.png"),
        str(tmp_path / "out" / "synthetic_diagnostics.pdf"),
    ]
    assert (tmp_path / "out" / "synthetic_diagnostics.png").stat().st_size > 10_000


def _record(confidence, coverage, entropy, distance, nearest_own, old):
    return {"confidence": confidence, "coverage": coverage, "entropy": entropy, "old_classes": old,
            "feature_gap": {"distance": distance, "nearest_own": nearest_own}}  # fmt: skip


def test_the_diagnostics_figure_has_one_panel_per_statistic(tmp_path):
    """On one axis the class-mean gap (up to about 3) squeezed the shares and probabilities (0 to 1) together, and
    the legend covered a point: one panel per statistic now, on a shared task axis, titled instead of a legend."""
    from PIL import Image

    found = [(1, _record(0.5, 1.0, 0.9, 0.3, 1.0, 5)), (2, _record(0.2, 0.6, 0.4, 2.8, 0.1, 10)),
             (3, _record(0.1, 0.5, 0.3, None, 0.0, 15))]  # fmt: skip
    Image.new("RGB", (20, 20)).save(tmp_path / "grid.png")
    for grids in ([], [(1, tmp_path / "grid.png")]):
        fig = inversions.diagnostics_figure("run", found, grids)
        panels = fig.subfigs[0].axes if grids else fig.axes
        assert len(panels) == len(inversions.PANELS) == 5 and len(fig.axes) == 5 + len(grids)
        titles = [ax.get_title() for ax in panels]
        assert [t.split(" (")[0] for t in titles] == [title for title, *_ in inversions.PANELS]
        assert titles[0] == "teacher confidence (- - 1/K)" and titles[3] == "class-mean gap (- - 1)"
        assert all(ax.get_legend() is None for ax in fig.axes)
        assert all(panels[0].get_shared_x_axes().joined(panels[0], ax) for ax in panels)
        assert [ax.get_ylabel() for ax in panels][:2] == ["mean top-1 probability", "share of old classes drawn"]
        gap = panels[3].get_lines()[-1].get_ydata()
        assert gap[:2].tolist() == [0.3, 2.8] and math.isnan(gap[2]) and panels[3].get_ylim()[1] > 2.8
        assert panels[0].get_ylim()[1] == pytest.approx(1.05)
        chance = panels[0].collections[0].get_segments()  # a dash at 1/K of each task
        assert [seg[0][1] for seg in chance] == pytest.approx([1 / 5, 1 / 10, 1 / 15])


def test_inspect_synthetic_on_a_run_without_inversions_says_so(smoke_run, tmp_path, capsys):
    out = tmp_path / "ft"  # a fine-tuning run's records: a task record of each task, no inversion in any
    out.mkdir()
    (out / "config.yaml").write_text((smoke_run / "config.yaml").read_text().replace("rdfcil", "finetune"))
    summary = json.loads((smoke_run / "summary.json").read_text())
    (out / "summary.json").write_text(json.dumps(summary | {"method": "finetune", "diagnostics": [{}, {}]}))
    assert main(["inspect", str(out), "--synthetic"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "has no inversion diagnostics: its method inverts no generator" in err


# That a run is the same with or without its diagnostics (they draw from a stream of their own and only read the
# generator and the teacher) is tests/test_tools.py::test_the_grids_and_loggers_leave_the_results_unchanged: the
# bare engine's run (no diagnostics, grids or loggers) against the shared smoke run, weights and every count.


def test_inspect_synthetic_prints_the_table_without_matplotlib(smoke_run, tmp_path, capsys, monkeypatch):
    def missing(module, extra, feature, package=None):
        raise MissingExtraError(f"{feature} needs {package}, which is not installed; pip install 'dfcil[{extra}]'")

    monkeypatch.setattr(inversions, "require", missing)
    assert main(["inspect", str(smoke_run), "--synthetic", "--out", str(tmp_path / "out")]) == 0
    captured = capsys.readouterr()
    assert captured.out.splitlines()[1].split()[:2] == ["1", "5"] and len(captured.out.splitlines()) == 2
    assert captured.err.count("\n") == 1 and "no figure: dfcil inspect --synthetic needs matplotlib" in captured.err
    assert not (tmp_path / "out").exists()


def test_the_statistics_refuse_non_finite_input():
    """Statistics of NaNs read as numbers ('teacher confidence nan ... 100 % nearest their own'): refused."""
    nan = torch.tensor([[0.0, float("nan")], [1.0, 2.0]])
    with pytest.raises(ValueError, match="the logits are not all finite"):
        top1_confidence(nan)
    with pytest.raises(ValueError, match="the images are not all finite"):
        pixel_statistics(torch.full((1, 3, 2, 2), float("inf")), [0.5] * 3, [0.2] * 3)
    with pytest.raises(ValueError, match="the synthetic features are not all finite"):
        class_mean_gap(nan, torch.tensor([0, 1]), torch.ones(2, 2), torch.tensor([0, 1]), 2)


# ------------------------------------------------------------------------------------- inspect --features: numbers


def test_the_silhouette_of_four_points_by_hand():
    from dfcil.analysis.separation import real_silhouette

    # classes {0, 1} and {4, 6} on a line; s = (b - a) / max(a, b), a: mean distance to its own class, b: to the other
    # 0: a 1, b (4 + 6)/2 = 5 → 4/5; 1: a 1, b (3 + 5)/2 = 4 → 3/4; 4: a 2, b (4 + 3)/2 → 3/7; 6: a 2, b 11/2 → 7/11
    x = np.array([[0.0], [1.0], [4.0], [6.0]])
    assert real_silhouette(x, np.array([0, 0, 1, 1])) == pytest.approx((4 / 5 + 3 / 4 + 3 / 7 + 7 / 11) / 4)
    assert math.isnan(real_silhouette(x, np.zeros(4)))  # one class: nothing to compare


def _blobs(centres, n, rng, scale=1.0):
    """n points around each centre (rows), and their labels."""
    x = np.concatenate([c + scale * rng.normal(size=(n, len(c))) for c in centres])
    return x, np.repeat(np.arange(len(centres)), n)


def test_well_separated_blobs_have_a_silhouette_near_one_and_overlapping_ones_near_zero():
    from dfcil.analysis.separation import real_silhouette

    rng = np.random.default_rng(0)
    far = np.array([[10.0, 0, 0, 0], [-10.0, 0, 0, 0], [0, 10.0, 0, 0]])
    assert real_silhouette(*_blobs(far, 40, rng, 0.1)) > 0.95
    assert abs(real_silhouette(*_blobs(np.zeros((3, 4)), 40, rng))) < 0.1


def test_the_real_synthetic_knn_is_at_chance_for_one_distribution_and_perfect_for_two_domains():
    from dfcil.analysis.separation import domain_overlap, mean_overlap

    rng = np.random.default_rng(0)
    centres = 4 * np.eye(3, 8)  # three classes in 8-D
    real, y = _blobs(centres, 60, rng)
    same, y_same = _blobs(centres, 60, rng)
    mixed = domain_overlap(real, y, same, y_same)
    assert [c.label for c in mixed] == [0, 1, 2] and all(c.real == c.synthetic == 60 for c in mixed)
    assert mean_overlap(mixed) == pytest.approx(0.5, abs=0.1)
    apart = domain_overlap(real, y, same + 6.0, y_same)  # the synthetic domain shifted away in every dimension
    assert [c.accuracy for c in apart] == [1.0, 1.0, 1.0] and mean_overlap(apart) == 1.0


def test_the_knn_compares_equal_numbers_and_skips_classes_with_too_few():
    from dfcil.analysis.separation import domain_overlap, mean_overlap

    rng = np.random.default_rng(1)
    real, y = _blobs(4 * np.eye(3, 8), 60, rng)
    # class 0: 10 synthetic images, far away; class 1: 4 (fewer than the 5 folds); class 2: none; class 7: no real
    syn = np.concatenate([rng.normal(size=(10, 8)) + 6.0, rng.normal(size=(4, 8)), rng.normal(size=(3, 8))])
    y_syn = np.array([0] * 10 + [1] * 4 + [7] * 3)
    per_class = domain_overlap(real, y, syn, y_syn)
    assert [(c.label, c.real, c.synthetic, c.accuracy) for c in per_class] == [
        (0, 60, 10, 1.0),  # 10 real against 10 synthetic: the 50 other real ones would make guessing "real" win
        (1, 60, 4, None),
        (2, 60, 0, None),
    ]
    assert mean_overlap(per_class) == 1.0 and math.isnan(mean_overlap(per_class[1:]))
    with pytest.raises(ValueError, match="k must be odd"):
        domain_overlap(real, y, syn, y_syn, k=4)
    with pytest.raises(ValueError, match="the synthetic features must be a finite"):
        domain_overlap(real, y, np.full((2, 8), np.nan), np.zeros(2))


def test_the_numbers_are_taken_on_l2_normalised_features():
    """Synthetic features ten times longer than the real ones, in the same directions: a k-NN on the raw features
    tells the domains apart by their length alone; on the normalised ones (the numbers') they are mixed."""
    from dfcil.analysis.separation import domain_overlap, l2_normalise, mean_overlap, separation_numbers

    assert l2_normalise(np.array([[3.0, 4.0], [0.0, 0.0]])).tolist() == [[0.6, 0.8], [0.0, 0.0]]
    rng = np.random.default_rng(2)
    centres = 5 * np.eye(3, 8)
    real, y = _blobs(centres, 50, rng)
    syn, y_syn = _blobs(centres, 50, rng)
    assert mean_overlap(domain_overlap(real, y, 10 * syn, y_syn)) > 0.95
    numbers = separation_numbers(real, y, 10 * syn, y_syn)
    assert numbers["overlap"] == pytest.approx(0.5, abs=0.12) and numbers["overlap_classes"] == 3
    assert numbers["silhouette"] == pytest.approx(separation_numbers(7 * real, y, syn, y_syn)["silhouette"])
    assert len(numbers["per_class"]) == 3 and numbers["per_class"][0]["synthetic"] == 50


# ------------------------------------------------------------------------- inspect --features: pictures, two runs


def test_the_joint_embedding_is_one_panel_and_the_independent_one_two():
    from dfcil.analysis.features import EMBEDDINGS, embed

    rng = np.random.default_rng(0)
    real, syn = rng.normal(size=(12, 6)), rng.normal(size=(8, 6)) + 3
    y_real, y_syn = np.arange(12) % 3, np.arange(8) % 2
    (joint,) = embed(EMBEDDINGS.get("joint"), real, y_real, syn, y_syn, seed=0)
    assert joint.points.shape == (20, 2) and joint.synthetic.sum() == 8
    assert joint.labels.tolist() == [*y_real, *y_syn]
    real_panel, syn_panel = embed(EMBEDDINGS.get("independent"), real, y_real, syn, y_syn, seed=0)
    assert real_panel.points.shape == (12, 2) and not real_panel.synthetic.any()
    assert syn_panel.points.shape == (8, 2) and syn_panel.synthetic.all() and syn_panel.labels.tolist() == [*y_syn]
    assert "own t-SNE" in real_panel.title and "own t-SNE" in syn_panel.title
    with pytest.raises(ConfigError, match="a t-SNE of the synthetic images needs at least 3 of them, got 2"):
        embed(EMBEDDINGS.get("independent"), real, y_real, syn[:2], y_syn[:2], seed=0)


def test_two_runs_pictures_stand_side_by_side_with_their_numbers_under_them():
    from dfcil.analysis.features import Panel, Picture, plot_pictures

    rng = np.random.default_rng(0)
    panel = Panel(rng.normal(size=(6, 2)), np.array([0, 1, 2, 0, 1, 2]), np.arange(6) >= 3, "real images")
    pictures = [Picture("abd: A", [panel, panel], "silhouette 0.1"), Picture("rdfcil: B", [panel, panel], "s 0.2")]
    fig = plot_pictures(pictures, ["a", "b", "c"], "title")
    assert [sf._suptitle.get_text() for sf in fig.subfigs] == ["abd: A", "rdfcil: B"]
    assert [sf._supxlabel.get_text() for sf in fig.subfigs] == ["silhouette 0.1", "s 0.2"]
    assert len(fig.axes) == 4 and [ax.get_legend() is not None for ax in fig.axes] == [False] * 3 + [True]
    assert [ax.get_title() for ax in fig.subfigs[1].axes] == ["real images"] * 2


def test_runs_of_different_protocols_are_told_apart_field_by_field():
    from dfcil.analysis.features import protocol_mismatch

    a = {"dataset": "cifar100", "class_order": list(range(10)), "task_sizes": [5, 5],
         "inputs": {"image_size": 32, "mean": [0.5] * 3, "std": [0.25] * 3}}  # fmt: skip
    assert protocol_mismatch(a, dict(a)) is None
    assert protocol_mismatch(a, a | {"dataset": "tiny_imagenet200"}) == "dataset: cifar100 against tiny_imagenet200"
    text = protocol_mismatch(a, a | {"class_order": list(range(10))[::-1]})
    assert text.startswith("classes (the raw class of each output): [0, 1, 2, 3, 4, 5, 6, 7]... against")
    assert text.endswith("[9, 8, 7, 6, 5, 4, 3, 2]...")
    assert protocol_mismatch(a, a | {"task_sizes": [4, 6]}).startswith("tasks (classes per task): [5, 5] against")
    assert protocol_mismatch(a, a | {"inputs": {**a["inputs"], "image_size": 64}}).startswith("inputs (image size")


def _copy(run, to):
    shutil.copytree(run, to, ignore=shutil.ignore_patterns("tensorboard", "inspect"))
    return to


def test_inspect_features_of_two_runs_draws_both_on_the_same_real_images(smoke_run, tmp_path, capsys, monkeypatch):
    """Two runs through the command, each run's network replaced by hand-made features (the networks' part is the
    slow test below): both get the same real images, a row of the table and an entry of the JSON file each."""
    import dfcil.analysis.features as features

    seen = []

    def fake(run, x_real, y_real, device, options):
        seen.append((run.dir, x_real, y_real))
        rng = np.random.default_rng(len(seen))
        real = rng.normal(size=(len(y_real), 4)) + 3 * np.eye(10, 4)[y_real.numpy() % 4] * len(seen)
        syn = features.Synthetic(torch.zeros(12, 3, 2, 2), torch.arange(12) % 3, f"source {len(seen)}", "teacher")
        fake_syn = rng.normal(size=(12, 4))
        numbers = separation_numbers(real, y_real.numpy(), fake_syn, syn.y.numpy())
        panels = features.embed(features.EMBEDDINGS.get(options.embedding), real, y_real.numpy(), fake_syn,
                                syn.y.numpy(), 0)  # fmt: skip
        return features.RunFeatures(run, syn, numbers, panels)

    monkeypatch.setattr(features, "run_features", fake)
    other = _copy(smoke_run, tmp_path / "B")
    assert main(["inspect", str(smoke_run), str(other), "--out", str(tmp_path), "--per-class", "5"]) == 0
    assert seen[0][0] == smoke_run and seen[1][0] == other
    assert torch.equal(seen[0][1], seen[1][1]) and torch.equal(seen[0][2], seen[1][2]) and len(seen[0][2]) == 50
    lines = capsys.readouterr().out.splitlines()
    assert lines[-3:] == [str(tmp_path / f"features_tsne_vs_B.{ext}") for ext in ("png", "pdf", "json")]
    assert [row.split()[:2] for row in lines[1:3]] == [[str(smoke_run), "rdfcil"], [str(other), "rdfcil"]]
    runs = json.loads((tmp_path / "features_tsne_vs_B.json").read_text())["runs"]
    assert [r["synthetic_source"] for r in runs] == ["source 1", "source 2"]
    assert runs[1]["silhouette"] > runs[0]["silhouette"]  # its classes drawn further apart
    assert [c["synthetic"] for c in runs[0]["per_class"]] == [4, 4, 4] + [0] * 7 and runs[0]["overlap_classes"] == 0
    assert runs[0]["overlap"] is None and runs[0]["per_class"][0]["class"] == "class 7, task 0"


@pytest.mark.slow
def test_inspect_features_of_two_runs_prints_and_writes_their_numbers(smoke_run, tmp_path, capsys):
    """The shared smoke run against a copy of itself, independently embedded: two pictures of two panels, the same
    numbers for both, in the table and the JSON file beside the figure. (9 s on a busy 2-core CPU.)"""
    other = _copy(smoke_run, tmp_path / "B")
    out = tmp_path / "out"
    args = ["inspect", str(smoke_run), str(other), "--embedding", "independent", "--out", str(out), "--per-class", "6",
            "--synthetic-images", "24"]  # fmt: skip
    assert main(args) == 0
    lines = capsys.readouterr().out.splitlines()
    stem = out / "features_tsne_independent_vs_B"
    assert lines[-3:] == [f"{stem}.png", f"{stem}.pdf", f"{stem}.json"]
    header, *rows = lines[:-3]
    assert header.split() == ["run", "method", "silhouette", "real/syn", "k-NN", "classes", "tested"]
    assert [row.split()[:2] for row in rows] == [[str(smoke_run), "rdfcil"], [str(other), "rdfcil"]]
    assert rows[0].split()[2:] == rows[1].split()[2:]  # the same model, images and folds
    record = json.loads((stem.with_suffix(".json")).read_text())
    settings = record["settings"]
    assert settings | {"knn_k": 5, "cv_folds": 5, "embedding": "independent", "per_class": 6} == settings
    first, second = record["runs"]
    assert first["run"] == str(smoke_run) and first["synthetic_images"] == 24 and first["silhouette"] <= 1
    assert {k: v for k, v in first.items() if k != "run"} == {k: v for k, v in second.items() if k != "run"}
    assert [c["label"] for c in first["per_class"]] == list(range(10)) and first["per_class"][0]["real"] == 6
    assert sum(c["synthetic"] for c in first["per_class"]) == 24 and first["per_class"][9]["accuracy"] is None
    tested = [c["accuracy"] for c in first["per_class"] if c["accuracy"] is not None]
    assert first["overlap_classes"] == len(tested) and all(0 <= a <= 1 for a in tested)
    assert stem.with_suffix(".png").stat().st_size > 10_000


def test_inspect_features_refuses_two_runs_of_different_protocols(smoke_run, tmp_path, capsys):
    from dfcil.checkpoint import dumps, loads

    other = _copy(smoke_run, tmp_path / "B")
    model = loads((other / "model.pt").read_bytes())
    (other / "model.pt").write_bytes(dumps(model | {"task_sizes": [4, 6]}))  # as if trained on another split
    assert main(["inspect", str(smoke_run), str(other), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{smoke_run} and {other} cannot be compared: their tasks" in err
    assert "[5, 5] against [4, 6]" in err and "compare two runs of one protocol" in err
    assert not (tmp_path / "out").exists()


def test_inspect_refuses_a_second_run_for_synthetic_and_an_unknown_embedding(smoke_run, capsys):
    assert main(["inspect", str(smoke_run), str(smoke_run), "--synthetic"]) == 2
    assert "--synthetic reads one run, got two" in capsys.readouterr().err
    assert main(["inspect", str(smoke_run), "--embedding", "jiont"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "jiont" in err and "joint" in err
    assert main(["inspect", str(smoke_run), "--synthetic-images", "0"]) == 2
    assert "--synthetic-images must be at least 1, got 0" in capsys.readouterr().err


def test_the_numbers_under_a_picture_are_short_lines_that_two_side_by_side_pictures_do_not_run_into():
    from dfcil.analysis.features import format_numbers

    numbers = {"silhouette": -0.026, "overlap": 0.8125, "overlap_classes": 14, "per_class": [{}] * 20}
    text = format_numbers(numbers)
    assert text.splitlines() == [
        "silhouette of the real classes: -0.026 (1: tight, apart; 0: touching)",
        "real vs synthetic 5-NN accuracy: 0.812 (0.5: mixed; 1: apart),",
        "mean of 14 classes (6 with too few images to test)",
    ]
    assert max(map(len, text.splitlines())) <= 72  # the caption of a joint panel, about 6 inches at 9 pt


def test_inspect_synthetic_replaces_its_figures_whole_and_never_writes_through_a_hard_link(smoke_run, tmp_path):
    # an output folder copied with `cp -al` shares its old figures with the original: they are replaced, not rewritten
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere.png"
    out.mkdir()
    elsewhere.write_bytes(b"the original's figure")
    os.link(elsewhere, out / "synthetic_diagnostics.png")
    assert main(["inspect", str(smoke_run), "--synthetic", "--out", str(out)]) == 0
    assert elsewhere.read_bytes() == b"the original's figure"
    assert (out / "synthetic_diagnostics.png").read_bytes().startswith(b"\x89PNG")
