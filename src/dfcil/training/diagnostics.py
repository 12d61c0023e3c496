"""Inversion diagnostics: after each task's model inversion, statistics of a fresh synthetic batch as the frozen old
model sees it, recorded with the task (``diagnostics.inversion`` of its ``metrics.jsonl`` record and of
``summary.json``); ``dfcil inspect RUN --synthetic`` prints and plots them beside the synthetic grids
(:mod:`dfcil.analysis.inversions`).

* ``confidence``: the teacher's mean top-1 softmax probability on the synthetic images;
* ``coverage``, ``entropy``, ``counts``: how its predicted classes spread over the old classes;
* ``loss_terms``: the inversion's weighted loss terms at its last step;
* ``pixels`` against ``data_pixels``: the synthetic images' per-channel mean and std, and the dataset's;
* ``feature_gap``: the distance between the synthetic and the real class means in the teacher's feature space,
  relative to the spacing of the real class means, and the share of classes whose synthetic mean is nearest to
  their own real one. The real images are the test set's old classes: for diagnosis only, never for training.

The synthetic batch's latent codes come from a stream of their own (seeded by the run's seed and the task), and
the generator and the teacher are only read: a run with diagnostics is the run without them (tested). How to read
the numbers: ``docs/diagnostics.md``.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch
from torch import Tensor

from dfcil.errors import NonFiniteLossError
from dfcil.synthesis.diagnostics import class_mean_gap, pixel_statistics, prediction_spread, top1_confidence
from dfcil.training.loop import Callback, Loop

log = logging.getLogger("dfcil")

REAL_PER_CLASS = 50  # real test images per old class for the feature-space comparison, at most


def diagnostics_seed(seed: int, task: int) -> int:
    """The seed of task ``task``'s diagnostic latents in a run seeded ``seed``: a stream of its own (< 2**63)."""
    state = np.random.SeedSequence([seed, task, 0x64696167]).generate_state(2, np.uint32)  # 0x64696167: "diag"
    return (int(state[0]) << 31) ^ int(state[1])


def synthetic_batch_size(n_old: int, image_size: int) -> int:
    """Images drawn for the statistics: 20 per old class, at least 256 and at most 2048 (512 above 64 pixels)."""
    return min(2048 if image_size <= 64 else 512, max(256, 20 * n_old))


@torch.no_grad()
def _synthetic(generator: torch.nn.Module, n: int, seed: int, batch: int) -> Tensor:
    """``n`` images of ``generator`` (eval mode), latents from a stream of their own seeded ``seed``, drawn at once
    and decoded ``batch`` at a time (eval-mode BN: the same images as in one pass); on the CPU."""
    device = next(generator.parameters()).device
    z = torch.randn(n, generator.zdim, generator=torch.Generator(device=device).manual_seed(seed), device=device)
    was_training = generator.training
    generator.eval()
    try:
        return torch.cat([generator(z[i : i + batch]).float().cpu() for i in range(0, n, batch)])
    finally:
        generator.train(was_training)


@torch.no_grad()
def _teacher_outputs(loop: Loop, teacher: torch.nn.Module, x: Tensor, uint8: bool = False) -> tuple[Tensor, Tensor]:
    """The teacher's logits and features of ``x`` (normalised images on the CPU, or the test set's uint8 images
    on the device, normalised here), in the run's evaluation batches and precision."""
    logits, features, batch, device = [], [], loop.evaluator.batch_size, loop.runtime.device
    with loop.runtime.autocast():
        for i in range(0, len(x), batch):
            part = loop.evaluator.test.normalizer(x[i : i + batch]) if uint8 else x[i : i + batch].to(device)
            out = teacher(part)
            logits.append(out.logits.float().cpu())
            features.append(out.features.float().cpu())
    return torch.cat(logits), torch.cat(features)


def _real_old_classes(loop: Loop, n_old: int) -> tuple[Tensor, Tensor]:
    """The test set's uint8 images of the old classes (at most :data:`REAL_PER_CLASS` each) and their labels."""
    test = loop.evaluator.test
    y = test.y[: int(test.seen[loop.state.position.task - 1])]  # sorted by label: the old classes' images first
    first = torch.searchsorted(y, torch.arange(n_old, device=y.device))
    rank = torch.arange(len(y), device=y.device) - first[y]
    keep = torch.nonzero(rank < REAL_PER_CLASS).squeeze(1)
    return test.x[keep], y[keep].cpu()


