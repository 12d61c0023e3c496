"""AdaGauss (Rypeść et al., NeurIPS 2024, "Task-recency bias strikes back"): a backbone trained on each task with CE,
feature distillation through a learned MLP distiller and an anti-collapse term; a Gaussian (mean, full covariance)
per class, carried into each new feature space by an MLP adapter; a Bayes (Mahalanobis) classifier over them
(docs/baselines.md, AdaGauss)."""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dfcil.config import MethodConfig, NonNegativeFloat, PositiveFloat, PositiveInt, TrainConfig, configclass
from dfcil.context import Task
from dfcil.errors import CheckpointError
from dfcil.losses.adagauss import anti_collapse, projected_distillation, small_batch
from dfcil.losses.classification import local_ce
from dfcil.losses.efc import rotation_batch
from dfcil.methods.adapter import AdapterConfig, AdapterDrift, BayesClassifier, mlp
from dfcil.methods.base import Batch, Phase, TaskContext, register_method
from dfcil.methods.lifecycle import TeacherMethod
from dfcil.methods.memory import ClassMemory, features_of
from dfcil.models.network import IncrementalNet

log = logging.getLogger("dfcil")


@configclass
class AdaGaussConfig(MethodConfig):
    name: str = "adagauss"
    lambda_kd: NonNegativeFloat = 10.0  # λ of the distilled MSE (the authors' --lamb)
    alpha: NonNegativeFloat = 1.0  # weight of the anti-collapse term, in training and in the adapter's fit
    beta: PositiveFloat = 1.0  # its clamp on the Cholesky diagonal
    ac_jitter: PositiveFloat = 1e-4  # a singular batch covariance is factored with this × its mean variance added
    multiplier: int = 32  # the distiller's hidden width, multiplier × d (the authors' --multiplier)
    rotation: bool = True  # first task: self-rotation labels, 4× the classes (the CIFAR script's --rotation)
    # with rotation, the first task's steps take train.batch_size // this images, each with its 3 rotations (the
    # authors' loader batch // 4: as many samples a step as later, 4x as many steps an epoch); 1: whole batches
    rotation_batch_divisor: PositiveInt = 4
    # the first epochs (this fraction of the task's, rounded down: 2 of 200) train the head and distiller only,
    # the backbone's features detached (the authors' int(nepochs · 0.01)): a phase of their own, "detached"
    detach_fraction: NonNegativeFloat = 0.01
    later_lr_scale: PositiveFloat = 0.1  # every task after the first: lr = train.lr × this (0.1 → 0.01)
    shrinkage: NonNegativeFloat = 3.0  # γ: Σ + γ·mean(diag Σ)·I in the classifier (the authors' shrink_cov(·, 3))
    normalize: bool = True  # L2-normalised features and means, correlation matrices (the script's --normalize)
    adapt: bool = True  # move the old Gaussians with the adapter after each task (False: they stay)
    adapter: AdapterConfig = dataclasses.field(default_factory=AdapterConfig)


