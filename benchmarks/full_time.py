"""Where a run's time went, task by task, from its ``metrics.jsonl``; for a run stopped early, its total
extrapolated from the tasks it finished.

    python benchmarks/full_time.py RUN_DIR

Tasks after the first share one schedule (inversion, then RRL and CHR on as many images), so an unfinished task is
estimated as the mean of the finished tasks after the first, less their compile time (with ``engine.compile: step``
and a static head only the first of them compiles); evaluation, which grows with the classes seen, is a small part.
The table says which tasks were measured and which estimated.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import yaml


def task_seconds(timing: dict) -> dict[str, float]:
    phases = {name: p.get("time_s", 0.0) for name, p in timing.get("phases", {}).items()}
    parts = {"setup": timing.get("setup_s", 0.0), **phases, "eval": timing.get("eval_s", 0.0)}
    return parts | {"compile": timing.get("compile_s", 0.0), "total": sum(parts.values())}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", type=Path)
    args = p.parse_args(argv)
    lines = [json.loads(x) for x in (args.run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    tasks = {x["task"]: x for x in lines if x.get("type") == "task"}
    num_tasks = yaml.safe_load((args.run / "config.yaml").read_text())["data"]["num_tasks"]
    if not tasks:
        print(f"{args.run}: no finished task yet")
        return 1
    rows = {t: task_seconds(x["timing"]) for t, x in sorted(tasks.items())}
    later = [r["total"] - r["compile"] for t, r in rows.items() if t > 0]
    print("| task | how | setup s | phases s | eval s | of which compile s | total s | acc |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|")
    total = 0.0
    for t in range(num_tasks):
        if t in rows:
            r = rows[t]
            phases = ", ".join(f"{k} {v:.1f}" for k, v in r.items() if k not in ("setup", "eval", "compile", "total"))
            print(f"| {t} | measured | {r['setup']:.1f} | {phases} | {r['eval']:.1f} | {r['compile']:.1f} | "
                  f"{r['total']:.1f} | {tasks[t]['acc']:.2f} |")  # fmt: skip
            total += r["total"]
        elif later:
            est = statistics.mean(later)
            print(f"| {t} | estimated (tasks 1..{max(rows)}, less compile) | | | | | {est:.1f} | |")
            total += est
        else:
            print(f"| {t} | not estimated (no task after the first finished) | | | | | | |")
    how = "measured" if len(rows) == num_tasks else "extrapolated"
    print(f"\n{how} total: {total:.0f} s ({total / 60:.1f} min) over {num_tasks} tasks")
    return 0


if __name__ == "__main__":
    sys.exit(main())
