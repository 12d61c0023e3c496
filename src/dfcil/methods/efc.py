"""EFC (Magistri et al., ICLR 2024): Elastic Feature Consolidation. The backbone keeps learning, its feature drift
is penalised only along the directions the classifier is sensitive to (the Empirical Feature Matrix), and the heads
are trained on real new images mixed with features sampled from drifting Gaussians of the old classes
(docs/baselines.md, EFC)."""

from __future__ import annotations

import math
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dfcil.config import MethodConfig, NonNegativeFloat, PositiveFloat, PositiveInt, TrainConfig, configclass
from dfcil.context import Task
from dfcil.losses.efc import balanced_counts, efm_penalty, empirical_feature_matrix, rotation_batch
from dfcil.losses.prototypes import balanced_labels, sample_gaussians
from dfcil.methods.base import Batch, Phase, TaskContext, register_method
from dfcil.methods.lifecycle import TeacherMethod
from dfcil.methods.memory import ClassMemory, KernelDrift
from dfcil.models.network import IncrementalNet


@configclass
class EFCConfig(MethodConfig):
    name: str = "efc"
    lambda_efm: NonNegativeFloat = 10.0  # λ: weight of the EFM in the regulariser's metric λ·E + η·I
    eta: NonNegativeFloat = 0.1  # η: isotropic damping of that metric, the only pull outside E's span
    drift: bool = True  # move the old class means at each task's end by the EFM-weighted kernel drift
    sigma: PositiveFloat = 0.2  # σ of the drift kernel, on min-max normalised distances (so unitless)
    jitter: NonNegativeFloat = 1e-5  # added to each class covariance's diagonal before sampling
    proto_batch: PositiveInt = 64  # Gaussian samples per step at most; the first step of a task uses this many
    # How the asymmetric CE's batch splits into old (sampled) and new (buffered real) items: train.batch_size
    # class slots drawn over the seen classes. "faithful": EFC's code, which pads a shuffled list of the K seen
    # classes with a copy of itself cut to batch_size − K, so the batch has 2K items when 2K < batch_size;
    # "clean": always batch_size slots, covering the classes as evenly as possible
    balanced_batch: Literal["faithful", "clean"] = "faithful"
    rotation: bool = True  # first task: self-rotation labels (4× the images, an auxiliary 3·n_new head)
    # Initialisation of each new head block: "uniform" U(−1/√d, 1/√d), nn.Linear's default (EFC's heads);
    # "normal": dfcil's N(0, model.head_init_std²)
    head_init: Literal["uniform", "normal"] = "uniform"
    first_lr: PositiveFloat = 1e-3  # Adam lr of the first task, lowered by train.gamma at train.milestones
    first_weight_decay: NonNegativeFloat = 2e-4  # Adam's coupled L2 in the first task
    lr: PositiveFloat = 1e-4  # Adam lr of every later task, constant
    weight_decay: NonNegativeFloat = 2e-4  # Adam's coupled L2 in later tasks (old heads included, as EFC)


