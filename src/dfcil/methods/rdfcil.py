"""R-DFCIL (Gao et al., ECCV 2022): relation-guided representation learning (RRL), then classification-head
refinement (CHR) with a class-balanced global CE, on synthetic replay from a freshly inverted generator.

Follows the authors' code (docs/reference.md, R-DFCIL training); where it differs from the paper the code wins
and the difference is a switch (``chr_hkd``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Annotated, Any, Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import Tensor, nn

from dfcil.compute.distributed import Dist
from dfcil.config import MethodConfig, NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt, configclass
from dfcil.errors import ConfigError
from dfcil.losses.classification import balanced_class_weights, class_histogram, local_ce
from dfcil.losses.contrastive import ContrastMemory
from dfcil.losses.distillation import RelationProjector, hkd_l1, rkd_angle
from dfcil.methods.base import Batch, Phase, Task, TaskContext, register_method
from dfcil.methods.lifecycle import ReplayMethod
from dfcil.methods.memory import ClassMemory, DriftConfig, NearestMeanClassifier
from dfcil.models.network import IncrementalNet, NetOutput
from dfcil.synthesis.inversion import InversionConfig
from dfcil.synthesis.replay import frozen_student_pass, student_pass, teacher_pass


@configclass
class ContrastConfig:
    """CRD or CRCD on the real new data in place of RKD (``new_kd: crd`` / ``crcd``; docs/baselines.md, "CRD and
    CRCD in place of RKD"). The defaults are CRD's in RepDistiller; R-DFCIL's ``crcd`` section changes them to
    CRCD's code's."""

    weight: NonNegativeFloat = 0.8  # base weight λ, times α·β as λ_rkd is (RepDistiller's CRD command: -b 0.8)
    feat_dim: PositiveInt = 128  # D, the size of both embeddings and bank rows (RepDistiller and CRCD: 128)
    negatives: PositiveInt = 16384  # K per image: bank rows of the task's other classes, with replacement
    temperature: PositiveFloat = 0.07  # T of the critic exp(s / T) (RepDistiller: nce_t 0.07)
    momentum: Annotated[NonNegativeFloat, Field(lt=1)] = 0.5  # of the bank's rows per update (nce_m 0.5)


@configclass
class RDFCILConfig(MethodConfig):
    name: str = "rdfcil"
    lambda_ce: NonNegativeFloat = 0.5  # base weight of the local CE (RRL) and of the global CE (CHR)
    lambda_hkd: NonNegativeFloat = 0.15  # base weight of HKD (L1 on old logits of synthetic data)
    lambda_rkd: NonNegativeFloat = 0.5  # base weight of angle-wise RKD on real new data
    chr_epochs: NonNegativeInt = 40  # last epochs of train.epochs that train the head only; 0: no CHR
    chr_lr: PositiveFloat = 0.005  # constant lr of CHR (reference: finetuning_lr)
    chr_hkd: bool = True  # keep HKD during CHR, as the reference code (the paper's CHR is the CE alone)
    # Ablations (paper Table 6 and supplement). Each replacing loss keeps its own adaptive weight.
    old_kd: Literal["hkd", "rkd", "none"] = "hkd"  # KD on synthetic old data: HKD, RKD (swap), or none (w/o HKD)
    # KD on real new data: RKD, HKD (swap), CRD or CRCD (supplement, against a bank of the task's images), or none
    new_kd: Literal["rkd", "hkd", "crd", "crcd", "none"] = "rkd"
    projection: Literal["learned", "identity"] = "learned"  # RKD through learned φ/ψ (d → 2d) or raw features
    # LDC on R-DFCIL: keep each class's mean feature, move the stored means through a projector fitted at the end
    # of every later task's RRL, and classify by nearest mean (docs/baselines.md, LDC)
    ldc: bool = False
    drift: DriftConfig = dataclasses.field(default_factory=DriftConfig)  # the projector's fit (ldc, R-DFCIL+)
    inversion: InversionConfig = dataclasses.field(default_factory=InversionConfig)
    crd: ContrastConfig = dataclasses.field(default_factory=ContrastConfig)  # new_kd: crd (RepDistiller's values)
    # new_kd: crcd (Lechatelia/CRCD's train_student.py: -b 1.0, nce_k 500, nce_t 0.05, nce_m 0.5, feat_dim 128)
    crcd: ContrastConfig = dataclasses.field(
        default_factory=lambda: ContrastConfig(weight=1.0, negatives=500, temperature=0.05)
    )


@dataclasses.dataclass(frozen=True)
class LossWeights:
    alpha: float
    beta: float
    lce: float
    hkd: float
    rkd: float


def rdfcil_loss_weights(lambda_ce: float, lambda_hkd: float, lambda_rkd: float, n_old: int, n_new: int) -> LossWeights:
    """Adaptive RRL weights (paper eqs. 7–8): α = log2(n_new/2 + 1), β = √(n_old/n_new),
    w_lce = λ_ce·(1 + 1/α)/β, w_hkd = λ_hkd·α·β, w_rkd = λ_rkd·α·β.

    CIFAR-100, 10 tasks, task 1: α = 2.585, weights 0.693 / 0.388 / 1.292.
    """
    if n_old < 1 or n_new < 1:
        raise ValueError(f"adaptive weights need n_old ≥ 1 and n_new ≥ 1, got {n_old}, {n_new}")
    alpha = math.log2(n_new / 2 + 1)
    beta = math.sqrt(n_old / n_new)
    return LossWeights(
        alpha, beta, lambda_ce * (1 + 1 / alpha) / beta, lambda_hkd * alpha * beta, lambda_rkd * alpha * beta
    )


def weighted_ce(logits: Tensor, y: Tensor, weight: Tensor, dist: Dist) -> Tensor:
    """Class-weighted CE, Σ w_y·CE / Σ w_y over the global batch: under several processes each process's numerator
    over the global denominator, times the number of processes (the engine averages the gradients over them)."""
    if not dist.active:
        return F.cross_entropy(logits.float(), y, weight=weight)
    total = dist.sum_(weight[y].sum())
    return F.cross_entropy(logits.float(), y, weight=weight, reduction="sum") * dist.world / total


@register_method(
    "rdfcil",
    graph_safe=True,  # its step replays as a CUDA graph (checked by tests/test_graphs.py)
    static_head=True,  # old and new columns through the head's masks when it is static
    distributed=True,  # its batch-level terms (RKD, weighted CE, label counts) over the global batch
    stores="synthesizer per task",
    switches={"ldc": "class statistics"},  # method.ldc: true keeps LDC's class means
)
class RDFCIL(ReplayMethod):
    """R-DFCIL (Gao et al., 2022): relation-guided representation learning, then head refinement.

    Task 0: CE for ``epochs - chr_epochs`` epochs (the reference's remaining task-0 epochs are no-ops, skipped).
    Task t ≥ 1: invert the old model into a fresh generator, then RRL (LCE + HKD + RKD), then CHR."""

    Config = RDFCILConfig

    def __init__(self, cfg: RDFCILConfig, train) -> None:
        super().__init__(cfg, train)
        if cfg.chr_epochs >= train.epochs:
            raise ConfigError(
                f"method.chr_epochs ({cfg.chr_epochs}) must be smaller than train.epochs ({train.epochs}): "
                f"train.epochs counts RRL and CHR epochs together, as the reference's max_epochs; lower "
                f"method.chr_epochs or raise train.epochs"
            )
        self.task_id: int | None = None  # the task the state below belongs to
        self.memory = self.build_memory(cfg)
        self.classifier = NearestMeanClassifier(self.memory) if cfg.ldc else None
        self.projector: RelationProjector | None = None
        self.contrast: ContrastMemory | None = None  # new_kd crd / crcd: embedding heads and banks of the task
        self.weights: LossWeights | None = None
        self.term_weights: Tensor | None = None  # (lce, hkd, rkd) of self.weights, then CRD's or CRCD's λ·α·β
        self.class_counts: Tensor | None = None
        self.class_weights: Tensor | None = None

    def phases(self, task: Task) -> list[Phase]:
        c, t = self.cfg, self.train
        rrl_epochs = t.epochs - c.chr_epochs
        if task.task_id == 0:
            return [Phase.from_train("base", t, epochs=rrl_epochs)]
        rrl = Phase.from_train("rrl", t, epochs=rrl_epochs)
        if not c.chr_epochs:
            return [rrl]
        # the same SGD as RRL, momentum carried over (the reference), at CHR's constant lr
        return [rrl, Phase.from_train("chr", t, epochs=c.chr_epochs, lr=c.chr_lr, milestones=(), trainable="head")]

    def _build_task_state(self, ctx: TaskContext) -> None:
        c = self.cfg
        self.task_id = ctx.task_id
        uses_rkd = "rkd" in (c.old_kd, c.new_kd) and c.projection == "learned"
        self.projector = RelationProjector(ctx.net.feature_dim).to(ctx.device) if uses_rkd else None
        contrast = {"crd": c.crd, "crcd": c.crcd}.get(c.new_kd)
        if contrast is not None:  # a fresh bank over this task's images (drawing from the global stream)
            if ctx.n_new < 2:
                raise ConfigError(
                    f"method.new_kd {c.new_kd} draws its negatives from the task's other classes, but task "
                    f"{ctx.task_id} has {ctx.n_new} class: use new_kd rkd for tasks of one class"
                )
            self.contrast = ContrastMemory(
                c.new_kd, ctx.net.feature_dim, ctx.data.y, contrast.feat_dim, contrast.negatives,
                contrast.temperature, contrast.momentum,
            ).to(ctx.device)  # fmt: skip
        self.weights = w = rdfcil_loss_weights(c.lambda_ce, c.lambda_hkd, c.lambda_rkd, ctx.n_old, ctx.n_new)
        w_contrast = contrast.weight * w.alpha * w.beta if contrast is not None else 0.0  # adaptive, as RKD's
        # the weights as one device tensor: a step reads them as data, so its graph is the same for every task
        self.term_weights = torch.tensor([w.lce, w.hkd, w.rkd, w_contrast], device=ctx.device)
        n = ctx.net.head.out_features  # the seen classes, or all of a static head's
        self.class_counts = torch.zeros(n, device=ctx.device)
        self.class_weights = torch.ones(n, device=ctx.device)

    def on_task_start(self, ctx: TaskContext) -> None:
        if ctx.task_id > 0:
            self._build_task_state(ctx)  # projectors (drawing from the global stream first), weights, counts
        super().on_task_start(ctx)  # the old model's snapshot and a fresh generator per task (reference)

    def build_memory(self, cfg: RDFCILConfig) -> ClassMemory | None:
        """The class statistics it keeps: LDC's class means (``ldc``), else none."""
        return ClassMemory.for_switch(cfg.ldc, cfg.drift, generator=True)

    def components(self) -> dict[str, Any]:
        return super().components() | ({"memory": self.memory} if self.memory is not None else {})

    def on_phase_end(self, ctx: TaskContext, phase: Phase) -> None:
        if phase.name == "rrl" and self.memory is not None:  # the backbone is final: CHR trains the head only
            self.memory.compensate(ctx, self.teacher, self.replay.generate)

    def on_task_end(self, ctx: TaskContext) -> None:
        if self.memory is not None:
            self.memory.add_classes(ctx)  # the new classes' statistics, in the final feature space
        super().on_task_end(ctx)  # nothing of a task's teacher, generator or projectors is carried into the next
        self.task_id = self.projector = self.contrast = self.weights = self.term_weights = None
        self.class_counts = self.class_weights = None

    def extra_modules(self, ctx: TaskContext) -> list[nn.Module]:
        return [m for m in (self.projector, self.contrast) if m is not None]  # the bank is buffers: not trained

    def _rkd(self, student_features: Tensor, teacher_features: Tensor, dist: Dist) -> Tensor:
        """Angle-wise RKD (eq. 4) through the learned projections φ/ψ, over the global batch's features."""
        student_features, teacher_features = dist.gather(student_features), dist.gather(teacher_features)
        if self.projector is not None:
            student_features, teacher_features = self.projector(student_features, teacher_features)
        return rkd_angle(student_features, teacher_features)

    def _contrast(self, student_features: Tensor, teacher_features: Tensor, batch: Batch, ctx: TaskContext) -> Tensor:
        """CRD or CRCD against the task's bank, over the global batch (whose bank rows ``batch.index`` gives)."""
        if batch.index is None:
            raise ValueError(f"method.new_kd {self.cfg.new_kd} needs the batch's image rows (Batch.index)")
        dist = ctx.runtime.dist
        return self.contrast(dist.gather(student_features), dist.gather(teacher_features), batch.index, ctx.rng)

    def training_step(self, net: IncrementalNet, batch: Batch, ctx: TaskContext, phase: Phase) -> dict[str, Tensor]:
        if phase.name == "base":  # task 0
            return {"ce": F.cross_entropy(net(batch.x).logits, batch.y)}
        c, b, runtime = self.cfg, len(batch.x), ctx.runtime
        w_lce, w_hkd, w_rkd, w_contrast = self.term_weights  # the adaptive weights (eqs. 7-8)
        old, new = net.old_and_new(ctx.n_old)  # the old and the new classes' logits
        x_syn = self.old_inputs(b, ctx)  # the old classes' images: fresh synthetic ones, as many as real
        need_real = phase.name == "rrl" and self.teacher_on_real  # the teacher on real data
        merge = runtime.merge_teacher
        t_real, t_syn = teacher_pass(self.teacher, batch.x if need_real else None, x_syn, merge, duplicate=True)
        y_syn = t_syn.logits.argmax(dim=1)  # pseudo-labels: the old model's argmax over the old classes
        self.class_counts += runtime.dist.sum_(class_histogram(torch.cat([batch.y, y_syn]), len(self.class_counts)))
        if phase.name == "chr":  # CHR (eq. 10): class-balanced CE on real + synthetic data, the backbone frozen
            logits = frozen_student_pass(net, batch.x, x_syn, merge)
            y = torch.cat([batch.y, y_syn])
            terms = {"gce": c.lambda_ce * weighted_ce(logits, y, self.class_weights, runtime.dist)}
            if c.chr_hkd and c.old_kd == "hkd":  # the reference keeps HKD in CHR
                terms["hkd"] = w_hkd * hkd_l1(logits[b:], t_syn.logits, old)
            return terms
        # RRL (eq. 9): each part of [real; synthetic] normalised with its own BN statistics, as the reference
        out = student_pass(net, batch.x, x_syn, "separate", runtime.merge_student)
        s_real, s_syn = out.rows(0, b), out.rows(b)
        terms = {"lce": w_lce * local_ce(s_real.logits, batch.y, new)}
        if c.old_kd == "hkd":  # old knowledge on synthetic data (eq. 2)
            terms["hkd"] = w_hkd * hkd_l1(s_syn.logits, t_syn.logits, old)
        elif c.old_kd == "rkd":
            terms["rkd_syn"] = w_rkd * self._rkd(s_syn.features, t_syn.features, runtime.dist)
        if c.new_kd == "rkd":  # the structure of the new data in the old feature space (eq. 4)
            terms["rkd"] = w_rkd * self._rkd(s_real.features, t_real.features, runtime.dist)
        elif c.new_kd == "hkd":
            terms["hkd_new"] = w_hkd * hkd_l1(s_real.logits, t_real.logits, old)
        elif self.contrast is not None:  # crd, crcd: the same images' embeddings against the task's bank
            terms[c.new_kd] = w_contrast * self._contrast(s_real.features, t_real.features, batch, ctx)
        return terms | self.rrl_feature_terms(out.features, t_real)

    def old_inputs(self, batch_size: int, ctx: TaskContext) -> Tensor:
        """The step's images of the old classes, for HKD and CHR: ``batch_size`` fresh, unaugmented images of the
        generator (this process's share of the global batch's). A subclass may add others (R-DFCIL+'s pseudo-replay).
        """
        return self.replay.generate_share(batch_size, ctx.runtime.dist)

    @property
    def teacher_on_real(self) -> bool:
        """Whether RRL passes the real images through the old model: for new-data KD (a subclass may need it for
        its own terms, :meth:`rrl_feature_terms`)."""
        return self.cfg.new_kd != "none"

    def rrl_feature_terms(self, features: Tensor, teacher_real: NetOutput | None) -> dict[str, Tensor]:
        """Further RRL terms on the student's features of the step's [real; synthetic] images and the old model's
        output on the real ones (None unless :attr:`teacher_on_real`); a subclass's: none here."""
        return {}

    def on_epoch_end(self, ctx: TaskContext, phase: Phase) -> None:
        if ctx.task_id > 0:  # cumulative real + pseudo-label counts since the task started, RRL included
            self.class_weights.copy_(balanced_class_weights(self.class_counts))  # in place: a graph reads it

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        if self.task_id is not None:
            state |= {
                "task_id": self.task_id,
                "projector": self.projector.state_dict() if self.projector is not None else {},
                "contrast": self.contrast.state_dict() if self.contrast is not None else {},
                "class_counts": self.class_counts,
                "class_weights": self.class_weights,
            }
        return state

    def load_state_dict(self, state: dict[str, Any], ctx: TaskContext, static: dict[str, Any] | None = None) -> None:
        super().load_state_dict(state, ctx, static)
        if "task_id" not in state:
            self.task_id = None
            return
        self._build_task_state(ctx)
        if self.projector is not None:
            self.projector.load_state_dict(state["projector"])
        if self.contrast is not None:  # its heads, banks and normalisers as the step before the checkpoint left them
            self.contrast.load_state_dict(state["contrast"])
        self.class_counts.copy_(state["class_counts"])
        self.class_weights.copy_(state["class_weights"])

    def task0_signature(self) -> str | None:
        # task 0 is plain CE over its classes; the class statistics of task 0 are not in a shared model
        return "ce" if self.memory is None else None
