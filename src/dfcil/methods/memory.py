"""Class statistics as parts a method composes (as composer's algorithms attach to any model): a
:class:`ClassMemory` of per-class feature means (and covariances) with a pluggable :class:`Drift` that moves them
into each new feature space, and a :class:`NearestMeanClassifier` that classifies by them.

* LDC (Gomez-Villa et al., ECCV 2024) on LwF and R-DFCIL (``method.ldc``): means, a linear drift map fitted after
  each later task's training (:class:`LinearDrift`, LDC's Adam fit or the closed form), nearest-mean classification;
* R-DFCIL+ (docs/rdfcil-plus.md): Gaussians of one augmented pass, moved by the closed-form map, replayed to the
  head;
* EFC (Magistri et al., ICLR 2024): Gaussians of one augmented pass, moved by EFC's kernel drift weighted by the
  Empirical Feature Matrix (:class:`KernelDrift`), sampled in the asymmetric CE.

Each part checkpoints itself (``state_dict`` / ``load_state_dict``, as :meth:`dfcil.methods.Method.components`
expects); the maths is in :mod:`dfcil.losses.prototypes` and :mod:`dfcil.losses.efc`.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any, Literal, Protocol, runtime_checkable

import torch
from torch import Tensor

from dfcil.config import PositiveFloat, PositiveInt, configclass
from dfcil.context import TaskContext
from dfcil.errors import ConfigError
from dfcil.losses.efc import drift_means
from dfcil.losses.prototypes import (
    class_gaussians,
    fit_projector,
    gaussian_factors,
    lstsq_projector,
    map_errors,
    ncm_scores,
    project_statistics,
)
from dfcil.models.network import IncrementalNet, NetOutput
from dfcil.progress import ProgressLog

log = logging.getLogger("dfcil")


@configclass
class DriftConfig:
    """How stored class statistics follow the backbone from one task to the next."""

    # "ldc": LDC's projector, a bias-free linear map trained with Adam on the MSE; "lstsq": the same map in closed
    # form (ridge least squares, one solve); "dual": DPCR's dual projection, the lstsq map restricted per class to
    # the row space of the class's features (a memory with covariances: rdfcil_plus); "none": statistics stay where
    # they were computed
    kind: Literal["ldc", "lstsq", "dual", "none"] = "ldc"
    # ldc: where the Adam fit starts. random: nn.Linear's default initialisation (the authors' code); identity:
    # P = I, leaving the means where they are, which a fit too short to converge then moves less far from the truth
    init: Literal["random", "identity"] = "random"
    epochs: PositiveInt = 20  # LDC: 20 Adam epochs
    lr: PositiveFloat = 0.001  # LDC: Adam lr 1e-3
    batch_size: PositiveInt = 128  # LDC: 128
    # augmented passes over the task's images that give feature pairs; the fit's epoch e uses pass e mod passes.
    # LDC draws fresh augmentations every epoch (passes = epochs); fewer passes cost fewer forward passes
    passes: PositiveInt = 20
    ridge: PositiveFloat = 0.001  # lstsq, dual: ridge, relative to the mean eigenvalue of the old features' Gram matrix
    # also fit the map on synthetic images of the old classes (methods with a generator; R-DFCIL+): the task's own
    # images only show how the new classes' region moved
    synthetic: bool = False


# ---------------------------------------------------------------------------------------------------- drifts


# the DriftConfig keys each kind reads (besides kind): lstsq and dual fit on one pass in closed form
DRIFT_READS: dict[str, frozenset[str]] = {
    "ldc": frozenset({"init", "epochs", "lr", "batch_size", "passes", "synthetic"}),
    "lstsq": frozenset({"ridge", "synthetic"}),
    "dual": frozenset({"ridge", "synthetic"}),
    "none": frozenset(),
}


def check_drift_keys(drift: DriftConfig, default: DriftConfig) -> None:
    """Refuse ``method.drift`` keys set away from the method's ``default`` that ``drift.kind`` does not read (e.g.
    ``passes`` with the closed-form kinds, which fit on one pass; anything with kind none)."""
    unread = [
        f.name
        for f in dataclasses.fields(DriftConfig)
        if f.name != "kind" and f.name not in DRIFT_READS[drift.kind]
        and getattr(drift, f.name) != getattr(default, f.name)
    ]  # fmt: skip
    if unread:
        readers = sorted(k for k, keys in DRIFT_READS.items() if unread[0] in keys)
        also = f" (nor {', '.join(f'method.drift.{k}' for k in unread[1:])})" if len(unread) > 1 else ""
        raise ConfigError(
            f"method.drift.{unread[0]} is {getattr(drift, unread[0])!r}, and drift kind {drift.kind} does not read "
            f"it{also}: drop it, or use a kind that reads it: {', '.join(readers)}"
        )


class Drift(Protocol):
    """How a :class:`ClassMemory`'s statistics move into the current feature space after a task: from feature
    pairs (the old model's, the new model's) of the same images, one pair of (N, d) matrices per augmented pass."""

    passes: int  # augmented passes of feature pairs the move needs
    synthetic: bool  # whether synthetic images of the old classes join the task's own in those passes

    def move(
        self, means: Tensor, covs: Tensor | None, pairs: list[tuple[Tensor, Tensor]], rng: torch.Generator, desc: str
    ) -> tuple[Tensor, Tensor | None]:
        """The statistics carried into the new feature space (``desc``: what the log lines say runs)."""
        ...


@runtime_checkable
class ImageDrift(Protocol):
    """A drift that moves the statistics from the task's images itself, through both networks, rather than from
    feature pairs of augmented passes (ADC, :class:`dfcil.methods.adversarial.AdversarialDrift`: the images are first
    attacked toward each class through the old model). :meth:`ClassMemory.compensate` hands it the task."""

    def move_images(
        self, means: Tensor, covs: Tensor | None, ctx: TaskContext, old: IncrementalNet, desc: str
    ) -> tuple[Tensor, Tensor | None]:
        """The statistics carried into the feature space of ``ctx.net`` from that of ``old`` (the frozen old model)."""
        ...


class LinearDrift:
    """A linear map P with P·f_old ≈ f_new, fitted on the pairs; μ ← Pμ and Σ ← PΣPᵀ (LDC moves only means; the
    covariances are our extension). ``kind`` "ldc": LDC's Adam fit over ``passes`` passes; "lstsq": the closed
    form on one."""

    def __init__(self, cfg: DriftConfig) -> None:
        self.cfg = cfg
        self.passes = cfg.passes if cfg.kind == "ldc" else 1
        self.synthetic = cfg.synthetic

    def move(
        self, means: Tensor, covs: Tensor | None, pairs: list[tuple[Tensor, Tensor]], rng: torch.Generator, desc: str
    ) -> tuple[Tensor, Tensor | None]:
        d = self.cfg
        if d.kind == "ldc":
            lines = ProgressLog(f"{desc} projector fit", d.epochs, parts=min(d.epochs, 5))

            def on_epoch(epoch: int, mse: float) -> None:
                if lines.due(epoch):
                    lines.log(epoch, {"mse": mse})

            projector = fit_projector(pairs, d.epochs, d.lr, d.batch_size, rng, d.init, on_epoch)
            check_fit(map_errors(*pairs[(d.epochs - 1) % len(pairs)], projector), desc)
        else:
            projector = lstsq_projector(pairs[0][0], pairs[0][1], d.ridge)
        return project_statistics(means, covs, projector.to(means.device))


UNCONVERGED = 1.25  # the fit's MSE over the least-squares map's above which the fit is said not to have converged


def check_fit(
    errors: dict[str, float],
    desc: str,
    what: str = "LDC's projector fit",
    fix: str = "Raise method.drift.epochs, start it at method.drift.init: identity, or use method.drift.kind: lstsq",
    bar: Literal["least squares", "in place"] = "least squares",
) -> None:
    """Log how far a fitted drift map (``what``: LDC's Adam fit, AdaGauss's adapter) got on its last pass of feature
    pairs, against the least-squares linear map and against leaving the features where they are, and warn where it
    has not converged, saying whether it then moves the statistics further than leaving them would, and ``fix``.

    ``bar``: "least squares", an MSE above :data:`UNCONVERGED` times the least-squares map's, which any converged
    fit of a linear map by MSE alone reaches (LDC); "in place", an MSE above leaving the features where they are,
    for a map fitted to a loss of its own beside the MSE (AdaGauss's adapter, with its anti-collapse term, ends 8 to
    17 times above least squares at its authors' schedule, where it matches their code, and far above leaving
    the features where cut short)."""
    fit, best, stay = errors["fit"], errors["best"], errors["stay"]
    log.info("%s: %s MSE %.4g (least squares %.4g, left in place %.4g)", desc, what, fit, best, stay)
    if fit <= (UNCONVERGED * best if bar == "least squares" else stay):
        return
    worse = ", worse than leaving the statistics in place" if fit > stay else ""
    log.warning(
        "%s: %s has not converged: its MSE %.4g is %.1f times the least-squares map's (%.4g)%s. %s",
        desc, what, fit, fit / best if best > 0 else float("inf"), best, worse, fix,
    )  # fmt: skip


class KernelDrift:
    """EFC's prototype drift: each old mean moves by the feature shifts of the images nearest to it in the metric
    of the Empirical Feature Matrix (:func:`dfcil.losses.efc.drift_means`); covariances stay. ``efm()``: the EFM
    that regularised the task just trained (its method holds it)."""

    passes = 1
    synthetic = False

    def __init__(self, sigma: float, efm: Callable[[], Tensor]) -> None:
        self.sigma, self.efm = sigma, efm

    def move(
        self, means: Tensor, covs: Tensor | None, pairs: list[tuple[Tensor, Tensor]], rng: torch.Generator, desc: str
    ) -> tuple[Tensor, Tensor | None]:
        old, new = pairs[0]
        return drift_means(means, old, new, self.efm(), self.sigma), covs


def linear_drift(cfg: DriftConfig) -> LinearDrift | None:
    """The drift a :class:`DriftConfig` of kind "ldc" or "lstsq" names; None for kind "none" (the statistics stay).
    Kind "dual" is :class:`dfcil.methods.projection.DualProjectionDrift`, which needs the classes' covariances."""
    if cfg.kind == "dual":
        raise ValueError("drift kind dual is DualProjectionDrift (dfcil.methods.projection), not a LinearDrift")
    return None if cfg.kind == "none" else LinearDrift(cfg)


