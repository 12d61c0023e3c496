"""APR (Honda, WACV 2026, "Adversarial Pseudo-replay for Exemplar-free Class-incremental Learning"): LwF's losses,
with the KD also on pseudo-images of the old classes made online from the task's own images; class prototypes and
covariances moved after each task by adversarial drift compensation; a Mahalanobis classifier (docs/baselines.md,
APR)."""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import torch
from torch import Tensor

from dfcil.config import MethodConfig, NonNegativeFloat, PositiveFloat, PositiveInt, TrainConfig, configclass
from dfcil.context import Task
from dfcil.losses.classification import local_ce
from dfcil.losses.distillation import kd_soft_ce
from dfcil.methods.adapter import BayesClassifier
from dfcil.methods.adversarial import AdversarialDrift, AdversarialDriftConfig, PseudoReplay, PseudoReplayConfig
from dfcil.methods.base import Batch, Phase, TaskContext, register_method
from dfcil.methods.dpcr import FirstTaskSchedule
from dfcil.methods.lifecycle import TeacherMethod
from dfcil.methods.memory import ClassMemory, NearestMeanClassifier
from dfcil.models.network import IncrementalNet


@configclass
class APRFirstTask(FirstTaskSchedule):
    """The first task's own schedule and batch (the authors' ``init_optimizer``, ``init_scheduler``, 64 images)."""

    batch_size: PositiveInt | None = None  # real images a step in the first task; None: train.batch_size


@configclass
class APRConfig(MethodConfig):
    name: str = "apr"
    lambda_kd: NonNegativeFloat = 10.0  # the KD's weight (kd_lambda)
    temperature: PositiveFloat = 2.0  # T, no T² factor
    pseudo_replay: bool = True  # KD on perturbed pseudo-images of the old classes too (do_apr)
    replay: PseudoReplayConfig = dataclasses.field(default_factory=PseudoReplayConfig)
    adc: bool = True  # move the old prototypes and covariances after each task (do_adc); false: they stay
    drift: AdversarialDriftConfig = dataclasses.field(default_factory=AdversarialDriftConfig)
    # what classifies at evaluation: the Mahalanobis distance to each class's statistics (the authors' headline), the
    # nearest prototype (NCM), or the trained cosine head ("Linear")
    classifier: Literal["mahalanobis", "ncm", "linear"] = "mahalanobis"
    shrinkage: NonNegativeFloat = 24.0  # γ1 = γ2 of FeCAM's shrinkage (gamma1_eval: 24 CIFAR-100, 40 Tiny, ImageNet)
    normalize: bool = True  # covariances taken as correlation matrices (protos.normalize)
    first: APRFirstTask | None = None  # the first task's schedule and batch; None: train's, as every later task


@register_method(
    "apr",
    head="cosine",  # the authors' split cosine head: one σ-scaled cosine classifier over every seen class
    stores="class statistics",
    distributed=False,  # the candidates, the attacks and the statistics are computed by one process
)
class APR(TeacherMethod):
    """APR (Honda, 2026): LwF with online adversarial pseudo-replay; ADC-moved class statistics, Mahalanobis head.

    Every task but the first trains CE over the new task's logits of the real batch plus λ·soft KD (T = 2) of the old
    model's logits over the real batch and a batch of pseudo-images: candidates from the task's own images nearest
    each old prototype, moved at every step by a few gradient steps through the old model toward a noisy prototype
    (:class:`~dfcil.methods.adversarial.PseudoReplay`). After the training the old classes' prototypes and covariances
    are moved by ADC (:class:`~dfcil.methods.adversarial.AdversarialDrift`), then the task's classes get theirs (the
    plain training images in eval mode); the shrunk, normalised Mahalanobis distance classifies from the first task
    on (or the nearest prototype, or the cosine head: ``classifier``)."""

    Config = APRConfig

    def __init__(self, cfg: APRConfig, train: TrainConfig) -> None:
        super().__init__(cfg, train)
        drift = AdversarialDrift(cfg.drift) if cfg.adc else None
        self.memory = ClassMemory(drift, covariances=True, augmented=False)
        self.replay = PseudoReplay(cfg.replay) if cfg.pseudo_replay else None
        self.bayes = None
        if cfg.classifier == "mahalanobis":  # FeCAM's shrinkage once, a correlation matrix, its pseudo-inverse
            self.bayes = BayesClassifier(cfg.shrinkage, cfg.normalize, offdiag=cfg.shrinkage, pseudo_inverse=True)
        self.classifier = {"mahalanobis": self.bayes, "ncm": NearestMeanClassifier(self.memory)}.get(cfg.classifier)

    def phases(self, task: Task) -> list[Phase]:
        f = self.cfg.first
        if task.task_id == 0 and f is not None:  # DPCR's first-task schedule, with train's gamma and momentum
            schedule = {"epochs": f.epochs, "lr": f.lr, "milestones": tuple(f.milestones)}
            return [Phase.from_train("train", self.train, **schedule, weight_decay=f.weight_decay)]
        return super().phases(task)

    def batch_size(self, task: int) -> int:
        first = self.cfg.first
        return first.batch_size if task == 0 and first is not None and first.batch_size else self.train.batch_size

    def end_units(self, task: Task) -> int:
        return max(1, task.n_old) if self.cfg.adc else 1  # ADC attacks every old class's images

    def on_task_start(self, ctx: TaskContext) -> None:
        super().on_task_start(ctx)  # the frozen old model, from the second task on
        if self.replay is not None and self.teacher.net is not None:
            self.replay.begin(ctx, self.teacher.net, self.memory.means, self.memory.covs)

    def training_step(self, net: IncrementalNet, batch: Batch, ctx: TaskContext, phase: Phase) -> dict[str, Tensor]:
        x, old = batch.x, self.teacher.net
        if old is not None and self.replay is not None:  # the pseudo-images ride along, in one train-mode pass
            x = torch.cat([x, self.replay.sample(ctx, old)])
        logits = net(x).logits
        n_old, new = net.old_and_new(ctx.n_old)
        terms = {"ce": local_ce(logits[: len(batch.x)], batch.y, new)}  # the real images' new classes only
        if old is not None:
            terms["kd"] = self.cfg.lambda_kd * kd_soft_ce(logits, self.teacher.logits(x), self.cfg.temperature, n_old)
        return terms

    def on_phase_end(self, ctx: TaskContext, phase: Phase) -> None:
        if self.teacher.net is not None and phase == self.phases(ctx)[-1]:  # after training, with the old model
            self.memory.compensate(ctx, self.teacher.net, None)

    @torch.no_grad()
    def on_task_end(self, ctx: TaskContext) -> None:
        self.memory.add_classes(ctx)  # the new classes' prototypes and covariances, plain images, eval mode
        if self.bayes is not None:
            self.bayes.refresh(self.memory)
        if self.replay is not None:
            self.replay.end()
        super().on_task_end(ctx)  # the old model dropped

    def components(self) -> dict[str, Any]:
        parts = super().components() | {"memory": self.memory}
        parts |= {"replay": self.replay} if self.replay is not None else {}
        return parts | ({"bayes": self.bayes} if self.bayes is not None else {})