def inversion_report(loop: Loop, seed: int) -> dict[str, Any] | None:
    """The running task's inversion statistics (its synthetic batch drawn from a stream of the run's ``seed``), or
    None where the method inverted no generator for it."""
    replay = loop.method.synthesizer()
    generator = replay.trained_generator if replay is not None else None
    if generator is None or loop.ctx is None:
        return None
    n_old, dataset, batch = loop.ctx.n_old, loop.protocol.dataset, loop.evaluator.batch_size
    n = synthetic_batch_size(n_old, dataset.image_size)
    x = _synthetic(generator, n, diagnostics_seed(seed, loop.ctx.task_id), batch)
    logits, features = _teacher_outputs(loop, replay.teacher, x)
    for values, what in ((x, "images"), (logits, "logits"), (features, "features")):
        if not bool(torch.isfinite(values).all()):  # a generator no step should train on: stop, as a loss would
            raise NonFiniteLossError(
                f"task {loop.ctx.task_id}: the inverted generator's {what} (the old model's, of its images) are not "
                f"finite, though its loss terms were: lower method.inversion.lr; no checkpoint of it was written"
            )
    pred = logits.argmax(dim=1)
    real_x, real_y = _real_old_classes(loop, n_old)
    _, real_features = _teacher_outputs(loop, replay.teacher, real_x, uint8=True)
    return {
        "images": len(x),
        "old_classes": n_old,
        "confidence": round(top1_confidence(logits), 4),
        **{k: (round(v, 4) if isinstance(v, float) else v) for k, v in prediction_spread(pred, n_old).items()},
        "loss_terms": replay.final_terms,
        "pixels": pixel_statistics(x, dataset.mean, dataset.std),
        "data_pixels": {"mean": [round(v, 4) for v in dataset.mean], "std": [round(v, 4) for v in dataset.std]},
        "feature_gap": {
            k: (round(v, 4) if isinstance(v, float) else v)
            for k, v in class_mean_gap(features, pred, real_features, real_y, n_old).items()
        },
    }


class InversionDiagnostics(Callback):
    """Measures :func:`inversion_report` when a task's inversion ends (``on_setup_end``) and logs it in one line.
    Its own state, which the checkpoint of that point keeps for a resumed run: every finished task's diagnostics
    and the running task's. Each task's record gets its ``diagnostics`` (``{}`` without an inversion), the summary
    every task's.

    Args:
        seed: the run's, from which each task's synthetic batch is drawn (a stream of its own).
    """

    state_key = "diagnostics"

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.tasks: list[dict[str, Any]] = []  # finished tasks' diagnostics
        self.task: dict[str, Any] = {}  # the running task's

    def state_dict(self) -> dict[str, Any]:
        return {"tasks": self.tasks, "task": self.task}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.tasks, self.task = list(state.get("tasks", [])), dict(state.get("task", {}))

    def on_eval_end(self) -> None:
        self.tasks.append(self.task)  # the task is trained: what was measured of it is final
        self.task = {}

    def task_fields(self, task: int) -> dict[str, Any]:
        return {"diagnostics": self.tasks[task]} if task < len(self.tasks) else {}

    def summary_fields(self) -> dict[str, Any]:
        return {"diagnostics": self.tasks}

    def on_run_start(self, loop: Loop) -> None:
        self.loop = loop

    def on_setup_end(self) -> None:
        report = inversion_report(self.loop, self.seed)
        if report is None:
            return
        self.task["inversion"] = report
        gap = report["feature_gap"]
        log.info(
            "task %d inversion: teacher confidence %.2f, %d of %d old classes predicted (entropy %.2f), synthetic "
            "class means %.2f of the real classes' spacing from the real ones (%.0f%% nearest their own)",
            self.loop.ctx.task_id, report["confidence"], sum(c > 0 for c in report["counts"]), report["old_classes"],
            report["entropy"], gap["distance"], 100 * gap["nearest_own"],
        )  # fmt: skip
