"""Peak host memory while preparing and while training on an ImageNet-like folder of generated JPEGs.

    python benchmarks/archive/memory.py [--sizes 30,60] [--val 10]

For each number of training images per class in ``--sizes`` it writes an ILSVRC-2012-shaped folder of ImageNet-100's
classes (``--sizes`` training and ``--val`` validation JPEGs per class at 256×320 pixels, smooth patterns with
noise), then, each in a fresh process: prepares the ``imagenet100`` dataset at 224 pixels (decoding into the cache
with one worker per core) and trains fine-tuning on it for one epoch of two tasks (ResNet-18, batch 16, the first
10 images per class of the task). It prints each process's peak resident memory (``ru_maxrss``) with the cache's
size: the preparation's peak should not grow with the dataset, and training's depends on a task's classes and the
model, not on the cache.
"""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

PREPARE = """
import json, resource, sys
from dfcil.config import DataConfig
from dfcil.data.datasets import build_dataset
d = build_dataset(DataConfig(name="imagenet100", root=sys.argv[1], cache=sys.argv[2]))
print(json.dumps({"peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "worker_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}))
"""

TRAIN = """
import json, resource, sys
from dfcil import load_config, train
cfg, _ = load_config(["configs/imagenet100/n5.yaml", "configs/imagenet100/finetune.yaml"], [
    ("data.root", sys.argv[1]), ("data.cache", sys.argv[2]), ("data.num_tasks", "10"), ("data.num_classes", "20"),
    ("data.train_per_class", "10"), ("train.epochs", "1"), ("train.batch_size", "16"), ("train.milestones", "[]"),
    ("device", "cpu")])
train(cfg, sys.argv[3])
print(json.dumps({"peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def write_folder(root: Path, train: int, val: int) -> None:
    from PIL import Image

    rng = np.random.default_rng(0)
    wnids = [f"n01{440764 + 4191 * i:06d}" for i in range(99)] + ["n01855672"]
    yy, xx = np.mgrid[0:256, 0:320]
    for c, wnid in enumerate(wnids):
        base = np.stack([(np.sin(xx / (9 + c % 7) + k) + np.cos(yy / (11 + k)) + 2) * 60 for k in range(3)], -1)
        for split, n in (("train", train), ("val", val)):
            folder = root / split / wnid
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(n):
                array = np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8)
                buf = io.BytesIO()
                Image.fromarray(array).save(buf, format="JPEG", quality=90)
                (folder / f"{wnid}_{i}.JPEG").write_bytes(buf.getvalue())


def run(code: str, *args: str) -> dict:
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="30,60", help="training images per class, one folder each")
    p.add_argument("--val", type=int, default=10)
    args = p.parse_args(argv)
    print("| training images per class | images | cache | peak RSS preparing (largest worker) | peak RSS training |")
    print("|---:|---:|---:|---:|---:|")
    for per_class in map(int, args.sizes.split(",")):
        with tempfile.TemporaryDirectory() as tmp:
            root, cache = Path(tmp) / "ilsvrc", Path(tmp) / "cache"
            write_folder(root, per_class, args.val)
            prepared = run(PREPARE, str(root), str(cache))
            trained = run(TRAIN, str(root), str(cache), str(Path(tmp) / "run"))
            size = sum(f.stat().st_size for f in cache.rglob("*") if f.is_file()) / 2**20
            images = 100 * (per_class + args.val)
            prep = f"{prepared['peak_mb']:.0f} MB ({prepared['worker_mb']:.0f} MB)"
            print(f"| {per_class} | {images} | {size:.0f} MB | {prep} | {trained['peak_mb']:.0f} MB |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
