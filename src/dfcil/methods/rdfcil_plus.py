"""R-DFCIL+: R-DFCIL with per-class Gaussian feature statistics, drift-compensated between tasks and replayed as
sampled features in the head refinement (docs/rdfcil-plus.md). dfcil's own combination of R-DFCIL with EFC++'s
prototype re-balancing and LDC's drift compensation; each addition is a switch, for the ablation table."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Annotated, Any, Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import Tensor

from dfcil.config import NonNegativeFloat, PositiveFloat, PositiveInt, configclass
from dfcil.errors import ConfigError
from dfcil.losses.adagauss import anti_collapse, small_batch
from dfcil.losses.prototypes import balanced_labels, sample_gaussians
from dfcil.methods.adapter import BayesClassifier
from dfcil.methods.adversarial import PseudoReplay, PseudoReplayConfig
from dfcil.methods.base import Batch, Phase, TaskContext, register_method
from dfcil.methods.cycle import CycleDistiller
from dfcil.methods.memory import ClassMemory, DriftConfig, NearestMeanClassifier, check_drift_keys, linear_drift
from dfcil.methods.projection import DualProjectionDrift, RidgeClassifier
from dfcil.methods.rdfcil import RDFCIL, RDFCILConfig
from dfcil.models.network import IncrementalNet, NetOutput

log = logging.getLogger("dfcil")
Classifier = NearestMeanClassifier | BayesClassifier | RidgeClassifier


@configclass
class RDFCILPlusConfig(RDFCILConfig):
    name: str = "rdfcil_plus"
    # CHR also trains the head on features sampled from the old classes' Gaussians N(μ_c, Σ_c + 1e-5·I), class-
    # uniform, replay_ratio per real image, with a plain CE over the seen classes weighted lambda_replay
    replay: bool = True
    replay_ratio: NonNegativeFloat = 1.0
    lambda_replay: NonNegativeFloat = 0.5
    # drift of the stored statistics at the end of each RRL (kind "none": they stay where they were computed): the
    # closed-form least-squares map on one augmented pass of feature pairs by default, which moves stored means
    # closer to the true ones than LDC's Adam fit at a fraction of its cost (docs/rdfcil-plus.md, measured)
    drift: DriftConfig = dataclasses.field(default_factory=lambda: DriftConfig(kind="lstsq", passes=1))
    # which classifier evaluates (CLASSIFIERS): the refined head ("head"); nearest class mean on the statistics
    # ("ncm"); Mahalanobis distances to the moved Gaussians, AdaGauss's Bayes classifier ("bayes"); or DPCR's ridge
    # head, reconstructed in closed form from the moved statistics after each task ("ridge"). CHR trains the head
    # only, which "ncm", "bayes" and "ridge" do not read: with them method.chr_epochs 0 saves its time
    classifier: Literal["head", "ncm", "bayes", "ridge"] = "head"
    bayes_shrinkage: NonNegativeFloat = 3.0  # bayes: Σ + γ·mean(diag Σ)·I (AdaGauss's γ = 3)
    bayes_normalize: bool = True  # bayes: L2-normalised features and means, correlation matrices (AdaGauss's)
    # bayes as APR's Mahalanobis head: FeCAM's off-diagonal shrinkage γ₂ too, and the pseudo-inverse (APR: γ = γ₂ =
    # 24 and true; AdaGauss: 0 and false). cifar100-mini/rdfcil_plus_mahalanobis sets APR's head
    bayes_offdiag: NonNegativeFloat = 0.0
    bayes_pseudo_inverse: bool = False
    ridge_gamma: PositiveFloat = 200.0  # ridge: γ of (Σ_c Φ_c + γI)⁻¹Q (DPCR's CIFAR-100 value, at d = 512)
    ridge_normalize: bool = True  # ridge: each class column L2-normalised (DPCR's)
    # AdaGauss's anti-collapse term in RRL, weight lambda_ac (0: off) and clamp ac_beta, on the covariance of the
    # student's features of the step's [real; synthetic] images (2·batch rows: the term needs more rows than feature
    # dimensions), −mean_i min(L_ii, β) over its Cholesky diagonal. On by default (λ = β = 1, AdaGauss's values):
    # the one switch whose paired gain on cifar100-mini is beyond its spread (docs/rdfcil-plus.md)
    lambda_ac: NonNegativeFloat = 1.0
    ac_beta: PositiveFloat = 1.0
    # APR's online pseudo-replay (docs/baselines.md, APR) as a source of old-class images for HKD and CHR: the task's
    # own images nearest each old class's stored mean, moved at every step by a few gradient steps through the old
    # model toward that mean plus noise. "extra": pseudo.batch_size of them beside the generator's images; "only": in
    # their place (no generator is used: set method.inversion.steps 0); "off": the generator's alone
    pseudo_replay: Literal["off", "extra", "only"] = "off"
    pseudo: PseudoReplayConfig = dataclasses.field(default_factory=PseudoReplayConfig)
    # BiCyc's cycle-consistent distiller in RRL (docs/rdfcil-plus.md, "The cycle switch"): a fresh MLP D per task
    # (d → cycle_multiplier·d → d) and lambda_cycle_kd·MSE(D(z), z°) on the real images (z the student's features,
    # z° the old model's), plus lambda_cycle·MSE(D(A(z°)), z°), A the affine old → new map fitted by centred ridge
    # (cycle_ridge, absolute) on the steps' pairs so far, weighted cycle_momentum per step; the cycle trains D alone.
    # BiCyc's values: 5, 2, 32, GATF's ridge 0.01
    cycle: bool = False
    lambda_cycle_kd: NonNegativeFloat = 5.0
    lambda_cycle: NonNegativeFloat = 2.0
    cycle_multiplier: PositiveInt = 32
    cycle_ridge: PositiveFloat = 0.01
    cycle_momentum: Annotated[NonNegativeFloat, Field(lt=1)] = 0.99


CLASSIFIERS: dict[str, Callable[[RDFCILPlusConfig, ClassMemory], Classifier | None]] = {
    "head": lambda cfg, memory: None,  # the network's head
    "ncm": lambda cfg, memory: NearestMeanClassifier(memory),
    "bayes": lambda cfg, memory: BayesClassifier(
        cfg.bayes_shrinkage, cfg.bayes_normalize, cfg.bayes_offdiag, cfg.bayes_pseudo_inverse
    ),
    "ridge": lambda cfg, memory: RidgeClassifier(cfg.ridge_gamma, cfg.ridge_normalize),
}


CYCLE_KEYS = ("lambda_cycle_kd", "lambda_cycle", "cycle_multiplier", "cycle_ridge", "cycle_momentum")
BAYES_KEYS = ("bayes_shrinkage", "bayes_normalize", "bayes_offdiag", "bayes_pseudo_inverse")
# each switch's own keys, read only while it is on: (keys, is it on, how to turn it on)
SWITCH_KEYS: tuple[tuple[tuple[str, ...], Callable[[RDFCILPlusConfig], bool], str], ...] = (
    (("replay_ratio", "lambda_replay"), lambda c: c.replay, "method.replay: true"),
    (BAYES_KEYS, lambda c: c.classifier == "bayes", "method.classifier: bayes"),
    (("ridge_gamma", "ridge_normalize"), lambda c: c.classifier == "ridge", "method.classifier: ridge"),
    (("ac_beta",), lambda c: c.lambda_ac > 0, "method.lambda_ac above 0"),
    (("pseudo",), lambda c: c.pseudo_replay != "off", "method.pseudo_replay: extra"),
    (CYCLE_KEYS, lambda c: c.cycle, "method.cycle: true"),
)


def check_switch_keys(cfg: RDFCILPlusConfig) -> None:
    """Refuse a switch's own keys set away from their defaults while the switch is off (they would be ignored),
    and drift keys that the drift kind does not read."""
    default = RDFCILPlusConfig()
    for keys, on, how in SWITCH_KEYS:
        unread = [k for k in keys if not on(cfg) and getattr(cfg, k) != getattr(default, k)]
        if unread:
            raise ConfigError(
                f"method.{unread[0]} is {getattr(cfg, unread[0])!r}, and its switch is off, so it would be ignored: "
                f"drop it, or set {how}"
            )
    check_drift_keys(cfg.drift, default.drift)


@register_method(
    "rdfcil_plus",
    stores="class statistics",  # and, as R-DFCIL, a synthesizer per task, dropped after it
    static_head=True,  # R-DFCIL's masks; the replayed features' CE is over the head's seen (unmasked) columns
    distributed=False,  # the statistics are computed by one process
    graph_safe=True,  # its step replays as a CUDA graph (checked by tests/test_graphs.py)
)
class RDFCILPlus(RDFCIL):
    """R-DFCIL+ (dfcil's): R-DFCIL plus class Gaussians, moved with the features and replayed to the head in CHR.

    A Gaussian per class (mean and covariance of one augmented pass of its images, after its task) is moved into
    each new feature space at the end of RRL, and replayed as sampled features to the head during CHR."""

    Config = RDFCILPlusConfig

    def __init__(self, cfg: RDFCILPlusConfig, train) -> None:
        if cfg.ldc:
            raise ConfigError(
                "method.ldc is R-DFCIL's nearest-mean switch; rdfcil_plus keeps class statistics always: drop "
                "method.ldc and set method.classifier ncm to classify by the means"
            )
        if cfg.chr_epochs == 0 and cfg.replay and cfg.classifier == "head":
            raise ConfigError(
                "rdfcil_plus replays its class statistics in CHR, and method.chr_epochs is 0: they would never be "
                "used. Give CHR epochs, classify by the means (method.classifier: ncm), or train rdfcil"
            )
        if cfg.pseudo_replay == "only" and cfg.inversion.steps:
            raise ConfigError(
                f"method.pseudo_replay only replays pseudo-images in place of the generator's, so its inversion "
                f"(method.inversion.steps {cfg.inversion.steps}) would be time lost: set method.inversion.steps 0, "
                f"or method.pseudo_replay extra to use both"
            )
        if cfg.pseudo_replay == "only" and cfg.drift.synthetic:
            raise ConfigError(
                "method.drift.synthetic fits the drift on the generator's images, which method.pseudo_replay only "
                "does not train: drop method.drift.synthetic, or set method.pseudo_replay extra"
            )
        check_switch_keys(cfg)
        super().__init__(cfg, train)
        self.classifier = CLASSIFIERS[cfg.classifier](cfg, self.memory)
        self.pseudo = PseudoReplay(cfg.pseudo) if cfg.pseudo_replay != "off" else None
        self.cycle: CycleDistiller | None = None  # the task's distiller (tasks > 0, method.cycle)
        self.pseudo_eager, self.replay_eager = self._pseudo_images, self._replay  # bound per run: _keep_eager

    def _keep_eager(self, ctx: TaskContext) -> None:
        """The pseudo-replay and the memory's replay, kept out of ``engine.compile: step``'s graphs (run eagerly
        between them) by the run's runtime, bound at each task's start and at a resume. Not a decorator:
        ``torch.compiler.disable`` imports the compiler, seconds of start-up for every process that imports the
        methods (each run of ``dfcil train``, ``resume``, ``eval``, a sweep's), with or without ``engine.compile``."""
        self.pseudo_eager = ctx.runtime.eager(self._pseudo_images)
        self.replay_eager = ctx.runtime.eager(self._replay)

    @property
    def eager_reason(self) -> str:
        if self.pseudo is not None:  # the pseudo-replay keeps its place on the host
            return f"method.pseudo_replay {self.cfg.pseudo_replay} does host work in every step of {self.name}"
        return super().eager_reason

    def build_memory(self, cfg: RDFCILPlusConfig) -> ClassMemory:
        d = cfg.drift
        if d.kind == "dual":  # DPCR's dual projection, its task-wise map the closed form of kind lstsq
            drift = DualProjectionDrift(d.ridge, relative=True, synthetic=d.synthetic)
        else:
            drift = linear_drift(d)
        return ClassMemory(drift, covariances=True, augmented=True)  # Gaussians, always

    def on_task_start(self, ctx: TaskContext) -> None:
        super().on_task_start(ctx)  # the old model's snapshot from the second task on
        self._keep_eager(ctx)
        if self.pseudo is not None and len(self.memory):  # the stored Gaussians are in the old model's space
            self.pseudo.begin(ctx, self.teacher, self.memory.means, self.memory.covs)
        rows, d = 2 * self.train.batch_size, ctx.net.feature_dim  # [real; synthetic]
        if self.cfg.cycle and ctx.task_id > 0:  # a fresh distiller, drawn from the method's stream
            self.cycle = self._cycle_distiller(d, ctx.device, ctx.rng)
        if self.cfg.lambda_ac > 0 and ctx.task_id == 1 and (why := small_batch(rows, d, "2 × train.batch_size")):
            log.warning("rdfcil_plus: %s", why)

    def _cycle_distiller(self, d: int, device: torch.device, rng: torch.Generator | None) -> CycleDistiller:
        c = self.cfg
        return CycleDistiller(d, c.cycle_multiplier, c.cycle_ridge, c.cycle_momentum, device, rng)

    @property
    def teacher_on_real(self) -> bool:
        return super().teacher_on_real or self.cfg.cycle  # z° of the real images, for the distiller

    def extra_modules(self, ctx: TaskContext) -> list[torch.nn.Module]:
        return super().extra_modules(ctx) + ([self.cycle.net] if self.cycle is not None else [])

    def rrl_feature_terms(self, features: Tensor, teacher_real: NetOutput | None) -> dict[str, Tensor]:
        c = self.cfg
        terms = {"ac": c.lambda_ac * anti_collapse(features, c.ac_beta)} if c.lambda_ac > 0 else {}
        if self.cycle is not None and teacher_real is not None:
            real = teacher_real.features
            distill, cycle = self.cycle.losses(features[: len(real)], real)
            terms |= {"cycle_kd": c.lambda_cycle_kd * distill, "cycle": c.lambda_cycle * cycle}
        return terms

    def old_inputs(self, batch_size: int, ctx: TaskContext) -> Tensor:
        if self.pseudo is None:
            return super().old_inputs(batch_size, ctx)
        if not len(self.pseudo):  # no stored class to start from (a task's start found the memory empty)
            raise ValueError("rdfcil_plus: the pseudo-replay has no candidates: no old class has statistics")
        pseudo = self.pseudo_eager(ctx)
        return pseudo if self.cfg.pseudo_replay == "only" else torch.cat([super().old_inputs(batch_size, ctx), pseudo])

    # Outside engine.compile: step's graphs (_keep_eager): the candidates' order is kept on the host, and the
    # perturbation takes gradients of the old model with respect to its input
    def _pseudo_images(self, ctx: TaskContext) -> Tensor:
        return self.pseudo.sample(ctx, self.teacher)

    def on_task_end(self, ctx: TaskContext) -> None:
        self.cycle = None  # a fresh distiller per task (BiCyc's)
        if self.pseudo is not None:
            self.pseudo.end()
        super().on_task_end(ctx)  # the task's classes' Gaussians, in the final feature space
        if isinstance(self.classifier, BayesClassifier):
            self.classifier.refresh(self.memory)
        elif isinstance(self.classifier, RidgeClassifier):  # every class from its (moved) statistics and counts
            self.classifier.add_counts(ctx.data.y, range(ctx.n_old, ctx.n_seen))
            empty = self.memory.means.new_zeros(0, self.memory.means.shape[1])
            self.classifier.fit(self.memory, ctx.n_seen, empty, empty.new_zeros(0, dtype=torch.long), ctx.n_seen)

    def components(self) -> dict[str, Any]:
        # a classifier with state of its own (bayes, ridge) is checkpointed; ncm's means are the memory's
        own = {"classifier": self.classifier} if hasattr(self.classifier, "state_dict") else {}
        own |= {"pseudo": self.pseudo} if self.pseudo is not None else {}
        return super().components() | own

    def training_step(self, net: IncrementalNet, batch: Batch, ctx: TaskContext, phase: Phase) -> dict[str, Tensor]:
        terms = super().training_step(net, batch, ctx, phase)
        if phase.name == "chr" and self.cfg.replay:
            terms |= self.replay_eager(net, len(batch.x), ctx)
        return terms

    # Outside engine.compile: step's graphs (_keep_eager): the replayed classes and the memory grow with every task,
    # so a compiled replay would compile again in each (its few small ops lose nothing eager, and a CUDA graph
    # replays them still)
    def _replay(self, net: IncrementalNet, batch_size: int, ctx: TaskContext) -> dict[str, Tensor]:
        """Features sampled from the old classes' Gaussians, class-uniform, ``replay_ratio`` per real image, and the
        head's CE on them."""
        c, memory = self.cfg, self.memory
        n = round(c.replay_ratio * batch_size)
        if not n or not len(memory):
            return {}
        labels = balanced_labels(ctx.n_old, n, ctx.rng, ctx.device)
        z = sample_gaussians(memory.means.to(ctx.device), memory.factors.to(ctx.device), labels, ctx.rng)
        return {"replay": c.lambda_replay * F.cross_entropy(net.head(z).float(), labels)}

    def state_dict(self) -> dict[str, Any]:
        return super().state_dict() | ({"cycle": self.cycle.state_dict()} if self.cycle is not None else {})

    def load_state_dict(self, state: dict[str, Any], ctx: TaskContext, static: dict[str, Any] | None = None) -> None:
        super().load_state_dict(state, ctx, static)
        self._keep_eager(ctx)
        self.cycle = None
        if "cycle" in state:  # inside a task: its distiller and moments as the checkpoint left them (nothing drawn)
            self.cycle = self._cycle_distiller(ctx.net.feature_dim, ctx.device, None)
            self.cycle.load_state_dict(state["cycle"])
