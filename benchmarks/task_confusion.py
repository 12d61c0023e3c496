"""Where a finished run's final model sends each task's test images: a table per run.

For every task j of the run, over the test images of task j's classes:

* ``acc``: top-1 accuracy over all seen classes (the last row of the accuracy matrix);
* ``within``: accuracy when the argmax is taken over task j's own classes only (task-aware): how well the
  representation and head separate the task's classes among themselves;
* ``to old``, ``to own``, ``to later``: the share of images predicted into a class of an earlier task, of task j,
  or of a later task.

A task whose ``within`` is high but whose ``acc`` is low is learned, and lost to the competition with the other
tasks' logits. Usage (the data root as the run's):

    python benchmarks/task_confusion.py RUN [RUN ...] [--data.root DATA]
"""

from __future__ import annotations

import argparse

import torch

from dfcil.analysis.tools import FinishedRun
from dfcil.compute.runtime import Runtime, resolve_device
from dfcil.data.device import Normalizer
from dfcil.progress import make_progress
from dfcil.training.protocol import TestSet


@torch.no_grad()
def confusion(run_dir: str, data_root: str | None) -> list[dict[str, float]]:
    run = FinishedRun.open(run_dir, **{"data.root": data_root})
    protocol, cfg = run.protocol(), run.cfg
    device = resolve_device(cfg.device)
    runtime = Runtime.from_config(cfg.engine, device, make_progress(False))
    test = TestSet.build(protocol, cfg.data.test_per_class, Normalizer(protocol.dataset.mean, protocol.dataset.std,
                         device, cfg.engine.channels_last), device)  # fmt: skip
    net = run.network(device).eval()
    n, batch, logits = int(test.seen[-1]), cfg.train.eval_batch_size, []
    with runtime.autocast():
        for i in range(0, n, batch):
            logits.append(net(test.normalizer(test.x[i : min(i + batch, n)])).logits.float().cpu())
    z, y = torch.cat(logits), test.y[:n].cpu()
    offsets = list(protocol.split.offsets)
    pred, rows = z.argmax(dim=1), []
    for j in range(protocol.split.num_tasks):
        lo, hi = offsets[j], offsets[j + 1]
        mask = (y >= lo) & (y < hi)
        pj, yj = pred[mask], y[mask]
        within = z[mask][:, lo:hi].argmax(dim=1) + lo
        rows.append({
            "task": j, "acc": 100 * float((pj == yj).double().mean()),
            "within": 100 * float((within == yj).double().mean()),
            "to old": 100 * float((pj < lo).double().mean()),
            "to own": 100 * float(((pj >= lo) & (pj < hi)).double().mean()),
            "to later": 100 * float((pj >= hi).double().mean()),
        })  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+")
    parser.add_argument("--data.root", dest="data_root")
    args = parser.parse_args()
    for run_dir in args.runs:
        print(f"\n{run_dir}\n| task | acc | within | to old | to own | to later |\n|---:|---:|---:|---:|---:|---:|")
        for r in confusion(run_dir, args.data_root):
            print(f"| {r['task']} | {r['acc']:.1f} | {r['within']:.1f} | {r['to old']:.1f} | {r['to own']:.1f} | "
                  f"{r['to later']:.1f} |")  # fmt: skip


if __name__ == "__main__":
    main()