@register_method(
    "efc",
    stores="class statistics",
    graph_safe=False,  # the batch split is read on the host, and the buffer is rebound at every step
    distributed=False,  # the statistics are computed by one process
)
class EFC(TeacherMethod):
    """EFC (Magistri et al., 2024): feature drift penalised by the Empirical Feature Matrix, drifting class Gaussians.

    The first task trains with self-rotation labels. Every later task trains, with the backbone's BN frozen, the
    current head's CE on the new images, the EFM-weighted feature distillation, and a CE over all seen classes on
    the previous step's images mixed with features sampled from the old classes' Gaussians. After each task the old
    means drift, the EFM is recomputed and the new classes' Gaussians are added."""

    Config = EFCConfig

    def __init__(self, cfg: EFCConfig, train: TrainConfig) -> None:
        super().__init__(cfg, train)
        # the old classes' Gaussians of one augmented pass, their means moved after every task by EFC's kernel
        # drift in the metric of the EFM that regularised it (covariances as computed after the class's task)
        drift = KernelDrift(cfg.sigma, lambda: self.efm) if cfg.drift else None
        self.memory = ClassMemory(drift, covariances=True, augmented=True, jitter=cfg.jitter)
        self.efm = torch.zeros(0, 0)  # (d, d) the Empirical Feature Matrix of the last finished task
        self.rotation: nn.Linear | None = None  # the first task's auxiliary head, d → 3·n_new
        self.buffer: tuple[Tensor, Tensor] | None = None  # the previous step's augmented images and labels

    def phases(self, task: Task) -> list[Phase]:
        c, t = self.cfg, self.train
        # EFC's own optimiser, Adam: train.lr, train.momentum and train.weight_decay are read by no phase
        if task.task_id == 0:
            wd = c.first_weight_decay
            return [Phase("base", t.epochs, c.first_lr, t.milestones, optimizer="adam", weight_decay=wd, gamma=t.gamma)]
        return [Phase("efc", t.epochs, c.lr, optimizer="adam", weight_decay=c.weight_decay, trainable="frozen_bn")]

    def on_task_start(self, ctx: TaskContext) -> None:
        super().on_task_start(ctx)  # the frozen old model, from the second task on
        d = ctx.net.feature_dim
        if self.cfg.head_init == "uniform":
            with torch.no_grad():
                block = ctx.net.head.blocks[-1].weight
                block.copy_(_uniform(block.shape, 1 / math.sqrt(d), ctx))
        self.rotation = None
        if ctx.task_id == 0 and self.cfg.rotation:
            self.rotation = _rotation_head(d, ctx.n_new, ctx.device)
            with torch.no_grad():  # nn.Linear's default initialisation, drawn from the method's stream
                for p in self.rotation.parameters():
                    p.copy_(_uniform(p.shape, 1 / math.sqrt(d), ctx))
        self.buffer = None

    def extra_modules(self, ctx: TaskContext) -> list[nn.Module]:
        return [self.rotation] if self.rotation is not None else []

    def training_step(self, net: IncrementalNet, batch: Batch, ctx: TaskContext, phase: Phase) -> dict[str, Tensor]:
        if ctx.task_id == 0:
            return {"ce": self.base_ce(net, batch, ctx)}
        n, m = self.balanced_split(ctx)
        replay_x, replay_y = (t[:m] for t in self.buffer) if m else (batch.x[:0], batch.y[:0])
        b = len(batch.x)
        out = net(torch.cat([batch.x, replay_x]))  # one pass for both: with BN frozen each image's output is its own
        with torch.no_grad():
            old = self.teacher(batch.x).features  # (B, d) the same augmented images
        terms = {
            "ce": F.cross_entropy(out.logits[:b, ctx.n_old :].float(), batch.y - ctx.n_old),  # current head only
            "efm": efm_penalty(out.features[:b].float(), old.float(), self.efm, self.cfg.lambda_efm, self.cfg.eta),
            "ace": self.asymmetric_ce(net, ctx, n, out.logits[b:], replay_y),
        }
        self.buffer = (batch.x.detach(), batch.y)  # replayed by the next step
        return terms

    def base_ce(self, net: IncrementalNet, batch: Batch, ctx: TaskContext) -> Tensor:
        """The first task's CE, over the task's classes and, with rotation, the 3·n_new rotation classes."""
        if self.rotation is None:
            return F.cross_entropy(net(batch.x).logits.float(), batch.y)
        x, y = rotation_batch(batch.x, batch.y, ctx.n_new)
        out = net(x)
        return F.cross_entropy(torch.cat([out.logits, self.rotation(out.features)], dim=1).float(), y)

    def balanced_split(self, ctx: TaskContext) -> tuple[int, int]:
        """(n, m): Gaussian samples of old classes and images of the previous step's batch in the asymmetric CE.
        The first step of a task has no previous batch: ``proto_batch`` samples alone."""
        if self.buffer is None:
            return self.cfg.proto_batch, 0
        faithful = self.cfg.balanced_batch == "faithful"
        n, m = balanced_counts(ctx.n_old, ctx.n_seen, ctx.batch_size, ctx.rng, faithful)
        return min(n, self.cfg.proto_batch), min(m, len(self.buffer[0]))

    def asymmetric_ce(self, net: IncrementalNet, ctx: TaskContext, n: int, replayed: Tensor, y: Tensor) -> Tensor:
        """PR-ACE: CE over all seen classes on n features sampled from the old classes' Gaussians (through the head
        only) and on the replayed real images (their logits ``replayed``, (m, n_seen), and labels ``y``)."""
        # the old classes covered about equally: each ⌊proto_batch/n_old⌋ times and a random rest, shuffled
        labels = balanced_labels(ctx.n_old, self.cfg.proto_batch, ctx.rng, ctx.device)[:n]
        samples = sample_gaussians(self.memory.means, self.memory.factors, labels, ctx.rng)  # (n, d)
        logits = torch.cat([net.head(samples), replayed])
        return F.cross_entropy(logits.float(), torch.cat([labels, y]))

    @torch.no_grad()
    def on_task_end(self, ctx: TaskContext) -> None:
        net, was_training = ctx.net, ctx.net.training
        net.eval()
        feats, old_feats, probs, labels = self.augmented_pass(ctx)
        net.train(was_training)
        self.memory.move([(old_feats, feats)] if old_feats is not None else [], ctx.rng)  # with the EFM of this task
        self.efm = empirical_feature_matrix(probs, net.head.weight())
        self.memory.add(feats, labels, range(ctx.n_old, ctx.n_seen))
        self.rotation, self.buffer = None, None
        super().on_task_end(ctx)  # the old model is dropped

    def augmented_pass(self, ctx: TaskContext) -> tuple[Tensor, Tensor | None, Tensor, Tensor]:
        """Every training image of the task once, with the training augmentation drawn from the method's stream,
        through the network (and the old model) as they are (eval mode).

        Returns:
            (N, d) features, (N, d) old features or None on the first task, (N, n_seen) probabilities, (N,) labels.
        """
        data = ctx.data
        views = data.views(500, ctx.rng)
        feats, old, probs, labels = [], [], [], []
        for i in range(0, len(data.x), 500):
            x, y = views.load(torch.arange(i, min(i + 500, len(data.x)), device=data.x.device))
            out = ctx.net(x)
            feats.append(out.features.float())
            probs.append(torch.softmax(out.logits.float(), dim=1))
            labels.append(y)
            if ctx.task_id > 0:
                old.append(self.teacher(x).features.float())
        return torch.cat(feats), torch.cat(old) if old else None, torch.cat(probs), torch.cat(labels)

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict() | {"memory": self.memory.state_dict(), "efm": self.efm}
        if self.rotation is not None:
            state["rotation"] = self.rotation.state_dict()
        if self.buffer is not None:
            state["buffer"] = list(self.buffer)
        return state

    def load_state_dict(self, state: dict[str, Any], ctx: TaskContext, static: dict[str, Any] | None = None) -> None:
        super().load_state_dict(state, ctx, static)  # the old model
        device = ctx.device
        # a checkpoint written before the memory was a part kept its means and covariances at the top
        memory = state.get("memory", {k: state[k] for k in ("means", "covs") if k in state and len(state[k])})
        self.memory.load_state_dict(memory, ctx)
        self.efm = state.get("efm", torch.zeros(0, 0)).to(device)
        self.rotation = None
        if "rotation" in state:
            self.rotation = _rotation_head(ctx.net.feature_dim, ctx.n_new, device)
            self.rotation.load_state_dict(state["rotation"])
        self.buffer = tuple(t.to(device) for t in state["buffer"]) if "buffer" in state else None


def _rotation_head(d: int, n_new: int, device: torch.device) -> nn.Linear:
    """The first task's auxiliary rotation head, d → 3·n_new with a bias (EFC's), left uninitialised: building it
    draws nothing from the global random stream."""
    return nn.utils.skip_init(nn.Linear, d, 3 * n_new, device=device)


def _uniform(shape: torch.Size, bound: float, ctx: TaskContext) -> Tensor:
    """U(−bound, bound) of ``shape`` from the method's stream, on the training device."""
    return (torch.rand(shape, generator=ctx.rng, device=ctx.device) * 2 - 1) * bound