@register_method(
    "adagauss",
    graph_safe=True,  # its step replays as a CUDA graph (checked by tests/test_graphs.py)
    static_head=True,  # the task's CE through the head's new-class mask when it is static
    stores="class statistics",
    distributed=False,  # the statistics and the adapter are computed by one process
    grad_clip_norm=1.0,  # the authors clip the norm of every step's gradient (network, heads, distiller) at 1
)
class AdaGauss(TeacherMethod):
    """AdaGauss (Rypeść et al., 2024): distilled features, anti-collapse; class Gaussians moved by an MLP adapter.

    Trains CE on the task's classes, λ·MSE(distiller(f), f_old) and the anti-collapse term; keeps each class's
    mean and covariance, moved by an MLP adapter after each task; classifies by Mahalanobis distance (Bayes).

    The first task trains with self-rotation labels (an auxiliary head for the rotated classes). Every later task
    trains CE over its own classes' logits, the MSE between a fresh MLP distiller of the features and the old
    model's features, and the anti-collapse term on the batch's features. After each task's training the old
    Gaussians are pushed through an adapter fitted from the old features to the new, then the task's classes get
    theirs (the plain images and their flips), and the classifier's precisions are recomputed.

    Each task's schedule is two phases on one optimiser (:func:`split_phase`): ``detached``, the first
    ``int(epochs · detach_fraction)`` epochs on detached features, then ``train``; so a step's graph never depends on
    the epoch. A checkpoint written inside a task by the earlier layout (one phase and an epoch counter in the
    method's state) past its detached epochs is refused: its position would fall in the wrong phase."""

    Config = AdaGaussConfig

    def __init__(self, cfg: AdaGaussConfig, train: TrainConfig) -> None:
        super().__init__(cfg, train)
        drift = AdapterDrift(cfg.adapter, cfg.alpha, cfg.beta) if cfg.adapt else None
        self.memory = ClassMemory(drift, covariances=True, augmented=False)
        self.bayes = BayesClassifier(cfg.shrinkage, cfg.normalize)
        self.classifier = self.bayes
        self.distiller: nn.Module | None = None  # the task's MLP distiller, d → multiplier·d → d (tasks > 0)
        self.rotation: nn.Linear | None = None  # the first task's auxiliary head, d → 3·n_new

    def phases(self, task: Task) -> list[Phase]:
        """The task's one schedule (every later task at ``later_lr_scale`` times the lr), cut after its first
        ``int(epochs · detach_fraction)`` epochs: ``detached``, then ``train``, each epoch at the lr it had."""
        if task.task_id == 0:
            whole = Phase.from_train("train", self.train)
        else:
            whole = Phase.from_train("train", self.train, lr=self.train.lr * self.cfg.later_lr_scale)
        return split_phase(whole, int(whole.epochs * self.cfg.detach_fraction), "detached")

    def batch_size(self, task: int) -> int:
        if task == 0 and self.cfg.rotation:
            return max(1, self.train.batch_size // self.cfg.rotation_batch_divisor)
        return self.train.batch_size

    def on_task_start(self, ctx: TaskContext) -> None:
        super().on_task_start(ctx)  # the frozen old model, from the second task on
        d = ctx.net.feature_dim
        if self.cfg.alpha > 0 and ctx.task_id == 0:  # said once; the later tasks' batches have no rotations
            batches = [("train.batch_size", self.train.batch_size)]
            batches += [("method.adapter.batch_size", self.cfg.adapter.batch_size)] if self.cfg.adapt else []
            for why in filter(None, (small_batch(size, d, key) for key, size in batches)):
                log.warning("adagauss: %s", why)
        with torch.no_grad():  # each task's head block as the authors' fresh nn.Linear (no bias here)
            block = _new_rows(ctx)
            block.copy_(_uniform(block.shape, 1 / math.sqrt(d), ctx))
        self.distiller = mlp(d, self.cfg.multiplier * d, ctx.device, ctx.rng) if ctx.task_id > 0 else None
        self.rotation = None
        if ctx.task_id == 0 and self.cfg.rotation:
            self.rotation = _rotation_head(d, ctx.n_new, ctx.device)
            with torch.no_grad():
                for p in self.rotation.parameters():
                    p.copy_(_uniform(p.shape, 1 / math.sqrt(d), ctx))

    def extra_modules(self, ctx: TaskContext) -> list[nn.Module]:
        return [m for m in (self.distiller, self.rotation) if m is not None]

    def training_step(self, net: IncrementalNet, batch: Batch, ctx: TaskContext, phase: Phase) -> dict[str, Tensor]:
        x, y = batch.x, batch.y
        if self.rotation is not None:  # task 0 (no old classes): the rotated classes' columns follow the head's
            x, y = rotation_batch(x, y, net.head.out_features)
        f = net(x).features.float()
        if phase.name == "detached":
            f = f.detach()  # the first epochs: head (and distiller) only
        logits = net.head(f)  # (B, n_seen), or (B, capacity) of a static head, the unseen columns masked
        if self.rotation is not None:
            ce = F.cross_entropy(torch.cat([logits, self.rotation(f)], dim=1).float(), y)
        else:  # the task's own classes' logits (the old ones' sliced off, or masked on a static head)
            ce = local_ce(logits, y, net.old_and_new(ctx.n_old)[1])
        terms = {"ce": ce}
        if self.distiller is not None and self.teacher.net is not None:
            with torch.no_grad():
                old = self.teacher(batch.x).features.float()
            terms["kd"] = self.cfg.lambda_kd * projected_distillation(self.distiller(f), old)
        if self.cfg.alpha > 0:
            terms["ac"] = self.cfg.alpha * anti_collapse(f, self.cfg.beta, self.cfg.ac_jitter)
        return terms

    def on_phase_end(self, ctx: TaskContext, phase: Phase) -> None:
        # after the task's last phase, with the old model: the old Gaussians adapted (once)
        if self.teacher.net is not None and phase == self.phases(ctx)[-1]:
            self.memory.compensate(ctx, self.teacher.net, None)

    @torch.no_grad()
    def on_task_end(self, ctx: TaskContext) -> None:
        # the task's classes: the plain training images and their horizontal flips, eval mode (the authors' 2N)
        batches = [(v, y) for x, y in ctx.data.plain() for v in (x, x.flip(3))]
        feats, labels = features_of(ctx.net, batches)
        self.memory.add(feats, labels, range(ctx.n_old, ctx.n_seen))
        self.bayes.refresh(self.memory)
        self.distiller = self.rotation = None
        super().on_task_end(ctx)  # the old model dropped

    def components(self) -> dict[str, Any]:
        return super().components() | {"memory": self.memory, "bayes": self.bayes}

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        for name in ("distiller", "rotation"):
            if (module := getattr(self, name)) is not None:
                state[name] = module.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any], ctx: TaskContext, static: dict[str, Any] | None = None) -> None:
        first = self.phases(ctx)[0]
        detached = first.epochs if first.name == "detached" else 0
        # the earlier layout's epoch counter, saved inside a task (with its distiller or rotation head)
        if ("distiller" in state or "rotation" in state) and state.get("epoch", 0) >= detached > 0:
            raise CheckpointError(
                f"this checkpoint was written inside task {ctx.task_id} after its {detached} detached epochs by a "
                f"dfcil whose AdaGauss trained them in the same phase as the rest: its position would fall in the "
                f"detached phase here; resume it with the dfcil that wrote it, or train the run again"
            )
        super().load_state_dict(state, ctx, static)  # the old model, the memory and the classifier
        d = ctx.net.feature_dim
        self.distiller = self.rotation = None
        if "distiller" in state:
            self.distiller = mlp(d, self.cfg.multiplier * d, ctx.device, None)
            self.distiller.load_state_dict(state["distiller"])
        if "rotation" in state:
            self.rotation = _rotation_head(d, ctx.n_new, ctx.device)
            self.rotation.load_state_dict(state["rotation"])


