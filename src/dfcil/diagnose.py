"""Inversion diagnostics: after each task's model inversion, statistics of a fresh synthetic batch as the frozen old
model sees it, recorded with the task (``diagnostics.inversion`` of its ``metrics.jsonl`` record and of
``summary.json``); ``dfcil inspect RUN --synthetic`` prints and plots them beside the synthetic grids.

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

import json
import logging
import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from dfcil.errors import ConfigError, MissingExtraError, NonFiniteLossError
from dfcil.extras import require
from dfcil.grid import synthetic_images_path
from dfcil.io import read_regular_text
from dfcil.loop import Callback, Loop
from dfcil.synthesis.diagnostics import class_mean_gap, pixel_statistics, prediction_spread, top1_confidence

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


# ------------------------------------------------------------------------------------------- dfcil inspect


def read_diagnostics(run_dir: str | os.PathLike) -> list[tuple[int, dict[str, Any]]]:
    """``(task, inversion statistics)`` of every task of a run that has them: from ``summary.json``, or, for an
    unfinished run, from the task records of ``metrics.jsonl``."""
    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").exists():
        raise ConfigError(f"{run_dir} is not a dfcil run directory (no config.yaml)")
    try:
        if (run_dir / "summary.json").exists():
            per_task = json.loads(read_regular_text(run_dir / "summary.json")).get("diagnostics") or []
        else:
            metrics = run_dir / "metrics.jsonl"
            lines = read_regular_text(metrics).splitlines() if metrics.exists() else []
            records = [json.loads(line) for line in lines if line.strip()]
            per_task = [r.get("diagnostics") or {} for r in records if r.get("type") == "task"]
    except (OSError, ValueError, AttributeError) as err:
        raise ConfigError(f"the records of {run_dir} cannot be read ({err}); they are damaged") from None
    found = [(t, d["inversion"]) for t, d in enumerate(per_task) if isinstance(d, dict) and d.get("inversion")]
    if not found:
        raise ConfigError(
            f"{run_dir} has no inversion diagnostics: its method inverts no generator, it has not finished a task "
            f"after its first, or dfcil recorded none when it ran (versions before them)"
        )
    return found


def format_diagnostics(found: list[tuple[int, dict[str, Any]]]) -> str:
    """The table ``dfcil inspect --synthetic`` prints: one line per task."""
    terms = sorted({k for _, d in found for k in (d.get("loss_terms") or {})})
    head = ["task", "old", "confidence", "coverage", "entropy", "gap", "nearest own", *terms, "pixel mean (data)"]
    rows = []
    for task, d in found:
        gap, px, data = d["feature_gap"], d["pixels"], d["data_pixels"]
        means = "/".join(f"{m:.2f}" for m in px["mean"]) + " (" + "/".join(f"{m:.2f}" for m in data["mean"]) + ")"
        rows.append([
            str(task), str(d["old_classes"]), f"{d['confidence']:.3f}", f"{d['coverage']:.2f}", f"{d['entropy']:.3f}",
            _num(gap["distance"]), _num(gap["nearest_own"]),
            *[_num((d.get("loss_terms") or {}).get(k)) for k in terms], means,
        ])  # fmt: skip
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(head, widths, strict=True))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(lines)


def _num(v: float | None) -> str:
    return "—" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.3f}"


def plot_diagnostics(run_dir: Path, found: list[tuple[int, dict[str, Any]]], out_dir: Path) -> list[Path]:
    """``synthetic_diagnostics.png`` and ``.pdf`` in ``out_dir``: the statistics per task, and each task's
    synthetic grid (``synthetic_task<t>.png``) below them."""
    figure = require("matplotlib.figure", "plot", "dfcil inspect --synthetic", "matplotlib")
    image = require("matplotlib.image", "plot", "dfcil inspect --synthetic", "matplotlib")
    grids = [(t, p) for t, _ in found if (p := synthetic_images_path(run_dir, t)).exists()]
    cols = max(len(grids), 1)
    fig = figure.Figure(figsize=(max(8.0, 2.6 * cols), 7.5 if grids else 4.0), layout="constrained")
    rows = fig.subfigures(2 if grids else 1, 1, height_ratios=[1.1, 1] if grids else None)
    top = rows[0] if grids else rows
    ax = top.subplots()
    tasks = [t for t, _ in found]
    for key, label in (("confidence", "teacher confidence"), ("coverage", "class coverage"), ("entropy", "entropy")):
        ax.plot(tasks, [d[key] for _, d in found], marker="o", label=label)
    ax.plot(tasks, [d["feature_gap"]["distance"] for _, d in found], marker="s", label="class-mean gap")
    ax.plot(tasks, [d["feature_gap"]["nearest_own"] for _, d in found], marker="^", label="nearest own class")
    ax.set(xlabel="task", title=f"{run_dir.name}: inversion diagnostics", xticks=tasks)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncols=3)
    if grids:
        axes = np.atleast_1d(rows[1].subplots(1, cols))
        for a, (task, path) in zip(axes, grids, strict=True):
            a.imshow(image.imread(path))
            a.set_title(f"task {task}", fontsize=9)
            a.axis("off")
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / "synthetic_diagnostics.png", out_dir / "synthetic_diagnostics.pdf"]
    for path in paths:
        fig.savefig(path, dpi=130)
    return paths


def inspect_synthetic(
    run_dir: str | os.PathLike, out_dir: str | os.PathLike | None = None
) -> tuple[str, list[Path], str | None]:
    """``dfcil inspect RUN --synthetic``: the table of every task's inversion statistics, its figure (default in
    ``<run>/inspect``), and, where matplotlib is missing, why there is no figure (the table needs nothing)."""
    found = read_diagnostics(run_dir)
    out = Path(out_dir) if out_dir is not None else Path(run_dir) / "inspect"
    try:
        return format_diagnostics(found), plot_diagnostics(Path(run_dir), found, out), None
    except MissingExtraError as err:
        return format_diagnostics(found), [], f"no figure: {err}"
