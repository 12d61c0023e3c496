"""How well each drift compensation moves stored class means, and what it costs.

    python benchmarks/archive/drift.py --config configs/cifar100-mini10.yaml --data.root DATA \
        --data.num_tasks 4 --data.num_classes 12

Trains the config's run (here the first 4 tasks of cifar100-mini10's R-DFCIL), keeping a copy of the network at the
end of each task (for R-DFCIL the backbone is final at the end of RRL: CHR trains the head only). At each task
boundary t-1 → t it then compares, for the classes of the earlier tasks, three means of each class's training images
(plain, no augmentation): under the old network (what a method stored), the true mean under the new network (which
no exemplar-free method can compute: it needs the old images), and the stored mean moved by each compensation,
fitted only on task t's images as the methods do. The table gives the relative error ‖moved − true‖ / ‖stored −
true‖ (1: no better than not moving the means; 0: exact), the cosine between moved and true means, and the fit's
time. The benchmark reads old images to measure; the methods never do.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch
import torch.nn.functional as F

from dfcil.data.device import crop_flip
from dfcil.load import load_config
from dfcil.losses.prototypes import fit_projector, lstsq_projector
from dfcil.progress import make_progress
from dfcil.training.callbacks import Callback
from dfcil.training.engine import run
from dfcil.training.loop import RunOptions
from dfcil.training.protocol import prepare


def variants(ldc_passes: int) -> dict[str, tuple[str, int]]:
    """name: (kind, passes of augmented feature pairs)."""
    return {"none": ("none", 0), "lstsq": ("lstsq", 1), "ldc, 1 pass": ("ldc", 1),
            f"ldc, {ldc_passes} passes{' (LDC)' if ldc_passes == 20 else ''}": ("ldc", ldc_passes)}  # fmt: skip


class Snapshots(Callback):
    """A copy of the network at the end of each task."""

    def __init__(self) -> None:
        self.nets: list[torch.nn.Module] = []

    def on_run_start(self, loop) -> None:  # noqa: ANN001
        self.loop = loop

    def on_task_end(self, record) -> None:  # noqa: ANN001
        self.nets.append(copy.deepcopy(self.loop.net).eval())


@torch.no_grad()
def features(net, x) -> torch.Tensor:  # noqa: ANN001
    return torch.cat([net(x[i : i + 500]).features.float() for i in range(0, len(x), 500)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", action="append", required=True)
    parser.add_argument("--ldc-passes", type=int, default=20, help="passes of the last row (LDC: 20)")
    args, rest = parser.parse_known_args()
    overrides = [(k.removeprefix("--"), v) for k, v in zip(rest[::2], rest[1::2], strict=True)]
    cfg, _ = load_config(args.config, overrides)
    snaps = Snapshots()
    protocol = prepare(cfg, make_progress(False))
    run(cfg, options=RunOptions(progress=False, callbacks=[snaps]), protocol=protocol)
    norm = snaps.loop.evaluator.test.normalizer
    device = torch.device("cpu")
    per_class = cfg.data.train_per_class
    kinds = variants(args.ldc_passes)
    rows = {name: ([], [], []) for name in kinds}
    g = torch.Generator().manual_seed(0)
    for t in range(1, len(snaps.nets)):
        old, new = snaps.nets[t - 1], snaps.nets[t]
        x_old, y_old = protocol.train_tensors(t - 1, True, per_class, device)  # the earlier classes' images
        x_new, _ = protocol.train_tensors(t, False, per_class, device)
        f_old_old, f_new_old = features(old, norm(x_old)), features(new, norm(x_old))
        classes = y_old.unique()
        stored = torch.stack([f_old_old[y_old == c].mean(0) for c in classes])
        true = torch.stack([f_new_old[y_old == c].mean(0) for c in classes])
        for name, (kind, passes) in kinds.items():
            start = time.perf_counter()
            if kind == "none":
                moved = stored
            else:
                pairs = []
                for _ in range(passes):
                    xa = _augment(norm, x_new, g)
                    pairs.append((features(old, xa), features(new, xa)))
                p = (
                    lstsq_projector(*pairs[0])
                    if kind == "lstsq"
                    else fit_projector(pairs, 20, 1e-3, 128, torch.Generator().manual_seed(t))
                )
                moved = stored @ p.T
            dt = time.perf_counter() - start
            err = (moved - true).norm(dim=1) / (stored - true).norm(dim=1)
            rows[name][0].append(float(err.mean()))
            rows[name][1].append(float(F.cosine_similarity(moved, true, dim=1).mean()))
            rows[name][2].append(dt)
    print(f"{cfg.method.name} on {cfg.data.name}, {len(snaps.nets) - 1} task boundaries, CPU threads "
          f"{torch.get_num_threads()}")  # fmt: skip
    print("| compensation | relative error (mean over boundaries) | cosine to the true mean | fit time (s) |")
    print("|---|---|---|---|")
    for name, (err, cos, dt) in rows.items():
        print(f"| {name} | {statistics.mean(err):.3f} | {statistics.mean(cos):.3f} | {statistics.mean(dt):.2f} |")


def _augment(norm, x, g):  # noqa: ANN001
    return norm.to_nchw(crop_flip(norm.nhwc(x), 4, g))


if __name__ == "__main__":
    main()
