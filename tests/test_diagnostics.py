"""Inversion diagnostics: the statistics on hand-made tensors, their record in a run, and dfcil inspect --synthetic."""

import json
import math

import pytest
import torch

from conftest import CONFIGS
from dfcil.analysis import inversions
from dfcil.cli import main
from dfcil.errors import MissingExtraError
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
