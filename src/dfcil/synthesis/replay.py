"""Synthetic replay of one task: a frozen snapshot of the old model and the generator inverted from it.

Every synthetic-replay method (R-DFCIL, ABD, DeepInversion, UCIR-DF, PODNet-DF) holds one :class:`Replay` through
:class:`dfcil.methods.lifecycle.ReplayMethod`, which calls :meth:`Replay.begin` at a task's start,
:meth:`Replay.fit` in its setup and :meth:`Replay.end` at its end; the checkpoint logic (partial inversion, frozen
state) lives here once. The passes a replay step makes over real and synthetic images (:func:`teacher_pass`,
:func:`student_pass`) are here too, so that a method's step says which outputs it needs, not how the engine batches
them. With ``InversionConfig.persistent`` (ABD) the generator and its
Adam state carry over to the next task and are warm-started there, instead of a fresh generator per task (R-DFCIL).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any, Literal

import torch
from torch import Tensor

from dfcil.compute.distributed import Dist
from dfcil.context import TaskContext
from dfcil.errors import DivergedError
from dfcil.models.batchnorm import BNMode
from dfcil.models.network import IncrementalNet, NetOutput
from dfcil.progress import ProgressLog
from dfcil.synthesis.inversion import InversionConfig, ModelInversion

log = logging.getLogger("dfcil")


class Replay:
    """Teacher snapshot + generator for the current task, with its checkpointable state."""

    def __init__(self, cfg: InversionConfig) -> None:
        self.cfg = cfg
        self.task_id: int | None = None
        self.teacher: IncrementalNet | None = None
        self.synth: ModelInversion | None = None
        self.carried: dict[str, Any] | None = None  # persistent generator + Adam state from the previous task

    @property
    def trained_generator(self) -> torch.nn.Module | None:
        """The running task's generator once its inversion is done (eval mode, frozen); None before, or between
        tasks."""
        return self.synth.generator if self.synth is not None and self.synth.done else None

    @property
    def final_terms(self) -> dict[str, float] | None:
        """The running task's inversion loss terms at its last step (weighted), once it ran one."""
        return self.synth.final_terms if self.synth is not None else None

    def _build(self, ctx: TaskContext) -> None:
        self.task_id = ctx.task_id
        self.teacher = ctx.net.frozen_copy(n_classes=ctx.n_old)
        batch = self.cfg.batch_size or ctx.batch_size
        self.synth = ModelInversion(self.teacher, self.cfg, ctx.image_size, batch, ctx.rng, ctx.runtime)

    def begin(self, ctx: TaskContext) -> None:
        """Snapshot the old model and build the task's generator (warm-started from the last one if it persists)."""
        self._build(ctx)
        if self.carried is not None:  # ABD: warm-start from the previous task's generator and Adam
            self.synth.warm_start(self.carried)
            self.carried = None  # from here on the generator itself holds that state

    def fit(self, ctx: TaskContext, on_step: Callable[[], None]) -> None:
        """Train the generator, from where it stands (a resumed run continues a partial inversion); ``on_step()``
        after every step (:meth:`dfcil.methods.base.Method.synthesize`: where the engine may checkpoint or stop)."""
        synth = self.synth
        if synth is None or synth.done:
            return
        log.info(
            "task %d: inverting the old model into a generator (steps %d..%d)", ctx.task_id, synth.step, synth.cfg.steps
        )
        desc, total = f"task {ctx.task_id} inversion", synth.cfg.steps
        # a line every tenth of the steps, bar or none (run.log has no bar); several processes: the first logs
        lines = ProgressLog(desc, total, synth.step) if ctx.runtime.dist.main else None
        with ctx.runtime.progress(total=total, desc=desc, initial=synth.step) as bar:

            def after_step(step: int, values: Tensor) -> None:
                bar.update(1)
                shown, logged = step % 50 == 0 or step == total, lines is not None and lines.due(step)
                if shown or logged:  # a host sync at these few steps: a captured step's output is read after it
                    terms = dict(zip(synth.names, values.tolist(), strict=True))
                    bar.set_postfix({k: f"{v:.3f}" for k, v in terms.items()})
                    if logged:
                        lines.log(step, terms)
                on_step()

            try:
                synth.fit(after_step)
            except DivergedError as err:  # the same error, saying which task's inversion
                raise type(err)(f"task {ctx.task_id}: {err}") from None
        log.info("task %d: inversion done", ctx.task_id)

    def end(self) -> None:
        """Drop the task's teacher and generator; keep the generator's training state if it persists."""
        if self.synth is not None and self.cfg.persistent:
            self.carried = self.synth.training_state()
        self.task_id = self.teacher = self.synth = None

    @torch.no_grad()
    def generate(self, n: int) -> Tensor:
        return self.synth.generate(n)

    @torch.no_grad()
    def generate_share(self, n: int, dist: Dist) -> Tensor:
        """This process's ``n`` of a synthetic batch drawn whole for every process (``n`` × their number), so that
        all of them draw the same latent codes and the global batch is the one-process batch (docs/distributed.md);
        with one process, ``n`` images."""
        return dist.shard(self.generate(n * dist.world))

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"carried": self.carried} if self.carried else {}
        if self.task_id is not None:
            state["task_id"] = self.task_id
            if not self.synth.done:  # inside the inversion: the partial generator travels with every checkpoint
                state |= {"teacher": self.teacher.state_dict(), "inversion": self.synth.state_dict()}
        return state

    def static_state_dict(self) -> dict[str, Any]:
        if self.task_id is None or not self.synth.done:
            return {}
        static = {"teacher": self.teacher.state_dict(), "generator": self.synth.generator.state_dict()}
        if self.synth.final_terms is not None:  # for the diagnostics of a run resumed right after its inversion
            static["final_terms"] = self.synth.final_terms
        if self.cfg.persistent:
            static["optimizer"] = self.synth.optimizer.state_dict()
        return static

    def load_state_dict(self, state: dict[str, Any], ctx: TaskContext, static: dict[str, Any] | None) -> None:
        self.carried = state.get("carried") or None
        if "task_id" not in state:
            self.task_id = self.teacher = self.synth = None
            return
        if state["task_id"] != ctx.task_id:
            raise ValueError(f"replay state of task {state['task_id']} cannot resume task {ctx.task_id}")
        self._build(ctx)
        if "inversion" in state:
            self.teacher.load_state_dict(state["teacher"])
            self.synth.load_state_dict(state["inversion"])
        else:
            if not static:
                raise ValueError("the trained generator and teacher of this task are missing from the checkpoint")
            self.teacher.load_state_dict(static["teacher"])
            self.synth.load_trained(static["generator"], static.get("optimizer"))
            self.synth.final_terms = static.get("final_terms")


