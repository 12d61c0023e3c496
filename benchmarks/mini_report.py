"""Print the cifar100-mini tables from run directories (runs/mini-<name>-o<order seed>/summary.json).

    python benchmarks/mini_report.py [RUNS_DIR]

Two tables: the methods, then R-DFCIL and its ablations (with the change in A_N against full R-DFCIL on the
same class orders). Mean ± std (population) over the class orders present for each name. Reads only the run
directories' summary.json and meta.json, never the engine.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

HEADER = "| {first} | orders | A_N | avg. inc. acc. | forgetting | {extra}wall time (s) | threads | commit |"


def fmt(values: list[float]) -> str:
    """One value, or mean ± population std followed by the values per class order."""
    if len(values) == 1:
        return f"{values[0]:.2f}"
    each = ", ".join(f"{v:.2f}" for v in values)
    return f"{statistics.mean(values):.2f} ± {statistics.pstdev(values):.2f} ({each})"


def load(root: Path) -> dict[str, dict[int, dict]]:
    rows: dict[str, dict[int, dict]] = defaultdict(dict)
    for summary in sorted(root.glob("mini-*-o*/summary.json")):
        match = re.fullmatch(r"mini-(.+)-o(\d+)", summary.parent.name)
        if match is None:
            continue
        name, order = match.groups()
        s = json.loads(summary.read_text())
        meta = json.loads((summary.parent / "meta.json").read_text())
        rows[name][int(order)] = s | {
            "commit": (meta.get("git_sha") or "?")[:7],
            "threads": meta.get("torch_threads", "?"),
        }
    return rows


def seconds(r: dict) -> str:
    """Time the run's kept work took; older resumed runs lack ``total_time_s``: sum their per-task timings."""
    if "total_time_s" in r or not r.get("resumed"):
        return str(round(r.get("total_time_s", r["wall_time_s"])))
    t = sum(x.get("setup_s", 0) + x["eval_s"] + sum(p["time_s"] for p in x["phases"].values()) for x in r["timings"])
    return f"≈{round(t)}"


def row(name: str, runs: dict[int, dict], extra: str = "") -> str:
    rs = [runs[o] for o in sorted(runs)]
    resumed = "*" if any(r.get("resumed") for r in rs) else ""
    return (
        f"| {name}{resumed} | {','.join(map(str, sorted(runs)))} | {fmt([r['last_acc'] for r in rs])} | "
        f"{fmt([r['avg_inc_acc'] for r in rs])} | {fmt([r['forgetting'] for r in rs])} | {extra}"
        f"{' / '.join(seconds(r) for r in rs)} | "
        f"{' / '.join(str(r['threads']) for r in rs)} | {','.join(sorted({r['commit'] for r in rs}))} |"
    )


def main(root: str = "runs") -> None:
    rows = load(Path(root))
    methods = sorted(n for n in rows if not n.startswith("rdfcil_"))  # every method found, ablations apart
    print(HEADER.format(first="method", extra=""))
    print("|---|---|---:|---:|---:|---:|---|---|")
    for name in methods:
        print(row(name, rows[name]))

    ablations = sorted(n for n in rows if n.startswith("rdfcil_"))
    if ablations:
        print()
        ablation_table(rows, ablations)
    if any(r.get("resumed") for runs in rows.values() for r in runs.values()):
        print()
        print("`*`: resumed from a checkpoint at least once; its time is the kept work of all its processes (`≈`: the")
        print("sum of its per-task timings, for runs made before `total_time_s` existed).")


def ablation_table(rows: dict[str, dict[int, dict]], ablations: list[str]) -> None:
    print(HEADER.format(first="R-DFCIL variant", extra="ΔA_N vs full | "))
    print("|---|---|---:|---:|---:|---:|---:|---|---|")
    full = rows.get("rdfcil", {})
    if full:
        print(row("rdfcil (full)", full, extra="— | "))
    for name in ablations:
        same = [o for o in rows[name] if o in full]
        delta = fmt([rows[name][o]["last_acc"] - full[o]["last_acc"] for o in same]) if same else "n/a"
        print(row(name, rows[name], extra=f"{delta} | "))


if __name__ == "__main__":
    main(*sys.argv[1:])
