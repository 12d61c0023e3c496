"""What a method is given and what it gives back, below the methods and the synthesizers that use it: the task at
hand (:class:`Task`, and :class:`TaskContext` with the network, the task's data and how the engine computes), a
batch of real images (:class:`Batch`) and the phases a method trains a task in (:class:`Phase`)."""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterable
from typing import Any, Literal

import torch
from torch import Tensor

from dfcil.compute.runtime import Runtime
from dfcil.config import TrainConfig
from dfcil.data.device import TrainBatches
from dfcil.models.network import IncrementalNet

_TRAIN = TrainConfig()  # the train section's defaults, which a phase's own defaults are


@dataclasses.dataclass(frozen=True)
class Phase:
    """A stretch of epochs of one task with its whole schedule: the optimiser and its settings, the lr schedule and
    the set of trained parameters; the engine reads nothing else. :meth:`from_train` fills the schedule from the
    run's ``train`` section, which a method's phases normally do; a method with optimisers of its own says so in
    its phases (EFC's Adam). The defaults are the train section's defaults: a phase that keeps one where the run
    set another value leaves that train key unread, which the protocol's checks refuse."""

    name: str  # "base", "rrl", "chr", ...
    epochs: int
    lr: float  # lr at the start of the phase
    # epochs from the phase start where lr *= gamma; fractions of the phase (train.milestones: [0.5, 0.75]) are
    # turned into epochs when the phase is made: round(f * epochs), halves rounded up
    milestones: tuple[int, ...] = ()
    # "head": backbone frozen (requires_grad=False) and in eval mode; "frozen_bn": everything trains but the BN
    # layers, kept in eval mode with fixed affine parameters (EFC's and SDC's convention after the first task)
    trainable: Literal["all", "head", "frozen_bn"] = "all"
    reset_optimizer: bool = False  # default: one optimiser per task, so momentum carries over between phases
    optimizer: Literal["sgd", "adam"] = "sgd"  # "adam": Adam (betas 0.9, 0.999) with coupled weight decay
    weight_decay: float = _TRAIN.weight_decay  # L2 on every trained parameter, added to the gradient
    gamma: float = _TRAIN.gamma  # the lr's factor at each milestone
    momentum: float = _TRAIN.momentum  # SGD's momentum (Adam has none: not read)

    def __post_init__(self) -> None:
        object.__setattr__(self, "milestones", milestone_epochs(self.milestones, self.epochs))

    @classmethod
    def from_train(cls, name: str, train: TrainConfig, **changes: Any) -> Phase:
        """A phase on the run's schedule: ``train``'s epochs, lr, milestones, gamma and SGD with its momentum and
        weight decay; ``changes`` replace any of them (``epochs=40, lr=0.005, milestones=(), trainable="head"``)."""
        schedule = {
            "epochs": train.epochs, "lr": train.lr, "milestones": tuple(train.milestones), "gamma": train.gamma,
            "optimizer": "sgd", "momentum": train.momentum, "weight_decay": train.weight_decay,
        }  # fmt: skip
        return cls(name=name, **(schedule | changes))

    def describe(self) -> str:
        """The schedule in words: ``rrl 160 ep, lr 0.1 ×0.1 at epochs 80, 120, sgd momentum 0.9, wd 0.0005``."""
        drops = f" ×{self.gamma:g} at epochs {', '.join(map(str, self.milestones))}" if self.milestones else " constant"
        trains = {"head": ", head only", "frozen_bn": ", BN frozen"}.get(self.trainable, "")
        momentum = f" momentum {self.momentum:g}" if self.optimizer == "sgd" else ""
        reset = ", new optimiser" if self.reset_optimizer else ""
        return (
            f"{self.name} {self.epochs} ep, lr {self.lr:g}{drops}{trains}, {self.optimizer}{momentum}, "
            f"wd {self.weight_decay:g}{reset}"
        )

    def lr_at(self, epoch: int) -> float:
        """The lr of epoch ``epoch`` (from the phase's start): ``lr`` times ``gamma`` per milestone passed (two
        milestones on one epoch: ``gamma`` squared there)."""
        return self.lr * self.gamma ** sum(epoch >= m for m in self.milestones)


def milestone_epochs(milestones: tuple[float, ...], epochs: int) -> tuple[int, ...]:
    """Milestones in epochs from a phase's start: an int is one already, a fraction f of a phase of ``epochs``
    epochs is epoch ``floor(f * epochs + 0.5)`` (0.5 of 3 epochs is epoch 2, 0.75 of 160 is 120). Fractions may
    fall on one epoch (0.5 and 0.75 of 3 epochs: 2 and 2), where :meth:`Phase.lr_at` lowers the lr twice at once:
    the protocol's checks refuse that, as a milestone at or after the phase's end."""
    return tuple(m if isinstance(m, int) else math.floor(m * epochs + 0.5) for m in milestones)


def fitting_fractions(lengths: Iterable[int], count: int) -> tuple[float, ...] | None:
    """``count`` (1 or 2) fractions of a phase (tenths or quarters), the nearest to 0.5 and 0.75, that give
    ``count`` different milestones inside every phase of ``lengths`` epochs (from its second epoch to its last: a
    phase of E epochs has room for E - 1); None where the shortest has no room for them."""
    lengths = set(lengths)
    if not lengths or min(lengths) - 1 < count:
        return None

    def fits(fractions: tuple[float, ...], epochs: int) -> bool:
        m = milestone_epochs(fractions, epochs)
        return m[0] > 0 and m[-1] < epochs and len(set(m)) == count

    target = (0.5, 0.75)[:count]
    candidates = itertools.combinations((0.1, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.7, 0.75, 0.8, 0.9), count)
    for fractions in sorted(candidates, key=lambda f: sum(abs(a - b) for a, b in zip(f, target, strict=True))):
        if all(fits(fractions, n) for n in lengths):
            return fractions
    return None  # not reached: (0.4, 0.75) fits every phase of 3 epochs or more, (0.5,) every one of 2 or more


@dataclasses.dataclass(frozen=True)
class Batch:
    x: Tensor  # (B, C, H, W) augmented, normalised real images of the current task
    y: Tensor  # (B,) labels in order position, all in [n_old, n_seen)
    # (B_global,) int64: the rows of ctx.data.x that the global batch holds (under several processes every rank's
    # rows, in the order Dist.gather concatenates them), for per-image state such as a memory bank; None outside
    # the engine's steps
    index: Tensor | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Task:
    """Where a task sits in the protocol: what :meth:`Method.phases` may depend on."""

    task_id: int
    n_old: int  # classes learned before this task
    n_new: int  # classes of this task
    num_tasks: int

    @property
    def n_seen(self) -> int:
        return self.n_old + self.n_new


@dataclasses.dataclass(frozen=True, kw_only=True)
class TaskContext(Task):
    """What a method may use during a task."""

    net: IncrementalNet  # the network being trained (head already expanded to n_seen)
    data: TrainBatches  # the task's real training data; ``data.plain()`` gives un-augmented batches (imprinting)
    rng: torch.Generator  # the method's own random stream (latent codes), on the training device
    runtime: Runtime = Runtime()  # how the engine computes: device, precision, merged passes, progress bars, ...

    @property
    def device(self) -> torch.device:
        return self.runtime.device

    @property
    def image_size(self) -> int:
        return self.data.image_size

    @property
    def batch_size(self) -> int:
        """Real images per training step."""
        return self.data.batch_size
