"""dfcil report: run directories written by hand (hand-checkable means and stds), the paper comparison, the three
formats, --by, the CLI; and every plot from a real smoke run."""

import csv
import dataclasses
import io
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
import yaml

from conftest import CONFIGS, REPO
from dfcil.analysis.report import Stat, records, report
from dfcil.analysis.run_dirs import find_runs, group_runs, setting_of
from dfcil.cli import main
from dfcil.errors import ReportError
from dfcil.metrics import AccuracyMatrix

# Ten values, then ten aliases of the one before, nine times: 10^9 values once expanded ("billion laughs").
BOMB = (
    "method:\n  name: rdfcil\ndata:\n  class_order: [&l0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]"
    + "".join(f", &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]" for i in range(1, 10))
    + "]\n"
)


def write_run(root: Path, name: str, data: dict, method: dict, seed: int = 1, summary: dict | None = None) -> Path:
    """A run directory: config.yaml (the sections the report reads), summary.json unless None (unfinished)."""
    path = root / name
    path.mkdir(parents=True)
    config = {"method": method, "data": {"root": "/data", "base_classes": 0} | data, "seed": seed}
    config |= {"train": {"epochs": 200}, "device": "cpu"}
    (path / "config.yaml").write_text(yaml.safe_dump(config))
    if summary is not None:
        (path / "summary.json").write_text(json.dumps(summary))
    return path


def summary(last, avg, forgetting=10.0, old=30.0, new=80.0):
    return {"last_acc": last, "avg_inc_acc": avg, "forgetting": forgetting, "old_acc": [None, 50.0, old],
            "new_acc": [90.0, 85.0, new], "acc_per_task": [90.0, avg, last], "task_sizes": [10, 10, 10]}  # fmt: skip


RDFCIL = {"name": "rdfcil", "lambda_hkd": 0.15, "new_kd": "rkd", "old_kd": "hkd", "chr_epochs": 40}
C100_N10 = {"name": "cifar100", "num_tasks": 10}


@pytest.fixture
def runs_root(tmp_path):
    """A sweep-like tree: R-DFCIL on CIFAR-100 N = 10 over orders 0-2 (+ one unfinished), ABD over two orders,
    R-DFCIL with another lambda_hkd, the no-RKD ablation, a reduced protocol, ImageNet-100 and 50 base classes."""
    root = tmp_path / "sweep"
    (root / "sweep.json").parent.mkdir(parents=True)
    (root / "sweep.json").write_text("{}")
    (root / "config.yaml").write_text(yaml.safe_dump({"method": RDFCIL}))  # a sweep's base config: not a run
    for order, (last, avg, fgt) in enumerate([(40.0, 58.0, 10.0), (42.0, 59.0, 20.0), (44.0, 60.0, 30.0)]):
        data = C100_N10 | {"class_order_seed": order}
        write_run(root, f"rdfcil/o{order}", data, RDFCIL, summary=summary(last, avg, fgt, old=30 + order, new=80))
    write_run(root, "rdfcil/o3", C100_N10 | {"class_order_seed": 3}, RDFCIL)  # unfinished
    for seed, last in ((1, 30.0), (2, 35.0)):  # differ in training seed only
        write_run(root, f"abd/s{seed}", C100_N10, {"name": "abd", "mu": 0.1}, seed=seed, summary=summary(last, 50.0))
    write_run(root, "hkd5/o0", C100_N10, RDFCIL | {"lambda_hkd": 5.0}, summary=summary(10.0, 30.0))
    write_run(root, "ablation/o0", C100_N10 | {"num_tasks": 20}, RDFCIL | {"new_kd": "none"}, summary=summary(22, 41))
    mini = C100_N10 | {"num_tasks": 4, "num_classes": 20, "train_per_class": 250}
    write_run(root, "mini/o0", mini, RDFCIL, summary=summary(30.0, 45.0))
    inet = {
        "name": "imagenet100",
        "num_tasks": 5,
        "class_order": [68, 56, 78, *(c for c in range(100) if c not in (68, 56, 78))],
    }
    write_run(root, "inet/o0", inet, RDFCIL, summary=summary(52.10, 68.0))
    write_run(root, "b50/o0", C100_N10 | {"num_tasks": 11, "base_classes": 50}, RDFCIL, summary=summary(50.0, 60.0))
    (root / "empty" / "checkpoints").mkdir(parents=True)  # no config.yaml: not a run
    return root


def by_label(groups):
    return {g.label: g for g in groups}


def test_runs_are_found_below_any_folder_and_grouped_by_all_but_order_and_seed(runs_root):
    runs = find_runs([runs_root])
    assert len(runs) == 11 and sum(r.summary is None for r in runs) == 1
    assert {r.name for r in runs} >= {"sweep/rdfcil/o0", "sweep/rdfcil/o3", "sweep/inet/o0"}
    groups = by_label(group_runs(runs))
    assert list(groups) == [
        "abd · cifar100 · n10",
        "rdfcil · cifar100 · n10 · method.lambda_hkd=0.15",
        "rdfcil · cifar100 · n10 · method.lambda_hkd=5.0",
        "rdfcil[no_rkd] · cifar100 · n20",
        "rdfcil · cifar100 · b50_n11",
        "rdfcil · cifar100 · n4 (20 classes, 250 train/class)",
        "rdfcil · imagenet100 · n5",
    ]
    g = groups["rdfcil · cifar100 · n10 · method.lambda_hkd=0.15"]
    assert len(g.runs) == 4 and len(g.finished) == 3
    assert Stat.of(g.values("last_acc")) == Stat(42.0, pytest.approx((8 / 3) ** 0.5), 3)  # population std
    assert Stat.of(g.values("forgetting")).std == pytest.approx((200 / 3) ** 0.5)
    assert Stat.of(g.values("old_acc")).mean == 31.0 and Stat.of(g.values("new_acc")) == Stat(80.0, 0.0, 3)
    assert Stat.of(groups["abd · cifar100 · n10"].values("last_acc")) == Stat(32.5, 2.5, 2)
    assert Stat.of([7.0]) == Stat(7.0, None, 1) and Stat.of([]) == Stat(None, None, 0)


def test_a_run_dir_given_directly_is_one_run(runs_root):
    runs = find_runs([runs_root / "abd" / "s1", runs_root / "abd"])  # overlapping paths: each run once
    assert sorted(r.name for r in runs) == ["abd/s2", "s1"]


def test_settings_map_runs_to_paper_keys():
    s = setting_of({"method": RDFCIL | {"old_kd": "none"}, "data": C100_N10 | {"num_tasks": 20}})
    assert (s.dataset, s.protocol, s.method, s.variant, s.reduced) == ("cifar100", "n20", "rdfcil", "no_hkd", "")
    assert s.paper_row().last_acc.text == "5.37 ± 0.35"
    faithful = setting_of({"method": {"name": "abd", "inversion": {"persistent": True}}, "data": C100_N10})
    assert faithful.paper_row().label == "ABD*"
    tiny = setting_of({"method": RDFCIL, "data": {"name": "tiny_imagenet200", "num_tasks": 4, "image_size": 32}})
    assert tiny.reduced == "32 px" and tiny.paper_row() is None
    full = {"name": "cifar100", "num_tasks": 5, "num_classes": 100, "image_size": 32}  # the full protocol, spelt out
    assert setting_of({"method": RDFCIL, "data": full}).paper_row().last_acc.mean == 50.47


def test_paper_values_differences_and_within_one_std(runs_root):
    recs = {r["group"]: r for r in records(group_runs(find_runs([runs_root])))}
    r = recs["rdfcil · cifar100 · n10 · method.lambda_hkd=0.15"]
    assert (r["runs"], r["unfinished"]) == (3, 1)
    assert r["last_acc_paper_mean"] == 42.37 and r["last_acc_paper_std"] == 0.72
    assert r["last_acc_diff"] == pytest.approx(-0.37) and r["last_acc_within_paper_std"] is True
    assert r["avg_inc_acc_diff"] == pytest.approx(-0.41) and r["avg_inc_acc_within_paper_std"] is True
    assert r["paper_row"] == "R-DFCIL (Table 1)"
    a = recs["abd · cifar100 · n10"]
    assert a["last_acc_diff"] == pytest.approx(32.5 - 36.19) and a["last_acc_within_paper_std"] is False
    ablation = recs["rdfcil[no_rkd] · cifar100 · n20"]
    assert ablation["last_acc_diff"] == pytest.approx(0.37) and ablation["paper_row"].endswith("(Table 6)")
    inet = recs["rdfcil · imagenet100 · n5"]  # one paper run: a difference, no verdict
    assert inet["last_acc_diff"] == pytest.approx(-1.0) and inet["last_acc_within_paper_std"] is None
    assert recs["rdfcil · cifar100 · b50_n11"]["last_acc_paper_mean"] == 49.70
    mini = recs["rdfcil · cifar100 · n4 (20 classes, 250 train/class)"]
    assert mini["last_acc_paper_mean"] is None and mini["last_acc_diff"] is None and mini["paper_row"] == ""


def test_markdown_long_table(runs_root):
    text = report(find_runs([runs_root]))
    lines = text.splitlines()
    assert lines[0].startswith("| group | runs | A_N | paper A_N | Δ | Ā_N | paper Ā_N | Δ | forgetting |")
    row = next(line for line in lines if line.startswith("| rdfcil · cifar100 · n10 · method.lambda_hkd=0.15"))
    assert "| 3 (+1 unfinished) | 42.00 ± 1.63 | 42.37 ± 0.72 | −0.37 ✓ | 59.00 ± 0.82 | 59.41 ± 1.76 |" in row
    assert "| 20.00 ± 8.16 | 31.00 ± 0.82 | 80.00 ± 0.00 | R-DFCIL (Table 1) |" in row
    assert "| −3.69 ✗ |" in next(line for line in lines if line.startswith("| abd"))
    assert "| 52.10 | 53.10 | −1.00 |" in next(line for line in lines if "imagenet100" in line)
    assert "population standard deviation" in text and "Unfinished runs (no summary.json): 1" in text
    assert "- sweep/rdfcil/o3" in lines and "never compared with the paper" in text


def test_csv_is_one_numeric_record_per_group(runs_root):
    rows = list(csv.DictReader(io.StringIO(report(find_runs([runs_root]), "csv"))))
    assert len(rows) == 7
    r = next(r for r in rows if r["method"] == "abd")
    assert (r["last_acc_mean"], r["last_acc_std"], r["last_acc_n"], r["runs"]) == ("32.5", "2.5", "2", "2")
    assert float(r["last_acc_diff"]) == pytest.approx(-3.69) and r["last_acc_within_paper_std"] == "False"
    assert r["protocol"] == "n10" and r["avg_inc_acc_paper_mean"] == "56.61"


def test_latex_table(runs_root):
    text = report(find_runs([runs_root]), "latex")
    assert "\\begin{tabular}" in text and "\\toprule" in text and text.count("\\\\\n") == 8
    assert "42.00 $\\pm$ 0.72" not in text and "42.00 $\\pm$ 1.63" in text and "$-$0.37 \\checkmark" in text
    assert "method.lambda\\_hkd=0.15" in text and "$\\bar{A}_N$" in text and "% Unfinished runs" in text


def test_by_rows_and_columns_as_the_papers_tables(runs_root):
    runs = [r for r in find_runs([runs_root]) if r.config["data"]["name"] == "cifar100" and "hkd5" not in r.name]
    text = report(runs, "md", by=("method", "protocol"))
    lines = text.splitlines()
    assert lines[0] == "| A_N: method \\ protocol | n10 | n20 | b50_n11 | n4 (20 classes, 250 train/class) |"
    rdfcil = next(line for line in lines if line.startswith("| rdfcil |"))
    assert "| 42.00 ± 1.63 (3) [paper 42.37 ± 0.72, −0.37 ✓] |" in rdfcil and "| 30.00 (1) |" in rdfcil
    abd = next(line for line in lines if line.startswith("| abd |"))
    assert abd.count("|") == 6 and abd.endswith("|  |  |  |")  # ABD ran N = 10 only
    assert any(line.startswith("| rdfcil[no_rkd] |") for line in lines)
    forgetting = report(runs, "md", by=("protocol", "method"), metric="forgetting")
    assert forgetting.splitlines()[0] == "| forgetting: protocol \\ method | abd | rdfcil | rdfcil[no_rkd] |"
    assert "| n10 | 10.00 ± 0.00 (2) | 20.00 ± 8.16 (3) |  |" in forgetting  # no paper number for forgetting
    both = report(find_runs([runs_root]), "csv", by=("method", "protocol")).splitlines()
    assert both[0].startswith("A_N: method \\ protocol,n10,") and any(
        r.startswith("rdfcil · cifar100 · method") for r in both
    )


