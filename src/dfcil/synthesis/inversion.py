"""ModelInversion: train a fresh generator against a frozen teacher, then sample pseudo-labelled images.

This is the one place besides the engine that runs an optimiser: the generator's own Adam loop (as cl-lite's
``GenerativeInversion`` and ABD's ``Teacher``). Reference §5.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from dfcil.compute.distributed import Dist
from dfcil.compute.graphs import GraphMode, StepGraph
from dfcil.compute.optim import load_optimizer_state
from dfcil.compute.runtime import Runtime
from dfcil.config import NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt, configclass
from dfcil.errors import DivergedError, LossLimitError, NonFiniteLossError
from dfcil.models.batchnorm import BNMode, BNStats, synchronise
from dfcil.models.generator import build_generator
from dfcil.models.network import IncrementalNet
from dfcil.synthesis.regularizers import (
    bn_statistics_loss,
    content_loss,
    diversity_loss,
    gaussian_kernel,
    smoothness_prior,
)


@configclass
class InversionConfig:
    steps: NonNegativeInt = 5000  # Adam steps per task (reference num_inv_iters; 10000 on ImageNet-100)
    batch_size: PositiveInt | None = None  # images per step; None → train.batch_size, as the reference
    lr: PositiveFloat = 1e-3  # Adam, default betas, no weight decay
    tau: PositiveFloat = 1000.0  # temperature of the content CE only
    w_content: NonNegativeFloat = 1.0
    w_diversity: NonNegativeFloat = 1.0
    w_bn: NonNegativeFloat = 50.0  # × mean over BN layers of the per-layer KL (= ABD's 5e1 / L per layer)
    w_prior: NonNegativeFloat = 1e-3  # Gaussian-blur smoothness prior
    zdim: PositiveInt = 1000  # latent dimension
    persistent: bool = False  # ABD: one generator and Adam for the whole run, warm-started every task


# inversion steps between reads of their loss terms on the host, on a GPU (a sync each, which a CPU does not
# pay: there every step is read); any save of the generator's state reads them first
CHECK_EVERY = 10

# the config key that weights each inversion loss term, for the error that names what to change
TERM_WEIGHTS = {"content": "w_content", "diversity": "w_diversity", "bn": "w_bn", "prior": "w_prior"}


def first_diverged(values: Tensor, max_loss: float | None) -> tuple[int, int] | None:
    """(row, column) of the first entry of ``values`` (steps × loss terms), in step order, that is not finite or
    whose magnitude passes ``max_loss`` (None: no limit); None when every entry is fine."""
    bad = ~torch.isfinite(values)
    if max_loss is not None:
        bad |= values.abs() > max_loss
    found = bad.nonzero()
    return (int(found[0, 0]), int(found[0, 1])) if len(found) else None


def inversion_terms(inversion: ModelInversion, z: Tensor) -> dict[str, Tensor]:
    """The generator's images from latent codes ``z`` and their loss terms, under the run's autocast: the part of an
    inversion step that ``engine.compile: step`` compiles (module level: compiled once for every task)."""
    with inversion.autocast():
        return inversion.loss_terms(inversion.generator(z))


class ModelInversion:
    """A generator trained to produce images the frozen ``teacher`` classifies confidently and whose BN
    statistics match the teacher's running statistics.

    Args:
        teacher: frozen old model (eval mode, no trainable parameters), logits over the old classes only.
        cfg: inversion hyper-parameters.
        image_size: side of the generated images (selects the generator architecture).
        batch_size: images per inversion step.
        rng: generator of the latent codes (on the teacher's device).
        runtime: how to compute: bf16 autocast around forward passes (the loss maths stays fp32), an NHWC
            generator, a fused Adam, the Adam step as one CUDA graph (``graphs``; see dfcil.compute.graphs); its
            ``max_loss`` bounds every loss term (the training's ``train.max_loss``).

    A step whose loss terms are not finite or pass ``max_loss`` stops the inversion (:meth:`check`, every
    :data:`CHECK_EVERY` steps, at the end and before any state is saved), naming the first such step and term:
    a diverged generator is never trained on, saved or sampled.
    """

    def __init__(
        self,
        teacher: IncrementalNet,
        cfg: InversionConfig,
        image_size: int,
        batch_size: int,
        rng: torch.Generator,
        runtime: Runtime | None = None,
    ) -> None:
        runtime = runtime or Runtime()
        self.teacher = teacher
        self.cfg = cfg
        self.batch_size = batch_size
        self.rng = rng
        self.autocast = runtime.autocast
        self.device = next(teacher.parameters()).device
        memory_format = torch.channels_last if runtime.channels_last else torch.contiguous_format
        self.generator = build_generator(image_size, cfg.zdim).to(self.device, memory_format=memory_format)
        # several processes, engine.distributed_inversion split: each trains on its share of the latent batch
        self.dist = runtime.dist if runtime.dist.active and runtime.split_inversion else Dist()
        if self.dist.active:
            synchronise(self.generator, self.dist)  # its BN over the global batch
        graphs = runtime.graphs
        self.graphs: GraphMode = graphs if self.device.type == "cuda" or graphs == "check" else "off"
        extra = {"fused": True} if runtime.fused else {}
        if self.graphs == "on":
            extra["capturable"] = True  # the step counter lives on the device, so a replay advances it
        self.optimizer = torch.optim.Adam(self.generator.parameters(), lr=cfg.lr, **extra)
        self.kernel = gaussian_kernel().to(self.device)
        self.terms = runtime.compiled(inversion_terms)  # engine.compile: step compiles it
        # torch.compile cannot trace a draw from a torch.Generator: under engine.compile: step it runs eagerly
        self.latent = runtime.eager(self._latent)
        self.step = 0  # Adam steps done; fit() continues from here
        self.names: list[str] = []  # the loss terms' names, in the order of fit()'s values
        self.final_terms: dict[str, float] | None = None  # the last step's weighted terms, once fit() ran one
        self.max_loss = runtime.max_loss
        self.check_every = 1 if self.device.type == "cpu" else CHECK_EVERY
        self.recent: Tensor | None = None  # (check_every, terms): the loss terms of the steps not checked yet
        self.checked = 0  # steps whose loss terms were checked
        self.previous: Tensor | None = None  # the loss terms of the last step checked

    @property
    def done(self) -> bool:
        return self.step >= self.cfg.steps

    def _latent(self, n: int) -> Tensor:
        return torch.randn(n, self.cfg.zdim, generator=self.rng, device=self.device)

    def loss_terms(self, x: Tensor) -> dict[str, Tensor]:
        """The four weighted inversion terms for generated images ``x`` (B, 3, H, W)."""
        c = self.cfg
        record: list[BNStats] = []
        sync = self.dist if self.dist.active else None  # the global batch's statistics, of split inversions
        logits = self.teacher(x, bn=BNMode(record=record, record_sync=sync)).logits.float()
        return {
            "content": c.w_content * content_loss(logits, c.tau),
            "diversity": c.w_diversity * diversity_loss(logits, self.teacher.head.mask, sync),
            "bn": c.w_bn * bn_statistics_loss(record),
            "prior": c.w_prior * smoothness_prior(x.float(), self.kernel),
        }

    def train_step(self) -> Tensor:
        """One Adam step of the generator; returns the weighted loss terms, in the order of :attr:`names`."""
        self.optimizer.zero_grad(set_to_none=True)
        terms = self.terms(self, self.dist.shard(self.latent(self.batch_size)))  # split: this process's rows
        self.names = list(terms)
        losses = torch.stack([t.float() for t in terms.values()])
        losses.sum().backward()
        self.dist.average_gradients(list(self.generator.parameters()))
        self.optimizer.step()
        return self.dist.mean(losses.detach())

    def fit(self, on_step: Callable[[int, Tensor], None] | None = None) -> None:
        """Run the remaining Adam steps, then freeze the generator in eval mode.

        Args:
            on_step: called after every step with (steps done, loss terms as in :attr:`names`), for progress
                and checkpoints; the vector is overwritten by the next step.
        """
        self.generator.train()
        self.teacher.eval()
        graph = (
            None
            if self.graphs == "off"
            else StepGraph(self.train_step, self.optimizer, self.graphs, self.device, (self.rng,))
        )
        values = None
        self.checked = self.step
        while self.step < self.cfg.steps:
            values = self.train_step() if graph is None else graph("inversion")  # a graph replays train_step
            if self.recent is None:
                self.recent = values.new_zeros(self.check_every, len(values))
            self.recent[self.step - self.checked].copy_(values)  # the step's only bookkeeping on the device
            self.step += 1
            if self.step - self.checked == self.check_every:
                self.check()
            if on_step is not None:
                on_step(self.step, values)
        self.check()
        if values is not None:  # one host sync, after the last step
            self.final_terms = {k: round(v, 6) for k, v in zip(self.names, values.tolist(), strict=True)}
        self._freeze()

    def check(self) -> None:
        """Stop at the first step since the last check whose loss terms are not finite or pass ``max_loss``.

        Raises:
            NonFiniteLossError: terms became NaN or infinite (named, with the step, the largest term of the step
                before, which usually caused it, and the keys to change).
            LossLimitError: a term passed ``max_loss``.
        """
        done, self.checked = self.step - self.checked, self.step
        if self.recent is None or done <= 0:
            return
        rows = self.recent[:done]
        bad = first_diverged(rows, self.max_loss)
        if bad is None:
            self.previous = rows[-1].clone()
            return
        row, step = bad[0], self.step - done + bad[0] + 1
        before = rows[row - 1] if row > 0 else self.previous  # the last good step's terms, if there was one
        values = rows[row].tolist()
        where = f"at step {step} of {self.cfg.steps}"
        if math.isfinite(values[bad[1]]):
            culprit = self.names[bad[1]]
            what = (
                f"its loss term {culprit!r} reached {values[bad[1]]:.4g} {where}, above train.max_loss "
                f"({self.max_loss:g}; null: no limit)"
            )
            error: type[DivergedError] = LossLimitError
        else:
            terms = [n for n, v in zip(self.names, values, strict=True) if not math.isfinite(v)]
            culprit, what = terms[0], f"its loss term{'s' * (len(terms) > 1)} {', '.join(map(repr, terms))} became "
            what += f"{values[bad[1]]} {where}"
            if before is not None and len(terms) > 1:  # several at once: the largest term of the step before
                last = before.tolist()
                culprit = self.names[max(range(len(last)), key=lambda k: abs(last[k]))]
                what += f" (the step before, the largest was {culprit!r}: {max(map(abs, last)):.4g})"
            error = NonFiniteLossError
        weight = TERM_WEIGHTS.get(culprit)
        keys = [f"method.inversion.{weight} (now {getattr(self.cfg, weight):g})"] if weight else []
        keys.append(f"method.inversion.lr (now {self.cfg.lr:g})")
        raise error(
            f"model inversion diverged: {what}. Lower {' or '.join(keys)}; no checkpoint of the diverged generator "
            f"was written"
        )

    def _freeze(self) -> None:
        self.generator.eval()
        self.generator.requires_grad_(False)
        if not self.cfg.persistent:
            self.optimizer = None  # Adam's moments are not needed for sampling

    def training_state(self) -> dict:
        """Generator and Adam state after training, to warm-start the next task's inversion (persistent)."""
        return {"generator": self.generator.state_dict(), "optimizer": self.optimizer.state_dict()}

    def warm_start(self, state: dict) -> None:
        """Start this inversion from a previous generator and its Adam state (ABD's persistent generator)."""
        self.generator.load_state_dict(state["generator"])
        load_optimizer_state(self.optimizer, state["optimizer"])

    @torch.no_grad()
    def generate(self, n: int) -> Tensor:
        """``n`` images from the frozen generator (eval mode: BN uses running statistics), no grad."""
        self.generator.eval()
        with self.autocast():
            return self.generator(self.latent(n))

    @torch.no_grad()
    def sample(self, n: int) -> tuple[Tensor, Tensor]:
        """``n`` images and their pseudo-labels, the teacher's argmax over the old classes."""
        x = self.generate(n)
        return x, self.teacher(x).logits.argmax(dim=1)

    def state_dict(self) -> dict:
        """Training state (generator, Adam, steps done); only while :attr:`done` is False."""
        if self.done:
            raise RuntimeError("the generator is trained; save generator.state_dict() instead")
        self.check()  # never a checkpoint of a diverged generator
        return {"generator": self.generator.state_dict(), "optimizer": self.optimizer.state_dict(), "step": self.step}

    def load_state_dict(self, state: dict) -> None:
        """Continue a partly trained generator (see :meth:`state_dict`)."""
        self.generator.load_state_dict(state["generator"])
        load_optimizer_state(self.optimizer, state["optimizer"])
        self.step = int(state["step"])
        if self.done:
            self._freeze()

    def load_trained(self, generator_state: dict, optimizer_state: dict | None = None) -> None:
        """Load a fully trained generator for sampling (and its Adam state when it persists)."""
        self.generator.load_state_dict(generator_state)
        if optimizer_state and self.optimizer is not None:
            load_optimizer_state(self.optimizer, optimizer_state)
        self.step = self.cfg.steps
        self._freeze()
