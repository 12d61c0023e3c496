"""Move the prepared CIFAR-100 arrays to a machine that only takes small uploads.

    python benchmarks/pack_cifar.py pack DATA .devdata --parts 2     # here: parts of about 61 MB
    python benchmarks/pack_cifar.py unpack .devdata /tmp/data                  # there: DIR/cifar100/{train,test}.npz
    python benchmarks/pack_cifar.py pack DATA .devdata --parts 1 --orders 0,1,2 --num-classes 20 \
        --train-per-class 250    # only what cifar100-mini reads on class orders 0, 1, 2 (about 43 MB)

A subset keeps the arrays' layout and labels: the images of the first ``--num-classes`` classes of each class order
in ``--orders`` (the first ``--train-per-class`` training images of each, in file order, and all their test images);
every other class has none. A protocol that reads only those classes and images gives the same results on it.

The images are compressed losslessly (LZMA2 after a per-channel horizontal delta filter, about 0.66 of raw) and
the SHA-256 of each array is checked after unpacking.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import lzma
from pathlib import Path

import numpy as np

FILTERS = [{"id": lzma.FILTER_DELTA, "dist": 3}, {"id": lzma.FILTER_LZMA2, "preset": 9 | lzma.PRESET_EXTREME}]


def keep(y: np.ndarray, classes: set[int] | None, per_class: int | None) -> np.ndarray:
    """Indices of the images kept: those of ``classes`` (all if None), the first ``per_class`` of each."""
    if classes is None:
        return np.arange(len(y))
    out = [np.flatnonzero(y == c)[:per_class] for c in sorted(classes)]
    return np.sort(np.concatenate(out))


def pack(root: Path, dest: Path, parts: int, classes: set[int] | None = None, per_class: int | None = None) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    blob, index = io.BytesIO(), {}
    for split in ("train", "test"):
        with np.load(root / "cifar100" / f"{split}.npz") as d:
            kept = keep(d["y"], classes, per_class if split == "train" else None)
            for key in ("x", "y"):
                a = np.ascontiguousarray(d[key][kept])
                index[f"{split}.{key}"] = {
                    "dtype": str(a.dtype), "shape": list(a.shape), "offset": blob.tell(), "nbytes": a.nbytes,
                    "sha256": hashlib.sha256(a.tobytes()).hexdigest(),
                }  # fmt: skip
                blob.write(a.tobytes())
    packed = lzma.compress(blob.getvalue(), format=lzma.FORMAT_RAW, filters=FILTERS)
    size = -(-len(packed) // parts)
    for i in range(parts):
        (dest / f"part{i}").write_bytes(packed[i * size : (i + 1) * size])
    (dest / "index.json").write_text(json.dumps({"parts": parts, "arrays": index}))
    print(f"{blob.tell() / 1e6:.1f} MB → {len(packed) / 1e6:.1f} MB in {parts} parts of ≤ {size / 1e6:.1f} MB")


def unpack(src: Path, root: Path) -> None:
    meta = json.loads((src / "index.json").read_text())
    packed = b"".join((src / f"part{i}").read_bytes() for i in range(meta["parts"]))
    raw = lzma.decompress(packed, format=lzma.FORMAT_RAW, filters=FILTERS)
    out = root / "cifar100"
    out.mkdir(parents=True, exist_ok=True)
    for split in ("train", "test"):
        arrays = {}
        for key in ("x", "y"):
            m = meta["arrays"][f"{split}.{key}"]
            chunk = raw[m["offset"] : m["offset"] + m["nbytes"]]
            if hashlib.sha256(chunk).hexdigest() != m["sha256"]:
                raise SystemExit(f"{split}.{key}: checksum mismatch after unpacking")
            arrays[key] = np.frombuffer(chunk, dtype=m["dtype"]).reshape(m["shape"])
        np.savez(out / f"{split}.npz", **arrays)
    print(f"unpacked to {out}")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("command", choices=("pack", "unpack"))
    p.add_argument("src")
    p.add_argument("dest")
    p.add_argument("--parts", type=int, default=2)
    p.add_argument("--orders", help="class order seeds whose first --num-classes classes are kept (a subset)")
    p.add_argument("--num-classes", type=int, default=100)
    p.add_argument("--train-per-class", type=int)
    args = p.parse_args(argv)
    if args.command == "unpack":
        unpack(Path(args.src), Path(args.dest))
        return
    classes = None
    if args.orders:
        from dfcil.data.splits import class_order_from_seed

        orders = [class_order_from_seed(100, int(s)) for s in args.orders.split(",")]
        classes = {c for order in orders for c in order[: args.num_classes]}
    pack(Path(args.src), Path(args.dest), args.parts, classes, args.train_per_class)


if __name__ == "__main__":
    main()
