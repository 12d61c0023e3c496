"""The method contract. A method says *what* to compute (named loss terms per step, phases, state); the engine
decides *how* to optimise (optimiser, schedule, freezing, backward, logging, checkpoints)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor, nn

from dfcil.config import METHOD_CONFIGS, MethodConfig, TrainConfig
from dfcil.data.device import TrainBatches
from dfcil.models.network import IncrementalNet
from dfcil.registry import Registry
from dfcil.runtime import Runtime


@dataclasses.dataclass(frozen=True)
class Phase:
    """A stretch of epochs of one task with its own lr schedule and set of trained parameters."""

    name: str  # "base", "rrl", "chr", ...
    epochs: int
    lr: float  # lr at the start of the phase
    milestones: tuple[int, ...] = ()  # epochs from the phase start where lr *= gamma
    trainable: Literal["all", "head"] = "all"  # "head": backbone frozen (requires_grad=False) and in eval mode
    reset_optimizer: bool = False  # default: one optimiser per task, so momentum carries over between phases


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


class Method:
    """One DFCIL algorithm. Owns its teacher, synthesizer and losses; never the optimisation loop.

    Per task the engine calls :meth:`on_task_start` once, then :meth:`synthesize`, then trains the :meth:`phases`
    (:meth:`training_step` per batch, :meth:`on_epoch_end` per epoch), then :meth:`on_task_end`. A resumed run
    restores the method with :meth:`load_state_dict` instead of calling :meth:`on_task_start` again.
    """

    name: ClassVar[str]
    head: ClassVar[str] = "linear"  # which head IncrementalNet must build
    train_data: ClassVar[Literal["task", "seen"]] = "task"  # "seen": real data of every task so far (joint only)
    data_free: ClassVar[bool] = True  # False: keeps real data or a generative model of it (joint, DGR)
    grad_clip_value: ClassVar[float | None] = None  # clamp every gradient to [-v, v] (PODNet: 5)
    # Its training_step may be replayed as a CUDA graph (engine.cuda_graphs: on): verified under "check" by
    # tests/test_graphs.py. False: the engine runs the method's steps eagerly even when graphs are on.
    graph_safe: ClassVar[bool] = False
    # Its losses work on a static head's full-width logits (model.static_head): unseen columns are masked, and it
    # compares old or new columns through the head's masks, never by slicing with the task's class counts.
    static_head: ClassVar[bool] = False
    # It trains over several processes (torchrun): every loss term is a mean over samples, or computed over the
    # global batch through ctx.runtime.dist (dfcil.distributed).
    distributed: ClassVar[bool] = False
    Config: ClassVar[type[MethodConfig]] = MethodConfig

    def __init__(self, cfg: MethodConfig, train: TrainConfig) -> None:
        self.cfg = cfg
        self.train = train

    def phases(self, task: Task) -> list[Phase]:
        """The phases of task ``task.task_id``; default: one phase with the train schedule."""
        t = self.train
        return [Phase("train", epochs=t.epochs, lr=t.lr, milestones=t.milestones)]

    def on_task_start(self, ctx: TaskContext) -> None:
        """Called once per task, after the head grew, before training: teacher snapshot, imprinting, new modules."""

    def synthesize(self, ctx: TaskContext) -> None:
        """Long work before the task trains, after :meth:`on_task_start`: model inversion.

        Call ``ctx.runtime.setup_step()`` at consistent points: the engine may checkpoint there (with
        :meth:`state_dict`), or stop on an interrupt. A run resumed inside it calls it again, with the partial state
        restored by :meth:`load_state_dict`: it continues from there.
        """

    def extra_modules(self, ctx: TaskContext) -> list[nn.Module]:
        """Modules trained with the network by the same optimiser (e.g. RKD projectors)."""
        return []

    def frozen(self, ctx: TaskContext, phase: Phase) -> list[nn.Module | nn.Parameter]:
        """Modules or single parameters of the network kept fixed during ``phase`` (e.g. UCIR's old classifier
        blocks): no gradient, so the optimiser applies neither an update nor weight decay to them."""
        return []

    def training_step(self, net: IncrementalNet, batch: Batch, ctx: TaskContext, phase: Phase) -> dict[str, Tensor]:
        """Named, already-weighted loss terms for one batch; the engine sums them and steps."""
        raise NotImplementedError

    def on_epoch_end(self, ctx: TaskContext, phase: Phase) -> None:
        """Called after every epoch."""

    def on_task_end(self, ctx: TaskContext) -> None:
        """Called after the last phase of a task, before evaluation."""

    def components(self) -> dict[str, Any]:
        """Named stateful parts saved and restored by the default state methods below, e.g. ``{"replay":
        self.replay}``; each has ``state_dict()``, ``static_state_dict()`` and ``load_state_dict(state, ctx,
        static)``."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """Everything that shapes the rest of the run and may change during a task (projectors, counters, a
        generator still being trained). Saved at every checkpoint. Default: the components' states."""
        return {name: s for name, part in self.components().items() if (s := part.state_dict())}

    def static_state_dict(self) -> dict[str, Any]:
        """State fixed from the end of :meth:`synthesize` to the end of the task (frozen teacher, trained
        generator). Saved once per task; per-epoch checkpoints refer to it. Default: the components'."""
        return {name: s for name, part in self.components().items() if (s := part.static_state_dict())}

    def load_state_dict(self, state: dict[str, Any], ctx: TaskContext, static: dict[str, Any] | None = None) -> None:
        """Restore :meth:`state_dict` (and :meth:`static_state_dict`) inside task ``ctx.task_id``; the network
        is already restored. Default: the components'."""
        for name, part in self.components().items():
            part.load_state_dict(state.get(name, {}), ctx, (static or {}).get(name))

    def task0_signature(self) -> str | None:
        """What task-0 training optimises, for sharing first-task models between methods; None: never share.

        Methods whose first task is plain CE over the task's classes return ``"ce"``; the engine adds the
        schedule (its phases) and everything else that shapes the model to the key.
        """
        return None


def loss_terms(
    method: Method, net: IncrementalNet, ctx: TaskContext, phase: Phase, x: Tensor, y: Tensor
) -> dict[str, Tensor]:
    """The method's loss terms for one batch, under the run's autocast: the part of a step that ``engine.compile:
    step`` compiles (its backward follows through AOTAutograd). At module level, so that its compiled code is
    cached once for the process and every task's step finds it."""
    with ctx.runtime.autocast():
        return method.training_step(net, Batch(x, y), ctx, phase)


METHODS: Registry[type[Method]] = Registry("method", builtins="dfcil.methods")


def register_method(name: str) -> Callable[[type[Method]], type[Method]]:
    """Class decorator: register a :class:`Method` subclass under ``name``, set its ``name``, and register its
    ``Config`` with the config layer (which validates ``method`` sections by name)."""

    def decorator(cls: type[Method]) -> type[Method]:
        cls.name = name
        METHOD_CONFIGS.register(name)(cls.Config)
        return METHODS.register(name)(cls)

    return decorator


def unregister_method(name: str) -> None:
    """Remove a registered method and its config (plugins and tests that add a method for a while)."""
    METHODS.unregister(name)
    METHOD_CONFIGS.unregister(name)


def build_method(cfg: MethodConfig, train: TrainConfig) -> Method:
    """Instantiate the method named by ``cfg.name`` with its validated config."""
    return METHODS.get(cfg.name)(cfg, train)
