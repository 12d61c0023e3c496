"""Fingerprint every registered method on the smoke preset, to show that a refactoring changed no result.

    python benchmarks/fingerprint.py --out before.json              # on the old code
    python benchmarks/fingerprint.py --out after.json --compare before.json

Each method runs ``configs/smoke.yaml`` (plus ``configs/smoke/<method>.yaml`` where a method needs one) through
``dfcil.runs.runner.train``. A name in ``--methods`` that is not a registered method is an overlay of
``configs/cifar100-mini/`` (``lwf_ldc``, ``rdfcil_plus_cycle``): its ``method`` section on the smoke preset of the
method it names, so that a method's switches are fingerprinted too. The fingerprint holds, per method: the summary
without its timings, every metrics.jsonl record without its times, the SHA-256 of every final weight tensor, and the
layout of the last checkpoint (keys, tensor dtypes and shapes). ``--compare`` prints what differs and exits 1 if
anything does.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
# what differs between two runs of one config: times, and the run id (model.pt, summary.json)
TIMES = {"timings", "timing", "wall_time_s", "total_time_s", "time_s", "images_per_s", "resumed", "elapsed_s", "run_id"}


def smoke_configs(name: str) -> list[Path]:
    overlay = REPO / "configs" / "smoke" / f"{name}.yaml"
    return [REPO / "configs" / "smoke.yaml", *([overlay] if overlay.exists() else [])]


def variant(name: str, tmp: Path) -> tuple[str, list[Path]]:
    """The registered method a ``configs/cifar100-mini/<name>.yaml`` overlay names, and the configs that run its
    ``method`` section on that method's smoke preset (the overlay's train keys and its protocol's
    ``inversion.steps`` left out)."""
    import yaml

    overlay = REPO / "configs" / "cifar100-mini" / f"{name}.yaml"
    if not overlay.is_file():
        raise SystemExit(f"--methods {name}: neither a registered method nor an overlay {overlay}")
    method = yaml.safe_load(overlay.read_text())["method"]
    method.get("inversion", {}).pop("steps", None)  # the protocol's synthesis budget: the smoke preset keeps its own
    path = tmp / f"{name}.method.yaml"
    path.write_text(yaml.safe_dump({"method": method}))
    return method["name"], [*smoke_configs(method["name"]), path]


def _layout(obj: Any) -> Any:
    """Keys and tensor shapes of a checkpoint payload; times and sizes that vary between runs left out."""
    if isinstance(obj, torch.Tensor):
        return f"{str(obj.dtype).removeprefix('torch.')}{list(obj.shape)}"
    if isinstance(obj, dict):
        return {str(k): _layout(v) for k, v in obj.items() if k not in TIMES and k not in ("task_timing",)}
    if isinstance(obj, list | tuple):
        return [_layout(v) for v in obj]
    return type(obj).__name__


def _digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest()[
        :16
    ]


def fingerprint(name: str, out: Path, configs: list[Path] | None = None) -> dict[str, Any]:
    try:
        from dfcil.load import load_config
    except ImportError:  # before dfcil.load existed
        from dfcil.config import load_config
    from dfcil.runs.runner import train

    try:
        from dfcil.checkpoint import loads
    except ImportError:  # the layout before dfcil.checkpoint existed
        from dfcil.training.state import loads

    cfg, _ = load_config(configs or smoke_configs(name), [("method.name", name)])
    try:
        from dfcil.training.loop import RunOptions
    except ImportError:  # before run options were one object
        train(cfg, out, progress=False)
    else:
        train(cfg, out, RunOptions(progress=False))
    summary = json.loads((out / "summary.json").read_text())
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    weights = loads((out / "model.pt").read_bytes())["net"]
    last = loads((out / "checkpoints" / "last.pt").read_bytes())
    return {
        "summary": {k: v for k, v in summary.items() if k not in TIMES},
        "records": [{k: v for k, v in r.items() if k not in TIMES} for r in records],
        "weights": {k: _digest(v) for k, v in weights.items()},
        "checkpoint": _layout(last),
    }


def main() -> int:
    from dfcil.methods import METHODS

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--compare", type=Path)
    parser.add_argument("--methods", nargs="*", default=None, help="default: every registered method")
    args = parser.parse_args()
    torch.set_num_threads(1)  # thread count can change float reductions
    result = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.methods or METHODS.names():
            print(f"{name} ...", flush=True)
            method, configs = (name, None) if name in METHODS.names() else variant(name, Path(tmp))
            result[name] = fingerprint(method, Path(tmp) / name, configs)
    args.out.write_text(json.dumps(result, indent=1, sort_keys=True))
    if args.compare is None:
        return 0
    before = json.loads(args.compare.read_text())
    bad = 0
    print(f"\n{'method':14s} {'summary':8s} {'records':8s} {'weights':8s} {'checkpoint':10s}")
    for name in sorted(set(before) | set(result)):
        if name not in before or name not in result:
            print(f"{name:14s} only in {'the new' if name in result else 'the old'} fingerprint")
            bad += 1
            continue
        same = [before[name][k] == result[name][k] for k in ("summary", "records", "weights", "checkpoint")]
        bad += not all(same)
        print(f"{name:14s} " + " ".join(f"{'same' if s else 'DIFFERS':8s}" for s in same))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