@pytest.mark.parametrize("metric", ["last_acc", "avg_inc_acc"])
def test_a_by_table_names_its_metric_in_every_format(runs_root, capsys, metric):
    """The corner cell names the metric (LaTeX, markdown, CSV) and the notes say what it is."""
    title, latex = {"last_acc": ("A_N", "$A_N$"), "avg_inc_acc": ("Ā_N", "$\\bar{A}_N$")}[metric]
    args = ["report", str(runs_root), "--by", "method,protocol", "--metric", metric]
    assert main([*args, "--format", "latex"]) == 0
    text = capsys.readouterr().out
    head = next(line for line in text.splitlines() if line.startswith(latex))
    assert head.startswith(f"{latex}: method / protocol & n10 &")
    assert f"% Cells: {title}, the " in text  # the notes are LaTeX comments, as written
    assert main([*args, "--format", "md"]) == 0
    text = capsys.readouterr().out
    assert text.startswith(f"| {title}: method \\ protocol |") and f"\nCells: {title}, the " in text
    assert main([*args, "--format", "csv"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith(f"{title}: method \\ protocol,") and f"dfcil report: Cells: {title}, the " in err


def own_data_runs(root: Path) -> Path:
    """Three runs on a folder of images (32 pixels, 6 classes) and one on arrays."""
    folder = {"name": "folder", "num_tasks": 2, "image_size": 32, "num_classes": 6}
    for order, last in enumerate((60.0, 62.0)):
        write_run(root, f"folder/o{order}", folder | {"class_order_seed": order}, RDFCIL, summary=summary(last, 70))
    write_run(root, "folder/o2", folder | {"class_order_seed": 2}, RDFCIL)  # unfinished
    write_run(root, "arrays/o0", {"name": "arrays", "num_tasks": 2}, RDFCIL, summary=summary(50.0, 60.0))
    return root


@pytest.mark.parametrize("fmt", ["md", "latex"])
def test_own_data_is_its_own_protocol_with_no_word_of_the_paper(tmp_path, fmt):
    """A dataset the paper never ran gets no pixel or class mark and no paper column or note; a shrunk paper
    dataset beside it brings the paper's columns and the note that explains their empty cells."""
    runs = find_runs([own_data_runs(tmp_path / "own")])
    assert {setting_of(r.config).reduced for r in runs} == {""}
    text = report(runs, fmt)
    assert "px" not in text and "paper" not in text and "Δ" not in text and "reduced" not in text.lower()
    assert "population standard deviation" in text and "Unfinished runs (no summary.json): 1" in text
    assert "folder" in text and "arrays" in text and "n2 (" not in text
    pivot = report(runs, fmt, by=("method", "dataset"))
    assert "paper" not in pivot and "62.00" not in pivot and "61.00" in pivot
    mini = C100_N10 | {"num_tasks": 4, "num_classes": 20, "train_per_class": 250}
    write_run(tmp_path / "own", "mini/o0", mini, RDFCIL, summary=summary(30.0, 45.0))
    both = report(find_runs([tmp_path / "own"]), fmt)
    assert "paper" in both and "never compared with the paper" in both and "20 classes, 250 train/class" in both


def test_the_colour_bar_label_stands_clear_of_the_next_panel(tmp_path):
    """The per-run figure: the heatmap's colour-bar label and the old/new panel's y label, both "accuracy (%)",
    are at least 0.3 inch apart, so they do not read as one label."""
    pytest.importorskip("matplotlib")
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from dfcil.analysis.plots import run_figure
    from dfcil.analysis.run_dirs import Run

    m = AccuracyMatrix(5)
    for i in range(5):
        m.record(i, np.arange(40, 40 + 10 * (i + 1), 10), np.full(i + 1, 100))
    s = m.summary() | {"method": "rdfcil", "dataset": "cifar100", "task_sizes": [10] * 5}
    fig = run_figure(Run(tmp_path, "sweep/rdfcil/o0", {}, s))
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    colour_bar = next(ax for ax in fig.axes if ax.get_label() == "<colorbar>")
    label = colour_bar.yaxis.label.get_window_extent(renderer)
    neighbour = fig.axes[1].yaxis.label.get_window_extent(renderer)
    assert colour_bar.yaxis.label.get_text() == fig.axes[1].yaxis.label.get_text() == "accuracy (%)"
    assert (neighbour.x0 - label.x1) / fig.dpi >= 0.3


def test_cli(runs_root, tmp_path, capsys):
    assert main(["report", str(runs_root), "--by", "method,protocol", "--format", "md"]) == 0
    assert capsys.readouterr().out.startswith("| A_N: method \\ protocol")
    assert main(["report", str(runs_root / "abd"), "--format", "csv"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("group,method,") and "population standard deviation" in err
    assert main(["report", str(tmp_path / "missing")]) == 2 and "does not exist" in capsys.readouterr().err
    (tmp_path / "nothing").mkdir()
    assert main(["report", str(tmp_path / "nothing")]) == 2 and "no run directories" in capsys.readouterr().err
    assert main(["report", str(runs_root), "--by", "method"]) == 2 and "ROWS,COLS" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["report", str(runs_root), "--bogus", "1"])


@pytest.mark.parametrize(
    "bad",
    [[], "finished", {"last_acc": "50"}, {"last_acc": float("nan")}, {"new_acc": []}, {"accuracy_matrix": [[1], 2]}],
    ids=["list", "string", "string-number", "nan", "empty-new-acc", "bad-matrix"],
)
def test_a_summary_of_the_wrong_shape_is_skipped_with_its_name(runs_root, tmp_path, capsys, bad):
    """Valid JSON of the wrong shape: the run is skipped with one line naming it; the others are reported (and,
    for the malformed matrix, plotted: the figures see the runs kept, whichever shape was skipped) as before, with
    no traceback."""
    path = runs_root / "rdfcil" / "o1" / "summary.json"
    good = json.loads(path.read_text())
    path.write_text(json.dumps(bad if not isinstance(bad, dict) else good | bad))
    plots = ["--plots", str(tmp_path / "plots")] if bad == {"accuracy_matrix": [[1], 2]} else []
    assert main(["report", str(runs_root), *plots]) == 0
    captured = capsys.readouterr()
    assert f"dfcil report: skipping {path.parent}: its summary.json is not a dfcil summary" in captured.err
    assert "Traceback" not in captured.err and "rdfcil" in captured.out


def test_a_yaml_bomb_in_a_runs_config_is_refused_at_once(runs_root, capsys):
    import time

    path = runs_root / "rdfcil" / "o1" / "config.yaml"
    path.write_text(BOMB)
    t0 = time.perf_counter()
    assert main(["report", str(runs_root)]) == 0  # skipped, with the other runs reported
    assert time.perf_counter() - t0 < 5
    err = capsys.readouterr().err
    line = next(line for line in err.splitlines() if str(path.parent) in line)
    assert line.startswith(f"dfcil report: skipping {path.parent}: its config.yaml cannot be read")
    assert "aliases" in line and len(line) < 600


def _without_summary_stderr(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("dfcil report: skip")]


def test_a_truncated_summary_skips_its_run_and_says_how_many_were_skipped(runs_root, capsys):
    """`head -c 100 R/summary.json > tree/trunc/summary.json` beside good runs stopped the whole report (exit 2,
    no table): a run still being copied is the common case. It is skipped with a warning, as one of the wrong shape
    is, and the last line counts the skipped runs."""
    path = runs_root / "rdfcil" / "o1" / "summary.json"
    path.write_text(path.read_text()[:100])
    (runs_root / "rdfcil" / "o2" / "summary.json").write_text("")  # empty: not valid JSON either
    assert main(["report", str(runs_root)]) == 0
    captured = capsys.readouterr()
    lines = _without_summary_stderr(captured.err)
    assert lines[0].startswith(f"dfcil report: skipping {path.parent}: its summary.json is not valid JSON (")
    assert "cut short, or still being copied?" in lines[0]
    assert lines[-1] == "dfcil report: skipped 2 of 11 run directories (above)", lines
    assert "| rdfcil · cifar100 · n10 · method.lambda_hkd=0.15 | 1 (+1 unfinished) | 40.00 |" in captured.out


def test_when_every_run_is_skipped_the_error_says_so_and_metric_needs_by(runs_root, capsys):
    """A folder whose only run was skipped ended in "no run directories (folders with a config.yaml)", though there
    was one; --metric without --by was ignored without a word (the long table has no first_acc column)."""
    only = runs_root / "rdfcil" / "o1"
    (only / "summary.json").write_text("{")
    assert main(["report", str(only)]) == 2
    err = capsys.readouterr().err
    assert "skipping" in err and "every run directory found (1) was skipped: the lines above say why" in err
    assert "no run directories" not in err
    assert main(["report", str(runs_root), "--metric", "first_acc"]) == 2
    assert "--metric first_acc picks the metric of a --by table" in capsys.readouterr().err
    assert main(["report", str(runs_root), "--metric", "first_acc", "--by", "method,config"]) == 0


def test_a_summary_or_config_that_is_no_regular_file_is_skipped_without_waiting(runs_root, tmp_path):
    """A FIFO named summary.json hung `dfcil report` forever (the read waits for a writer): anything but a regular
    file is skipped with a warning. A new process, with a timeout, so that a regression fails instead of hanging."""
    import subprocess
    import sys

    if not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs on this platform")
    (runs_root / "rdfcil" / "o1" / "summary.json").unlink()
    os.mkfifo(runs_root / "rdfcil" / "o1" / "summary.json")
    (runs_root / "abd" / "s1" / "config.yaml").unlink()
    os.mkfifo(runs_root / "abd" / "s1" / "config.yaml")
    done = subprocess.run([sys.executable, "-m", "dfcil", "report", str(runs_root)], capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = _without_summary_stderr(done.stderr)
    assert f"skipping {runs_root / 'rdfcil' / 'o1'}: its summary.json cannot be read (" in lines[1], lines
    assert "is a FIFO, not a file" in lines[1] and "config.yaml cannot be read" in lines[0] and "FIFO" in lines[0]
    assert lines[-1] == "dfcil report: skipped 2 of 11 run directories (above)"
    assert "rdfcil · cifar100 · n10" in done.stdout


def test_the_report_never_imports_torch(runs_root):
    code = (
        "import sys; from dfcil.cli import main; import dfcil.analysis.plots, dfcil.analysis.paper; "
        f"assert main(['report', {str(runs_root)!r}]) == 0; assert 'torch' not in sys.modules, 'torch imported'"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr


def test_plots_without_matplotlib_say_how_to_install_it(runs_root, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # import fails as if absent
    assert main(["report", str(runs_root / "abd"), "--plots", str(tmp_path / "plots")]) == 2
    assert "pip install 'dfcil[plot]'" in capsys.readouterr().err and not (tmp_path / "plots").exists()


def test_plots_refuse_a_file_as_folder_and_a_damaged_image_in_one_line(runs_root, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    target = tmp_path / "plots"
    target.write_text("not a folder")
    assert main(["report", str(runs_root / "abd"), "--plots", str(target)]) == 2
    err = capsys.readouterr().err
    assert f"--plots {target} is a file; give a folder" in err and err.count("\n") == 1
    (runs_root / "abd" / "s1" / "synthetic_task1.png").write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    assert main(["report", str(runs_root / "abd"), "--plots", str(tmp_path / "figs")]) == 2
    err = capsys.readouterr().err
    assert "synthetic_task1.png cannot be read as an image" in err and err.count("\n") == 1
    written = [p for p in (tmp_path / "figs").rglob("*") if p.is_file()]
    assert written and all(not p.name.startswith(".") for p in written)  # whole figures only, no temporary files


def test_forgetting_per_task_is_metrics_forgetting_of_each_prefix():
    from dfcil.analysis.plots import forgetting_per_task

    m = AccuracyMatrix(3)
    for i, (correct, count) in enumerate([([80], [100]), ([50, 90], [100, 100]), ([30, 60, 70], [100, 100, 100])]):
        m.record(i, np.array(correct), np.array(count))
    s = m.summary()
    f = forgetting_per_task(s["correct_matrix"], s["count_matrix"])
    assert np.isnan(f[0]) and f[1:].tolist() == pytest.approx([30.0, 40.0])  # 80 − 50; (80 − 30 + 90 − 60) / 2
    assert f[-1] == pytest.approx(s["forgetting"])


def test_stability_points_are_each_groups_last_old_and_new_accuracy_mean_and_std(tmp_path):
    """One point per group: the last entries of old_acc and new_acc, mean and population std over its runs; runs
    of one task (no old classes) and unfinished runs left out; the figure written per dataset and protocol."""
    from dfcil.analysis.plots import plot_stability, stability_points

    for order, (old, new) in enumerate([(30.0, 70.0), (33.0, 74.0), (36.0, 72.0)]):
        write_run(tmp_path, f"rdfcil/o{order}", C100_N10 | {"class_order_seed": order}, RDFCIL,
                  summary=summary(40.0, 50.0, old=old, new=new))  # fmt: skip
    write_run(tmp_path, "hkd1/o0", C100_N10, RDFCIL | {"lambda_hkd": 1.0}, summary=summary(40.0, 50.0, old=50, new=40))
    write_run(tmp_path, "abd/o0", C100_N10, {"name": "abd"}, summary=summary(30.0, 45.0, old=20.0, new=60.0))
    write_run(tmp_path, "abd/o1", C100_N10 | {"class_order_seed": 1}, {"name": "abd"})  # unfinished
    one_task = summary(90.0, 90.0) | {"old_acc": [None], "new_acc": [90.0], "acc_per_task": [90.0]}
    write_run(tmp_path, "joint1/o0", C100_N10 | {"num_tasks": 1}, {"name": "joint"}, summary=one_task)
    groups = group_runs(find_runs([tmp_path]))
    points = stability_points(groups)
    assert list(points) == [("cifar100", "n10")]
    got = {
        (p.method, p.variant): (p.new_mean, p.new_std, p.old_mean, p.old_std, p.n) for p in points[("cifar100", "n10")]
    }
    std_new, std_old = np.sqrt(8 / 3), np.sqrt(6)  # new 70, 74, 72: mean 72; old 30, 33, 36: mean 33
    assert got[("rdfcil", "method.lambda_hkd=0.15")] == pytest.approx((72.0, std_new, 33.0, std_old, 3))
    assert got[("rdfcil", "method.lambda_hkd=1.0")] == (40.0, 0.0, 50.0, 0.0, 1)
    assert got[("abd", "")] == (60.0, 0.0, 20.0, 0.0, 1)
    # R-DFCIL's two groups are a sweep of one key: a curve; with a third group that differs in another key too (an
    # augmentation and a switch), the points are not joined (the curve drew a trade-off never swept)
    assert {p.method: p.joined for p in points[("cifar100", "n10")]} == {"rdfcil": True, "abd": False}
    extra = write_run(tmp_path / "more", "aa/o0", C100_N10 | {"augment": "autoaugment"}, RDFCIL | {"lambda_rkd": 2.0},
                      summary=summary(40.0, 50.0))  # fmt: skip
    more = stability_points(group_runs(find_runs([tmp_path])))
    assert extra.exists() and not any(p.joined for p in more[("cifar100", "n10")] if p.method == "rdfcil")
    # nor where they differ in a condition alone (APR with and without AutoAugment, a review), or in a switch's modes
    cases = [("cf", {}, {"name": "apr"}), ("aa", {"augment": "autoaugment"}, {"name": "apr"}),
             ("off", {}, RDFCIL | {"new_kd": "rkd"}), ("none", {}, RDFCIL | {"new_kd": "none"})]  # fmt: skip
    for name, data, method in cases:
        write_run(tmp_path / "conditions", name, C100_N10 | data, method, summary=summary(40.0, 50.0))
    apart = stability_points(group_runs(find_runs([tmp_path / "conditions"])))[("cifar100", "n10")]
    assert len(apart) == 4 and not any(p.joined for p in apart)
    pytest.importorskip("matplotlib")
    files = plot_stability(groups, tmp_path / "plots")
    assert [f.relative_to(tmp_path / "plots").as_posix() for f in files] == [
        "stability/cifar100_n10.png", "stability/cifar100_n10.pdf"]  # fmt: skip
    assert all(f.stat().st_size > 1000 for f in files)


def test_the_stability_figure_takes_the_reports_std_and_each_methods_colour_from_the_other_figures(
    tmp_path, monkeypatch
):
    """`--std sample` drew the stability figure's error bars with the population std all the same, and its colours
    were matplotlib's cycle by method, not each group's colour in the curves beside it."""
    pytest.importorskip("matplotlib")
    from matplotlib.colors import to_rgb

    from dfcil.analysis import plots

    for order, (old, new) in enumerate([(30.0, 70.0), (33.0, 74.0), (36.0, 72.0)]):
        write_run(tmp_path, f"rdfcil/o{order}", C100_N10 | {"class_order_seed": order}, RDFCIL,
                  summary=summary(40.0, 50.0, old=old, new=new))  # fmt: skip
    write_run(tmp_path, "abd/o0", C100_N10, {"name": "abd"}, summary=summary(30.0, 45.0, old=20.0, new=60.0))
    groups = group_runs(find_runs([tmp_path]))
    got = {p.method: (p.new_std, p.old_std) for p in plots.stability_points(groups, "sample")[("cifar100", "n10")]}
    assert got == {"rdfcil": pytest.approx((2.0, 3.0)), "abd": (0.0, 0.0)}  # sample: √(8/2), √(18/2); one run: 0
    with pytest.raises(plots.PlotError, match="std 'n'"):
        plots.stability_points(groups, "n")
    styles = plots.curve_styles(list(reversed(groups)))  # not the cycle's order: the colours must come from here
    figures = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: figures.append(fig) or [])
    plots.plot_stability(groups, tmp_path / "plots", styles, "sample")
    ax = figures[0].axes[0]
    assert ax.get_legend().get_title().get_text() == "after the last task; mean ± sample std over runs"
    handles, labels = ax.get_legend_handles_labels()
    colours = {label.split(" ")[0]: to_rgb(h.lines[0].get_color()) for h, label in zip(handles, labels, strict=True)}
    assert colours == {g.setting.method_label: to_rgb(styles[(g.setting.method_label, g.config_label)].colour)
                       for g in groups}  # fmt: skip
    assert colours["rdfcil"] != colours["abd"]


def test_long_group_labels_are_wrapped_in_the_figures_without_a_layout_warning(tmp_path):
    """An ablation's labels of several config keys ran across the curves and off the figure, with matplotlib's
    'constrained_layout not applied' on the console (a new-user probe): they are wrapped, and the figure saved."""
    import warnings

    pytest.importorskip("matplotlib")
    from dfcil.analysis.plots import plot_curves, wrapped

    long = {f"switch_{k}": f"value_{k}" for k in range(6)}
    for order in (0, 1):
        data = C100_N10 | {"class_order_seed": order}
        write_run(tmp_path, f"a/o{order}", data, RDFCIL, summary=summary(40.0, 50.0))
        write_run(tmp_path, f"b/o{order}", data, RDFCIL | long, summary=summary(42.0, 50.0))
    groups = group_runs(find_runs([tmp_path]))
    assert max(len(g.config_label) for g in groups) > 100
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning fails the test
        files = plot_curves(groups, tmp_path / "plots")
    assert len(files) == 2 and all(f.stat().st_size > 1000 for f in files)
    text = wrapped("rdfcil · " + max((g.config_label for g in groups), key=len) + " (n=2)")
    assert "\n" in text and max(len(line) for line in text.splitlines()) <= 56


@pytest.mark.slow
def test_every_plot_from_a_real_smoke_run(tmp_path, capsys):
    """The smoke preset, trained for real (seconds), then `dfcil report --plots`: every kind of figure."""
    pytest.importorskip("matplotlib")
    from matplotlib.image import imsave

    run = tmp_path / "runs" / "smoke"
    assert main(["train", "--config", str(CONFIGS / "smoke.yaml"), "--out", str(run), "--no-progress"]) == 0
    imsave(run / "synthetic_task1.png", np.random.default_rng(0).random((64, 96, 3)))  # as the engine saves them
    plots = tmp_path / "plots"
    assert main(["report", str(tmp_path / "runs"), "--plots", str(plots)]) == 0
    assert "| rdfcil · fake · n2 |" in capsys.readouterr().out
    files = sorted(str(p.relative_to(plots)) for p in plots.rglob("*") if p.is_file())
    kinds = ["curves/fake_n2", "first/fake_n2", "runs/runs__smoke", "stability/fake_n2", "synthetic/runs__smoke"]
    assert files == sorted(f"{k}.{ext}" for k in kinds for ext in ("pdf", "png"))
    assert all((plots / f).stat().st_size > 1000 for f in files)


def test_the_report_says_what_each_method_keeps_between_tasks(tmp_path):
    """From summary.json's ``stores``, else (a run from before it was recorded) from the method's source."""
    write_run(tmp_path, "joint/o0", C100_N10, {"name": "joint"}, summary=summary(60.0, 70.0) | {"stores": "all data"})
    write_run(tmp_path, "rdfcil/o0", C100_N10, RDFCIL, summary=summary(40.0, 58.0))  # no "stores": an older run
    write_run(tmp_path, "lwf/o0", C100_N10, {"name": "lwf"})  # unfinished: says nothing
    text = report(find_runs([tmp_path]))
    kept = "Kept between tasks besides the model: joint: all data (not data-free); rdfcil: synthesizer per task."
    assert kept in text


def test_the_report_says_how_a_method_scores_where_summary_json_says_it(tmp_path):
    """FeCAM's forgetting compares its cosine head (task 0) with its Mahalanobis classifier (later tasks): a
    negative forgetting has a note under the table, from the run's own summary.json."""
    from dfcil.methods.fecam import FeCAM

    scoring = FeCAM.info.scoring
    write_run(tmp_path, "fecam/o0", C100_N10, {"name": "fecam"}, summary=summary(30.0, 40.0) | {"scoring": scoring})
    write_run(tmp_path, "rdfcil/o0", C100_N10, RDFCIL, summary=summary(40.0, 58.0))
    text = report(find_runs([tmp_path]))
    assert f"How methods score: fecam: {scoring}." in text and "can be negative" in scoring
    assert "How methods score" not in report(find_runs([tmp_path / "rdfcil"]))


def test_a_run_trained_in_its_last_task_only_is_read_for_its_last_task_only(tmp_path):
    """Joint with last_only has an untrained network until its last task: its Ā_N, forgetting and BWT, and its
    curves' points before the last task, are no results; the report leaves them out (–, NaN, blank in the CSV) and
    says why, whether the summary lists its unscored tasks or is older and the config says last_only."""
    from dfcil.analysis.plots import first_task_curve

    joint = {"name": "joint", "last_only": True}
    matrix = [[19.0, None, None], [0.0, 14.0, None], [60.0, 55.0, 70.0]]
    late = summary(61.0, 11.0, forgetting=-40.0, old=57.5, new=70.0) | {"accuracy_matrix": matrix, "bwt": 40.0}
    write_run(tmp_path, "old/o0", C100_N10, joint, summary=late)  # a summary from before unscored_tasks
    write_run(tmp_path, "new/o0", C100_N10 | {"class_order_seed": 1}, joint, summary=late | {"unscored_tasks": [0, 1]})
    write_run(tmp_path, "rdfcil/o0", C100_N10, RDFCIL, summary=summary(40.0, 58.0))
    runs = {r.name.partition("/")[2]: r for r in find_runs([tmp_path])}
    for name in ("old/o0", "new/o0"):
        r = runs[name]
        assert [r.metric(m) for m in ("last_acc", "avg_inc_acc", "forgetting", "bwt", "old_acc")] == [
            61.0, None, None, None, 57.5
        ]  # fmt: skip
        assert r.summary["acc_per_task"] == [None, None, 61.0] and r.summary["new_acc"] == [None, None, 70.0]
        assert first_task_curve(r.summary) == [None, None, 60.0]
    assert runs["rdfcil/o0"].metric("avg_inc_acc") == 58.0  # a run that scores every task is read whole
    from dfcil.analysis.plots import run_figure

    counts = [[100, 100, 100]] * 3
    whole = runs["new/o0"].summary | {"correct_matrix": [[19, 0, 0], [0, 14, 0], [60, 55, 70]], "count_matrix": counts}
    forgetting = run_figure(dataclasses.replace(runs["new/o0"], summary=whole)).axes[2].lines[0].get_ydata()
    assert np.isnan(forgetting).all()  # after task 2 too: it reads rows 0 and 1
    text = report(find_runs([tmp_path]))
    head, joint_line = (next(ln for ln in text.splitlines() if ln.startswith(s)) for s in ("| group", "| joint"))
    row = dict(zip(head.split(" | "), joint_line.split(" | "), strict=True))
    assert (row["runs"], row["A_N"], row["Ā_N"], row["forgetting"]) == ("2", "61.00 ± 0.00", "–", "–"), row
    assert "Not results: joint: untrained after tasks 0 to 1" in text
    assert "Not results" not in report(find_runs([tmp_path / "rdfcil"]))
    rows = list(csv.DictReader(io.StringIO(report(find_runs([tmp_path]), fmt="csv"))))
    joint_row = next(r for r in rows if r["method"] == "joint")
    assert joint_row["last_acc_mean"] == "61.0" and joint_row["avg_inc_acc_mean"] == ""


def other_papers_runs(root: Path) -> Path:
    """EFC and LwF + LDC on CIFAR-100 N = 10 (their papers' checked numbers), EFC on N = 20 (a number recalled
    from its paper, unchecked) and R-DFCIL beside them."""
    write_run(root, "efc/o0", C100_N10, {"name": "efc"}, summary=summary(40.0, 55.0))
    ldc = {"name": "lwf", "lambda_kd": 10.0, "ldc": True}
    write_run(root, "ldc/o0", C100_N10, ldc, summary=summary(44.0, 57.0) | {"stores": "class statistics"})
    write_run(root, "lwf/o0", C100_N10, {"name": "lwf"}, summary=summary(10.0, 30.0) | {"stores": "nothing"})
    write_run(root, "efc20/o0", C100_N10 | {"num_tasks": 20}, {"name": "efc"}, summary=summary(30.0, 45.0))
    write_run(root, "rdfcil/o0", C100_N10, RDFCIL, summary=summary(42.0, 59.0))
    return root


def test_other_papers_numbers_are_marked_as_their_own_protocol(tmp_path):
    """EFC's and LDC's numbers come beside ours with a † and, under the table, their papers' backbone, schedule and
    class order; R-DFCIL's own rows have no mark, and numbers recalled but not checked are never shown."""
    runs = find_runs([other_papers_runs(tmp_path / "runs")])
    recs = {r["group"]: r for r in records(group_runs(runs))}
    efc, ldc, rdfcil = recs["efc · cifar100 · n10"], recs["lwf[ldc] · cifar100 · n10"], recs["rdfcil · cifar100 · n10"]
    assert (efc["paper_row"], efc["last_acc_paper_mean"], efc["avg_inc_acc_paper_mean"]) == (
        "EFC (EFC paper) †",
        43.6,
        None,
    )
    assert efc["last_acc_diff"] == pytest.approx(-3.6) and efc["last_acc_within_paper_std"] is None
    assert (ldc["paper_row"], ldc["last_acc_paper_mean"]) == ("LwF + LDC (LDC paper) †", 45.4)
    assert ldc["paper_protocol"].startswith("LDC paper (Gomez-Villa et al., ECCV 2024, LwF + LDC): ResNet-18")
    assert (rdfcil["paper_row"], rdfcil["paper_protocol"]) == ("R-DFCIL (Table 1)", "")
    assert recs["efc · cifar100 · n20"]["last_acc_paper_mean"] is None  # 32.15 is recalled, not checked
    text = report(runs)
    row = next(line for line in text.splitlines() if line.startswith("| efc · cifar100 · n10"))
    assert "| 40.00 | 43.60 | −3.60 | 55.00 | – |" in row and row.endswith("| EFC (EFC paper) † |")
    note = next(line for line in text.splitlines() if line.startswith("†: another paper's number"))
    efc_protocol = "EFC paper (Magistri et al., ICLR 2024, cold start): ResNet-18 (d = 512), 100 epochs per task"
    assert efc_protocol in note and "PyCIL's class order (seed 1993)" in note  # LDC's
    assert "ABD paper" in note  # LwF*, quoted from ABD's paper, is another protocol too
    assert "32.15" not in text and "58.58" not in text and "59.5" not in text
    kept = "efc: class statistics; lwf: nothing; lwf[ldc]: class statistics; rdfcil: synthesizer per task."
    assert kept in text
    pivot = report(runs, "md", by=("method", "protocol"))
    assert "| efc | 40.00 (1) [paper 43.60†, −3.60] | 30.00 (1) |" in pivot and efc_protocol in pivot
    latex = report(runs, "latex", by=("method", "protocol"))
    assert "[paper 45.40$^\\dagger$, $-$1.40]" in latex and "% †: another paper's number" in latex
    only_rdfcil = report([r for r in runs if r.config["method"]["name"] == "rdfcil"])
    assert "†" not in only_rdfcil


def test_a_run_saved_before_a_key_existed_joins_its_experiment_as_the_keys_default(tmp_path):
    """Runs of one experiment over several dfcil versions: the older config.yaml lacks keys added since (here
    ``plugins`` and ``engine.compile_cache``); absent, a key means its default, so the runs are one group, while a
    key set away from its default still splits."""
    root = tmp_path / "runs"
    old = write_run(root, "o0", C100_N10 | {"class_order_seed": 0}, RDFCIL, summary=summary(40.0, 58.0))
    for order in (1, 2):
        path = write_run(root, f"o{order}", C100_N10 | {"class_order_seed": order}, RDFCIL, summary=summary(42, 59))
        config = yaml.safe_load((path / "config.yaml").read_text())
        config |= {"plugins": [], "engine": {"compile_cache": "auto", "precision": "fp32"}}
        (path / "config.yaml").write_text(yaml.safe_dump(config))
    assert "plugins" not in yaml.safe_load((old / "config.yaml").read_text())
    groups = group_runs(find_runs([root]))
    assert [(g.label, len(g.finished)) for g in groups] == [("rdfcil · cifar100 · n10", 3)]
    path = write_run(root, "bf16", C100_N10, RDFCIL, summary=summary(41.0, 58.0))
    config = yaml.safe_load((path / "config.yaml").read_text()) | {"engine": {"precision": "bf16"}}
    (path / "config.yaml").write_text(yaml.safe_dump(config))
    labels = sorted(g.label for g in group_runs(find_runs([root])))
    assert labels == [
        'rdfcil · cifar100 · n10 · engine.precision="bf16"',
        'rdfcil · cifar100 · n10 · engine.precision="fp32"',
    ]


def test_a_method_key_added_since_a_run_was_saved_reads_as_what_the_run_trained(tmp_path):
    """lwf gained head, ce, ldc and drift after runs were saved: an old lwf run (none of them in its config.yaml)
    groups with a new one that saves the keys at their defaults, not with one that sets them otherwise."""
    root = tmp_path / "runs"
    write_run(root, "old", C100_N10, {"name": "lwf"}, summary=summary(40.0, 58.0))
    new = {"name": "lwf", "head": "linear", "ce": "seen", "ldc": False, "drift": {"kind": "ldc", "passes": 20}}
    write_run(root, "new", C100_N10 | {"class_order_seed": 1}, new, summary=summary(42.0, 59.0))
    write_run(root, "cos", C100_N10, new | {"head": "cosine"}, summary=summary(42.0, 59.0))
    groups = {g.label: len(g.finished) for g in group_runs(find_runs([root]))}
    assert groups == {"lwf · cifar100 · n10": 2, "lwf[cosine] · cifar100 · n10": 1}  # the cosine head: LDC's LwF


def test_an_rdfcil_plus_run_from_before_its_classifier_switches_pairs_with_the_later_ones(tmp_path):
    """rdfcil_plus gained the Bayes and ridge classifiers and the anti-collapse term after runs were saved: an old
    run (none of their keys) is the default group that ``--against rdfcil_plus`` names, beside a ridge run."""
    root = tmp_path / "runs"
    mini = C100_N10 | {"num_tasks": 4, "num_classes": 20}
    new = {"bayes_shrinkage": 3.0, "bayes_normalize": True, "ridge_gamma": 200.0, "ridge_normalize": True}
    new |= {"lambda_ac": 0.0, "ac_beta": 1.0}
    for order in (0, 1):
        data = mini | {"class_order_seed": order}
        write_run(root, f"old{order}", data, {"name": "rdfcil_plus", "classifier": "head"}, summary=summary(40, 58))
        ridge = {"name": "rdfcil_plus", "classifier": "ridge"} | new
        write_run(root, f"ridge{order}", data, ridge, summary=summary(41.0 + order, 59.0))
    labels = sorted(g.label for g in group_runs(find_runs([root])))
    assert labels == [
        'rdfcil_plus · cifar100 · n4 (20 classes) · method.classifier="head"',
        'rdfcil_plus · cifar100 · n4 (20 classes) · method.classifier="ridge"',
    ]


def test_the_method_keys_the_report_fills_in_are_the_methods_defaults():
    import dataclasses

    from dfcil.analysis.run_dirs import METHOD_KEYS_ADDED
    from dfcil.methods import METHODS

    # where a key's default changed after it was added, runs saved before the key read what they trained
    trained = {("rdfcil_plus", "lambda_ac"): 0.0}  # the term on by default since after it was added
    for name, keys in METHOD_KEYS_ADDED.items():
        defaults = dataclasses.asdict(METHODS.get(name).Config())
        want = {k: trained.get((name, k), defaults[k]) for k in keys}
        assert want == keys, name
    for (name, key), value in trained.items():  # an exception only where the default did change
        assert dataclasses.asdict(METHODS.get(name).Config())[key] != value, (name, key)


def paired_root(root: Path) -> Path:
    """R-DFCIL, LwF and fine-tuning on orders 0-2 of one protocol (LwF also on order 3, which R-DFCIL lacks), and
    R-DFCIL alone on another protocol."""
    accuracies = {"rdfcil": (40.0, 42.0, 44.0), "lwf": (41.0, 45.0, 44.0, 50.0), "finetune": (41.0, 40.0, 45.0)}
    for method, accs in accuracies.items():
        for order, last in enumerate(accs):
            data = C100_N10 | {"class_order_seed": order}
            write_run(root, f"{method}/o{order}", data, {"name": method}, summary=summary(last, 60.0 + order, 10.0))
    write_run(root, "n20/o0", C100_N10 | {"num_tasks": 20}, {"name": "lwf"}, summary=summary(30.0, 40.0))
    return root


def test_against_pairs_runs_by_class_order_and_gives_mean_and_std_of_the_differences(tmp_path):
    runs = find_runs([paired_root(tmp_path / "runs")])
    recs = {r["group"]: r for r in records(group_runs(runs), against="rdfcil")}
    lwf, ft = recs["lwf · cifar100 · n10"], recs["finetune · cifar100 · n10"]
    # LwF − R-DFCIL per order: 1, 3, 0 (order 3 has no partner); population std over the three pairs
    assert lwf["last_acc_vs_mean"] == pytest.approx(4 / 3) and lwf["last_acc_vs_n"] == 3
    assert lwf["last_acc_vs_std"] == pytest.approx((14 / 9) ** 0.5) and lwf["last_acc_vs_unpaired"] == 1
    assert lwf["avg_inc_acc_vs_mean"] == pytest.approx(0.0) and lwf["avg_inc_acc_vs_std"] == pytest.approx(0.0)
    assert ft["last_acc_vs_mean"] == pytest.approx(0.0)  # 1, -2, 1
    assert recs["rdfcil · cifar100 · n10"]["vs"] == "" and recs["lwf · cifar100 · n20"]["vs"] == ""
    text = report(runs, against="rdfcil")
    table = text.split("| group | against | pairs |")[1]
    assert "| lwf · cifar100 · n10 | rdfcil | 3 (+1 unpaired) | +1.33 ± 1.25 |" in table  # |1.33| > 1.25: beyond
    assert table.split("| lwf · cifar100 · n10 |")[1].split("\n")[0].endswith("| ✓ |")
    assert table.split("| finetune · cifar100 · n10 |")[1].split("\n")[0].endswith("| ✗ |")
    assert "n20" not in table and "Paired: each run minus the reference run" in text
    assert "last_acc_vs_mean" in report(runs, fmt="csv", against="rdfcil").splitlines()[0]


def test_against_refuses_what_it_cannot_pair(tmp_path, runs_root, capsys):
    runs = find_runs([paired_root(tmp_path / "runs")])
    with pytest.raises(ReportError, match=r"names no group: give a method \(finetune, lwf, rdfcil\)"):
        report(runs, against="abd")
    with pytest.raises(ReportError, match="not with --by"):
        report(runs, by=("method", "protocol"), against="rdfcil")
    two = find_runs([runs_root])  # R-DFCIL with lambda_hkd 0.15 and 5.0 on one protocol: which one?
    with pytest.raises(ReportError, match=r"matches 2 groups of one setting.*method.lambda_hkd=5.0"):
        report(two, against="rdfcil")
    label = "rdfcil · cifar100 · n10 · method.lambda_hkd=0.15"
    one = report(two, against=label).split("| rdfcil · cifar100 · n10 · method.lambda_hkd=5.0 | rdfcil · method.")[1]
    line = one.split("\n")[0]
    assert line.startswith("lambda_hkd=0.15 | 1 |") and line.endswith("|  |")  # one pair: no spread, no mark
    assert main(["report", str(tmp_path / "runs"), "--against", "rdfcil"]) == 0
    assert "| lwf · cifar100 · n10 | rdfcil |" in capsys.readouterr().out


def test_against_a_method_of_several_groups_takes_the_one_at_its_defaults(tmp_path):
    """An ablation: R-DFCIL as it comes and with another lambda_hkd, on one protocol. ``--against rdfcil`` takes the
    group whose runs changed none of the keys that tell the groups apart (``method_changed`` in summary.json); where
    no group, or more than one, is at the defaults, it asks for a label as before."""
    root = tmp_path / "runs"
    for order, (ref, hkd) in enumerate([(40.0, 41.0), (42.0, 45.0), (44.0, 44.0)]):
        data = C100_N10 | {"class_order_seed": order}
        for name, method, last, changed in (("ref", RDFCIL, ref, []), ("hkd", RDFCIL | {"lambda_hkd": 5.0}, hkd,
                                                                         ["lambda_hkd"])):  # fmt: skip
            write_run(root, f"{name}/o{order}", data, method, summary=summary(last, 60.0) | {"method_changed": changed})
    recs = {r["group"]: r for r in records(group_runs(find_runs([root])), against="rdfcil")}
    hkd = recs["rdfcil · cifar100 · n10 · method.lambda_hkd=5.0"]
    assert hkd["vs"] == "rdfcil · cifar100 · n10 · method defaults"
    assert hkd["last_acc_vs_mean"] == pytest.approx(4 / 3)  # 1, 3, 0

    again = tmp_path / "again"  # both groups changed lambda_hkd: neither is the method as it comes
    for name, value in (("a", 5.0), ("b", 7.0)):
        write_run(again, f"{name}/o0", C100_N10, RDFCIL | {"lambda_hkd": value},
                  summary=summary(40.0, 60.0) | {"method_changed": ["lambda_hkd"]})  # fmt: skip
    with pytest.raises(ReportError, match=r"matches 2 groups.*none of them alone at the method's defaults"):
        records(group_runs(find_runs([again])), against="rdfcil")
    assert records(group_runs(find_runs([again])), against="rdfcil · cifar100 · n10 · method.lambda_hkd=5.0")


def test_a_switchs_group_is_labelled_by_the_keys_it_changed_not_by_every_key_another_changed(tmp_path):
    """An ablation of two switches beside the method as it comes, with AutoAugment for one of them: each group's
    label names the keys outside the method that differ and the method keys its runs changed (method_changed),
    not the keys only another group changed; a group of runs that do not say what they changed keeps every key."""
    root = tmp_path / "runs"
    head, bayes, pseudo = (
        {"classifier": "head", "pseudo_replay": "off"},
        {"classifier": "bayes"},
        {"pseudo_replay": "extra"},
    )
    groups = [
        ("default", head, [], "cropflip"),
        ("aa", head, [], "autoaugment"),
        ("bayes", head | bayes, ["classifier"], "cropflip"),
        ("pseudo", head | pseudo, ["pseudo_replay"], "cropflip"),
    ]
    for name, method, changed, augment in groups:
        config = C100_N10 | {"augment": augment}
        write_run(root, name, config, RDFCIL | method, summary=summary(40.0, 60.0) | {"method_changed": changed})
    labels = sorted(g.config_label for g in group_runs(find_runs([root])))
    assert labels == [
        'data.augment="autoaugment"',
        'data.augment="cropflip"',
        'data.augment="cropflip", method.classifier="bayes"',
        'data.augment="cropflip", method.pseudo_replay="extra"',
    ]
    assert records(group_runs(find_runs([root])), against='rdfcil · cifar100 · n10 · data.augment="cropflip"')
    # a run saved before summary.json said what it changed: its group names every key in which the groups differ
    ncm = RDFCIL | {"classifier": "ncm", "pseudo_replay": "off"}
    write_run(root, "legacy", C100_N10 | {"augment": "cropflip"}, ncm, summary=summary(40.0, 60.0))
    labels = {g.runs[0].name: g.config_label for g in group_runs(find_runs([root]))}
    assert labels["runs/legacy"] == 'data.augment="cropflip", method.classifier="ncm", method.pseudo_replay="off"'
    assert labels["runs/bayes"] == 'data.augment="cropflip", method.classifier="bayes"'


def test_a_method_key_every_group_moved_is_the_protocols_and_labels_only_the_groups_apart(tmp_path):
    """cifar100-mini sets R-DFCIL+'s inversion to 80 steps, one switch to 0: the 80 is the protocol's, so the
    default's AutoAugment group reads as APR's does (`--by method,config` put them in two columns: the label said
    method.inversion.steps=80), and only the switch that differs says its steps."""
    root = tmp_path / "runs"
    plus = {"name": "rdfcil_plus", "inversion": {"steps": 80}}
    cases = [
        ("plus-aa", "autoaugment", plus, ["inversion"]),
        ("plus-cf", "cropflip", plus, ["inversion"]),
        ("maha", "cropflip", plus | {"classifier": "mahalanobis"}, ["inversion", "classifier"]),
        (
            "only",
            "cropflip",
            plus | {"inversion": {"steps": 0}, "pseudo_replay": "only"},
            ["inversion", "pseudo_replay"],
        ),
        ("apr-aa", "autoaugment", {"name": "apr"}, []),
    ]
    for name, augment, method, changed in cases:
        for order in (0, 1):
            data = C100_N10 | {"augment": augment, "class_order_seed": order}
            done = summary(40.0 + order, 60.0) | {"method_changed": changed}
            write_run(root, f"{name}/o{order}", data, method, summary=done)
    labels = {g.runs[0].name.split("/")[1]: g.config_label for g in group_runs(find_runs([root]))}
    assert labels == {
        "plus-aa": 'data.augment="autoaugment"',
        "plus-cf": 'data.augment="cropflip"',
        "maha": 'data.augment="cropflip", method.classifier="mahalanobis"',
        "only": 'data.augment="cropflip", method.inversion.steps=0, method.pseudo_replay="only"',
        "apr-aa": 'data.augment="autoaugment"',
    }
    # a key that one group kept at the method's default is a switch: every group that moved it says so
    (root / "plus-cf").rename(tmp_path / "away")
    for order in (0, 1):
        data = C100_N10 | {"augment": "cropflip", "class_order_seed": order}
        write_run(
            root, f"plain/o{order}", data, {"name": "rdfcil_plus"}, summary=summary(40.0, 60.0) | {"method_changed": []}
        )
    labels = {g.runs[0].name.split("/")[1]: g.config_label for g in group_runs(find_runs([root]))}
    assert labels["plus-aa"] == 'data.augment="autoaugment", method.inversion.steps=80'
    assert labels["maha"] == 'data.augment="cropflip", method.classifier="mahalanobis", method.inversion.steps=80'


def test_the_default_beside_its_switches_under_one_protocol_is_short_and_found_by_against(tmp_path):
    """The pseudo-replay report of docs/results.md (a review): the default, `extra` and `only`, all at cifar100-mini's
    chr_epochs 3 and (but `only`) 80 inversion steps. The default read every differing key; --against rdfcil_plus
    found no group at the method's defaults, since every group changed the protocol's keys (as the engine writes
    them: dotted)."""
    root = tmp_path / "runs"
    plus = {"name": "rdfcil_plus", "chr_epochs": 3, "inversion": {"steps": 80}}
    protocol = ["chr_epochs", "inversion.steps"]
    cases = [
        ("default", plus, protocol, 46.0),
        ("extra", plus | {"pseudo_replay": "extra", "pseudo": {"per_class": 50}},
         [*protocol, "pseudo.per_class", "pseudo_replay"], 48.0),
        ("only", plus | {"inversion": {"steps": 0}, "pseudo_replay": "only", "pseudo": {"per_class": 50}},
         [*protocol, "pseudo.per_class", "pseudo_replay"], 47.0),
    ]  # fmt: skip
    for name, method, changed, last in cases:
        for order in (0, 1):
            data = C100_N10 | {"class_order_seed": order}
            write_run(
                root, f"{name}/o{order}", data, method, summary=summary(last + order, 60) | {"method_changed": changed}
            )
    groups = group_runs(find_runs([root]))
    labels = {g.runs[0].name.split("/")[1]: g.config_label for g in groups}
    assert labels == {
        "default": "method.inversion.steps=80",
        "extra": 'method.pseudo.per_class=50, method.pseudo_replay="extra"',
        "only": 'method.inversion.steps=0, method.pseudo.per_class=50, method.pseudo_replay="only"',
    }
    recs = {r["config"]: r for r in records(groups, against="rdfcil_plus")}
    assert recs['method.pseudo.per_class=50, method.pseudo_replay="extra"']["last_acc_vs_mean"] == 2.0
    assert (
        recs['method.inversion.steps=0, method.pseudo.per_class=50, method.pseudo_replay="only"']["last_acc_vs_mean"]
        == 1.0
    )


def test_groups_are_labelled_and_compared_at_their_own_augmentation(tmp_path, capsys):
    """APR with and without AutoAugment, R-DFCIL+ with it only, LwF without it and with a recipe of its own (train
    keys): R-DFCIL+'s label says AutoAugment though it is its method's only group (a comparison with APR's crop and
    flip would otherwise read as like for like), the recipes' train keys stay out of the labels, and --against apr
    pairs each group with APR at its own augmentation."""
    root = tmp_path / "runs"
    cases = [("apr", "autoaugment", {}, 30.0), ("apr", "cropflip", {}, 40.0), ("rdfcil_plus", "autoaugment", {}, 35.0),
             ("lwf", "cropflip", {"epochs": 50}, 20.0)]  # fmt: skip
    for order in (0, 1):
        for name, augment, train, last in cases:
            data = C100_N10 | {"augment": augment, "class_order_seed": order}
            done = summary(last + order, 60.0) | {"method_changed": []}
            run = write_run(root, f"{name}-{augment}/o{order}", data, {"name": name}, summary=done)
            if train:
                config = yaml.safe_load((run / "config.yaml").read_text())
                (run / "config.yaml").write_text(yaml.safe_dump(config | {"train": config["train"] | train}))
    groups = group_runs(find_runs([root]))
    labels = {(g.setting.method, g.config_label) for g in groups}
    assert labels == {("apr", 'data.augment="autoaugment"'), ("apr", 'data.augment="cropflip"'),
                      ("rdfcil_plus", 'data.augment="autoaugment"'), ("lwf", 'data.augment="cropflip"')}  # fmt: skip
    recs = {(r["method"], r["config"]): r for r in records(groups, against="apr")}
    plus, lwf = recs[("rdfcil_plus", 'data.augment="autoaugment"')], recs[("lwf", 'data.augment="cropflip"')]
    assert plus["vs_short"] == 'apr · data.augment="autoaugment"' and plus["last_acc_vs_mean"] == 5.0
    assert lwf["vs_short"] == 'apr · data.augment="cropflip"' and lwf["last_acc_vs_mean"] == -20.0
    # R-DFCIL+ as the reference: it was not run with crop and flip, so those groups are compared with none
    recs = {(r["method"], r["config"]): r for r in records(groups, against="rdfcil_plus")}
    assert recs[("apr", 'data.augment="autoaugment"')]["last_acc_vs_mean"] == -5.0
    assert recs[("apr", 'data.augment="cropflip"')]["vs"] == "" and recs[("lwf", 'data.augment="cropflip"')]["vs"] == ""
    # a full label names one reference for every group, across augmentations
    full = 'apr · cifar100 · n10 · data.augment="cropflip"'
    recs = {(r["method"], r["config"]): r for r in records(groups, against=full)}
    assert recs[("rdfcil_plus", 'data.augment="autoaugment"')]["last_acc_vs_mean"] == -5.0
    # two APR groups with crop and flip, neither at the defaults: said, and the other augmentation still compared
    for name, kd in (("apr-cropflip", 7.0), ("apr-other", 3.0)):
        for order in (0, 1):
            data = C100_N10 | {"augment": "cropflip", "class_order_seed": order}
            done = summary(40.0, 60.0) | {"method_changed": ["lambda_kd"]}
            write_run(root / "kd", f"{name}/o{order}", data, {"name": "apr", "lambda_kd": kd}, summary=done)
    for run in (root / "apr-autoaugment").iterdir():
        config = yaml.safe_load((run / "config.yaml").read_text())
        (run / "config.yaml").write_text(yaml.safe_dump(config | {"method": {"name": "apr", "lambda_kd": 10.0}}))
    for kept in ("apr-autoaugment", "rdfcil_plus-autoaugment"):
        (root / kept).rename(root / "kd" / kept)
    root = root / "kd"
    capsys.readouterr()
    recs = {(r["method"], r["config"]): r for r in records(group_runs(find_runs([root])), against="apr")}
    assert "matches 2 groups of one setting" in capsys.readouterr().err
    assert recs[("rdfcil_plus", 'data.augment="autoaugment"')]["last_acc_vs_mean"] == 5.0
    # LwF with crop and flip: compared with none because APR has two groups there, not because APR was never run
    # with crop and flip (the note said so); and where no group is compared at all, the error says why
    shutil.rmtree(root / "rdfcil_plus-autoaugment")
    for order in (0, 1):
        data = C100_N10 | {"augment": "cropflip", "class_order_seed": order}
        write_run(root, f"lwf/o{order}", data, {"name": "lwf"}, summary=summary(30.0, 60.0))
    with pytest.raises(ReportError, match="no group could be compared with one of apr's"):
        records(group_runs(find_runs([root])), against="apr")
    err = capsys.readouterr().err
    assert 'is compared with none: apr has several groups under data.augment="cropflip", none of them' in err
    assert "not under" not in err


def test_conditions_are_not_the_recipes_and_groups_left_uncompared_are_said(tmp_path, capsys):
    """The review of the conditions: a backbone a method's preset sets (AdaGauss's on ImageNet-100) is its recipe,
    not a condition, so it is still compared; a group the reference was not run under is said on stderr, and where
    none is compared the error says why; 'method defaults' only where the runs changed nothing; on own data, every
    folder's conditions label the method's groups."""
    root = tmp_path / "recipes"
    for order in (0, 1):
        data = C100_N10 | {"class_order_seed": order}
        for name, backbone, last in (("rdfcil", "resnet18", 40.0), ("adagauss", "resnet18_b64", 43.0)):
            run = write_run(root, f"{name}/o{order}", data, {"name": name}, summary=summary(last, 60.0))
            config = yaml.safe_load((run / "config.yaml").read_text())
            (run / "config.yaml").write_text(yaml.safe_dump(config | {"model": {"backbone": backbone}}))
    recs = {r["method"]: r for r in records(group_runs(find_runs([root])), against="rdfcil")}
    assert recs["adagauss"]["config"] == "" and recs["adagauss"]["last_acc_vs_mean"] == 3.0

    root = tmp_path / "conditions"
    for order in (0, 1):
        for name, augment in (("rdfcil", "autoaugment"), ("lwf", "cropflip")):
            data = C100_N10 | {"class_order_seed": order, "augment": augment}
            write_run(root, f"{name}/o{order}", data, {"name": name}, summary=summary(40.0, 60.0))
    with pytest.raises(ReportError, match="no group could be compared with one of rdfcil's"):
        records(group_runs(find_runs([root])), against="rdfcil")
    assert "'lwf · cifar100 · n10 · data.augment=\"cropflip\"' is compared with none" in capsys.readouterr().err

    root = tmp_path / "defaults"
    cases = [
        ("a", {"lambda_hkd": 5.0}, ["lambda_hkd"]),
        ("b", {"lambda_hkd": 5.0, "lambda_rkd": 2.0}, ["lambda_hkd", "lambda_rkd"]),
    ]
    for name, method, changed in cases:
        write_run(root, name, C100_N10, RDFCIL | method, summary=summary(40.0, 60.0) | {"method_changed": changed})
    labels = sorted(g.config_label for g in group_runs(find_runs([root])))
    assert "method defaults" not in labels and labels == ["method.lambda_rkd=2.0", "method.lambda_rkd=unset"]

    root = tmp_path / "own"
    folder = {"name": "folder", "num_tasks": 2}
    cases = [
        ("r-a", "rdfcil", "/d/A", "autoaugment"),
        ("r-b", "rdfcil", "/d/B", "autoaugment"),
        ("apr-b", "apr", "/d/B", "cropflip"),
    ]
    for name, method, where, augment in cases:
        write_run(
            root, name, folder | {"root": where, "augment": augment}, {"name": method}, summary=summary(40.0, 60.0)
        )
    labels = {g.runs[0].name: g.config_label for g in group_runs(find_runs([root]))}
    assert 'data.augment="autoaugment"' in labels["own/r-b"] and 'data.augment="cropflip"' in labels["own/apr-b"]


def test_against_pairs_by_training_seed_and_counts_each_metric_own_pairs(tmp_path):
    """Runs of one class order and two training seeds pair seed with seed; a reference run without forgetting
    leaves that metric one pair short, which its cell says; Δ forgetting is run − reference (more is worse)."""
    root = tmp_path / "runs"
    for seed, (ref, run) in {1: ((40.0, 20.0), (43.0, 26.0)), 2: ((50.0, None), (51.0, 30.0))}.items():
        write_run(root, f"rdfcil/s{seed}", C100_N10, {"name": "rdfcil"}, seed, summary(ref[0], 60.0, ref[1]))
        write_run(root, f"lwf/s{seed}", C100_N10, {"name": "lwf"}, seed, summary(run[0], 60.0, run[1]))
    rec = next(r for r in records(group_runs(find_runs([root])), against="rdfcil") if r["method"] == "lwf")
    assert (rec["last_acc_vs_mean"], rec["last_acc_vs_std"], rec["last_acc_vs_n"]) == (2.0, 1.0, 2)  # 3, 1
    assert (rec["forgetting_vs_mean"], rec["forgetting_vs_std"], rec["forgetting_vs_n"]) == (6.0, None, 1)
    line = report(find_runs([root]), against="rdfcil").split("| lwf · cifar100 · n10 | rdfcil |")[1].split("\n")[0]
    assert line == " 2 | +2.00 ± 1.00 | +0.00 ± 0.00 | +6.00 (1 pairs) | ✓ |"
    rows = {r["method"]: r for r in csv.DictReader(io.StringIO(report(find_runs([root]), fmt="csv", against="rdfcil")))}
    lwf = rows["lwf"]
    assert rows["rdfcil"]["vs"] == "" and rows["rdfcil"]["last_acc_vs_mean"] == ""
    assert float(lwf["last_acc_vs_mean"]) == 2.0 and float(lwf["forgetting_vs_mean"]) == 6.0 and lwf["vs"]


def repeated_root(root: Path) -> Path:
    """R-DFCIL and LwF on class orders 0 and 1, and R-DFCIL's order 0 once more with ``engine.compile`` on (a key
    that never splits a group), in ``rdfcil/o0-again``: two candidates for one pair. Its summary.json is cut short
    in ``broken/``."""
    for order in (0, 1):
        data = C100_N10 | {"class_order_seed": order}
        write_run(root, f"rdfcil/o{order}", data, RDFCIL, summary=summary(40 + order, 60))
        write_run(root, f"lwf/o{order}", data, {"name": "lwf"}, summary=summary(45 + 3 * order, 60))
    again = write_run(root, "rdfcil/o0-again", C100_N10, RDFCIL, summary=summary(50.0, 60.0))
    config = yaml.safe_load((again / "config.yaml").read_text()) | {"engine": {"compile": "default"}}
    (again / "config.yaml").write_text(yaml.safe_dump(config))
    return root


def test_against_leaves_out_only_an_ambiguous_class_order_and_seed_with_one_warning(tmp_path, capsys):
    """A run repeated (as runs/smoke and runs/smoke-logs, or runs that differ only in keys that never split a group,
    e.g. engine.compile) gives two candidates for one pair: that class order and seed is left out, with one warning
    naming both runs and --exclude, and the rest is paired as before; never paired with whichever was read last."""
    root = repeated_root(tmp_path / "runs")
    assert len(group_runs(find_runs([root]))) == 2  # the compiled run joins its experiment
    capsys.readouterr()
    lwf = next(r for r in records(group_runs(find_runs([root])), against="rdfcil") if r["method"] == "lwf")
    assert (lwf["last_acc_vs_mean"], lwf["last_acc_vs_n"], lwf["last_acc_vs_unpaired"]) == (7.0, 1, 0)  # 48 − 41
    warnings = capsys.readouterr().err.splitlines()
    assert warnings == [
        "dfcil report: warning: --against: 'rdfcil · cifar100 · n10' has 2 finished runs of class order 0, seed 1 "
        "(runs/rdfcil/o0 and runs/rdfcil/o0-again), so which one to pair is ambiguous: that class order and seed is "
        "left out of its pairs; leave all but one out with --exclude, e.g. --exclude runs/rdfcil/o0-again"
    ]
    assert main(["report", str(root), "--against", "rdfcil"]) == 0  # the report goes on
    out, err = capsys.readouterr()
    assert "| lwf · cifar100 · n10 | rdfcil | 1 | +7.00 |" in out and err.count("warning") == 1
    assert "order seed" not in err
    with pytest.raises(ReportError, match="no other group shares a dataset and protocol"):
        report(find_runs([root / "rdfcil"]), fmt="csv", against="rdfcil")  # CSV refuses as the table does
    # without --against the repeated run is counted (n = 3 over two class orders), and the report says so
    text = report(find_runs([root]))
    assert "| 3 | 43.67 ± 4.50" in text
    assert "Warning: runs of one class order and seed in one group" in text
    assert "rdfcil · cifar100 · n10: runs/rdfcil/o0, runs/rdfcil/o0-again." in text
    assert "Warning" not in report(find_runs([root / "lwf"]))


def test_exclude_leaves_out_matching_run_directories_before_anything_else(tmp_path, capsys):
    """--exclude GLOB (repeatable) matches a run directory's own name, its name from the folder given or its
    absolute path; a run left out is never read (no warning for its damaged files), and a glob that matches nothing
    is said."""
    root = repeated_root(tmp_path / "runs")
    write_run(root, "broken/o0", C100_N10, RDFCIL, summary=summary(1.0, 1.0))
    (root / "broken" / "o0" / "summary.json").write_text('{"last_acc": 4')  # cut short
    names = sorted(r.name for r in find_runs([root], exclude=["o0-again", "runs/broken/*"]))
    assert names == ["runs/lwf/o0", "runs/lwf/o1", "runs/rdfcil/o0", "runs/rdfcil/o1"]
    assert capsys.readouterr().err == ""  # broken/o0 left out unread
    absolute = sorted(r.name for r in find_runs([root], exclude=[f"{root.resolve()}/rdfcil/*", "*/broken/*"]))
    assert absolute == ["runs/lwf/o0", "runs/lwf/o1"]
    capsys.readouterr()
    assert main(["report", str(root), "--against", "rdfcil", "--exclude", "o0-again", "--exclude", "broken"]) == 0
    out, err = capsys.readouterr()
    assert "| lwf · cifar100 · n10 | rdfcil | 2 | +6.00 ± 1.00 |" in out and err == ""  # 5 and 7: both orders paired
    assert main(["report", str(root), "--exclude", "*", "--exclude", "nothing-like-it"]) == 2
    err = capsys.readouterr().err
    assert "--exclude 'nothing-like-it' matches no run directory" in err
    assert "no run directories (folders with a config.yaml) that --exclude '*' nothing-like-it leaves under" in err


def test_an_exclude_glob_that_matches_the_folder_given_is_read_against_the_names_below_it(tmp_path):
    """``dfcil report results/long-cal --exclude 'long-*'`` leaves out the runs named ``long-*``, not the folder given
    itself, whose name the glob matches too, and with it the name and path of every folder below it."""
    root = tmp_path / "long-cal"
    write_run(root, "long-order0", C100_N10, RDFCIL, summary=summary(40.0, 58.0))
    write_run(root, "dpcr-order0", C100_N10, {"name": "dpcr"}, summary=summary(45.0, 60.0))

    def kept(*globs: str) -> list[str]:
        return sorted(r.name for r in find_runs([root], exclude=globs))

    assert kept("long-*") == kept("*long*") == ["long-cal/dpcr-order0"]
    assert kept(f"{tmp_path.resolve()}/*") == ["long-cal/dpcr-order0", "long-cal/long-order0"]  # the folder given
    assert kept("long-cal/dpcr*") == kept(f"{root.resolve()}/dpcr-*") == ["long-cal/long-order0"]  # as before
    assert kept("long-cal") == ["long-cal/dpcr-order0", "long-cal/long-order0"]
    assert "long" not in tmp_path.name and find_runs([tmp_path], exclude=["long-*"]) == []  # a folder below: all of it


def test_bwt_is_a_metric_of_by_and_the_csv_with_its_sign(tmp_path, capsys):
    """summary.json's ``bwt`` (as AccuracyMatrix writes it) is a --metric: negative where forgetting is positive;
    a run from before BWT was saved has none, and a bwt that is no number skips its run."""
    m = AccuracyMatrix(2)
    m.record(0, np.array([80]), np.array([100]))
    m.record(1, np.array([50, 90]), np.array([100, 100]))  # task 0: 80 → 50
    s = m.summary() | {"task_sizes": [10, 10]}
    assert (s["bwt"], s["forgetting"]) == (-30.0, 30.0)
    data = C100_N10 | {"num_tasks": 2}
    write_run(tmp_path / "runs", "o0", data, RDFCIL, summary=s)
    write_run(tmp_path / "runs", "o1", data | {"class_order_seed": 1}, RDFCIL, summary=s | {"bwt": -20.0})
    old = {k: v for k, v in s.items() if k != "bwt"}
    write_run(tmp_path / "runs", "o2", data | {"class_order_seed": 2}, RDFCIL, summary=old)
    assert main(["report", str(tmp_path / "runs"), "--by", "method,protocol", "--metric", "bwt"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("| BWT: method \\ protocol | n2 |\n") and "| rdfcil | -25.00 ± 5.00 (2) |" in out
    assert "Cells: BWT, backward transfer: " in out and "negative is forgetting" in out
    row = next(csv.DictReader(io.StringIO(report(find_runs([tmp_path / "runs"]), "csv"))))
    assert (row["bwt_mean"], row["bwt_n"], row["forgetting_mean"]) == ("-25.0", "2", "30.0")
    write_run(tmp_path / "runs", "bad", data, RDFCIL, summary=s | {"bwt": "-30"})
    capsys.readouterr()
    assert len(find_runs([tmp_path / "runs"])) == 3
    assert "its summary.json is not a dfcil summary (bwt is" in capsys.readouterr().err


def test_first_acc_is_the_first_tasks_classes_after_the_last_task(tmp_path, capsys):
    """--metric first_acc reads the accuracy matrix's bottom-left entry (the first task's classes after the last
    task: what is left of it at the end of a long sequence), in the --by table and the CSV."""
    data = C100_N10 | {"num_tasks": 3}
    for order, after in enumerate((40, 30)):
        m = AccuracyMatrix(3)
        m.record(0, np.array([80]), np.array([100]))
        m.record(1, np.array([60, 90]), np.array([100, 100]))
        m.record(2, np.array([after, 70, 85]), np.array([100, 100, 100]))  # task 0: 80 → 60 → after
        summary = m.summary() | {"task_sizes": [10, 10, 10]}
        write_run(tmp_path / "runs", f"o{order}", data | {"class_order_seed": order}, RDFCIL, summary=summary)
    assert main(["report", str(tmp_path / "runs"), "--by", "method,protocol", "--metric", "first_acc"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("| first task: method \\ protocol | n3 |\n") and "| rdfcil | 35.00 ± 5.00 (2) |" in out
    assert "Cells: the accuracy on the first task's classes after the last task (%)" in out
    row = next(csv.DictReader(io.StringIO(report(find_runs([tmp_path / "runs"]), "csv"))))
    assert (row["first_acc_mean"], row["first_acc_n"]) == ("35.0", "2")


def test_std_sample_or_population_is_said_under_each_table_and_used_for_pairs(tmp_path, capsys):
    """--std sample: n − 1 in the denominator for a group's runs and for --against's pairs; the kind is said on its
    own line right under each table (markdown, LaTeX) or on stderr (CSV); population stays the default."""
    runs = find_runs([paired_root(tmp_path / "runs")])
    recs = {r["group"]: r for r in records(group_runs(runs), against="rdfcil", std="sample")}
    assert recs["rdfcil · cifar100 · n10"]["last_acc_std"] == pytest.approx(2.0)  # 40, 42, 44
    assert recs["lwf · cifar100 · n10"]["last_acc_vs_std"] == pytest.approx((7 / 3) ** 0.5)  # pairs 1, 3, 0
    sample = "± is the sample standard deviation (n − 1 in the denominator) over "
    population = "± is the population standard deviation (n in the denominator) over "
    for std, words in (("sample", sample), ("population", population)):
        lines = report(runs, against="rdfcil", std=std).splitlines()
        under = [i for i, line in enumerate(lines) if line.startswith("± is the")]
        assert [lines[i] for i in under] == [words + "a group's finished runs.", words + "the pairs."]
        assert all(lines[i - 1] == "" and lines[i - 2].startswith("|") for i in under)  # right under a table
    assert "| lwf · cifar100 · n10 | rdfcil | 3 (+1 unpaired) | +1.33 ± 1.53 |" in report(runs, against="rdfcil",
                                                                                          std="sample")  # fmt: skip
    by = report(runs, by=("method", "protocol"), std="sample")
    assert "| 42.00 ± 2.00 (3) [paper 42.37 ± 0.72, −0.37 ✓] |" in by and f"\n\n{sample}a group's" in by
    latex = report(runs, "latex", against="rdfcil", std="sample")
    assert f"\\end{{tabular}}\n% {sample}a group's finished runs.\n" in latex
    assert f"\\end{{tabular}}\n% {sample}the pairs.\n" in latex
    assert main(["report", str(tmp_path / "runs"), "--format", "csv", "--against", "rdfcil", "--std", "sample"]) == 0
    out, err = capsys.readouterr()
    assert f"dfcil report: {sample}a group's finished runs." in err and f"dfcil report: {sample}the pairs." in err
    assert main(["report", str(tmp_path / "runs")]) == 0 and population + "a group's" in capsys.readouterr().out
    with pytest.raises(ReportError, match="std must be population or sample"):
        report(runs, std="unbiased")


def test_own_data_from_two_folders_is_never_averaged_and_pairs_within_its_folder(tmp_path):
    """On own data the folder is the dataset: runs on two folders form two groups (labelled by data.root), and
    --against pairs each with the reference on its own folder."""
    root = tmp_path / "runs"
    own = {"name": "folder", "num_tasks": 2}
    for folder, (ref, run) in {"flowers": (40.0, 45.0), "birds": (20.0, 19.0)}.items():
        for order in (0, 1):
            data = own | {"root": f"/data/{folder}", "class_order_seed": order}
            write_run(root, f"{folder}/rdfcil/o{order}", data, {"name": "rdfcil"}, summary=summary(ref + order, 50.0))
            write_run(root, f"{folder}/lwf/o{order}", data, {"name": "lwf"}, summary=summary(run + 2 * order, 50.0))
    groups = group_runs(find_runs([root]))
    assert sorted((g.label, len(g.finished)) for g in groups) == [
        ('lwf · folder · n2 · data.root="/data/birds"', 2),
        ('lwf · folder · n2 · data.root="/data/flowers"', 2),
        ('rdfcil · folder · n2 · data.root="/data/birds"', 2),
        ('rdfcil · folder · n2 · data.root="/data/flowers"', 2),
    ]
    recs = {r["group"]: r for r in records(groups, against="rdfcil")}
    flowers, birds = (
        recs['lwf · folder · n2 · data.root="/data/flowers"'],
        recs['lwf · folder · n2 · data.root="/data/birds"'],
    )
    assert (flowers["last_acc_vs_mean"], flowers["last_acc_vs_std"]) == (5.5, 0.5)  # 5, 6
    assert (birds["last_acc_vs_mean"], birds["last_acc_vs_std"]) == (-0.5, 0.5)  # -1, 0
    assert flowers["vs"].endswith('"/data/flowers"') and birds["vs"].endswith('"/data/birds"')


def test_timing_gives_each_tasks_seconds_and_extrapolates_an_unfinished_run(tmp_path, capsys):
    """benchmarks/full_time.py folded into dfcil report --timing: measured tasks, then the unfinished ones as the
    mean of the finished tasks after the first, less their compile time."""
    run = write_run(tmp_path, "run", C100_N10 | {"num_tasks": 4}, RDFCIL)
    timing = {"setup_s": 10.0, "phases": {"rrl": {"time_s": 20.0}, "chr": {"time_s": 5.0}}, "eval_s": 1.0}
    first = {"phases": {"base": {"time_s": 30.0}}, "eval_s": 1.0}
    records = [{"type": "task", "task": 0, "acc": 90.0, "timing": first},
               {"type": "task", "task": 1, "acc": 70.0, "timing": timing | {"compile_s": 6.0}},
               {"type": "task", "task": 2, "acc": 60.0, "timing": timing | {"drift_s": 4.0}}]  # fmt: skip
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert main(["report", str(run), "--timing"]) == 0
    out = capsys.readouterr().out
    assert "| 0 | measured | 0.0 | base 30.0 | 0.0 | 1.0 | 0.0 | 31.0 | 90.00 |" in out
    assert "| 1 | measured | 10.0 | rrl 20.0, chr 5.0 | 0.0 | 1.0 | 6.0 | 36.0 | 70.00 |" in out
    # the method's own work at the task's end (APR's ADC, LDC's drift) is a part of the task's time
    assert "| 2 | measured | 10.0 | rrl 20.0, chr 5.0 | drift 4.0 | 1.0 | 0.0 | 40.0 | 60.00 |" in out
    assert "| 3 | estimated (tasks 1..2, less compile) | | | | | | 35.0 | |" in out  # mean of 36 - 6 and 40
    assert "extrapolated total: 142 s (2.4 min) over 4 tasks" in out
    # a sweep's run set up a moment ago has no metrics.jsonl yet: said, and the other runs' tables still printed
    write_run(tmp_path, "new", C100_N10 | {"num_tasks": 4}, RDFCIL)
    assert main(["report", str(tmp_path), "--timing"]) == 0
    out = capsys.readouterr().out
    assert "new: no finished task yet (no metrics.jsonl" in out and "| 1 | measured |" in out
    # only the first task finished: no extrapolation, and the total says it is a floor (it said "extrapolated")
    first_only = write_run(tmp_path, "first", C100_N10 | {"num_tasks": 4}, RDFCIL)
    (first_only / "metrics.jsonl").write_text(json.dumps(records[0]) + "\n")
    assert main(["report", str(first_only), "--timing"]) == 0
    out = capsys.readouterr().out
    assert "no total yet: at least 31 s (0.5 min) over 4 tasks" in out and "extrapolated" not in out


def test_timing_scales_a_growing_end_work_by_the_units_each_task_recorded(tmp_path, capsys):
    """APR's ADC attacks each old class: a task records its end units (5, 10 old classes), and a task not yet done
    gets the seconds per unit times its units, extrapolated (15, 20); it was the flat mean of the finished tasks."""
    run = write_run(tmp_path, "run", C100_N10 | {"num_tasks": 5}, RDFCIL)
    timing = {"setup_s": 10.0, "phases": {"rrl": {"time_s": 20.0}, "chr": {"time_s": 5.0}}, "eval_s": 1.0}
    adc = [{"adc_s": 50.0, "end_units": 5}, {"adc_s": 100.0, "end_units": 10}]
    records = [{"type": "task", "task": 0, "acc": 90.0, "timing": {"phases": {"base": {"time_s": 30.0}}}},
               {"type": "task", "task": 1, "acc": 70.0, "timing": timing | adc[0]},
               {"type": "task", "task": 2, "acc": 60.0, "timing": timing | adc[1]}]  # fmt: skip
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert main(["report", str(run), "--timing"]) == 0
    out = capsys.readouterr().out
    assert "| 2 | measured | 10.0 | rrl 20.0, chr 5.0 | adc 100.0 | 1.0 | 0.0 | 136.0 | 60.00 |" in out
    assert "| 3 | estimated (tasks 1..2, less compile) | | | | | | 186.0 | |" in out  # 36 + 10 s x 15 units
    assert "| 4 | estimated (tasks 1..2, less compile) | | | | | | 236.0 | |" in out  # 36 + 10 s x 20 units
    assert "extrapolated total: 674 s (11.2 min) over 5 tasks" in out  # 30 + 86 + 136 + 186 + 236
    # a part that does not grow (a real APR run: 68.6 and 96.0 s at 5 and 10 old classes): the line through them,
    # 41.2 s + 5.48 s a class, gives 123.4 s at 15 where seconds per class alone gave 175 s (it read 136 s)
    adc[0]["adc_s"], adc[1]["adc_s"] = 68.6, 96.0
    records[1]["timing"], records[2]["timing"] = timing | adc[0], timing | adc[1]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert main(["report", str(run), "--timing"]) == 0
    assert "| 3 | estimated (tasks 1..2, less compile) | | | | | | 159.4 | |" in capsys.readouterr().out  # 36 + 123.4
    # a run resumed across the commit that added end_units: its first task did not record them, so flat, not a
    # rate of seconds per unit that mixes a count of 1 with a count of 10 (it read 601 s)
    del adc[0]["end_units"]
    records[1]["timing"] = timing | adc[0]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert main(["report", str(run), "--timing"]) == 0
    assert "| 3 | estimated (tasks 1..2, less compile) | | | | | | 118.3 | |" in capsys.readouterr().out  # 36 + 82.3


def test_a_folder_of_links_to_runs_is_read_through_them_each_real_run_once(runs_root, tmp_path):
    picked = tmp_path / "picked"
    picked.mkdir()
    (picked / "a").symlink_to(runs_root / "abd" / "s1", target_is_directory=True)
    (picked / "b").symlink_to(runs_root / "abd", target_is_directory=True)  # s1 again, through another link
    (picked / "loop").symlink_to(picked, target_is_directory=True)  # a cycle: walked once
    runs = find_runs([picked])
    assert sorted(r.name for r in runs) == ["picked/a", "picked/b/s2"]
    assert len(find_runs([picked, runs_root / "abd"])) == 2  # the real folders, given too: still each once


# ------------------------------------------------------------------------------------------------ hostile input


@pytest.mark.parametrize(
    ("bad", "problem"),
    [
        ({"last_acc": 1e308}, "last_acc is 1e+308, not an accuracy in [0, 100]"),
        ({"avg_inc_acc": 150.0}, "avg_inc_acc is 150.0, not an accuracy in [0, 100]"),
        ({"acc_per_task": [90.0, 58.0, -0.5]}, "acc_per_task holds -0.5, not an accuracy in [0, 100]"),
        ({"old_acc": [None, 50.0, 100.5]}, "old_acc holds 100.5, not an accuracy in [0, 100]"),
        ({"accuracy_matrix": [[90.0, None], [50.0, 1000.0]]}, "accuracy_matrix holds 1000.0, not an accuracy"),
        ({"forgetting": -101.0}, "forgetting is -101.0, not a difference of accuracies in [-100, 100]"),
    ],
    ids=["huge", "above-100", "negative", "old-above-100", "matrix", "forgetting"],
)
def test_an_accuracy_outside_0_to_100_skips_its_run_naming_the_file_the_key_and_the_fix(runs_root, capsys, bad,
                                                                                        problem):  # fmt: skip
    """A finite accuracy outside [0, 100] was taken as one, and two runs of 1e308 in one group stopped the report
    with an OverflowError in the mean: each such run is skipped with one line naming its summary.json, the key, and
    the fix; the others are reported."""
    for order in (1, 2):  # two in one group: their mean would overflow
        path = runs_root / "rdfcil" / f"o{order}" / "summary.json"
        path.write_text(json.dumps(json.loads(path.read_text()) | bad))
    assert main(["report", str(runs_root)]) == 0
    out, err = capsys.readouterr()
    line = next(line for line in err.splitlines() if str(path.parent) in line)
    assert line.startswith(f"dfcil report: skipping {path.parent}: its summary.json is not a dfcil summary (")
    assert problem in line and "restore the run's own summary.json, or leave it out with --exclude" in line
    assert "| rdfcil · cifar100 · n10 · method.lambda_hkd=0.15 | 1 (+1 unfinished) | 40.00 |" in out


def test_the_mean_and_std_of_a_group_do_not_overflow():
    """fmean sums first: two values of 1e308 overflowed (OverflowError), though their mean is a float."""
    assert Stat.of([1e308, 1e308]) == Stat(1e308, 0.0, 2)
    assert Stat.of([1e308, -1e308]) == Stat(0.0, 1e308, 2)
    assert Stat.of([40.0, 42.0, 44.0]).mean == 42.0 and Stat.of([0.1, 0.2, 0.4]).mean == pytest.approx(0.7 / 3)


def hostile_root(root: Path, names: Sequence[str], method: dict = RDFCIL) -> Path:
    """One finished run per name, each its own class order: folders named as given."""
    for order, name in enumerate(names):
        data = C100_N10 | {"class_order_seed": order}
        s = summary(40.0 + order, 50.0) | {"stores": "nothing"}
        m = AccuracyMatrix(3)
        for i in range(3):
            m.record(i, np.array([80] * (i + 1)), np.array([100] * (i + 1)))
        write_run(root, name, data, method, summary=s | {k: v for k, v in m.summary().items() if "matrix" in k})
    return root


@pytest.mark.filterwarnings("ignore:Glyph .* missing from font")  # 猫 and 犬 drawn as boxes: not this test's
def test_figure_names_never_collide(tmp_path, capsys):
    """Names were made by replacing odd characters with `_`: `x-猫`, `x-犬` and `x-?` (or `a b` and `a_b`, `lr0.1`
    and `lr0.2`, whose suffix was taken for the file's) wrote one file, and the report counted figures that were
    overwritten. Every run now has figures of its own, and the count is what is on disk."""
    pytest.importorskip("matplotlib")
    names = ["x-猫", "x-犬", "x-?", "a b", "a_b", "lr0.1", "lr0.2", "Run", "run"]
    root = hostile_root(tmp_path / "runs", names)
    plots = tmp_path / "plots"
    assert main(["report", str(root), "--plots", str(plots)]) == 0
    files = [p for p in plots.rglob("*") if p.is_file()]
    assert len({p.relative_to(plots).as_posix().casefold() for p in files}) == len(files)  # case-insensitive too
    assert len([p for p in files if p.parent.name == "runs"]) == 2 * len(names)
    assert f"dfcil report: {len(files)} figure files in {plots}" in capsys.readouterr().err
    from dfcil.analysis.plots import figure_stems

    stems = figure_stems([f"runs/{n}" for n in names])
    assert stems[names.index("lr0.1")] == "runs__lr0.1"  # a name with nothing odd reads as before
    assert stems[names.index("a_b")].startswith("runs__a_b@") and stems[names.index("a b")].startswith("runs__a_b@")
    assert figure_stems(["same", "same"])[0] != figure_stems(["same", "same"])[1]  # two runs of one name


def test_names_with_dollar_signs_are_drawn_as_they_are(tmp_path, capsys):
    """`$` in a method name, a config value or a run's folder was read as matplotlib's mathtext: a traceback (or
    maths where a name was meant). Every figure is written, and the name is drawn literally."""
    pytest.importorskip("matplotlib")
    from dfcil.analysis.plots import run_figure

    root = hostile_root(tmp_path / "runs", ["$a", "b$c$d"], method={"name": "lwf$", "lambda_kd": "$\\alpha"})
    hostile_root(tmp_path / "runs", ["e"], method={"name": "lwf$", "lambda_kd": "$x$"})
    assert main(["report", str(root), "--plots", str(tmp_path / "plots")]) == 0
    assert "Traceback" not in capsys.readouterr().err
    fig = run_figure(find_runs([root / "b$c$d"])[0])
    fig.canvas.draw()  # drawn as it is, no mathtext error
    assert fig.texts[0].get_text().startswith("b$c$d: ")


NEWLINE_METHOD = "evil\n\\input{/etc/passwd}"


def test_a_name_never_ends_a_latex_comment_and_terminal_escapes_are_never_printed(tmp_path, capsys):
    """The method name was escaped in LaTeX's table but not in the trailing comments: a newline in it ended the
    comment and `\\input{...}` was live. Terminal escape sequences in names (a run's folder, the method, what its
    summary says it keeps) were printed raw in every format. Now every name is escaped in every line, and control
    characters are shown as Python escapes."""
    root = tmp_path / "runs"
    write_run(root, "o0", C100_N10, {"name": NEWLINE_METHOD},
              summary=summary(40.0, 50.0) | {"stores": "nothing\n\\input{x}", "scoring": "by\r\\input{y}"})  # fmt: skip
    write_run(root, "\x1b[2J\x1b]0;pwned\x07o1", C100_N10 | {"class_order_seed": 1}, {"name": "red\x1b[31m"})
    write_run(root, "o2", C100_N10 | {"class_order_seed": 2}, {"name": "red\x1b[31m"}, summary=summary(30.0, 40.0))
    for fmt in ("latex", "md", "csv"):
        assert main(["report", str(root), "--format", fmt]) == 0
        out, err = capsys.readouterr()
        assert "\x1b" not in out + err and "\x07" not in out + err and "\r" not in out + err, fmt
        assert ("red\\textbackslash{}x1b[31m" if fmt == "latex" else "red\\x1b[31m") in out, fmt
        if fmt == "latex":
            live = [line for line in out.splitlines() if not line.startswith("%")]
            assert not any("input" in line and "\\textbackslash{}input" not in line for line in live), live
            assert all(line.startswith("%") or "&" in line or line.startswith("\\") for line in out.splitlines())
            assert "evil\\textbackslash{}ninput" not in out and "evil\\textbackslash{}n\\textbackslash{}input" in out


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"method": "abd"}, "config.yaml's method.name is 'rdfcil', summary.json's method is 'abd'"),
        ({"dataset": "tiny_imagenet200"}, "data.name is 'cifar100', summary.json's dataset is 'tiny_imagenet200'"),
        ({"class_order": list(range(100))}, "summary.json's class_order is [0, 1, 2, 3, 4, 5, ...]"),
        ({"seed": 7}, "config.yaml's seed is 1, summary.json's seed is 7"),
    ],
    ids=["method", "dataset", "class-order", "seed"],
)
def test_a_run_whose_config_and_summary_disagree_is_skipped_with_both_values(tmp_path, capsys, change, said):
    """A run's config.yaml said one method (or dataset, class order, seed) and its summary.json another (files of
    two runs mixed up when copying): the run was reported under its config's name with the other run's numbers. It
    is skipped with one line naming both files' values and the fix; a summary that agrees, or one from before a key
    was saved, is read as before."""
    from dfcil.analysis.run_dirs import NAMED_AS_REGISTERED
    from dfcil.data.datasets import DATASETS
    from dfcil.data.splits import class_order_from_seed

    assert set(DATASETS.names()) >= NAMED_AS_REGISTERED  # the datasets whose summary's name is compared
    root = tmp_path / "runs"
    agrees = {"method": "rdfcil", "dataset": "cifar100", "seed": 1}
    for order in (0, 1):  # a seeded order, then one given in full
        data = C100_N10 | ({"class_order_seed": 5} if order == 0 else {"class_order": list(range(99, -1, -1))})
        agrees["class_order"] = class_order_from_seed(100, 5) if order == 0 else list(range(99, -1, -1))
        write_run(root, f"o{order}", data, RDFCIL, summary=summary(40.0, 50.0) | agrees)
        write_run(root, f"bad{order}", data, RDFCIL, summary=summary(40.0, 50.0) | agrees | change)
    write_run(root, "old", C100_N10, RDFCIL, summary=summary(40.0, 50.0))  # no method, dataset, order or seed
    assert sorted(r.name for r in find_runs([root])) == ["runs/o0", "runs/o1", "runs/old"]
    err = capsys.readouterr().err
    for order in (0, 1):
        line = next(line for line in err.splitlines() if f"bad{order}:" in line)
        assert line.startswith(f"dfcil report: skipping {root / f'bad{order}'}: its config.yaml and summary.json "
                               "disagree (")  # fmt: skip
        assert said in line and "put back the run's own file, or leave it out with --exclude" in line, line


def _heatmap(tmp_path: Path, rows: Sequence[Sequence[int]]):
    """:func:`run_figure` of a run whose accuracy matrix has lower triangle ``rows`` (percent, 100 images a cell),
    drawn; its heatmap's Axes."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from dfcil.analysis.plots import run_figure
    from dfcil.analysis.run_dirs import Run

    n = len(rows)
    m = AccuracyMatrix(n)
    for i, row in enumerate(rows):
        m.record(i, np.array(row[: i + 1]), np.full(i + 1, 100))
    s = m.summary() | {"method": "rdfcil", "dataset": "cifar100", "task_sizes": [10] * n}
    fig = run_figure(Run(tmp_path, f"sweep/n{n}", {}, s))
    FigureCanvasAgg(fig).draw()
    return fig, fig.axes[0]


def _luminance(colour) -> float:
    from matplotlib.colors import to_rgb

    return float(np.dot(to_rgb(colour), [0.2126, 0.7152, 0.0722]))


def test_the_accuracy_matrix_numbers_contrast_with_their_cells_and_leave_the_upper_triangle_empty(tmp_path):
    """Every number was small white text, unreadable on viridis's light (high-accuracy) cells: each cell's text
    is now dark on a light cell and light on a dark one, large enough on a 5 × 5 matrix, and the empty upper
    triangle (tasks not yet learned) carries none."""
    pytest.importorskip("matplotlib")
    rows = [[95], [5, 95], [50, 70, 95], [30, 60, 80, 95], [5, 30, 50, 70, 95]]
    _, ax = _heatmap(tmp_path, rows)
    texts = {(round(t.get_position()[1]), round(t.get_position()[0])): t for t in ax.texts}
    assert set(texts) == {(i, j) for i in range(5) for j in range(i + 1)}  # (row i, column j), j <= i only
    assert texts[(4, 0)].get_text() == "5" and texts[(4, 4)].get_text() == "95"
    assert _luminance(texts[(4, 0)].get_color()) > 0.8  # a 5 % cell is dark purple: light text
    assert _luminance(texts[(4, 4)].get_color()) < 0.2  # a 95 % cell is yellow: dark text
    assert min(t.get_fontsize() for t in ax.texts) >= 9


@pytest.mark.parametrize("n", [20, 25, 40])
def test_the_accuracy_matrix_numbers_fit_their_cells_or_are_left_out_with_a_word(tmp_path, n):
    """On a 20 × 20 or 25 × 25 matrix (or larger) each number is narrower than its cell, or no number is drawn and
    the heatmap's title says so (the colour bar reads the cells)."""
    pytest.importorskip("matplotlib")
    fig, ax = _heatmap(tmp_path, [[100] * (i + 1) for i in range(n)])
    renderer = fig.canvas.get_renderer()
    cell = ax.get_window_extent(renderer).width / n
    if ax.texts:
        assert max(t.get_window_extent(renderer).width for t in ax.texts) < cell
        assert len(ax.texts) == n * (n + 1) // 2
    else:
        assert "numbers" in ax.get_title()


def test_overlapping_curves_keep_their_own_colour_line_style_and_a_light_edged_band(tmp_path, monkeypatch):
    """Fine-tuning's and LwF's curves lie within a point of each other: their ±std bands (alpha 0.2, no edge)
    merged into one colour. Each method now has its own colour of a qualitative palette (the same in every
    figure), its own line style and marker, and a light band with an edge; the legend shows each."""
    pytest.importorskip("matplotlib")
    from matplotlib.collections import PolyCollection
    from matplotlib.colors import to_rgba

    from dfcil.analysis import plots

    for order, (last, avg) in enumerate([(40.0, 58.0), (42.0, 60.0)]):
        data = C100_N10 | {"class_order_seed": order}
        write_run(tmp_path, f"finetune/o{order}", data, {"name": "finetune"}, summary=summary(last, avg))
        write_run(tmp_path, f"lwf/o{order}", data, {"name": "lwf"}, summary=summary(last + 1, avg + 1))
    write_run(tmp_path, "lwf5/o0", C100_N10 | {"num_tasks": 5}, {"name": "lwf"}, summary=summary(41.0, 59.0))
    figures = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: figures.append((path.name, fig)) or [])
    plots.plot_curves(group_runs(find_runs([tmp_path])), tmp_path / "plots")
    (_, n10), (_, n5) = sorted(figures, key=lambda f: f[0] != "cifar100_n10")
    ax = n10.axes[0]
    lines = {line.get_label(): line for line in ax.get_lines() if not line.get_label().startswith("_")}
    ft, lwf = lines["finetune (n=2)"], lines["lwf (n=2)"]
    assert to_rgba(ft.get_color()) != to_rgba(lwf.get_color())
    assert ft.get_linestyle() != lwf.get_linestyle() and ft.get_marker() != lwf.get_marker()
    bands = [c for c in ax.collections if isinstance(c, PolyCollection)]
    assert len(bands) == 2
    for band in bands:
        assert band.get_facecolor()[0][3] <= 0.15  # light: the other band shows through
        assert band.get_linewidth()[0] > 0 and band.get_edgecolor()[0][3] > band.get_facecolor()[0][3]  # its edge
        assert band.get_hatch()
    assert {tuple(b.get_facecolor()[0][:3]) for b in bands} == {to_rgba(line.get_color())[:3] for line in (ft, lwf)}
    assert bands[0].get_hatch() != bands[1].get_hatch()
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["finetune (n=2)", "lwf (n=2)"]
    lwf5 = next(line for line in n5.axes[0].get_lines() if line.get_label() == "lwf (n=1)")
    assert to_rgba(lwf5.get_color()) == to_rgba(lwf.get_color())  # a method's colour is its own in every figure


def test_an_rdfcil_plus_run_from_before_the_apr_and_cycle_switches_groups_with_one_saving_every_key(tmp_path):
    """A run saved by today's dfcil writes every method key, the APR switches' and the cycle switch's at their
    defaults; one saved before they existed (all of its other keys alike) is the same experiment: one group."""
    import dataclasses

    from dfcil.methods.rdfcil_plus import RDFCILPlusConfig

    root, mini = tmp_path / "runs", C100_N10 | {"num_tasks": 4, "num_classes": 20}
    today = json.loads(json.dumps(dataclasses.asdict(RDFCILPlusConfig())))
    later = ("pseudo_replay", "pseudo", "bayes_offdiag", "bayes_pseudo_inverse", "cycle", "lambda_cycle_kd")
    later += ("lambda_cycle", "cycle_multiplier", "cycle_ridge", "cycle_momentum")
    before = {k: v for k, v in today.items() if k not in later}
    write_run(root, "before", mini, before, summary=summary(40.0, 58.0))
    write_run(root, "today", mini | {"class_order_seed": 1}, today, summary=summary(41.0, 59.0))
    write_run(root, "cycle", mini, today | {"cycle": True}, summary=summary(42.0, 59.0))
    groups = {g.label: len(g.finished) for g in group_runs(find_runs([root]))}
    assert sorted(groups.values()) == [1, 2] and any("method.cycle=true" in label for label in groups), groups


def test_an_explicit_order_of_fewer_classes_is_a_reduced_protocol_never_averaged_with_the_full_one(tmp_path):
    """data.class_order is what runs of one experiment differ in, so it was left out of the groups: an order of 50
    CIFAR-100 classes read as the paper's protocol (and was set against its numbers), and 3 classes of a 10-class
    dataset were averaged with all 10."""
    root = tmp_path / "runs"
    order = list(range(50))
    write_run(root, "half", {"name": "cifar100", "num_tasks": 5, "class_order": order}, RDFCIL, summary=summary(40, 60))
    write_run(root, "full", {"name": "cifar100", "num_tasks": 5}, RDFCIL, summary=summary(50, 60))
    groups = {g.runs[0].name: g for g in group_runs(find_runs([root]))}
    assert groups["runs/half"].setting.reduced == "50 classes" and groups["runs/half"].setting.paper_row() is None
    assert groups["runs/full"].setting.reduced == "" and groups["runs/full"].setting.paper_row() is not None
    root = tmp_path / "fake"
    fake = {"name": "fake", "num_tasks": 2}
    write_run(root, "three", fake | {"class_order": [1, 2, 3]}, RDFCIL, summary=summary(40, 60))
    write_run(root, "other-three", fake | {"class_order": [4, 5, 6]}, RDFCIL, summary=summary(42, 60))
    from dfcil.data.splits import class_order_from_seed

    seeded = {"class_order": class_order_from_seed(10, 0)}  # what the run saved: its seeded order of all 10
    write_run(root, "all", fake, RDFCIL, summary=summary(50, 60) | seeded)
    groups = group_runs(find_runs([root]))
    assert sorted(len(g.runs) for g in groups) == [1, 2]  # the two 3-class orders are one experiment
    assert {g.config_label for g in groups} == {"data.num_classes=3", "data.num_classes=null"}
    # an explicit order of all 10 (a review): one experiment with the seeded order, as num_classes: 100 on CIFAR-100
    write_run(root, "all-listed", fake | {"class_order": list(range(9, -1, -1))}, RDFCIL, summary=summary(48, 60))
    assert sorted(len(g.runs) for g in group_runs(find_runs([root]))) == [2, 2]
    write_run(tmp_path / "c100", "100", {"name": "cifar100", "num_tasks": 5, "num_classes": 100}, RDFCIL,
              summary=summary(40, 60))  # fmt: skip
    write_run(tmp_path / "c100", "unset", {"name": "cifar100", "num_tasks": 5}, RDFCIL, summary=summary(41, 60))
    assert [len(g.runs) for g in group_runs(find_runs([tmp_path / "c100"]))] == [2]


def test_a_condition_off_its_default_is_in_the_label_even_of_a_report_of_one_group(tmp_path):
    """A report of AutoAugment runs alone labelled them `rdfcil · cifar100 · n10`: nothing told that they were not
    run at the default crop and flip (a probe). Off its default, the augmentation (and the precision) is said."""
    for order in (0, 1):
        data = C100_N10 | {"augment": "autoaugment", "class_order_seed": order}
        write_run(tmp_path / "aa", f"o{order}", data, RDFCIL, summary=summary(40.0, 50.0))
        write_run(tmp_path / "cf", f"o{order}", C100_N10 | {"class_order_seed": order}, RDFCIL, summary=summary(40, 50))
    (group,) = group_runs(find_runs([tmp_path / "aa"]))
    assert group.config_label == 'data.augment="autoaugment"'
    (group,) = group_runs(find_runs([tmp_path / "cf"]))
    assert group.config_label == ""  # the default needs no word


def test_a_report_of_reduced_protocols_alone_has_no_paper_columns(tmp_path, capsys):
    """cifar100-mini's report printed paper columns of "–" and the note on Δ where nothing can be compared (a
    probe): with reduced protocols alone they are left out, and the note says why there is no comparison."""
    mini = C100_N10 | {"num_tasks": 4, "num_classes": 20, "train_per_class": 250}
    write_run(tmp_path / "mini", "o0", mini, RDFCIL, summary=summary(40.0, 50.0))
    assert main(["report", str(tmp_path / "mini")]) == 0
    out = capsys.readouterr().out
    assert "paper A_N" not in out and "Δ = ours − paper" not in out
    assert "Reduced protocols (fewer classes, images or pixels) are never compared with the paper." in out
    write_run(tmp_path / "mini", "full", C100_N10, RDFCIL, summary=summary(40.0, 50.0))
    assert main(["report", str(tmp_path / "mini")]) == 0
    assert "paper A_N" in capsys.readouterr().out  # beside a full protocol they stay


def _curves_of(fig):
    """label → y-data of a figure's labelled lines (the legend's), the reference's zero line included."""
    ax = fig.axes[0]
    return {line.get_label(): list(line.get_ydata()) for line in ax.get_lines() if not line.get_label().startswith("_")}


def test_the_first_tasks_classes_are_drawn_after_each_task_mean_over_runs(tmp_path, monkeypatch):
    """The first figure a long sequence needs beyond A_N: the accuracy on the first task's classes after each task,
    the first column of each run's accuracy matrix, averaged over the group's runs (hand-computed here)."""
    pytest.importorskip("matplotlib")
    from dfcil.analysis import plots

    matrices = [[[90.0, None, None], [60.0, 80.0, None], [40.0, 70.0, 85.0]],
                [[80.0, None, None], [50.0, 82.0, None], [30.0, 60.0, 88.0]]]  # fmt: skip
    for order, matrix in enumerate(matrices):
        data = C100_N10 | {"class_order_seed": order}
        write_run(
            tmp_path, f"lwf/o{order}", data, {"name": "lwf"}, summary=summary(50.0, 60.0) | {"accuracy_matrix": matrix}
        )
    assert plots.first_task_curve({"accuracy_matrix": matrices[0]}) == [90.0, 60.0, 40.0]
    figures = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: figures.append((path.parent.name, path.name, fig)) or [])
    plots.plot_first_task(group_runs(find_runs([tmp_path])), tmp_path / "plots")
    ((folder, name, fig),) = figures
    assert (folder, name) == ("first", "cifar100_n10")
    assert _curves_of(fig) == {"lwf (n=2)": [85.0, 55.0, 35.0]}
    band = fig.axes[0].collections[0].get_paths()[0].vertices  # mean ± population std: 85 ± 5 after the first task
    assert band[:, 1].min() == pytest.approx(30.0) and band[:, 1].max() == pytest.approx(90.0)


def test_against_with_plots_draws_each_groups_paired_difference_after_each_task(tmp_path, monkeypatch, capsys):
    """`report --against M --plots`: each group's accuracy after each task minus M's run of the same class order
    (hand-computed), mean over the pairs; the reference itself is the zero line, a group without a partner run is
    left out, and a warning the table printed is not printed again for the figures."""
    pytest.importorskip("matplotlib")
    from dfcil.analysis import plots

    curves = {"rdfcil": [[90.0, 60.0, 40.0], [80.0, 50.0, 30.0]], "lwf": [[91.0, 58.0, 35.0], [82.0, 54.0, 36.0]]}
    for name, runs in curves.items():
        for order, acc in enumerate(runs):
            done = summary(acc[-1], 60.0) | {"acc_per_task": acc}
            write_run(tmp_path, f"{name}/o{order}", C100_N10 | {"class_order_seed": order}, RDFCIL | {"name": name}
                      if name == "rdfcil" else {"name": name}, summary=done)  # fmt: skip
    done = summary(20.0, 40.0) | {"acc_per_task": [70.0, 40.0, 20.0]}
    write_run(tmp_path, "abd/o5", C100_N10 | {"class_order_seed": 5}, {"name": "abd"}, summary=done)  # no partner
    groups = group_runs(find_runs([tmp_path]))
    from dfcil.analysis.report import plot_pairs

    pairs = plot_pairs(groups, "rdfcil")
    assert list(pairs) == ["lwf · cifar100 · n10"]
    assert [c for _, c in plots.paired_curves(pairs["lwf · cifar100 · n10"][1])] == [[1.0, -2.0, -5.0], [2.0, 4.0, 6.0]]
    figures = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: figures.append((path.parent.name, path.name, fig)) or [])
    plots.plot_against(groups, pairs, tmp_path / "plots")
    ((folder, name, fig),) = figures
    assert (folder, name) == ("against", "cifar100_n10")
    lines = _curves_of(fig)
    assert lines["lwf (n=2)"] == [1.5, 1.0, 0.5] and len(lines) == 2  # lwf and the reference's zero line
    assert [v for k, v in lines.items() if "the reference" in k] == [[0.0, 0.0]]
    # through the CLI: the figures' folder holds against/ only with --against
    monkeypatch.undo()
    assert main(["report", str(tmp_path), "--plots", str(tmp_path / "p1")]) == 0
    assert main(["report", str(tmp_path), "--against", "rdfcil", "--plots", str(tmp_path / "p2")]) == 0
    assert not (tmp_path / "p1" / "against").exists()
    assert sorted(p.name for p in (tmp_path / "p2" / "against").iterdir()) == ["cifar100_n10.pdf", "cifar100_n10.png"]
    assert not (tmp_path / "p2" / "first").exists()  # these summaries have no accuracy matrix: no first-task figure


def test_a_reference_warning_is_printed_once_with_plots(tmp_path, capsys):
    """Two R-DFCIL groups under crop and flip, none at its defaults, one under AutoAugment: the table warns that the
    crop and flip groups are compared with none; drawing the figures reads the references again, silently."""
    pytest.importorskip("matplotlib")
    for name, augment, kd in (("a", "cropflip", 1.0), ("b", "cropflip", 2.0), ("c", "autoaugment", 0.15)):
        for order in (0, 1):
            data = C100_N10 | {"augment": augment, "class_order_seed": order}
            done = summary(40.0 + order, 60.0) | {"method_changed": [] if name == "c" else ["lambda_hkd"]}
            write_run(tmp_path, f"{name}/o{order}", data, RDFCIL | {"lambda_hkd": kd}, summary=done)
        data = C100_N10 | {"augment": augment, "class_order_seed": 0}
        write_run(tmp_path, f"lwf-{name}/o0", data, {"name": "lwf"}, summary=summary(30.0, 50.0))
    assert main(["report", str(tmp_path), "--against", "rdfcil", "--plots", str(tmp_path / "plots")]) == 0
    err = capsys.readouterr().err
    assert err.count("matches 2 groups of one setting") == 1


def _styled_lines(fig):
    from matplotlib.colors import to_rgba

    ax = fig.axes[0]
    return {
        line.get_label().split(" (n=")[0].split(" − ")[0]: (to_rgba(line.get_color()), line.get_linestyle())
        for line in ax.get_lines()
        if not line.get_label().startswith("_")
    }


def test_against_figures_keep_each_groups_style_follow_std_and_split_by_reference(tmp_path, monkeypatch, capsys):
    """Found by a new-user probe of the figures: a group had another colour in against/ than in curves/ (styles were
    dealt out again without the reference); --std sample changed no band; a reference under two augmentations drew
    lines from two baselines about one zero; a one-task protocol drew against/ as one dot; a group whose first run
    held fewer tasks raised a traceback; and the figures of an earlier report stayed in the folder unsaid."""
    pytest.importorskip("matplotlib")
    from dfcil.analysis import plots
    from dfcil.analysis.report import plot_pairs

    acc = {"rdfcil": [[90.0, 60.0, 40.0], [80.0, 50.0, 30.0], [85.0, 55.0, 35.0]],
           "apr": [[91.0, 62.0, 44.0], [82.0, 51.0, 31.0], [86.0, 58.0, 41.0]],
           "lwf": [[88.0, 55.0, 30.0], [79.0, 45.0, 25.0], [84.0, 50.0, 33.0]]}  # fmt: skip
    for augment in ("cropflip", "autoaugment"):
        for name, runs in acc.items():
            for order, curve in enumerate(runs):
                data = C100_N10 | {"class_order_seed": order, "augment": augment}
                done = summary(curve[-1], 60.0) | {"acc_per_task": curve, "method_changed": []}
                write_run(tmp_path, f"{augment}/{name}/o{order}", data, {"name": name}, summary=done)
    groups = group_runs(find_runs([tmp_path]))
    figures = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: figures.append((path.parent.name, path.name, fig)) or [])
    plots.write_plots(groups, tmp_path / "plots", plot_pairs(groups, "rdfcil"), "sample")
    by_kind = {}
    for folder, name, fig in figures:
        by_kind.setdefault(folder, []).append((name, fig))
    assert len(by_kind["against"]) == 2  # one figure per reference (augmentation), each with its own zero
    assert all("vs_rdfcil" in name for name, _ in by_kind["against"])
    curves = _styled_lines(by_kind["curves"][0][1])
    for _, fig in by_kind["against"]:
        for label, style in _styled_lines(fig).items():
            if "the reference" not in label:
                assert style == curves[label], label  # the style of curves/
    # the band is the sample std over the pairs: apr − rdfcil at the last task is 4, 1, 6
    diffs = np.array([4.0, 1.0, 6.0])
    fig = by_kind["against"][0][1]
    tops = {round(float(v), 6) for c in fig.axes[0].collections for v in c.get_paths()[0].vertices[:, 1]}
    assert round(diffs.mean() + diffs.std(ddof=1), 6) in tops and round(diffs.mean() + diffs.std(), 6) not in tops
    assert "mean ± sample std over the pairs" in fig.axes[0].get_legend().get_title().get_text()
    # one task: no against/ (nor first/); a group whose first run holds fewer tasks: drawn without it, no traceback
    short = tmp_path / "cropflip" / "apr" / "o0" / "summary.json"
    s = json.loads(short.read_text())
    short.write_text(json.dumps(s | {"acc_per_task": s["acc_per_task"][:2], "task_sizes": [10, 10]}))
    figures.clear()
    groups = group_runs(find_runs([tmp_path]))
    plots.write_plots(groups, tmp_path / "plots", plot_pairs(groups, "rdfcil"))
    curves = {n: f for folder, n, f in figures if folder == "curves"}
    (fig,) = curves.values()
    assert any(k.startswith('apr · data.augment="cropflip" (n=2)') for k in _curves_of(fig))
    monkeypatch.undo()
    one = tmp_path / "one"
    for name in ("rdfcil", "lwf"):
        for order in (0, 1):
            done = summary(50.0, 50.0) | {"acc_per_task": [50.0 + order], "task_sizes": [10]}
            done |= {"accuracy_matrix": [[50.0 + order]]}  # a first task's column, which one task draws no figure of
            write_run(one, f"{name}/o{order}", C100_N10 | {"num_tasks": 1, "class_order_seed": order}, {"name": name},
                      summary=done)  # fmt: skip
    assert main(["report", str(one), "--against", "rdfcil", "--plots", str(tmp_path / "p1")]) == 0
    assert not (tmp_path / "p1" / "against").exists() and (tmp_path / "p1" / "curves").is_dir()
    assert not (tmp_path / "p1" / "first").exists()
    # an earlier report's figures in the folder: said, with one of them
    capsys.readouterr()
    assert main(["report", str(tmp_path / "cropflip"), "--plots", str(tmp_path / "p1")]) == 0
    err = capsys.readouterr().err
    assert f"note: {tmp_path / 'p1'} also holds " in err and "figure files this report did not write" in err
    assert f"e.g. {tmp_path / 'p1' / 'curves' / 'cifar100_n1.pdf'}" in err
    capsys.readouterr()
    (tmp_path / "p2").mkdir()
    (tmp_path / "p2" / "my-own-figure.png").write_bytes(b"not the report's")  # the user's, beside the report's folders
    assert main(["report", str(tmp_path / "cropflip"), "--plots", str(tmp_path / "p2")]) == 0
    assert "also holds" not in capsys.readouterr().err  # no earlier report's figures: nothing to say


def test_one_run_draws_no_band_and_a_group_without_a_full_run_is_left_out_of_its_figure(tmp_path, monkeypatch):
    """From a review: a group of one run drew a band of zero width, shown in the legend as a band; and a group
    whose every summary holds fewer accuracies than tasks raised a bare ValueError from the figure's axes."""
    pytest.importorskip("matplotlib")
    from matplotlib.collections import PolyCollection

    from dfcil.analysis import plots

    write_run(tmp_path, "lwf/o0", C100_N10, {"name": "lwf"}, summary=summary(40.0, 50.0))
    for order in (0, 1):
        write_run(tmp_path, f"ft/o{order}", C100_N10 | {"class_order_seed": order}, {"name": "finetune"},
                  summary=summary(30.0, 40.0) | {"acc_per_task": [90.0, 40.0]})  # fmt: skip
    figures = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: figures.append(fig) or [])
    plots.plot_curves(group_runs(find_runs([tmp_path])), tmp_path / "plots")
    (fig,) = figures
    assert list(_curves_of(fig)) == ["lwf (n=1)"]  # finetune's runs hold 2 accuracies of 3 tasks: not drawn
    assert not [c for c in fig.axes[0].collections if isinstance(c, PolyCollection)]  # one run: no band
    figures.clear()
    plots.plot_curves(group_runs(find_runs([tmp_path / "ft"])), tmp_path / "plots")
    assert figures == []  # nothing to draw in the setting: no figure, and no error