def split_phase(phase: Phase, epochs: int, name: str) -> list[Phase]:
    """``phase`` cut after its first ``epochs`` epochs: a phase ``name`` of those, then the rest under ``phase``'s
    name, starting at ``phase.lr_at(epochs)`` with the milestones after the cut shifted by it, so that every epoch
    keeps its lr; neither resets the optimiser (momentum carries over as within one phase). A part of no epochs is
    left out. Where milestones fall both before the cut and after it, a later epoch's lr is lr·γ^a·γ^b against the
    whole phase's lr·γ^(a+b): equal within a rounding."""
    k = min(epochs, phase.epochs)
    first = dataclasses.replace(phase, name=name, epochs=k, milestones=tuple(m for m in phase.milestones if m < k))
    rest = dataclasses.replace(
        phase, epochs=phase.epochs - k, lr=phase.lr_at(k), milestones=tuple(m - k for m in phase.milestones if m > k)
    )
    return [p for p in (first, rest) if p.epochs > 0]


def _new_rows(ctx: TaskContext) -> Tensor:
    """The head's weight rows of the task's classes, (n_new, d), to write in place: a growing head's newest block,
    a static head's rows of the task."""
    head = ctx.net.head
    return head.blocks[-1].weight if head.mask is None else head.table[ctx.n_old : ctx.n_seen]


def _rotation_head(d: int, n_new: int, device: torch.device) -> nn.Linear:
    """The first task's auxiliary rotation head, d → 3·n_new with a bias, left uninitialised."""
    return nn.utils.skip_init(nn.Linear, d, 3 * n_new, device=device)


def _uniform(shape: torch.Size, bound: float, ctx: TaskContext) -> Tensor:
    """U(−bound, bound) of ``shape`` from the method's stream, on the training device."""
    return (torch.rand(shape, generator=ctx.rng, device=ctx.device) * 2 - 1) * bound
