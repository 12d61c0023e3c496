"""Move the prepared CIFAR-100 arrays to a machine that only takes small uploads.

    python benchmarks/pack_cifar.py pack ../shared/data .devdata --parts 2     # here: parts of about 61 MB
    python benchmarks/pack_cifar.py unpack .devdata /tmp/data                  # there: DIR/cifar100/{train,test}.npz

The images are compressed losslessly (LZMA2 after a per-channel horizontal delta filter, about 0.66 of raw) and
the SHA-256 of each array is checked after unpacking.
"""

from __future__ import annotations

import hashlib
import io
import json
import lzma
import sys
from pathlib import Path

import numpy as np

FILTERS = [{"id": lzma.FILTER_DELTA, "dist": 3}, {"id": lzma.FILTER_LZMA2, "preset": 9 | lzma.PRESET_EXTREME}]


def pack(root: Path, dest: Path, parts: int) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    blob, index = io.BytesIO(), {}
    for split in ("train", "test"):
        with np.load(root / "cifar100" / f"{split}.npz") as d:
            for key in ("x", "y"):
                a = np.ascontiguousarray(d[key])
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


if __name__ == "__main__":
    cmd, a, b, *rest = sys.argv[1:]
    if cmd == "pack":
        pack(Path(a), Path(b), int(rest[1]) if rest[:1] == ["--parts"] else 2)
    else:
        unpack(Path(a), Path(b))
