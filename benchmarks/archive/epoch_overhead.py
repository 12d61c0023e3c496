"""What a run spends between epochs: checkpoint policies, and the checkpoint layouts.

    python benchmarks/archive/epoch_overhead.py [--rounds 3] [--device cpu]

Runs a short R-DFCIL protocol (the smoke preset's generated data with ResNet-32, 2 tasks, 21 epochs in all) with
``epoch_checkpoint_interval_s`` 0 (the default: every epoch) and 60, alternately, into temporary run directories,
and prints per policy the number of checkpoints written, the median time of one write (state to host, serialise,
SHA-256, write, fsync, rename), and the time between epochs: each phase's wall time minus the sum of its epochs'
own times, per epoch boundary. On a GPU whose epochs take a tenth of a second this between-epochs time is what a
5-task CIFAR-100 run pays 960 times (its epochs: 160 in task 0, 200 in each later task). Then it times one
epoch-end checkpoint's serialisation (``dfcil.checkpoint.dumps``: the tensors' bytes in one block) against a
plain ``torch.save`` of the same payload (~300 tensors), to bytes and back.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from dfcil.checkpoint import dumps, loads
from dfcil.load import load_config
from dfcil.runs.runner import train
from dfcil.training.callbacks import Checkpointing
from dfcil.training.loop import RunOptions


def serialisation(path: Path, reps: int = 30) -> list[tuple[str, float, float]]:
    """ms to turn one checkpoint's payload into bytes and back: ``torch.save`` of the payload, tensors included,
    against ``dumps`` (tensors' bytes in one block, and a SHA-256 of the whole)."""
    payload = loads(path.read_bytes())

    def torch_save() -> bytes:
        buf = io.BytesIO()
        torch.save(payload, buf)
        return buf.getvalue()

    def torch_load(data: bytes) -> object:
        return torch.load(io.BytesIO(data), weights_only=True)

    def median_ms(fn) -> float:  # noqa: ANN001
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return statistics.median(times) * 1000

    out = []
    for name, write, read in (
        ("torch.save of the payload", torch_save, torch_load),
        ("dfcil.checkpoint (dumps/loads)", lambda: dumps(payload), loads),
    ):
        data = write()
        out.append((name, median_ms(write), median_ms(lambda data=data, read=read: read(data))))
    return out


def one_run(interval: float, device: str, root: Path) -> tuple[list[float], float, int]:
    saves: list[float] = []
    original = Checkpointing.save

    def timed(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        t0 = time.perf_counter()
        original(self, *args, **kwargs)
        saves.append(time.perf_counter() - t0)

    Checkpointing.save = timed
    try:
        overrides = [("model.backbone", "resnet32"), ("train.epochs", "12"), ("train.milestones", "[8]")]
        overrides += [("epoch_checkpoint_interval_s", str(interval)), ("device", device)]
        overrides += [("method.inversion.steps", "5"), ("method.chr_epochs", "3")]
        cfg = load_config([str(Path(__file__).parents[2] / "configs" / "smoke.yaml")], overrides)[0]
        out = root / f"run-{interval}-{time.monotonic_ns()}"
        summary = train(cfg, out, options=RunOptions(progress=False))
    finally:
        Checkpointing.save = original
    epochs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    epoch_time = sum(r["time_s"] for r in epochs if r["type"] == "epoch")
    phase_time = sum(p["time_s"] for t in summary["timings"] for p in t["phases"].values())
    n_epochs = sum(r["type"] == "epoch" for r in epochs)
    return saves, (phase_time - epoch_time) / n_epochs, n_epochs


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--device", default="cpu")
    args = p.parse_args(argv)
    policies = {"every epoch (0 s)": 0.0, "at most every 60 s": 60.0}
    saves: dict[str, list[float]] = {k: [] for k in policies}
    between: dict[str, list[float]] = {k: [] for k in policies}
    counts: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for name in list(policies) if r % 2 == 0 else list(policies)[::-1]:
                s, gap, n_epochs = one_run(policies[name], args.device, Path(tmp))
                saves[name] += s
                between[name].append(gap)
                counts[name] = len(s)
        ckpts = sorted(Path(tmp).glob("run-*/checkpoints/*.pt"), key=lambda p: p.stat().st_size)
        formats = serialisation([p for p in ckpts if "static" not in p.name][-1])
    print(f"device {args.device}, ResNet-32, 2 tasks, {n_epochs} epochs per run, {args.rounds} runs per policy")
    print("| epoch-end checkpoints | checkpoints per run | ms per checkpoint (median) | ms between epochs (median) |")
    print("|---|---:|---:|---:|")
    for name in policies:
        ms_save, ms_gap = statistics.median(saves[name]) * 1000, statistics.median(between[name]) * 1000
        print(f"| {name} | {counts[name]} | {ms_save:.1f} | {ms_gap:.1f} |")
    print()
    print("One epoch-end checkpoint (ResNet-32, SGD state), bytes in memory, median of 30:")
    print("| layout | ms to bytes | ms from bytes |")
    print("|---|---:|---:|")
    for name, ms_out, ms_in in formats:
        print(f"| {name} | {ms_out:.1f} | {ms_in:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
