"""What a method is given and what it gives back, below the methods and the synthesizers that use it: the task at
hand (:class:`Task`, and :class:`TaskContext` with the network, the task's data and how the engine computes), a
batch of real images (:class:`Batch`) and the phases a method trains a task in (:class:`Phase`)."""

from __future__ import annotations

import dataclasses
from typing import Literal

import torch
from torch import Tensor

from dfcil.data.device import TrainBatches
from dfcil.models.network import IncrementalNet
from dfcil.runtime import Runtime


@dataclasses.dataclass(frozen=True)
class Phase:
    """A stretch of epochs of one task with its own lr schedule and set of trained parameters."""

    name: str  # "base", "rrl", "chr", ...
    epochs: int
    lr: float  # lr at the start of the phase
    milestones: tuple[int, ...] = ()  # epochs from the phase start where lr *= gamma
    # "head": backbone frozen (requires_grad=False) and in eval mode; "frozen_bn": everything trains but the BN
    # layers, kept in eval mode with fixed affine parameters (EFC's and SDC's convention after the first task)
    trainable: Literal["all", "head", "frozen_bn"] = "all"
    reset_optimizer: bool = False  # default: one optimiser per task, so momentum carries over between phases
    optimizer: Literal["sgd", "adam"] = "sgd"  # "adam": Adam (betas 0.9, 0.999) with coupled weight decay
    weight_decay: float | None = None  # None: train.weight_decay


@dataclasses.dataclass(frozen=True)
class Batch:
    x: Tensor  # (B, C, H, W) augmented, normalised real images of the current task
    y: Tensor  # (B,) labels in order position, all in [n_old, n_seen)


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
