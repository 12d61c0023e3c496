"""Throughput of K identical runs sharing one GPU, with and without CUDA MPS (``dfcil sweep --mps``).

    python benchmarks/concurrency.py                       # K = 1, 3, 6; MPS off and auto; a short R-DFCIL schedule
    python benchmarks/concurrency.py --jobs 1,3 --mps off  # a subset
    python benchmarks/concurrency.py --device cpu --jobs 1,2 --mps off -- --config configs/smoke.yaml   # a dry run

Each configuration is one ``dfcil sweep`` of K runs (training seeds 1..K, so that they are distinct runs with the
same work) with ``--jobs K`` into a fresh directory. Every run does the same steps: the default is CIFAR-100's
R-DFCIL (``configs/cifar100/n5.yaml`` then ``configs/cifar100/rdfcil.yaml``: its model, batch and losses) on
generated images of 40 classes in 2 tasks, 3 epochs and 200 inversion steps, fp32 with channels_last and CUDA
graphs. The table gives the sweep's wall time, the images trained per second by all runs together (the phases'
images over the wall time), and the speed-up over one run: K runs in the time of ``K / speed-up`` runs. The sweep's
log line on MPS is quoted.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHORT = [
    "--config", "configs/cifar100/n5.yaml+configs/cifar100/rdfcil.yaml", "--data.name", "fake",
    "--data.num_classes", "40", "--data.image_size", "32",
    "--data.num_tasks", "2", "--data.train_per_class", "500", "--train.epochs", "3", "--train.milestones", "[1]",
    "--method.chr_epochs", "1", "--method.inversion.steps", "200", "--engine.channels_last", "true",
    "--engine.cuda_graphs", "on",
]  # fmt: skip


def sweep(k: int, mps: str, device: str, extra: list[str], where: Path) -> dict:
    """One sweep of ``k`` runs at once; its wall time, images trained and what it said about MPS."""
    seeds = ",".join(str(s) for s in range(1, k + 1))
    command = [sys.executable, "-m", "dfcil", "sweep", *(extra or SHORT), "--grid", f"seed={seeds}", "--jobs", str(k)]
    command += ["--mps", mps, "--device", device, "--out", str(where)]
    started = time.perf_counter()
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        sys.exit(f"concurrency.py: the sweep failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    images = 0
    for summary in where.glob("*/summary.json"):
        for task in json.loads(summary.read_text())["timings"]:
            images += sum(p["images"] for p in task["phases"].values())
    said = [ln.removeprefix("dfcil sweep: ") for ln in done.stdout.splitlines() if "MPS:" in ln]
    return {"wall_s": wall, "images": images, "mps": said[0] if said else "-"}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--jobs", default="1,3,6", help="the numbers of concurrent runs, comma-separated")
    parser.add_argument("--mps", default="off,auto", help="the --mps settings, comma-separated")
    parser.add_argument("extra", nargs="*", help="after --: dfcil sweep arguments instead of the default schedule")
    args = parser.parse_args(argv)
    ks, settings = [int(k) for k in args.jobs.split(",")], args.mps.split(",")
    print(f"| runs at once | --mps | wall s | images/s, all runs | speed-up over 1 run | MPS |  (device {args.device})")
    print("|---:|---|---:|---:|---:|---|", flush=True)
    one = None
    with tempfile.TemporaryDirectory(prefix="dfcil-concurrency-") as tmp:
        for mps in settings:
            for k in ks:
                r = sweep(k, mps, args.device, args.extra, Path(tmp) / f"{mps}-{k}")
                rate = r["images"] / r["wall_s"]
                if k == 1 and one is None:
                    one = rate
                gain = f"{rate / one:.2f}x" if one else "-"
                print(f"| {k} | {mps} | {r['wall_s']:.0f} | {rate:.0f} | {gain} | {r['mps']} |", flush=True)


if __name__ == "__main__":
    main()
