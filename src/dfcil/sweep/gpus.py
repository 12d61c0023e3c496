"""Where a sweep's local runs go: how many at once, and on which of the visible GPUs, from their free memory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence

from dfcil.sweep.plan import SweepRun

GPU_RUN_GIB = {64: 3.0}  # a run's GPU memory, estimated from its image size: small images, else LARGE_RUN_GIB
LARGE_RUN_GIB = 24.0
MAX_RUNS_PER_GPU = 6  # beyond about six small runs a card gains nothing (docs/experiments.md)


def free_gpu_memory() -> list[tuple[int, float]]:
    """``(index, free GiB)`` of each visible GPU, queried in a short child process (the sweep's own process never
    holds a CUDA context); empty without CUDA."""
    code = (
        "import json, torch\n"
        "n = torch.cuda.device_count() if torch.cuda.is_available() else 0\n"
        "print(json.dumps([torch.cuda.mem_get_info(i)[0] / 2**30 for i in range(n)]))\n"
    )
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
        free = json.loads(done.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return []
    return list(enumerate(free))


def run_gib(image_size: int) -> float:
    """Estimated GPU memory of one run of this image size."""
    return next((gib for size, gib in sorted(GPU_RUN_GIB.items()) if image_size <= size), LARGE_RUN_GIB)


def default_jobs(runs: Sequence[SweepRun], gpus: Sequence[tuple[int, float]]) -> tuple[int, str]:
    """How many runs to start at once, and why: one on the CPU; on GPUs as many as fit in free memory, at most
    ``MAX_RUNS_PER_GPU`` per card."""
    if not gpus or not any(uses_gpu(r) for r in runs):
        return 1, "one run at a time on the CPU (--jobs K to change; each run then gets cores/K threads)"
    need = max(run_gib(r.image_size) for r in runs)
    jobs = max(1, min(len(runs), sum(_capacity(gpus, need))))
    each = ", ".join(f"GPU {i}: {free:.0f} GiB free" for i, free in gpus)
    return jobs, f"{jobs} at once ({each}; about {need:g} GiB per run, at most {MAX_RUNS_PER_GPU} per GPU)"


def _capacity(gpus: Sequence[tuple[int, float]], need: float) -> list[int]:
    """Runs of ``need`` GiB that fit on each card (at most ``MAX_RUNS_PER_GPU``)."""
    return [min(MAX_RUNS_PER_GPU, int(free // need)) for _, free in gpus]


def placement(gpus: Sequence[tuple[int, float]], need: float, jobs: int) -> list[int]:
    """The card (index among the visible ones) of each of ``jobs`` slots: cards filled in turn up to their
    capacity, so that a nearly full card gets no run while another has room; beyond every card's capacity (an
    explicit ``--jobs``), round-robin over all of them."""
    left = _capacity(gpus, need)
    slots: list[int] = []
    while len(slots) < jobs and any(left):
        for k, (i, _) in enumerate(gpus):
            if left[k] and len(slots) < jobs:
                slots.append(i)
                left[k] -= 1
    while len(slots) < jobs:
        slots.append(gpus[len(slots) % len(gpus)][0])
    return slots


def visible_device(index: int) -> str:
    """The ``CUDA_VISIBLE_DEVICES`` entry of the ``index``-th GPU this process sees (its own list, if it has one:
    indices count within it)."""
    mine = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    return mine[index] if index < len(mine) else str(index)


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))  # what this process may use (taskset, SLURM, containers)
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def uses_gpu(run: SweepRun) -> bool:
    return str(run.config.get("device", "auto")) in ("auto", "cuda")
