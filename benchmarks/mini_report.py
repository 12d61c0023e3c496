"""Print the cifar100-mini table from run directories (runs/mini-<name>-o<order seed>/summary.json).

    python benchmarks/mini_report.py [RUNS_DIR]

Mean ± std (population) over the class orders present for each name; reads only summary.json and meta.json.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

ORDER = ["joint", "finetune", "lwf", "deepinversion", "abd", "ucir_df", "podnet_df", "rdfcil"]


def fmt(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.mean(values):.2f} ± {statistics.pstdev(values):.2f}"


def main(root: str = "runs") -> None:
    rows: dict[str, list[dict]] = defaultdict(list)
    for summary in sorted(Path(root).glob("mini-*-o*/summary.json")):
        name, order = re.fullmatch(r"mini-(.+)-o(\d+)", summary.parent.name).groups()
        s = json.loads(summary.read_text())
        meta = json.loads((summary.parent / "meta.json").read_text())
        rows[name].append(s | {"order": int(order), "commit": (meta.get("git_sha") or "?")[:7]})
    names = [n for n in ORDER if n in rows] + sorted(n for n in rows if n not in ORDER)
    print("| method | orders | A_N | avg. inc. acc. | forgetting | wall time (s) | commit |")
    print("|---|---|---:|---:|---:|---:|---|")
    for name in names:
        runs = rows[name]
        commits = ",".join(sorted({r["commit"] for r in runs}))
        print(
            f"| {name} | {','.join(str(r['order']) for r in runs)} | {fmt([r['last_acc'] for r in runs])} | "
            f"{fmt([r['avg_inc_acc'] for r in runs])} | {fmt([r['forgetting'] for r in runs])} | "
            f"{' / '.join(str(round(r['wall_time_s'])) for r in runs)} | {commits} |"
        )


if __name__ == "__main__":
    main(*sys.argv[1:])
