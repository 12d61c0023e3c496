"""The records kept under results/ (``benchmarks/pack.py SWEEP --records``) and docs/results.md agree: every kept run's
A_N is cited there, so a record never backs a number the page does not show, and a rounding or a copying slip
between a run and its row shows up here."""

import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_every_kept_runs_last_accuracy_is_cited_in_results_md():
    page = (REPO / "docs" / "results.md").read_text()
    summaries = sorted((REPO / "results").glob("*/*/summary.json"))
    missing = []
    for path in summaries:
        summary = json.loads(path.read_text())
        if f"{summary['last_acc']:.2f}" not in page:
            missing.append(f"{path.relative_to(REPO)}: A_N {summary['last_acc']:.2f}")
    assert missing == []


def test_each_records_folder_is_named_in_results_md_and_holds_no_weights():
    page = (REPO / "docs" / "results.md").read_text()
    for folder in sorted(p for p in (REPO / "results").iterdir() if p.is_dir()):
        assert f"results/{folder.name}" in page, f"{folder.name} is not named in docs/results.md"
        assert (folder / "sweep.json").is_file() or list(folder.glob("*/summary.json")), folder
        heavy = [p for p in folder.rglob("*") if p.suffix in (".pt", ".png", ".safetensors", ".tgz")]
        assert heavy == [], heavy
