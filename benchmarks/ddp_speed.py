"""Training images per second over 1 and K processes, and the gradient all-reduce's share of a step.

    python benchmarks/ddp_speed.py [--phase inversion]    # CPU, gloo: 1 and 2 processes
    python benchmarks/ddp_speed.py --device cuda --procs 1,2,4,8   # a machine with several GPUs (NCCL)

Each setting starts ``torchrun --standalone --nproc-per-node K`` on this file. Every process times steps of the
student's RRL pass as a run over K processes does them: its share of the global batch (real and synthetic halves,
per-half batch norm synchronised over the processes), backward, the gradients averaged over the processes
(``Dist.average_gradients``), a fused SGD step where the device has one. Medians over rounds; the all-reduce is
timed apart, on a step boundary. ``--phase inversion`` times model-inversion steps instead (batch ``--batch``),
split over the processes or the same on each (``engine.distributed_inversion``). On a 2-core CPU two processes
share the cores, so expect little speed-up there.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

import torch


def worker(args: argparse.Namespace) -> None:
    from dfcil.compute import distributed
    from dfcil.models.batchnorm import BNMode
    from dfcil.models.network import build_network

    dist = distributed.start(args.device)
    device = distributed.device_of(torch.device(args.device), dist)
    torch.manual_seed(0)
    net = build_network("resnet32").to(device)
    net.expand(40)
    if args.sync_bn:
        net.sync_batch_norm(dist)
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9, **({"fused": True} if device.type == "cuda" else {}))
    params = list(net.parameters())
    share = args.batch // dist.world
    x = torch.randn(2 * share, 3, 32, 32, device=device)  # real and synthetic halves
    y = torch.randint(0, 40, (2 * share,), device=device)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    if args.phase == "inversion":  # the generator's steps, split over the processes or the same on each
        from dfcil.compute.runtime import Runtime
        from dfcil.synthesis.inversion import InversionConfig, ModelInversion

        runtime = Runtime(device=device, dist=dist, split_inversion=args.sync_bn == 1, fused=device.type == "cuda")
        inv = ModelInversion(net.frozen_copy(40), InversionConfig(), 32, args.batch, torch.Generator(device), runtime)
        inv.generator.train()

    def step() -> float:
        if args.phase == "inversion":
            inv.train_step()
            return 0.0
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(net(x, bn=BNMode(splits=2)).logits, y).backward()
        sync()
        t0 = time.perf_counter()
        dist.average_gradients(params)
        sync()
        reduce = time.perf_counter() - t0
        opt.step()
        return reduce

    for _ in range(3):
        step()
    totals, reduces = [], []
    for _ in range(args.rounds):
        sync()
        t0 = time.perf_counter()
        reduce = sum(step() for _ in range(args.steps))
        sync()
        totals.append((time.perf_counter() - t0) / args.steps)
        reduces.append(reduce / args.steps)
    if dist.main:
        t, r = statistics.median(totals), statistics.median(reduces)
        print(f"RESULT {dist.world} {t * 1000:.2f} {r * 1000:.2f} {args.batch / t:.0f}", flush=True)
    distributed.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--procs", default="1,2", help="process counts to compare")
    p.add_argument("--batch", type=int, default=128, help="global batch of real images (as many synthetic)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--sync-bn", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--phase", default="rrl", choices=["rrl", "inversion"], help="which step to time")
    args = p.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    threads = os.cpu_count() or 1
    print(
        f"{args.device}, global batch {args.batch} real + {args.batch} synthetic, ResNet-32, torch {torch.__version__}"
    )
    what = {1: "global batch (sync_bn)", 0: "each process's share"}
    if args.phase == "inversion":
        what = {1: "split (engine.distributed_inversion)", 0: "same on every process"}
    print(f"{args.phase} steps")
    header = "BN statistics | ms / step | of which gradient all-reduce ms"
    if args.phase == "inversion":
        header = "inversion | ms / step | (all-reduces inside the step)"
    print(f"| processes | {header} | images / s | speed-up |")
    print("|---:|---|---:|---:|---:|---:|")
    base = None
    for k in (int(v) for v in args.procs.split(",")):
        for sync in (1, 0) if k > 1 else (1,):
            env = dict(os.environ, OMP_NUM_THREADS=str(max(1, threads // k)))
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(k), __file__,
                   "--worker", "--device", args.device, "--batch", str(args.batch), "--rounds", str(args.rounds),
                   "--steps", str(args.steps), "--sync-bn", str(sync), "--phase", args.phase]  # fmt: skip
            out = subprocess.run(cmd, env=env, capture_output=True, text=True)
            line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT")), None)
            bn = what[sync] if k > 1 else ""
            if line is None:
                print(f"| {k} | {bn} | failed: {out.stderr.strip().splitlines()[-1:]} | | | |")
                continue
            _, _, ms, reduce_ms, ips = line.split()
            base = base or float(ips)
            print(f"| {k} | {bn} | {ms} | {reduce_ms} | {ips} | {float(ips) / base:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