# ------------------------------------------------------------------------------------------------- the memory


class ClassMemory:
    """Per-class feature means (and covariances) of every class seen so far, in the current feature space.

    A component of its method (:meth:`dfcil.methods.Method.components`): saved at every checkpoint, with the task
    whose drift it last compensated so that a resumed run does not compensate twice.

    Args:
        drift: how the statistics follow the backbone, from feature pairs (a :class:`Drift`) or from the task's images
            (an :class:`ImageDrift`); None: they stay where they were computed.
        covariances: keep a covariance per class (Gaussian replay), not only a mean.
        augmented: statistics of one augmented pass (EFC, R-DFCIL+) or of the plain images (LDC).
        jitter: added to each covariance's diagonal for sampling (:attr:`factors`).
    """

    def __init__(
        self, drift: Drift | ImageDrift | None, covariances: bool, augmented: bool, jitter: float = 1e-5
    ) -> None:
        self.drift = drift
        self.covariances = covariances
        self.augmented = augmented
        self.jitter = jitter
        self.means = torch.zeros(0, 0)  # (n_classes, d)
        self.covs: Tensor | None = None  # (n_classes, d, d) when covariances
        self.factors: Tensor | None = None  # Cholesky factors of covs + jitter·I, derived, for sampling
        self.compensated = -1  # the last task whose drift moved the statistics
        self.seconds = 0.0  # what the last compensation took (the task's timings: drift_s)

    def __len__(self) -> int:
        return len(self.means)

    @classmethod
    def for_switch(cls, on: bool, drift: DriftConfig, generator: bool) -> ClassMemory | None:
        """LDC's memory behind a method's ``ldc`` switch (means of the plain images, :class:`LinearDrift`), or None
        when it is off; a ``method.drift`` set with the switch off, or ``drift.synthetic`` without a generator
        (``generator``: the method has one), is refused as a setting the method would ignore."""
        if not on and drift != DriftConfig():
            raise ConfigError(
                "method.drift sets how LDC moves the stored class means, and method.ldc is false, so there are none: "
                "set method.ldc: true, or drop method.drift"
            )
        if drift.kind == "dual":
            raise ConfigError(
                "method.drift.kind dual moves each class's covariance within its row space, and LDC's memory keeps "
                "class means only: use method.drift.kind lstsq (the same task-wise map) or ldc"
            )
        if drift.synthetic and not generator:
            raise ConfigError(
                "method.drift.synthetic fits the drift on synthetic images too, and this method has no generator to "
                "draw them: drop method.drift.synthetic (rdfcil and rdfcil_plus have one)"
            )
        if on:
            check_drift_keys(drift, DriftConfig())
        return cls(linear_drift(drift), covariances=False, augmented=False) if on else None

    # -- the task's work -------------------------------------------------------------------------------------

    def add(self, features: Tensor, labels: Tensor, classes: range) -> None:
        """Append the statistics of ``classes`` from their features (N, d) and labels (N,)."""
        means, covs = class_gaussians(features, labels, classes)
        device = means.device
        self.means = torch.cat([self.means.to(device), means]) if len(self) else means
        if self.covariances:
            self.covs = torch.cat([self.covs.to(device), covs]) if self.covs is not None else covs
            self.factors = gaussian_factors(self.covs, self.jitter)

    @torch.no_grad()
    def add_classes(self, ctx: TaskContext) -> None:
        """The statistics of the task's classes, from the network as it is now, in eval mode."""
        feats, labels = features_of(ctx.net, self._images(ctx))
        self.add(feats, labels, range(ctx.n_old, ctx.n_seen))

    def move(self, pairs: list[tuple[Tensor, Tensor]], rng: torch.Generator, desc: str = "drift") -> None:
        """Carry the stored statistics into the new feature space with :attr:`drift`, from feature pairs of the
        same images (the method's own pass: EFC's)."""
        if self.drift is None or not len(self):
            return
        self._moved(*self.drift.move(self.means, self.covs, pairs, rng, desc))

    def _moved(self, means: Tensor, covs: Tensor | None) -> None:
        self.means, self.covs = means, covs
        if self.covs is not None:
            self.factors = gaussian_factors(self.covs, self.jitter)

    @torch.no_grad()
    def compensate(self, ctx: TaskContext, old: IncrementalNet, synthetic: Callable[[int], Tensor] | None) -> None:
        """Move the stored statistics into the current feature space (once per task; again after a resume does
        nothing), from :attr:`drift`'s passes over the task's augmented images through ``old`` (the frozen old
        model) and the network; ``synthetic(n)``: n synthetic images, added where the drift asks for them."""
        if ctx.task_id <= self.compensated or not len(self) or self.drift is None:
            return
        started, desc = time.perf_counter(), f"task {ctx.task_id} drift"
        if isinstance(self.drift, ImageDrift):
            log.info("%s: moving %d class means, from the task's images", desc, len(self))
            with torch.enable_grad():  # an attack steps images along gradients
                self._moved(*self.drift.move_images(self.means, self.covs, ctx, old, desc))
        else:
            self.move(self._pairs(ctx, old, synthetic, desc), ctx.rng, desc)
        self.compensated, self.seconds = ctx.task_id, time.perf_counter() - started
        log.info("%s: done in %.1fs", desc, self.seconds)

    def _pairs(
        self, ctx: TaskContext, old: IncrementalNet, synthetic: Callable[[int], Tensor] | None, desc: str
    ) -> list[tuple[Tensor, Tensor]]:
        """The feature pairs (old model's, network's) of :attr:`drift`'s augmented passes over the task's images."""
        passes = self.drift.passes
        log.info("%s: moving %d class means, from %d passes of feature pairs", desc, len(self), passes)
        lines, pairs = ProgressLog(f"{desc} features", passes, parts=min(passes, 5)), []
        for done in range(1, passes + 1):
            batches = list(ctx.data)  # one augmented pass (full batches, shuffled)
            if self.drift.synthetic and synthetic is not None:
                batches += [(synthetic(len(x)), None) for x, _ in batches]
            old_f, _ = features_of(old, batches)
            new_f, _ = features_of(ctx.net, batches)
            pairs.append((old_f, new_f))
            if lines.due(done):
                lines.log(done, {}, f"{len(old_f)} images a pass")
        return pairs

    def task_seconds(self, task: int) -> dict[str, float]:
        """The seconds of this memory's own work in ``task`` (its drift compensation), for the task's timings."""
        return {"drift": self.seconds} if self.compensated == task and self.seconds else {}

    def ncm(self, features: Tensor) -> Tensor:
        """Nearest-class-mean scores (B, n_classes) of ``features`` (LDC's classifier)."""
        return ncm_scores(features, self.means.to(features.device))

    def _images(self, ctx: TaskContext) -> Iterator[tuple[Tensor, Tensor]]:
        return iter(ctx.data) if self.augmented else ctx.data.plain()

    # -- state -----------------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        if not len(self):
            return {}
        state = {"means": self.means, "compensated": self.compensated}
        return state | ({"covs": self.covs} if self.covs is not None else {})

    def static_state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any], ctx: TaskContext | None = None, static: Any = None) -> None:
        device = ctx.device if ctx is not None else None
        self.means = state.get("means", torch.zeros(0, 0))
        self.covs = state.get("covs")
        if device is not None:
            self.means = self.means.to(device)
            self.covs = self.covs.to(device) if self.covs is not None else None
        self.factors = gaussian_factors(self.covs, self.jitter) if self.covs is not None else None
        self.compensated = int(state.get("compensated", -1))


