"""How fast image datasets are decoded into the cache, against a plain Pillow process pool, A/B in one process.

    python benchmarks/prepare_speed.py --source ../shared/data/tiny-imagenet-200/tiny-imagenet-200-sub100.zip

A (dfcil): ``dfcil.data.images.prepare_cache`` with one worker per core, into a fresh cache directory (decoding,
the memory-mapped writes, the statistics pass, fsync and the rename). B (the baseline): ``Image.open(...).convert
("RGB")`` of every image in a ``ProcessPoolExecutor.map`` over the same cores (chunks of 64), the arrays collected
in the parent and stacked, nothing written. The order alternates between rounds; the table gives each round's
images per second and the parent's peak resident memory. The source is a Tiny-ImageNet-200 zip (its training and
validation images, as the dataset reads them).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import io
import os
import resource
import shutil
import statistics
import tempfile
import time
import zipfile
from pathlib import Path

import numpy as np


def _baseline_chunk(args: tuple[str, list[str]]) -> list[np.ndarray]:
    from PIL import Image

    archive, names = args
    with zipfile.ZipFile(archive) as z:
        return [np.asarray(Image.open(io.BytesIO(z.read(n))).convert("RGB")) for n in names]


def baseline(archive: Path, names: list[str], workers: int) -> int:
    chunks = [(str(archive), names[i : i + 64]) for i in range(0, len(names), 64)]
    with concurrent.futures.ProcessPoolExecutor(workers) as pool:
        arrays = [a for chunk in pool.map(_baseline_chunk, chunks) for a in chunk]
    return len(np.stack(arrays))


def dfcil_prepare(archive: Path, names: list[str], workers: int, where: Path) -> int:
    from dfcil.data.images import BaseTransform, ImageFile, Split, prepare_cache

    split = Split([ImageFile(n, str(archive)) for n in names], np.zeros(len(names), dtype=np.int64))
    path = where / f"cache-{time.monotonic_ns()}"
    prepare_cache(path, {"train": split}, BaseTransform(64, 64), {"source": str(archive)}, workers)
    shutil.rmtree(path)
    return len(names)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--source", type=Path, required=True, help="a tiny-imagenet-200 zip")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--limit", type=int, default=0, help="decode only the first N images (0: all)")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = p.parse_args(argv)
    with zipfile.ZipFile(args.source) as z:
        names = sorted(n for n in z.namelist() if n.endswith(".JPEG") and ("/train/" in n or "/val/" in n))
    names = names[: args.limit] if args.limit else names
    rates: dict[str, list[float]] = {"dfcil prepare_cache": [], "Pillow process pool": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            order = list(rates) if r % 2 == 0 else list(rates)[::-1]
            for name in order:
                t0 = time.perf_counter()
                if name.startswith("dfcil"):
                    n = dfcil_prepare(args.source, names, args.workers, Path(tmp))
                else:
                    n = baseline(args.source, names, args.workers)
                rates[name].append(n / (time.perf_counter() - t0))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{len(names)} JPEGs of {args.source.name}, {args.workers} workers, {args.rounds} rounds (alternating)")
    print("| | images/s per round | median images/s |\n|---|---|---:|")
    for name, values in rates.items():
        print(f"| {name} | {', '.join(f'{v:.0f}' for v in values)} | {statistics.median(values):.0f} |")
    a, b = (statistics.median(v) for v in rates.values())
    print(f"ratio dfcil / baseline: {a / b:.2f}; parent's peak RSS {peak:.0f} MB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
