"""APR's parts (Honda, WACV 2026; docs/baselines.md, APR): the current task's images moved toward stored class
prototypes by gradient steps through the frozen old model, each part usable by any method that keeps a frozen old
model and a :class:`~dfcil.methods.memory.ClassMemory` with covariances:

* :class:`PseudoReplay`: APR's online pseudo-replay. At a task's start, for every old class the task's images whose
  old-model features lie nearest its prototype; at every step a batch of them, perturbed toward their class's
  prototype (plus Gaussian noise) through the old model: pseudo-images of the old classes for the step's KD;
* :class:`AdversarialDrift`: ADC's adversarial drift compensation with APR's covariance map, an
  :class:`~dfcil.methods.memory.ImageDrift`. After a task's training, per old class the task's images nearest its
  prototype are attacked toward it through the old model; the prototype moves by the mean change of their features
  from the old model to the new one, and the covariance by the linear part of an affine map fitted from the old
  features to the new ones;
* :class:`FixedViews`: one draw of the training augmentation per image of the task, kept, so that an image is the same
  view each time it is loaded (the authors' reproducible transforms).

The maths is in :mod:`dfcil.losses.apr`.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import Tensor

from dfcil.config import NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt, configclass
from dfcil.context import TaskContext
from dfcil.data.device import TrainBatches
from dfcil.losses.apr import (
    adc_step_size,
    fit_affine,
    mean_shift,
    nearest,
    nearest_class,
    noise_radius,
    perturb,
)
from dfcil.losses.prototypes import map_covariances
from dfcil.methods.memory import features_of
from dfcil.models.network import IncrementalNet

log = logging.getLogger("dfcil")


@configclass
class PseudoReplayConfig:
    """APR's online pseudo-replay (the authors' ``apr`` section; CIFAR-100 values)."""

    per_class: PositiveInt = 200  # candidates per old class: the task's images nearest its prototype (apr_sample_limit)
    batch_size: PositiveInt = 64  # pseudo-images a step, beside the real batch (p_batchsize)
    steps: NonNegativeInt = 4  # gradient steps toward the target a step (loops: 4 CIFAR-100, 6 Tiny, 2 ImageNet-subset)
    step_size: PositiveFloat = 64.0  # distance the whole batch moves a step, in normalised pixels (perturb_alpha)
    noise: NonNegativeFloat = 1.0  # the target: prototype + noise · r · N(0, I), r the classes' RMS spread


@configclass
class AdversarialDriftConfig:
    """ADC's attack and APR's covariance map (the authors' ``adc`` section; CIFAR-100 values)."""

    samples: PositiveInt = 1000  # the task's images nearest each old prototype that are attacked (adc_sample_limit)
    batch_size: PositiveInt = 64  # images attacked together (batchsize)
    alpha: PositiveFloat = 25.0  # step size α·√(batch_size/1000) (adc_alpha and the code's scaling)
    steps: PositiveInt = 9  # steps between two tests of success (epochs: 9 CIFAR-100, 6 Tiny, 3 ImageNet-subset)
    # tests of success before a batch is given up (the code raises an error after 100 steps: 11 tests of 9)
    rounds: PositiveInt = 11
    clamp: bool = True  # attacked images kept within the value range of the task's images (clamp_x)
    map_epochs: PositiveInt = 64  # Adam epochs of each class's affine map (trans_epochs)
    map_lr: PositiveFloat = 1e-4  # its lr (trans_lr)
    map_batch_size: PositiveInt = 16  # its batches (the code's 16)


def crop_flip_at(x: Tensor, pad: int, dy: Tensor, dx: Tensor, flip: Tensor, border: Tensor | None = None) -> Tensor:
    """The padded crop at offsets (``dy``, ``dx``) in 0..2·pad and the horizontal flip where ``flip``, per image, of
    a float (B, H, W, C) batch, padded as :func:`dfcil.data.device.crop_flip` pads (zeros, the mean colour, or the
    per-channel ``border``): the same views each time for the same offsets. (B,) offsets and flips."""
    b, h, w, _ = x.shape
    dev = x.device
    if border is None:
        padded = torch.nn.functional.pad(x, (0, 0, pad, pad, pad, pad))
    else:
        padded = border.to(x.dtype).expand(b, h + 2 * pad, w + 2 * pad, x.shape[3]).clone()
        padded[:, pad : pad + h, pad : pad + w] = x
    rows = dy[:, None] + torch.arange(h, device=dev)  # (B, H)
    cols = dx[:, None] + torch.arange(w, device=dev)  # (B, W)
    cols = torch.where(flip[:, None], cols.flip(1), cols)
    return padded[torch.arange(b, device=dev)[:, None, None], rows[:, :, None], cols[:, None, :]]


class FixedViews:
    """One view of every training image of the task: the training augmentation's pad-4 crop and flip, drawn once from
    the method's stream and kept (the authors' reproducible transforms: an image is selected and replayed as the same
    view). The offsets are (N,) tensors on the training device; the images are the task's own (``data.x``)."""

    def __init__(self, data: TrainBatches, dy: Tensor, dx: Tensor, flip: Tensor) -> None:
        self.data, self.dy, self.dx, self.flip = data, dy, dx, flip

    @classmethod
    def draw(cls, data: TrainBatches, rng: torch.Generator) -> FixedViews:
        n, dev, span = len(data.x), data.x.device, 2 * data.pad + 1
        dy = torch.randint(0, span, (n,), generator=rng, device=dev)
        dx = torch.randint(0, span, (n,), generator=rng, device=dev)
        flip = torch.rand(n, generator=rng, device=dev) < 0.5
        return cls(data, dy, dx, flip)

    def load(self, idx: Tensor) -> Tensor:
        """The views of images ``idx`` (B,), normalised, (B, C, H, W)."""
        norm = self.data.normalizer
        x = crop_flip_at(norm.nhwc(self.data.x[idx]), self.data.pad, self.dy[idx], self.dx[idx], self.flip[idx],
                         norm.crop_border)  # fmt: skip
        return norm.to_nchw(x)

    def features(self, net: IncrementalNet, batch: int = 500) -> Tensor:
        """The features (N, d) of every view under ``net`` in eval mode."""
        idx = torch.arange(len(self.data.x), device=self.data.x.device)
        return features_of(net, ((self.load(i), None) for i in idx.split(batch)))[0]

    def value_range(self, batch: int = 500) -> tuple[Tensor, Tensor]:
        """The least and the greatest value of any view (normalised pixels): ADC's clamp."""
        idx = torch.arange(len(self.data.x), device=self.data.x.device)
        parts = [self.load(i).aminmax() for i in idx.split(batch)]
        return torch.stack([p.min for p in parts]).min(), torch.stack([p.max for p in parts]).max()

    def state_dict(self) -> dict[str, Tensor]:
        return {"dy": self.dy, "dx": self.dx, "flip": self.flip}

    @classmethod
    def from_state(cls, data: TrainBatches, state: dict[str, Tensor]) -> FixedViews:
        dev = data.x.device
        return cls(data, state["dy"].to(dev), state["dx"].to(dev), state["flip"].to(dev))


class PseudoReplay:
    """APR's online pseudo-replay (the authors' ``_apr_extract_closest``, ``_build_apr_dataloader`` and
    ``_perturb``).

    :meth:`begin` (a task's start, with the frozen old model and the stored old prototypes and covariances): one
    :class:`FixedViews` draw of the task's images, their old-model features, and for every old class the
    ``per_class`` views nearest its prototype (an image may serve several classes), labelled with that class.
    :meth:`sample` (every step): the next ``batch_size`` candidates of a shuffled order (reshuffled when fewer than a
    batch remain: the authors' shuffled loader with ``drop_last``, cycled), each moved ``steps`` normalised gradient
    steps of the whole batch (:func:`~dfcil.losses.apr.perturb`) toward its class's prototype plus
    ``noise``·r·N(0, I) noise, r = √(mean_c tr Σ_c / d) over the old classes.

    A component: the candidates, views and targets are its static state (fixed during the task), the order and its
    position its state at every checkpoint, so a resumed run replays the same batches.
    """

    def __init__(self, cfg: PseudoReplayConfig) -> None:
        self.cfg = cfg
        self.end()

    def end(self) -> None:
        """Drop the task's candidates (a task's end)."""
        self.views: FixedViews | None = None
        self.index = torch.zeros(0, dtype=torch.long)  # (K,) the candidates' images, rows of the task's data
        self.labels = torch.zeros(0, dtype=torch.long)  # (K,) their old classes
        self.targets = torch.zeros(0, 0)  # (n_old, d) the old prototypes
        self.radius = torch.zeros(())  # r, the noise's scale
        self.order = torch.zeros(0, dtype=torch.long)  # (K,) the current pass's order
        self.position = 0  # candidates of the order already replayed

    def __len__(self) -> int:
        return len(self.index)

    @torch.no_grad()
    def begin(self, ctx: TaskContext, old: IncrementalNet, means: Tensor, covs: Tensor) -> None:
        views = FixedViews.draw(ctx.data, ctx.rng)
        feats = views.features(old)  # (N, d), the old model's
        means = means.to(feats.device)
        picks = [nearest(feats, mean, self.cfg.per_class) for mean in means]
        self.views, self.targets = views, means.clone()
        self.index = torch.cat(picks)
        self.labels = torch.cat([torch.full_like(p, c) for c, p in enumerate(picks)])
        self.radius = noise_radius(covs.to(feats.device).double()).float()
        self.order, self.position = torch.randperm(len(self), generator=ctx.rng, device=ctx.device), 0
        log.info("task %d pseudo-replay: %d candidates of %d old classes from %d images (noise radius %.4g)",
                 ctx.task_id, len(self), len(means), len(feats), float(self.radius))  # fmt: skip

    def sample(self, ctx: TaskContext, old: IncrementalNet) -> Tensor:
        """The step's pseudo-images (n, C, H, W), n = min(batch_size, candidates), perturbed toward their targets."""
        n = min(self.cfg.batch_size, len(self))
        if self.position + n > len(self):  # a new pass, as the authors' loader restarts (drop_last)
            self.order, self.position = torch.randperm(len(self), generator=ctx.rng, device=ctx.device), 0
        pick = self.order[self.position : self.position + n]
        self.position += n
        labels = self.labels[pick]
        x, targets = self.views.load(self.index[pick]), self.targets[labels]
        if self.cfg.noise > 0:
            eps = torch.randn(targets.shape, generator=ctx.rng, device=targets.device)
            targets = targets + self.cfg.noise * self.radius * eps
        return perturb(lambda v: old(v).features, x, targets, self.cfg.steps, self.cfg.step_size)

    def state_dict(self) -> dict[str, Any]:
        return {"order": self.order, "position": self.position} if len(self) else {}

    def static_state_dict(self) -> dict[str, Any]:
        if self.views is None:
            return {}
        fixed = {"index": self.index, "labels": self.labels, "targets": self.targets, "radius": self.radius}
        return fixed | {"views": self.views.state_dict()}

    def load_state_dict(self, state: dict[str, Any], ctx: TaskContext, static: dict[str, Any] | None) -> None:
        self.end()
        if not static:
            return
        dev = ctx.device
        self.views = FixedViews.from_state(ctx.data, static["views"])
        self.index, self.labels = static["index"].to(dev), static["labels"].to(dev)
        self.targets, self.radius = static["targets"].to(dev), static["radius"].to(dev)
        self.order, self.position = state["order"].to(dev), int(state["position"])


class AdversarialDrift:
    """ADC's drift compensation as APR runs it (the authors' ``_adc``, ``Attack``, ``_adc_transfer``), an
    :class:`~dfcil.methods.memory.ImageDrift`.

    One :class:`FixedViews` draw of the task's images and their old-model features; per old class c, the ``samples``
    views nearest its prototype μ_c, in batches of ``batch_size``, each attacked toward μ_c through the old model
    (:func:`~dfcil.losses.apr.perturb`, step α·√(B/1000), clamped to the views' value range) ``steps`` steps at a
    time until one image of the batch has its old-model feature nearest μ_c among the old prototypes; the batch's
    images that are (its successes) are kept. Then μ_c ← μ_c + mean(f_new − f_old) over them, and Σ_c ← WΣ_cWᵀ with
    W the linear part of the affine map fitted from their old features to their new ones (Adam from the identity,
    :func:`~dfcil.losses.apr.fit_affine`). A class with no success anywhere keeps its statistics (the code stops with
    an error), and a warning names it.
    """

    def __init__(self, cfg: AdversarialDriftConfig) -> None:
        self.cfg = cfg

    def move_images(
        self, means: Tensor, covs: Tensor | None, ctx: TaskContext, old: IncrementalNet, desc: str
    ) -> tuple[Tensor, Tensor | None]:
        if covs is None:
            raise ValueError(f"{desc}: ADC's covariance map needs a ClassMemory with covariances")
        c = self.cfg
        views = FixedViews.draw(ctx.data, ctx.rng)
        feats = views.features(old)  # (N, d)
        low, high = views.value_range() if c.clamp else (None, None)
        size = adc_step_size(c.alpha, c.batch_size)
        means, covs = means.to(feats.device), covs.to(feats.device)
        moved_means, moved_covs, kept = means.clone(), covs.clone(), []
        for k in range(len(means)):
            olds, news = [], []
            for chunk in nearest(feats, means[k], c.samples).split(c.batch_size):
                x, target = views.load(chunk), means[k].expand(len(chunk), -1)
                for _ in range(c.rounds):
                    x = perturb(lambda v: old(v).features, x, target, c.steps, size, low, high)
                    f_old = features_of(old, [(x, None)])[0]
                    success = nearest_class(f_old, means) == k
                    if bool(success.any()):
                        break
                olds.append(f_old[success])
                news.append(features_of(ctx.net, [(x[success], None)])[0])
            f_old, f_new = torch.cat(olds), torch.cat(news)
            kept.append(len(f_old))
            if not len(f_old):
                continue
            moved_means[k] = mean_shift(means[k], f_old, f_new)
            weight, _ = fit_affine(f_old, f_new, c.map_epochs, c.map_lr, c.map_batch_size, ctx.rng)
            moved_covs[k] = map_covariances(covs[k].double(), weight.double()).float()
        log.info("%s: ADC kept %d to %d attacked images a class (mean %.1f)", desc, min(kept), max(kept),
                 sum(kept) / len(kept))  # fmt: skip
        if failed := [k for k, n in enumerate(kept) if n == 0]:
            log.warning("%s: ADC's attack reached no old class's prototype for classes %s within %d steps a batch: "
                        "their statistics stay where they were", desc, failed, c.steps * c.rounds)  # fmt: skip
        return moved_means, moved_covs