@torch.no_grad()
def features_of(net: IncrementalNet, batches: Any) -> tuple[Tensor, Tensor | None]:
    """The pooled features (N, d) of ``batches`` of (images, labels or None) under ``net`` in eval mode (its mode
    restored after), with the labels concatenated where every batch has them."""
    was_training = net.training
    net.eval()
    feats, labels = [], []
    for x, y in batches:
        feats.append(net(x).features.float())
        labels.append(y)
    net.train(was_training)
    return torch.cat(feats), (torch.cat(labels) if all(y is not None for y in labels) else None)


# --------------------------------------------------------------------------------------------- the classifier


class NearestMeanClassifier:
    """Classification by the nearest stored class mean on the unit sphere (LDC's), from a :class:`ClassMemory`:
    the scores at evaluation, and the means ``model.pt`` keeps for ``dfcil eval`` (a method's ``eval_logits``,
    ``eval_state`` and ``load_eval_state`` hand over to it)."""

    def __init__(self, memory: ClassMemory) -> None:
        self.memory = memory

    def scores(self, out: NetOutput) -> Tensor | None:
        """(B, n_classes) scores of the network's output; None before any class has statistics."""
        return self.memory.ncm(out.features) if len(self.memory) else None

    def eval_state(self) -> dict[str, Any]:
        return {"means": self.memory.means}

    @staticmethod
    def recipe() -> str:
        return (
            "scores = dfcil.losses.prototypes.ncm_scores(net(x).features, state['method.means']), i.e. "
            "-|normalize(f) - normalize(mean_c)|^2; the prediction is scores.argmax(1) (output k as in output_names)"
        )

    def load_eval_state(self, state: dict[str, Any]) -> None:
        if "means" in state:
            self.memory.means = state["means"]
