"""Operators dispatched per training step of each R-DFCIL phase: what a CUDA graph replays in one launch.

    python benchmarks/archive/op_count.py [--batch 128] [--fast teacher|all]

Counts the aten operators of one step (forward, loss terms, backward, optimiser update) after a warm-up step,
with ResNet-32 on the CPU, for the eager engine (``engine.cuda_graphs: off``) and what stays eager under ``on``:
copying the batch's indices into the graph's buffer and the step's loss terms into the epoch's record. On a GPU
each operator is at least one kernel launch plus its Python and dispatcher overhead, which is what bounds ResNet-32
steps in eager mode (docs/notes/measurements.md).
"""

from __future__ import annotations

import argparse
import collections
from unittest import mock

import torch
from speed import build, steps_for
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
from torch.utils._python_dispatch import TorchDispatchMode

from dfcil.models import batchnorm

PHASES = ("task0", "inversion", "rrl", "chr")


class Count(TorchDispatchMode):
    """Operators by name, those inside ``optimizer.step`` apart (the CPU's per-parameter loop; on CUDA the engine
    uses the fused kernels)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter[str] = collections.Counter()
        self.kernels = 0  # operators that compute (not views, not bare allocations): at least one kernel each
        self.optimizer_ops = 0
        self.in_optimizer = False

    def __enter__(self):  # noqa: ANN204
        self.hooks = [
            register_optimizer_step_pre_hook(lambda *_: setattr(self, "in_optimizer", True)),
            register_optimizer_step_post_hook(lambda *_: setattr(self, "in_optimizer", False)),
        ]
        return super().__enter__()

    def __exit__(self, *args):  # noqa: ANN002, ANN204
        for h in self.hooks:
            h.remove()
        return super().__exit__(*args)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        name = func.overloadpacket.__name__
        if self.in_optimizer:
            self.optimizer_ops += 1
        else:
            self.ops[name] += 1
            self.kernels += not (func.is_view or name in ("empty", "empty_like", "empty_strided", "detach"))
        return func(*args, **(kwargs or {}))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--fast", choices=["all", "teacher"], default="all", help="merge_passes of the fast path")
    p.add_argument("--top", type=int, default=0, help="also list the most frequent operators")
    args = p.parse_args(argv)
    device = torch.device("cpu")
    print(f"ResNet-32, batch {args.batch}, n_old 20, n_new 20, torch {torch.__version__}")
    print("Operators per step, model and losses (forward and backward) + optimiser update on the CPU;")
    print("'compute': the model-and-loss operators that are not views or bare allocations")
    print("| phase | reference (separate passes, hooks) | fast path | fast path under cuda_graphs: on |")
    print("|---|---:|---:|---:|")
    counts = {}
    cuda_path = mock.patch.object(batchnorm, "_TWO_PASS_DEVICES", frozenset())  # batch_moments: one var_mean
    for label, merge, hooks in (("reference", "none", True), ("fast", args.fast, False)):
        steps = steps_for(build(device, args.batch, 20, 20, merge, "fp32", False), hooks)
        for phase in PHASES:
            with cuda_path:
                steps[phase]()  # warm-up: lazy optimiser state
                with Count() as c:
                    steps[phase]()
            counts[(label, phase)] = c
    for phase in PHASES:
        eager_under_graphs = 0 if phase == "inversion" else 2  # copies: indices in, loss terms out to the epoch
        ref, fast = counts[("reference", phase)], counts[("fast", phase)]
        cells = [f"{sum(c.ops.values())} + {c.optimizer_ops}" for c in (ref, fast)]
        print(f"| {phase} | {cells[0]} | {cells[1]} ({fast.kernels} compute) | 1 replay + {eager_under_graphs} |")
    if args.top:
        for phase in PHASES:
            print(phase, counts[("fast", phase)].ops.most_common(args.top))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