ReplayBN = Literal["mixed", "separate"]


@torch.no_grad()
def teacher_pass(
    teacher: IncrementalNet, real: Tensor | None, synthetic: Tensor, merge: bool, duplicate: bool = False
) -> tuple[NetOutput | None, NetOutput]:
    """The frozen teacher's outputs on ``real`` (None: not needed) and on ``synthetic`` images.

    ``merge``: one eval-mode pass over both, which equals two passes exactly; else two passes, with the reference's
    duplicate pass over the synthetic images first where ``duplicate`` (R-DFCIL's code labels them twice; it changes
    only the time a step takes, for A/B timing against the reference mode ``engine.merge_passes: none``).
    """
    if merge:
        out = teacher(synthetic if real is None else torch.cat([real, synthetic]))
        return (None if real is None else out.rows(0, len(real))), out.rows(out.logits.shape[0] - len(synthetic))
    if duplicate:
        teacher(synthetic)
    return (None if real is None else teacher(real)), teacher(synthetic)


def frozen_student_pass(net: IncrementalNet, real: Tensor, synthetic: Tensor, merge: bool) -> Tensor:
    """The logits of a student whose backbone is frozen in eval mode (a head-only phase) on ``real`` then
    ``synthetic`` images: one pass over both where ``merge`` (exact in eval mode), else two."""
    if merge:
        return net(torch.cat([real, synthetic])).logits
    return torch.cat([net(real).logits, net(synthetic).logits])


def student_pass(
    net: IncrementalNet, real: Tensor, synthetic: Tensor, bn: ReplayBN, merge: bool = False, fmaps: bool = False
) -> NetOutput:
    """The student's outputs on ``real`` then ``synthetic`` images (rows in that order).

    ``bn="mixed"``: one batch, so BN normalises both with shared statistics (ABD's, DeepInversion's and DGR's code).
    ``"separate"``: each part with its own batch statistics, the running statistics updated real part first, as two
    passes would (R-DFCIL's code); computed as one pass with per-part BN statistics when ``merge`` and the parts
    are equally large, else as two passes (whose feature maps are joined only if ``fmaps``).
    """
    if bn == "mixed":
        return net(torch.cat([real, synthetic]))
    if merge and len(real) == len(synthetic):
        return net(torch.cat([real, synthetic]), bn=BNMode(splits=2))
    a, b = net(real), net(synthetic)
    maps = tuple(torch.cat(pair) for pair in zip(a.fmaps, b.fmaps, strict=True)) if fmaps else ()
    return NetOutput(torch.cat([a.logits, b.logits]), torch.cat([a.features, b.features]), maps)


def synthetic_count(per_class: int, n_old: int, real_batch: int, steps_per_epoch: int) -> int:
    """Synthetic images per step: as many as real ones (``per_class == 0``, ABD's and R-DFCIL's 1:1), or enough that
    an epoch sees ``per_class`` per old class (UCIR's and PODNet's exemplar budget, e.g. 20): at least one."""
    if per_class == 0:
        return real_batch
    return max(1, math.ceil(per_class * n_old / max(steps_per_epoch, 1)))


def synthetic_per_step(per_class: int, ctx: TaskContext, real_batch: int) -> int:
    """:func:`synthetic_count` for the task at hand (its old classes and steps per epoch)."""
    return synthetic_count(per_class, ctx.n_old, real_batch, len(ctx.data) if per_class else 0)
