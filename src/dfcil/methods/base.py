"""The method contract. A method says *what* to compute (named loss terms per step, phases, state); the engine
decides *how* to optimise (optimiser, schedule, freezing, backward, logging, checkpoints)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Literal

from torch import Tensor, nn

from dfcil.config import MethodConfig, TrainConfig, configclass
from dfcil.context import Batch, Phase, Task, TaskContext
from dfcil.errors import RegistryError
from dfcil.methods.memory import NearestMeanClassifier
from dfcil.models.network import IncrementalNet, NetOutput
from dfcil.registry import Registry
from dfcil.stores import check_stores
from dfcil.synthesis.replay import Replay


@dataclasses.dataclass(frozen=True)
class MethodInfo:
    """What a method declares about itself, once, where it is registered (``@register_method(name, **facts)``):
    what ``dfcil methods`` lists (read from the decorator's source without importing torch, :mod:`dfcil.catalogue`)
    and what the engine asks of it."""

    # What it keeps from one task to the next besides the model: one of dfcil.stores.STORES, which also says which
    # methods are data-free
    stores: str = "nothing"
    # Config switches that change what it keeps: {"ldc": "class statistics"}, a true method.ldc keeps that instead
    # (each switch is described in dfcil.stores.SWITCHES)
    switches: Mapping[str, str] = dataclasses.field(default_factory=dict)
    head: str = "linear"  # the head IncrementalNet builds (an instance may choose another from its config: LwF)
    train_data: Literal["task", "seen"] = "task"  # "seen": real data of every task so far (joint only)
    grad_clip_value: float | None = None  # clamp every gradient to [-v, v] (PODNet: 5)
    grad_clip_norm: float | None = None  # rescale the gradient of all trained parameters to norm ≤ v (AdaGauss: 1)
    # Its training_step may be replayed as a CUDA graph (engine.cuda_graphs: on): verified under "check" by
    # tests/test_graphs.py. False: the engine runs the method's steps eagerly even when graphs are on.
    graph_safe: bool = False
    # Its losses work on a static head's full-width logits (model.static_head): unseen columns are masked, and it
    # compares old or new columns through the head's masks, never by slicing with the task's class counts.
    static_head: bool = False
    # It trains over several processes (torchrun): every loss term is a mean over samples, or computed over the
    # global batch through ctx.runtime.dist (dfcil.compute.distributed).
    distributed: bool = False
    # Where its classifier changes between tasks, so that an accuracy of task 0 and a later one are not scored alike
    # (FeCAM: the cosine head after the first task, Mahalanobis distances after): said under every report of it
    scoring: str = ""


FACTS = tuple(f.name for f in dataclasses.fields(MethodInfo))


class Method:
    """One DFCIL algorithm. Owns its teacher, synthesizer and losses; never the optimisation loop.

    Per task the engine calls :meth:`on_task_start` once, then :meth:`synthesize`, then trains the :meth:`phases`
    (:meth:`training_step` per batch, :meth:`on_epoch_end` per epoch), then :meth:`on_task_end`. A resumed run
    restores the method with :meth:`load_state_dict` instead of calling :meth:`on_task_start` again. What it
    declares about itself is :attr:`info`, set by :func:`register_method`.
    """

    name: ClassVar[str]
    info: ClassVar[MethodInfo] = MethodInfo()
    Config: ClassVar[type[MethodConfig]] = MethodConfig

    def __init__(self, cfg: MethodConfig, train: TrainConfig) -> None:
        self.cfg = cfg
        self.train = train
        # a part that classifies at evaluation instead of the network's logits (LDC's nearest class mean), or None
        self.classifier: NearestMeanClassifier | None = None

    @property
    def graph_safe(self) -> bool:
        """Whether this instance's steps may replay as a CUDA graph: its :attr:`info` says so, unless a switch of its
        config makes the step do host work (R-DFCIL+'s pseudo-replay): :attr:`eager_reason` is empty."""
        return not self.eager_reason

    @property
    def eager_reason(self) -> str:
        """Why this instance's steps run eagerly under ``engine.cuda_graphs: on`` ("" where they may replay as
        graphs), for the engine's warning: a method overrides it where a switch of its config makes a step do
        host work."""
        return "" if self.info.graph_safe else f"{self.name} is not marked graph_safe"

    @property
    def stores(self) -> str:
        """What this run's method keeps between tasks: its declared ``stores``, or a switch's that its config turns
        on (``method.ldc: true`` on LwF: class statistics)."""
        on = [stores for key, stores in self.info.switches.items() if getattr(self.cfg, key, False)]
        return on[0] if on else self.info.stores

    @property
    def head(self) -> str:
        """The head the network is built with: the declared one (a method may choose from its config)."""
        return self.info.head

    def phases(self, task: Task) -> list[Phase]:
        """The phases of task ``task.task_id``, each with its whole schedule and optimiser; default: one phase on
        the run's ``train`` schedule (:meth:`Phase.from_train`)."""
        return [Phase.from_train("train", self.train)]

    def scored(self, task: Task) -> bool:
        """Whether the model after task ``task.task_id`` is this method's answer for the classes seen so far, so that
        its row of the accuracy matrix is a result; False for a task whose training the method leaves to a later one
        (joint with ``last_only``: an untrained network until the last task). The summary lists the tasks that are
        not (``unscored_tasks``), and a report reads only what comes after them (A_N where it is the last task)."""
        return True

    def batch_size(self, task: int) -> int:
        """Real images per training step in task ``task``, for the whole task; default: ``train.batch_size``."""
        return self.train.batch_size

    def end_units(self, task: Task) -> int:
        """How the method's work at the end of task ``task`` (its phases' and the task's: statistics, drift) grows
        over a run, for the time estimates (:mod:`dfcil.training.estimate`), which time it in the first incremental
        task: the same in every task (1, the default), or in proportion to what this returns (APR's ADC attacks
        each old class: its old classes' count)."""
        return 1

    def check_image_size(self, size: int) -> None:
        """Raise ValueError (the message naming the sizes it takes) for an image size this method cannot train; the
        protocol calls it before any training, so the error comes before task 0, not after it."""

    def on_task_start(self, ctx: TaskContext) -> None:
        """Called once per task, after the head grew, before training: teacher snapshot, imprinting, new modules."""

    def synthesize(self, ctx: TaskContext, on_step: Callable[[], None]) -> None:
        """Long work before the task trains, after :meth:`on_task_start`: model inversion.

        Call ``on_step()`` at consistent points (after every inversion step): the engine may checkpoint there (with
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

    def on_phase_end(self, ctx: TaskContext, phase: Phase) -> None:
        """Called after the last epoch of ``phase``, before the phase's checkpoint (e.g. drift compensation between
        R-DFCIL's RRL and CHR). A run resumed from that checkpoint calls it again with the state it saved, which
        already holds the work: the method records that it did it (in :meth:`state_dict`) and does not repeat it."""

    def on_task_end(self, ctx: TaskContext) -> None:
        """Called after the last phase of a task, before evaluation."""

    def eval_logits(self, out: NetOutput) -> Tensor:
        """The class scores (B, n_seen) whose argmax is the prediction when the engine evaluates; default: the
        :attr:`classifier`'s where the method has one (and its statistics), else the network's logits. A method
        that classifies otherwise (FeCAM: Mahalanobis distances to stored class statistics) overrides it and keeps
        what it needs in :meth:`eval_state`."""
        scores = self.classifier.scores(out) if self.classifier is not None else None
        return out.logits if scores is None else scores

    def eval_state(self) -> dict[str, Any]:
        """What :meth:`eval_logits` needs besides the network after the last task (e.g. class statistics): the
        final model file keeps it, so that ``dfcil eval`` predicts as the run did. Default: the classifier's."""
        return self.classifier.eval_state() if self.classifier is not None else {}

    def task_seconds(self, task: int) -> dict[str, float]:
        """Seconds of named work of the method in ``task`` outside its phases' epochs (LDC's drift compensation at
        a phase's end), each an entry ``<name>_s`` of the task's timings: its components' (``task_seconds``)."""
        parts = [p for p in self.components().values() if hasattr(p, "task_seconds")]
        return {k: v for part in parts for k, v in part.task_seconds(task).items()}

    def eval_recipe(self) -> str:
        """How :meth:`eval_logits` classifies with :meth:`eval_state`, as code a user can run on the exported tensors
        (``state["method.<key>"]``): the model card's ``classify``. Empty where the network's logits decide."""
        return self.classifier.recipe() if self.classifier is not None else ""

    def load_eval_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`eval_state` into a freshly built method (``dfcil eval``)."""
        if self.classifier is not None:
            self.classifier.load_eval_state(state)

    def synthesizer(self) -> Replay | None:
        """The synthetic replay the method inverts from the old model at each task (its teacher snapshot, generator
        and their state), or None for a method without one: what the inversion diagnostics, the synthetic grids,
        ``dfcil inspect`` and the protocol's checks read. Default: None."""
        return None

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
    method: Method, net: IncrementalNet, ctx: TaskContext, phase: Phase, x: Tensor, y: Tensor, index: Tensor
) -> dict[str, Tensor]:
    """The method's loss terms for one batch, under the run's autocast: the part of a step that ``engine.compile:
    step`` compiles (its backward follows through AOTAutograd). At module level, so that its compiled code is
    cached once for the process and every task's step finds it."""
    with ctx.runtime.autocast():
        return method.training_step(net, Batch(x, y, index), ctx, phase)


# The registered methods, by name: the one table the engine, the config loader (dfcil.load) and the tools look
# methods up in. dfcil/methods/__init__.py imports every built-in method, so it is complete once this package is; a
# plugin's method (an entry point of the group dfcil.methods) is imported when a config names it (dfcil.plugins).
METHODS: Registry[type[Method]] = Registry("method", group="dfcil.methods")


def register_method(name: str, **facts: Any) -> Callable[[type[Method]], type[Method]]:
    """Class decorator: register a :class:`Method` subclass under ``name``, with what it declares about itself
    (``facts``: the fields of :class:`MethodInfo`, e.g. ``stores="class statistics", graph_safe=True``), and set
    its ``name`` and ``info``. Each fact is declared here and nowhere else: a class attribute of the same name is
    refused, and a subclass declares its own (nothing is inherited, so what ``dfcil methods`` reads from this call
    is the whole truth).

    Its ``Config`` then names it: ``Config.name`` defaults to ``name``, so a config built from the class's defaults
    (``Config()``) selects this method. A method that reuses another's ``Config`` (or the bare
    :class:`MethodConfig`) gets a subclass of it that only sets the name; one whose own ``Config`` names another
    method is refused.
    """
    unknown = sorted(set(facts) - set(FACTS))
    if unknown:
        raise RegistryError(f"method {name!r}: unknown facts {unknown}; a method declares {', '.join(FACTS)}")
    info = MethodInfo(**facts)
    try:
        check_stores(info.stores, name)
        for stores in info.switches.values():
            check_stores(stores, name)
    except ValueError as err:
        raise RegistryError(str(err)) from None

    def decorator(cls: type[Method]) -> type[Method]:
        for klass in cls.__mro__[: cls.__mro__.index(Method)]:
            shadowed = sorted(f for f in FACTS if f in vars(klass) and not isinstance(vars(klass)[f], property))
            if shadowed:
                shown = ", ".join(f"{f}={vars(klass)[f]!r}" for f in shadowed)
                raise RegistryError(
                    f"method {name!r}: {klass.__name__} sets {', '.join(shadowed)} as class attributes; declare them "
                    f"once, where the method is registered: @register_method({name!r}, {shown})"
                )
        cls.name = name
        cls.info = info
        cls.Config = _named_config(cls, name)
        return METHODS.register(name)(cls)

    return decorator


def _named_config(cls: type[Method], name: str) -> type[MethodConfig]:
    """``cls.Config``, or a subclass of it whose ``name`` defaults to ``name``."""
    config = cls.Config
    default = {f.name: f.default for f in dataclasses.fields(config)}["name"]
    if default == name:
        return config
    if default and "Config" in vars(cls):
        raise RegistryError(
            f"{cls.__name__}.Config ({config.__name__}) has name {default!r} but the method is registered as "
            f"{name!r}: give its name field the default {name!r}"
        )
    # pickle finds the class as <module>.<Method>.Config, which is what it is set to
    attrs = {"__annotations__": {"name": str}, "name": name, "__module__": cls.__module__}
    attrs |= {"__qualname__": f"{cls.__qualname__}.Config", "__doc__": f"{name}'s config: {config.__name__}, named."}
    return configclass(type(config.__name__ if "Config" in vars(cls) else f"{cls.__name__}Config", (config,), attrs))


def unregister_method(name: str) -> None:
    """Remove a registered method (plugins and tests that add a method for a while)."""
    METHODS.unregister(name)


def build_method(cfg: MethodConfig, train: TrainConfig) -> Method:
    """Instantiate the method named by ``cfg.name`` with its validated config."""
    return METHODS.get(cfg.name)(cfg, train)
