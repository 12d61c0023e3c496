"""How fast image datasets are decoded into the cache, against a plain Pillow process pool, A/B in one process.

    python benchmarks/archive/prepare_speed.py --source DATA/tiny-imagenet-200-sub100.zip

A (dfcil): ``dfcil.data.cache.prepare_cache`` with one worker per core into a fresh cache directory (decoding,
the memory-mapped writes, the statistics pass, fsync and the rename), and its decoding stage alone, into memory.
B (the baselines): ``Image.open(...).convert("RGB")`` of every image in a ``ProcessPoolExecutor.map`` over the
same cores (chunks of 64, each opening the zip; and again with each worker keeping the zip open, as dfcil's do),
the arrays collected in the parent and stacked, nothing written. The order alternates between rounds; the table
gives each round's images per second and the parent's peak resident memory. The source is a Tiny-ImageNet-200
zip (its training and validation images, as the dataset reads them).
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

_ZIP: dict[str, zipfile.ZipFile] = {}  # the baseline's workers: one open archive each, when asked to keep it


def _baseline_chunk(args: tuple[str, list[str], bool]) -> list[np.ndarray]:
    from PIL import Image

    archive, names, keep = args
    if keep and archive not in _ZIP:
        _ZIP[archive] = zipfile.ZipFile(archive)
    z = _ZIP[archive] if keep else zipfile.ZipFile(archive)
    arrays = [np.asarray(Image.open(io.BytesIO(z.read(n))).convert("RGB")) for n in names]
    if not keep:
        z.close()
    return arrays


def baseline(archive: Path, names: list[str], workers: int, keep: bool) -> int:
    chunks = [(str(archive), names[i : i + 64], keep) for i in range(0, len(names), 64)]
    with concurrent.futures.ProcessPoolExecutor(workers) as pool:
        arrays = [a for chunk in pool.map(_baseline_chunk, chunks) for a in chunk]
    return len(np.stack(arrays))


def dfcil_prepare(archive: Path, names: list[str], workers: int, where: Path) -> int:
    from dfcil.data.cache import Split, prepare_cache
    from dfcil.data.decode import BaseTransform, ImageFile

    split = Split([ImageFile(n, str(archive)) for n in names], np.zeros(len(names), dtype=np.int64))
    path = where / f"cache-{time.monotonic_ns()}"
    prepare_cache(path, {"train": split}, BaseTransform(64, 64), {"source": str(archive)}, workers)
    shutil.rmtree(path)
    return len(names)


def dfcil_decode(archive: Path, names: list[str], workers: int) -> int:
    """dfcil's decoding stage alone: the same pool and chunks, into an array in memory (no cache written)."""
    from dfcil.data.cache import Split, _decode_all
    from dfcil.data.decode import CHUNK, BaseTransform, ImageFile

    split = Split([ImageFile(n, str(archive)) for n in names], np.zeros(len(names), dtype=np.int64))
    x = np.zeros((len(names), 64, 64, 3), dtype=np.uint8)

    class Memory:  # the writer: into the array
        def write(self, start: int, images: np.ndarray) -> None:
            x[start : start + len(images)] = images

    for _ in _decode_all(
        split, np.zeros(-(-len(names) // CHUNK), dtype=bool), BaseTransform(64, 64), workers, Memory()
    ):
        pass
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
    rates: dict[str, list[float]] = {
        "dfcil prepare_cache (cache written and synced)": [], "dfcil decoding alone (into memory)": [],
        "Pillow process pool": [], "Pillow process pool, zip kept open per worker": [],
    }  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            order = list(rates) if r % 2 == 0 else list(rates)[::-1]
            for name in order:
                t0 = time.perf_counter()
                if name.startswith("dfcil prepare"):
                    n = dfcil_prepare(args.source, names, args.workers, Path(tmp))
                elif name.startswith("dfcil"):
                    n = dfcil_decode(args.source, names, args.workers)
                else:
                    n = baseline(args.source, names, args.workers, keep=name.endswith("per worker"))
                rates[name].append(n / (time.perf_counter() - t0))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{len(names)} JPEGs of {args.source.name}, {args.workers} workers, {args.rounds} rounds (alternating)")
    print("| | images/s per round | median images/s |\n|---|---|---:|")
    for name, values in rates.items():
        print(f"| {name} | {', '.join(f'{v:.0f}' for v in values)} | {statistics.median(values):.0f} |")
    prepared, decoded, *others = (statistics.median(v) for v in rates.values())
    ratios = ", ".join(f"{decoded / b:.2f}" for b in others)
    print(
        f"dfcil's decoding / the baselines: {ratios}; the whole preparation / decoding alone: {prepared / decoded:.2f}"
    )
    print(f"the parent's peak RSS: {peak:.0f} MB (the baselines hold every image in memory)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
