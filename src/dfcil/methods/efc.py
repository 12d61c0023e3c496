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
from dfcil.data.device import TrainBatches
from dfcil.errors import ConfigError
from dfcil.losses.prototypes import balanced_labels, class_gaussians, gaussian_factors, sample_gaussians
from dfcil.methods.base import Batch, Phase, TaskContext, register_method
from dfcil.methods.lifecycle import TeacherMethod
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


TRAIN_DEFAULTS = TrainConfig()


def rotation_batch(x: Tensor, y: Tensor, n_classes: int) -> tuple[Tensor, Tensor]:
    """Self-rotation label augmentation (PASS, used by EFC's first task): the batch followed by its rotations
    rot90^k, k = 1, 2, 3 (counter-clockwise in the image plane), image y rotated k times labelled n + 3y + k − 1.

    Args:
        x: (B, C, H, H) square images.
        y: (B,) labels in [0, n_classes).
        n_classes: n, the classes of the task (the rotated labels follow them).

    Returns:
        (4B, C, H, H) images and (4B,) labels in [0, 4n): the originals first, then k = 1, 2, 3 in blocks of B.
    """
    images = [x, *(torch.rot90(x, k, dims=(2, 3)) for k in (1, 2, 3))]
    labels = [y, *(n_classes + 3 * y + k - 1 for k in (1, 2, 3))]
    return torch.cat(images), torch.cat(labels)


def empirical_feature_matrix(probs: Tensor, weight: Tensor) -> Tensor:
    """The Empirical Feature Matrix of a linear head (EFC §3.3), in closed form.

    E = (1/N) Σ_x Σ_c p_c(x) g_c(x) g_c(x)ᵀ with g_c = ∂ log p_c / ∂f = Wᵀ(e_c − p), which sums to
    E = Wᵀ [diag(p̄) − (1/N) Σ_x p(x) p(x)ᵀ] W, p̄ the mean of p. PSD, of rank ≤ K − 1 (each diag p − ppᵀ has 1 in
    its kernel).

    Args:
        probs: (N, K) softmax outputs p(x) of the head over the K seen classes.
        weight: (K, d) the head's weights W (bias-free).

    Returns:
        (d, d) float32, symmetric.
    """
    p, w = probs.double(), weight.double()
    inner = torch.diag(p.mean(dim=0)) - p.T @ p / len(p)  # (K, K)
    e = w.T @ inner @ w
    return ((e + e.T) / 2).float()


def efm_penalty(features: Tensor, old_features: Tensor, efm: Tensor, lam: float, eta: float) -> Tensor:
    """EFC's regulariser: the mean over the batch of δᵀ(λE + ηI)δ, δ = f_t(x) − f_{t−1}(x) (EFC Eq. of L_EFM).

    Args:
        features: (B, d) the model's features.
        old_features: (B, d) the frozen old model's features of the same images.
        efm: (d, d) E of the previous task.
        lam, eta: λ and η.

    Returns:
        A scalar.
    """
    delta = features - old_features
    return lam * ((delta @ efm) * delta).sum(dim=1).mean() + eta * delta.pow(2).sum(dim=1).mean()


def drift_weights(old_features: Tensor, means: Tensor, efm: Tensor, sigma: float) -> Tensor:
    """Kernel weights of EFC's prototype drift: how much image i tells about the drift of class c.

    m_{c,i} = (f_i − μ_c)ᵀ E (f_i − μ_c) with f_i the old model's features; m̃ = (m − min m)/(max m − min m), min
    and max over the whole matrix (all 0 when it is constant); w_{c,i} = exp(−m̃_{c,i}/(2σ²)) / Σ_j exp(−m̃_{c,j}/(2σ²)):
    the images nearest to a mean in E's metric weigh most, and each row sums to 1.

    Args:
        old_features: (N, d) the old model's features f_{t−1}(x_i).
        means: (C, d) the old classes' means μ_c (in the old model's feature space).
        efm: (d, d) E of the previous task (the one that regularised the task just trained).
        sigma: σ.

    Returns:
        (C, N) weights, float64.
    """
    f, mu, e = old_features.double(), means.double(), efm.double()
    e = (e + e.T) / 2  # same quadratic form; makes the expansion below exact
    m = ((f @ e) * f).sum(dim=1)[None, :] - 2 * (mu @ e) @ f.T + ((mu @ e) * mu).sum(dim=1)[:, None]  # (C, N)
    span = m.max() - m.min()
    scaled = (m - m.min()) / span if span > 0 else torch.zeros_like(m)
    return torch.softmax(-scaled / (2 * sigma**2), dim=1)


def drift_means(means: Tensor, old_features: Tensor, features: Tensor, efm: Tensor, sigma: float) -> Tensor:
    """EFC's drift update of the old class means: μ_c + Σ_i w_{c,i} (f_t(x_i) − f_{t−1}(x_i)), w from
    :func:`drift_weights`. Covariances are not moved.

    Args:
        means: (C, d) old class means.
        old_features, features: (N, d) the old and the new model's features of the same images.
        efm, sigma: as :func:`drift_weights`.

    Returns:
        (C, d) moved means, in ``means``' dtype.
    """
    w = drift_weights(old_features, means, efm, sigma)
    return (means.double() + w @ (features.double() - old_features.double())).to(means.dtype)


