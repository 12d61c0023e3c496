"""DPCR (He et al., ICML 2025): LwF's training, then after every task the stored class statistics moved by the dual
projection (task-wise ridge map, class-wise row-space projection) and a ridge-regression head reconstructed in closed
form from them (docs/baselines.md, DPCR)."""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import Tensor

from dfcil.config import NonNegativeFloat, PositiveFloat, PositiveInt, configclass
from dfcil.context import Task
from dfcil.methods.base import Phase, TaskContext, register_method
from dfcil.methods.lwf import LwF, LwFConfig
from dfcil.methods.memory import ClassMemory, DriftConfig, features_of
from dfcil.methods.projection import DualProjectionDrift, RidgeClassifier


@configclass
class FirstTaskSchedule:
    """The first task's own SGD schedule (the authors' code trains it longer, at a higher lr, than later tasks)."""

    epochs: PositiveInt = 200
    lr: PositiveFloat = 0.1
    milestones: tuple[PositiveInt, ...] = (60, 120, 160)  # lr × train.gamma at these epochs
    weight_decay: NonNegativeFloat = 0.0005


@configclass
class DPCRConfig(LwFConfig):
    name: str = "dpcr"
    lambda_kd: NonNegativeFloat = 10.0  # the authors' lamda (CIFAR-100, Tiny-ImageNet as their code runs)
    temperature: PositiveFloat = 2.0  # T, no T² factor
    head: Literal["linear", "cosine"] = "cosine"  # the trained head: PyCIL's cosine head (σ·cos, one learned σ)
    ce: Literal["seen", "local"] = "local"  # later tasks: CE over the new task's logits only
    gamma: PositiveFloat = 200.0  # γ of the ridge head (the authors' rg: 200 CIFAR-100, 2000 Tiny, ImageNet-100)
    task_ridge: PositiveFloat = 1e-9  # ridge of the task-wise map, absolute (the authors' rg_tssp)
    rank_tol: NonNegativeFloat = 0.0  # class projector keeps singular values > rank_tol·max (0: the authors' S > 0)
    # the ablation's switches: both projections off is the ridge head alone on statistics that stay where they were
    task_projection: bool = True  # move the old statistics by the task-wise map
    class_projection: bool = True  # ... restricted per class to its row space (needs task_projection)
    normalize: bool = True  # L2-normalise every class column of the ridge head
    first: FirstTaskSchedule | None = None  # the first task's schedule; None: train's, as every later task

    def __post_init__(self) -> None:
        if self.ldc or self.drift != DriftConfig():
            raise ValueError(
                "method.ldc and method.drift are LwF's LDC means; dpcr keeps its own statistics and moves them by "
                "its dual projection: drop method.ldc and method.drift (method.task_projection, "
                "method.class_projection set the drift)"
            )
        if self.class_projection and not self.task_projection:
            raise ValueError(
                "method.class_projection without method.task_projection moves nothing (a class's statistics lie in "
                "its own row space): set method.task_projection: true, or method.class_projection: false"
            )


@register_method(
    "dpcr",
    head="cosine",
    stores="class statistics",
    distributed=False,  # the statistics and the head are computed by one process
    graph_safe=True,  # its step is LwF's, which replays as a CUDA graph (checked by tests/test_graphs.py)
    static_head=True,  # LwF's step, through the head's masks; the ridge head scores from the features alone
)
class DPCR(LwF):
    """DPCR (He et al., 2025): LwF; class means and Gram matrices moved by a dual projection; a rebuilt ridge head.

    Trains as LwF (local CE + KD, cosine head). After each task's training the stored class statistics (mean,
    covariance and count: the uncentred Gram matrix Φ_c) are moved by the task-wise map and each class's row-space
    projector, the task's classes get their statistics, and the head that scores every class at evaluation is the
    closed-form ridge regression on all of them, its class columns L2-normalised."""

    Config = DPCRConfig

    def __init__(self, cfg: DPCRConfig, train) -> None:
        super().__init__(cfg, train)  # LwF's teacher; no LDC memory (method.ldc is refused)
        self.ridge = RidgeClassifier(cfg.gamma, cfg.normalize)
        drift = None
        if cfg.task_projection:
            counts = lambda: self.ridge.counts  # noqa: E731 - the counts the head keeps, read at each move
            drift = DualProjectionDrift(cfg.task_ridge, cfg.rank_tol, True, cfg.class_projection, counts)
        # statistics of the plain images at the end of each class's task (the authors': test transform, eval mode)
        self.memory = ClassMemory(drift, covariances=True, augmented=False)
        self.classifier = self.ridge

    def phases(self, task: Task) -> list[Phase]:
        f = self.cfg.first
        if task.task_id == 0 and f is not None:
            schedule = {
                "epochs": f.epochs,
                "lr": f.lr,
                "milestones": tuple(f.milestones),
                "weight_decay": f.weight_decay,
            }
            return [Phase.from_train("train", self.train, **schedule)]
        return super().phases(task)

    def components(self) -> dict[str, Any]:
        return super().components() | {"ridge": self.ridge}  # teacher, memory (LwF's) and the head

    # on_phase_end is LwF's: after training, with the old model, the memory's drift moves the old statistics

    @torch.no_grad()
    def on_task_end(self, ctx: TaskContext) -> None:
        feats, labels = augmented_features(ctx)  # the head's terms of the task's classes (one augmented pass)
        self.ridge.add_counts(ctx.data.y, range(ctx.n_old, ctx.n_seen))
        super().on_task_end(ctx)  # the task's classes' statistics (plain images); the old model dropped
        self.ridge.fit(self.memory, ctx.n_old, feats, labels, ctx.n_seen)


def augmented_features(ctx: TaskContext) -> tuple[Tensor, Tensor]:
    """The features (N, d) and labels (N,) of every training image of the task once, with the training augmentation
    drawn from the method's stream, through the network in eval mode."""
    data, step = ctx.data, 500
    views = data.views(step, ctx.rng)
    idx = torch.arange(len(data.x), device=data.x.device)
    feats, labels = features_of(ctx.net, (views.load(idx[i : i + step]) for i in range(0, len(idx), step)))
    return feats, labels
