"""Compile time of a run whose graphs an earlier run compiled (``engine.compile_cache``), against the first run's.

    python benchmarks/compile_cache.py                              # CPU, ResNet-32, smoke-sized R-DFCIL
    python benchmarks/compile_cache.py --device cuda --runs 3
    python benchmarks/compile_cache.py -- --config configs/cifar100-mini.yaml --data.root DATA

Every run is a fresh ``dfcil train`` process with ``engine.compile: step`` (``model.static_head: true``) and one
cache directory, empty before the first run: run 1 compiles every graph and writes the cache, the later runs load
what they can. A last run with ``engine.compile_cache: off`` compiles everything again (the cold cost, with the
machine as busy as for the others). The table gives, per run, the graphs compiled (dynamo frames), those whose
forward/backward AOTAutograd loaded from the cache, and the seconds of the steps that compiled (``compile_s`` of
each task's timings, summed), beside the run's wall time. Compiling happens in the first two tasks, so a two-task
protocol (the default: the smoke preset with the CIFAR ResNet-32) measures what a long run pays.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT = ["--config", "configs/smoke.yaml", "--model.backbone", "resnet32"]


def run_once(run_dir: Path, cache: str, device: str, extra: list[str]) -> dict:
    """One ``dfcil train`` process; its summed compile record and wall time."""
    command = [sys.executable, "-m", "dfcil", "train", *(extra or DEFAULT), "--model.static_head", "true"]
    command += ["--engine.compile", "step", "--engine.compile_cache", cache, "--device", device]
    command += ["--out", str(run_dir), "--no-progress"]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"compile_cache.py: a run failed:\n{done.stderr[-3000:]}")
    summary = json.loads((run_dir / "summary.json").read_text())
    timings = summary["timings"]
    return {
        "compiles": sum(t.get("compiles", 0) for t in timings),
        "loaded": sum(t.get("compile_cache_hits", 0) for t in timings),
        "compile_s": sum(t.get("compile_s", 0.0) for t in timings),
        "wall_s": summary["wall_time_s"],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--runs", type=int, default=2, help="runs sharing the cache (the first one fills it)")
    parser.add_argument("extra", nargs="*", help="after --: dfcil train arguments instead of the default protocol")
    args = parser.parse_args(argv)
    print(f"| run | graphs compiled | loaded from the cache | compile s | wall s |  (device {args.device})", flush=True)
    print("|---|---:|---:|---:|---:|", flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="dfcil-compile-cache-") as tmp:
        cache = str(Path(tmp) / "cache")
        plan = [(f"run {i + 1}" + (" (empty cache)" if i == 0 else ""), cache) for i in range(args.runs)]
        for i, (name, where) in enumerate([*plan, ("cache off", "off")]):
            r = run_once(Path(tmp) / f"r{i}", where, args.device, args.extra)
            rows.append(r)
            print(
                f"| {name} | {r['compiles']} | {r['loaded']} | {r['compile_s']:.1f} | {r['wall_s']:.1f} |", flush=True
            )
    first, last = rows[0]["compile_s"], rows[-2]["compile_s"]
    print(f"\nrun {args.runs}'s compiling takes {last / first:.2f}x run 1's ({last:.1f} s against {first:.1f} s)")


if __name__ == "__main__":
    main()