def balanced_counts(n_old: int, n_seen: int, slots: int, generator: torch.Generator, faithful: bool) -> tuple[int, int]:
    """How many old (sampled) and new (real) items the asymmetric CE's batch has: ``slots`` class draws over the
    seen classes, counted by whether they fall among the old ones.

    ``faithful`` (EFC's code): a shuffled list of the seen classes, followed by the same list again, cut to
    ``slots`` items: without replacement when n_seen ≥ slots, and 2·n_seen items (every class twice) when
    2·n_seen ≤ slots. Otherwise: exactly ``slots`` items covering the classes as evenly as possible.

    Returns:
        (n, m): old-class items, new-class items.
    """
    device = generator.device
    if faithful:
        perm = torch.randperm(n_seen, generator=generator, device=device)
        classes = torch.cat([perm, perm])[:slots]
    else:
        classes = balanced_labels(n_seen, slots, generator, device)
    n = int((classes < n_old).sum())
    return n, len(classes) - n


@register_method("efc")
class EFC(TeacherMethod):
    """EFC (Magistri et al., 2024): feature drift penalised by the Empirical Feature Matrix, drifting class Gaussians.

    The first task trains with self-rotation labels. Every later task trains, with the backbone's BN frozen, the
    current head's CE on the new images, the EFM-weighted feature distillation, and a CE over all seen classes on
    the previous step's images mixed with features sampled from the old classes' Gaussians. After each task the old
    means drift, the EFM is recomputed and the new classes' Gaussians are added."""

    Config = EFCConfig
    stores = "class statistics"
    graph_safe = False  # the batch split is read on the host, and the buffer is rebound at every step
    distributed = False  # the statistics are computed by one process

    def __init__(self, cfg: EFCConfig, train: TrainConfig) -> None:
        # EFC trains with its own Adam settings; train.lr and train.weight_decay are read by no phase (its presets
        # repeat the first task's values there, which is accepted), train.momentum by no optimiser
        ignored = [
            f"train.{key} ({value:g})"
            for key, value, allowed in (
                ("lr", train.lr, (TRAIN_DEFAULTS.lr, cfg.first_lr)),
                ("weight_decay", train.weight_decay, (TRAIN_DEFAULTS.weight_decay, cfg.first_weight_decay)),
                ("momentum", train.momentum, (TRAIN_DEFAULTS.momentum,)),
            )
            if value not in allowed
        ]
        if ignored:
            raise ConfigError(
                f"{' and '.join(ignored)} would change nothing: efc trains with Adam at method.first_lr and "
                f"method.first_weight_decay in the first task and method.lr and method.weight_decay after it; set those"
            )
        super().__init__(cfg, train)
        self.means = torch.zeros(0, 0)  # (n_old, d) class means, drifted after every task
        self.covs = torch.zeros(0, 0, 0)  # (n_old, d, d) class covariances, as computed after the class's task
        self.factors = torch.zeros(0, 0, 0)  # (n_old, d, d) their Cholesky factors with the jitter (derived)
        self.efm = torch.zeros(0, 0)  # (d, d) the Empirical Feature Matrix of the last finished task
        self.rotation: nn.Linear | None = None  # the first task's auxiliary head, d → 3·n_new
        self.buffer: tuple[Tensor, Tensor] | None = None  # the previous step's augmented images and labels

    def phases(self, task: Task) -> list[Phase]:
        c, t = self.cfg, self.train
        if task.task_id == 0:
            wd = c.first_weight_decay
            return [Phase("base", t.epochs, c.first_lr, t.milestones, optimizer="adam", weight_decay=wd)]
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
        self.factors = gaussian_factors(self.covs, self.cfg.jitter) if len(self.covs) else self.covs

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
        samples = sample_gaussians(self.means, self.factors, labels, ctx.rng)  # (n, d)
        logits = torch.cat([net.head(samples), replayed])
        return F.cross_entropy(logits.float(), torch.cat([labels, y]))

    @torch.no_grad()
    def on_task_end(self, ctx: TaskContext) -> None:
        net, was_training = ctx.net, ctx.net.training
        net.eval()
        feats, old_feats, probs, labels = self.augmented_pass(ctx)
        net.train(was_training)
        if ctx.task_id > 0 and self.cfg.drift:  # with the EFM that regularised this task
            self.means = drift_means(self.means, old_feats, feats, self.efm, self.cfg.sigma)
        self.efm = empirical_feature_matrix(probs, net.head.weight())
        means, covs = class_gaussians(feats, labels, range(ctx.n_old, ctx.n_seen))
        self.means = torch.cat([self.means.to(means.device), means]) if len(self.means) else means
        self.covs = torch.cat([self.covs.to(covs.device), covs]) if len(self.covs) else covs
        self.rotation, self.buffer = None, None
        super().on_task_end(ctx)  # the old model is dropped

    def augmented_pass(self, ctx: TaskContext) -> tuple[Tensor, Tensor | None, Tensor, Tensor]:
        """Every training image of the task once, with the training augmentation drawn from the method's stream,
        through the network (and the old model) as they are (eval mode).

        Returns:
            (N, d) features, (N, d) old features or None on the first task, (N, n_seen) probabilities, (N,) labels.
        """
        data = ctx.data
        views = TrainBatches(data.x, data.y, 500, data.normalizer, ctx.rng, pad=data.pad, augment=data.augment)
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
        state = super().state_dict() | {"means": self.means, "covs": self.covs, "efm": self.efm}
        if self.rotation is not None:
            state["rotation"] = self.rotation.state_dict()
        if self.buffer is not None:
            state["buffer"] = list(self.buffer)
        return state

    def load_state_dict(self, state: dict[str, Any], ctx: TaskContext, static: dict[str, Any] | None = None) -> None:
        super().load_state_dict(state, ctx, static)  # the old model
        device = ctx.device
        self.means = state.get("means", torch.zeros(0, 0)).to(device)
        self.covs = state.get("covs", torch.zeros(0, 0, 0)).to(device)
        self.efm = state.get("efm", torch.zeros(0, 0)).to(device)
        self.factors = gaussian_factors(self.covs, self.cfg.jitter) if len(self.covs) else self.covs
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
