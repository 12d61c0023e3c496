"""The protocol of a run: the dataset, how it is cut into tasks, and the test set evaluated after every task.

Three separate jobs, so that each command does only those it needs:

* :func:`config_problems` (:func:`validate` refuses them): the config across its sections (the method's own checks,
  the backbone and head names, engine switches the method or the launch cannot use); no data, no file system;
* :func:`environment_problems`: what training writes or compiles beside the run (the shared first-task models'
  directory, the compile cache, the compiler): only a run that trains needs them;
* :func:`load_protocol`: the data read (decoded and cached the first time) and cut into tasks, for training and
  for evaluating a finished run alike; :func:`training_problems` are what the method cannot train of it.

:func:`prepare` does them all before a run starts, so that bad input is refused before a run directory exists: each
check adds what it finds to one list rather than stopping at it, so that one refusal (and one dry run) names every
problem, each with its fix.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np
import torch
from torch import Tensor

from dfcil.compute import distributed
from dfcil.compute.distributed import Dist
from dfcil.compute.runtime import check_compiler, compile_cache_dir, resolve_device
from dfcil.config import RunConfig, TrainConfig
from dfcil.context import Phase, fitting_fractions, milestone_epochs
from dfcil.data.datasets import ImageDataset, build_dataset
from dfcil.data.device import Normalizer, TrainBatches, class_indices, to_device
from dfcil.data.splits import ClassIncrementalSplit
from dfcil.errors import ConfigError, DatasetError, RegistryError, SplitError
from dfcil.io import check_creatable_dir
from dfcil.methods import METHODS, Method, Task, build_method
from dfcil.models.backbones import BACKBONES
from dfcil.models.generator import generator_layout
from dfcil.models.heads import HEADS
from dfcil.models.network import IncrementalNet, NetOutput, backbone_for
from dfcil.progress import ProgressFactory


@dataclasses.dataclass(frozen=True)
class Protocol:
    """A validated run setting: the dataset and how it is cut into tasks."""

    dataset: ImageDataset
    split: ClassIncrementalSplit
    train_images: tuple[int, ...]  # training images per task
    test_images: tuple[int, ...]  # test images per task

    def train_tensors(
        self, task: int, seen: bool, per_class: int | None, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The training images (uint8) and labels (order positions) of ``task``, or of tasks 0..task when ``seen``,
        on ``device``: only those classes' images are read."""
        offsets, lut = self.split.offsets, self.split.label_map(self.dataset.num_classes)
        labels = range(0 if seen else offsets[task], offsets[task + 1])
        return to_device(self.dataset.train, lut, class_indices(self.dataset.train, lut, labels, per_class), device)

    def data_identity(self, per_class: int | None, tasks: int | None = None, sample: int = 256) -> dict[str, Any]:
        """What the first ``tasks`` tasks (all by default; at most ``per_class`` images of each class, the config's
        ``data.train_per_class``) train on, independent of where the data lies: the
        classes' names in order, the image size and normalisation, the training images' count and a digest of
        ``sample`` of them spread evenly (pixels and labels). Another dataset, or another version of one, differs."""
        ds, split = self.dataset, self.split
        tasks = split.num_tasks if tasks is None else tasks
        classes = split.class_order[: split.offsets[tasks]]
        idx = class_indices(ds.train, split.label_map(ds.num_classes), range(split.offsets[tasks]), per_class)
        digest = hashlib.sha256()
        for i in idx[:: max(1, len(idx) // sample)][:sample]:
            digest.update(ds.train.x[i].tobytes())
            digest.update(int(ds.train.y[i]).to_bytes(8, "little", signed=True))
        return {
            "classes": [ds.classes[c] for c in classes] if ds.classes else [],
            "image_size": ds.image_size, "mean": list(ds.mean), "std": list(ds.std),
            "train_images": len(idx), "images": digest.hexdigest(),
        }  # fmt: skip


# What identifies a run's data whatever decodes it: a run continues, and is evaluated, only on the same classes,
# image size and image count (Protocol.data_identity). Decoded pixels (and the normalisation computed from them) may
# differ by a decoder's rounding on another machine, so a change there is said, not refused.
IDENTITY_KEYS = ("classes", "image_size", "train_images")


# What a check raises for input it refuses: prepare collects them into one refusal, each with its fix
REFUSALS = (ConfigError, SplitError, DatasetError, RegistryError)
T = TypeVar("T")


def attempt(problems: list[Exception], check: Callable[[], T]) -> T | None:
    """``check()``, or None with its refusal (:data:`REFUSALS`) added to ``problems``."""
    try:
        return check()
    except REFUSALS as err:
        problems.append(err)
        return None


def engine_problems(cfg: RunConfig, method: Method) -> list[Exception]:
    """Engine and model switches that ``method`` or this launch cannot use: a static head, compiled steps, several
    processes (:mod:`dfcil.compute.distributed`)."""
    problems: list[Exception] = []
    if cfg.model.static_head and not method.info.static_head:
        able = ", ".join(n for n in METHODS.names() if METHODS.get(n).info.static_head)
        problems.append(ConfigError(
            f"model.static_head: {method.name} compares logit columns by slicing with the task's class counts, "
            f"which a static head's fixed width does not allow; the methods that support it: {able}. Set "
            f"model.static_head: false"
        ))  # fmt: skip
    dist = distributed.current()
    if dist.active:
        able = ", ".join(n for n in METHODS.names() if METHODS.get(n).info.distributed)
        if not method.info.distributed:
            problems.append(ConfigError(
                f"{method.name} does not train over several processes yet (its batch-level terms are computed per "
                f"process); the methods that do: {able}. Run it as one process"
            ))  # fmt: skip
        if cfg.engine.cuda_graphs == "on" or cfg.engine.compile != "none":
            problems.append(ConfigError(
                "engine.cuda_graphs: on and engine.compile do not work over several processes yet; set "
                "engine.cuda_graphs: off and engine.compile: none, or run one process"
            ))  # fmt: skip
        attempt(problems, lambda: dist.check_batch(cfg.train.batch_size))
        inversion = getattr(cfg.method, "inversion", None)
        if inversion is not None and inversion.batch_size and cfg.engine.distributed_inversion == "split":
            attempt(problems, lambda: dist.check_batch(inversion.batch_size, "method.inversion.batch_size"))
    if cfg.engine.compile == "step" and not cfg.model.static_head:
        problems.append(ConfigError(
            "engine.compile: step compiles each step once per run, which needs shapes that do not change between "
            "tasks: add model.static_head: true (or use engine.compile: default, which compiles the backbones)"
        ))  # fmt: skip
    return problems


def config_problems(cfg: RunConfig) -> tuple[Method | None, list[Exception]]:
    """Every reason the config cannot run, across its sections: a device this machine lacks, the method's own
    cross-field checks (building it), an unknown backbone or head, engine and model switches the method or this
    launch cannot use (:func:`engine_problems`). Reads no data and touches no file. Returns the method built
    (None where its own checks refuse it) and the problems."""
    problems: list[Exception] = []
    attempt(problems, lambda: resolve_device(cfg.device))  # a device this machine has
    method = attempt(problems, lambda: build_method(cfg.method, cfg.train))  # the method's cross-field checks
    if cfg.model.backbone != "auto":
        attempt(problems, lambda: BACKBONES.get(cfg.model.backbone))
    if method is not None:
        attempt(problems, lambda: HEADS.get(method.head))
        problems += engine_problems(cfg, method)
    return method, problems


def validate(cfg: RunConfig) -> Method:
    """Refuse a config that cannot run (:func:`config_problems`, all of them in one error). Reads no data and
    touches no file. Returns the method built (unused but for its checks and what it declares)."""
    method, problems = config_problems(cfg)
    refuse(problems)
    assert method is not None  # refused above otherwise
    return method


def environment_problems(cfg: RunConfig) -> list[Exception]:
    """What only training needs and this machine cannot give: a compiler for ``engine.compile``, and the
    directories ``task0_cache`` and ``engine.compile_cache`` name, which must be creatable. Evaluating a finished
    run needs none of them."""
    problems: list[Exception] = []
    if cfg.engine.compile != "none" and cfg.engine.compile_backend == "inductor":
        try:
            device = resolve_device(cfg.device)
        except ConfigError:  # named by config_problems
            device = None
        if device is not None:
            attempt(problems, lambda: check_compiler(device))
    kept = compile_cache_dir(cfg.engine.compile_cache) if cfg.engine.compile != "none" else None
    for path, what, fix in (
        (cfg.task0_cache, "task0_cache", "set it to a directory or leave it unset"),
        (kept, "engine.compile_cache", "set it to a writable directory, or off"),
    ):
        try:
            if path:
                check_creatable_dir(path, what, fix)
        except ValueError as err:
            problems.append(ConfigError(str(err)))
    return problems


def load_protocol(cfg: RunConfig, progress: ProgressFactory | None = None) -> Protocol:
    """Load the data (decoding and caching image files the first time, with ``progress`` bars) and cut it into the
    config's tasks: what training and the evaluation of a finished run both read.

    Raises:
        DatasetError: the data is missing or cannot be read.
        SplitError: the tasks cannot be built, or one has no test images.
    """
    return cut_tasks(cfg, build_dataset(cfg.data, progress=progress))


def cut_tasks(cfg: RunConfig, dataset: ImageDataset) -> Protocol:
    """Cut ``dataset`` into the config's tasks (:class:`SplitError` where they cannot be built)."""
    d = cfg.data
    split = ClassIncrementalSplit.build(
        dataset.num_classes, d.num_tasks, d.base_classes, d.class_order, d.class_order_seed, d.num_classes
    )
    lut, offsets = split.label_map(dataset.num_classes), split.offsets
    train_n, test_n = [], []
    for t in range(split.num_tasks):
        labels = range(offsets[t], offsets[t + 1])
        train_n.append(len(class_indices(dataset.train, lut, labels, d.train_per_class)))
        test_n.append(len(class_indices(dataset.test, lut, labels, d.test_per_class)))
    if min(test_n) == 0:
        raise SplitError(f"a task has no test images (per task: {test_n}); check data.test_per_class")
    backbone_for(cfg.model.backbone, dataset.image_size)
    return Protocol(dataset, split, tuple(train_n), tuple(test_n))


def training_problems(
    cfg: RunConfig, method: Method | None, dataset: ImageDataset | None, protocol: Protocol | None
) -> list[Exception]:
    """Every reason ``method`` cannot train the protocol: a task with fewer images than a batch (it would never
    train), lr milestones that do not lower the lr where they say (:func:`phase_problems`), a schedule key no phase
    reads, an image size the method or its synthesizer is not built for. What a missing part allows is still
    checked, so that one dry run lists everything: without a protocol (its tasks could not be cut) the batch against
    all the kept classes' images and the phases of a first and a later task; without data, the schedule alone;
    without a method (its own checks refused it), the train section's schedule."""
    tasks = tasks_of(protocol.split) if protocol else stand_in_tasks(cfg.data.num_tasks)
    problems = [] if dataset is None else batch_problems(cfg, dataset, protocol)
    problems += phase_problems(cfg, method, tasks)
    if method is None:
        return problems
    problems += unread_problems(cfg, method, tasks)
    if dataset is None:
        return problems
    try:  # an image size the method (DGR's VAE) or its synthesizer is not built for, refused with the sizes it takes
        method.check_image_size(dataset.image_size)
        if method.synthesizer() is not None:
            generator_layout(dataset.image_size)
    except ValueError as err:
        problems.append(ConfigError(str(err)))
    return problems


def batch_problems(cfg: RunConfig, dataset: ImageDataset, protocol: Protocol | None) -> list[Exception]:
    """A task with fewer training images than ``train.batch_size``: with ``drop_last`` it would never train."""
    b = cfg.train.batch_size
    if protocol is None:  # no tasks: an upper bound, the kept classes' images all together
        counts = np.sort(np.bincount(np.asarray(dataset.train.y), minlength=dataset.num_classes))[::-1]
        kept = counts[: cfg.data.num_classes or len(counts)]
        total = int(np.minimum(kept, cfg.data.train_per_class or kept.max(initial=0)).sum())
        if total >= b:
            return []
        return [
            SplitError(
                f"train.batch_size={b} is more than all {total} training images of the kept classes: no task could "
                f"fill a batch, and with drop_last none would train. Use a smaller batch"
            )
        ]
    short = [(t, n) for t, n in enumerate(protocol.train_images) if n < b]
    if not short:
        return []
    tasks, counts = ", ".join(str(t) for t, _ in short), ", ".join(str(n) for _, n in short)
    which = f"task {tasks} has {counts}" if len(short) == 1 else f"tasks {tasks} have {counts}"
    return [
        SplitError(
            f"{which} training images, fewer than train.batch_size={b}; with drop_last it would never train. Use "
            f"fewer tasks, more images per class or a smaller batch"
        )
    ]


def refuse(problems: Sequence[Exception]) -> None:
    """Raise the one problem as it is, or every problem in one :class:`ConfigError`, one numbered line each (one
    that two checks found is named once)."""
    problems = list({(type(p), str(p)): p for p in problems}.values())
    if len(problems) == 1:
        raise problems[0]
    if problems:
        lines = "".join(f"\n  {i}. {p}" for i, p in enumerate(problems, 1))
        raise ConfigError(f"{len(problems)} problems, each with its fix:{lines}")


def prepare(cfg: RunConfig, progress: ProgressFactory | None = None) -> Protocol:
    """Everything a run checks before it starts (:func:`config_problems`, :func:`environment_problems`, the data,
    the tasks and :func:`training_problems`), raising one clear error that names every problem found, each with its
    fix: a check that finds one adds it and the others still run on what there is. Returns the protocol."""
    method, problems = config_problems(cfg)
    problems += environment_problems(cfg)
    dataset = attempt(problems, lambda: build_dataset(cfg.data, progress=progress))
    protocol = None if dataset is None else attempt(problems, lambda: cut_tasks(cfg, dataset))
    problems += training_problems(cfg, method, dataset, protocol)
    refuse(problems)
    assert protocol is not None  # refused above otherwise
    return protocol


SCHEDULE_KEYS = ("lr", "momentum", "weight_decay", "gamma", "milestones")  # train keys only phases read


def tasks_of(split: ClassIncrementalSplit) -> list[Task]:
    return [
        Task(task_id=t, n_old=split.offsets[t], n_new=split.task_sizes[t], num_tasks=split.num_tasks)
        for t in range(split.num_tasks)
    ]


def stand_in_tasks(num_tasks: int) -> list[Task]:
    """A first task and a later one of one class each: what the schedule checks read where the tasks could not be
    cut (a method's phases depend on whether a task is the first, not on its classes)."""
    return [Task(task_id=t, n_old=t, n_new=1, num_tasks=num_tasks) for t in range(min(num_tasks, 2))]


def unread_problems(cfg: RunConfig, method: Method, tasks: Sequence[Task]) -> list[Exception]:
    """Every schedule key of ``train`` (:data:`SCHEDULE_KEYS`) set away from its default that no phase of any task
    reads: the method's phases stay the same when the key takes another value (EFC's Adam phases read neither
    ``train.lr`` nor ``train.momentum``). A value that some phase uses anyway (a preset repeating a method's own
    lr there) is accepted: it changes nothing, and says nothing false."""
    defaults, phases = TrainConfig(), [p for task in tasks for p in method.phases(task)]
    problems: list[Exception] = []
    for key in unread_schedule_keys(cfg, method, tasks):
        value = getattr(cfg.train, key)
        if value == getattr(defaults, key) or value == () or value in {getattr(p, key) for p in phases}:
            continue
        described = "; ".join(dict.fromkeys(p.describe() for p in phases))
        problems.append(ConfigError(
            f"train.{key} ({list(value) if isinstance(value, tuple) else value}) changes nothing: no phase of "
            f"{method.name} reads it (its phases: {described or 'none'}); drop it, or set the method's own keys "
            f"(dfcil train --print-config lists them)"
        ))  # fmt: skip
    return problems


def unread_schedule_keys(cfg: RunConfig, method: Method, tasks: Sequence[Task]) -> list[str]:
    """The schedule keys of ``train`` that no phase of ``tasks`` reads: another value leaves every phase as it is."""
    phases = [method.phases(task) for task in tasks]
    unread = []
    for key in SCHEDULE_KEYS:
        value = getattr(cfg.train, key)
        another = (() if value else (0.5,)) if key == "milestones" else value * 2 if value else 0.5  # valid, other
        try:
            other = build_method(cfg.method, dataclasses.replace(cfg.train, **{key: another}))
        except (ConfigError, ValueError):  # the method, or the train section, refuses it: the key is read
            continue
        if [other.phases(task) for task in tasks] == phases:
            unread.append(key)
    return unread


def phase_problems(cfg: RunConfig, method: Method | None, tasks: Sequence[Task]) -> list[Exception]:
    """Phases whose lr milestones (epochs from the phase's start) do not lower the lr where they say: one at or after
    the phase's end never does, silently (R-DFCIL's RRL phase, for one, is ``train.epochs - method.chr_epochs``
    long), and two on one epoch (fractions of a short phase: 0.5 and 0.75 of 3 epochs are 2 and 2) lower it twice at
    once (:meth:`~dfcil.context.Phase.lr_at`). One problem per kind of phase (all but its name alike), naming every
    phase of that kind, with a fix that fits the phases at hand. Without a method (its own checks refused it) the
    train section's one phase stands in: no phase on the run's schedule is longer."""
    found: dict[Phase, list[tuple[str, int]]] = {}  # a phase, nameless → (name, task) of every phase of that kind
    if method is None:
        found[Phase.from_train("", cfg.train)] = []
    else:
        for task in tasks:
            for phase in method.phases(task):
                found.setdefault(dataclasses.replace(phase, name=""), []).append((phase.name, task.task_id))
    lengths = {p.epochs for p in found if p.milestones}  # the phases a fix must fit
    given = cfg.train.milestones
    problems: list[Exception] = []
    for phase, where in found.items():
        ms, epochs = phase.milestones, phase.epochs
        late = [m for m in ms if m >= epochs]
        same = sorted({m for m in ms if ms.count(m) > 1})
        if not (late or same):
            continue
        if where:
            lasts = f"lasts {epochs} epoch{'s' * (epochs != 1)}"
            subject = f"the {where[0][0]} phase of task {where[0][1]} {lasts}, but its lr milestones"
        else:
            subject = f"train.epochs is {epochs} (no phase on the run's schedule is longer), but the lr milestones"
        fractions = bool(given) and isinstance(given[0], float) and milestone_epochs(given, epochs) == ms
        shown = f"{list(given)} (epochs {list(ms)} of it)" if fractions else f"{list(ms)} (epochs from its start)"
        reasons = [f"reach {late[0]}: a milestone there never lowers the lr"] if late else []
        if same:
            lowered = f"from {phase.lr:g} to {phase.lr_at(same[0]):g}"
            reasons.append(f"fall on one epoch, {same[0]}: they lower the lr twice at once there ({lowered})")
        others = _phases_named(where[1:])
        also = f" {' and '.join(others)} {'is' if len(others) == 1 else 'are'} the same." if others else ""
        problems.append(ConfigError(
            f"{subject} {shown} {'; and they '.join(reasons)}.{also} {milestone_fix(lengths, len(ms), epochs)}"
        ))  # fmt: skip
    return problems


def _phases_named(where: Sequence[tuple[str, int]]) -> list[str]:
    """``The rrl phase of tasks 1, 2`` for each phase name of (name, task) pairs."""
    tasks: dict[str, list[int]] = {}
    for name, task in where:
        tasks.setdefault(name, []).append(task)
    named = [f"the {n} phase of task{'s' * (len(t) > 1)} {', '.join(map(str, t))}" for n, t in tasks.items()]
    return [text[0].upper() + text[1:] if i == 0 else text for i, text in enumerate(named)]


def milestone_fix(lengths: set[int], wanted: int, epochs: int) -> str:
    """What to set instead of ``wanted`` milestones of a phase of ``epochs``: epochs inside it, or fractions that
    fit every phase of ``lengths`` epochs (:func:`~dfcil.context.fitting_fractions`); where the shortest has no
    room for two (a phase of E epochs has room for E - 1, its epochs 1 to E - 1), as many as it has room for."""
    shortest, count = min(lengths), min(wanted, 2)
    room = min(count, shortest - 1)
    longer = "or make the phases longer (train.epochs)"
    if not room:  # the shortest lasts 1 epoch
        return f"A phase of 1 epoch cannot have a milestone: drop them (train.milestones: []), {longer}"
    fractions = fitting_fractions(lengths, room) or ()
    where = " and ".join(f"{', '.join(map(str, milestone_epochs(fractions, n)))} of a {n}-epoch phase"
                         for n in sorted(lengths)[:3])  # fmt: skip
    at = f"train.milestones: {list(fractions)} lowers the lr at epoch{'s' * (room > 1)} {where}"
    if room == count:
        return f"Use epochs below {epochs}, or fractions of each phase ({at})"
    return f"A phase of {shortest} epochs cannot have two milestones (it has room for one): use one ({at}), {longer}"


@dataclasses.dataclass
class TestSet:
    """The protocol's test images on the device, sorted by label so that the seen classes' images are a prefix."""

    x: torch.Tensor  # (N, H, W, C) uint8
    y: torch.Tensor  # (N,) labels in order position
    seen: np.ndarray  # seen[t] = images of the classes of tasks 0..t
    task_of_label: torch.Tensor
    normalizer: Normalizer

    @classmethod
    def build(cls, protocol: Protocol, per_class: int | None, normalizer: Normalizer, device: torch.device) -> TestSet:
        split, ds = protocol.split, protocol.dataset
        lut = split.label_map(ds.num_classes)
        idx = class_indices(ds.test, lut, range(split.num_classes), per_class)
        idx = idx[np.argsort(lut[ds.test.y[idx]], kind="stable")]  # by label, file order within a label
        x, y = to_device(ds.test, lut, idx, device)
        seen = np.searchsorted(y.cpu().numpy(), split.offsets[1:])
        labels = torch.as_tensor(split.task_of_label(), device=device)
        return cls(x, y, seen, labels, normalizer)

    def batches(self, task: int, batch_size: int) -> int:
        """Forward passes :meth:`evaluate` makes after ``task``."""
        return -(-int(self.seen[task]) // batch_size)

    @torch.no_grad()
    def evaluate(
        self,
        net: IncrementalNet,
        task: int,
        batch_size: int,
        bar: Any = None,
        dist: Dist = Dist(),  # noqa: B008
        scores: Callable[[NetOutput], Tensor] | None = None,
    ) -> tuple[np.ndarray, ...]:
        """Top-1 accuracy counts per task after ``task``, argmax over all classes the head has (the seen ones) of
        ``scores`` of the network's output (the method's :meth:`~dfcil.methods.Method.eval_logits`; None: the
        logits). Under several processes each evaluates every ``dist.world``-th image of each batch and the counts are
        summed: the same counts as one process's.

        Returns:
            (correct, count) per task 0..task.
        """
        was_training = net.training
        net.eval()
        n = int(self.seen[task])
        correct = torch.zeros(task + 1, dtype=torch.long, device=self.x.device)
        count = torch.zeros(task + 1, dtype=torch.long, device=self.x.device)
        for i in range(0, n, batch_size):
            rows = slice(i + dist.rank, min(i + batch_size, n), dist.world)
            xb, yb = self.x[rows], self.y[rows]
            out = net(self.normalizer(xb))
            pred = (out.logits if scores is None else scores(out)).argmax(dim=1)
            t = self.task_of_label[yb]
            correct.index_add_(0, t, (pred == yb).long())
            count.index_add_(0, t, torch.ones_like(yb))
            if bar is not None:
                bar.update(1)
        net.train(was_training)
        dist.sum_(correct)
        dist.sum_(count)
        return correct.cpu().numpy(), count.cpu().numpy()


@dataclasses.dataclass(frozen=True)
class TaskBatches:
    """The batches factory of a run: each task's training images on the device, cut into its batches; resolved
    from the config once, when the run is built."""

    protocol: Protocol
    per_class: int | None  # data.train_per_class
    batch_size: int  # train.batch_size: real images per step
    normalizer: Normalizer
    device: torch.device
    seen: bool = False  # every task so far (joint training), not only the task's own
    dist: Dist = Dist()  # several processes: each loads its share of every batch
    augment: str = "cropflip"  # data.augment

    def __call__(self, task: int, rng: torch.Generator, batch_size: int | None = None) -> TrainBatches:
        """Task ``task``'s batches of ``batch_size`` real images (default: ``train.batch_size``), shuffled and
        augmented with ``rng`` (the run's data stream)."""
        x, y = self.protocol.train_tensors(task, self.seen, self.per_class, self.device)
        return TrainBatches(x, y, batch_size or self.batch_size, self.normalizer, rng, self.dist, recipe=self.augment)


@dataclasses.dataclass(frozen=True)
class Evaluator:
    """The test set evaluated after every task and the batch it is evaluated in (train.eval_batch_size)."""

    test: TestSet
    batch_size: int

    def batches(self, task: int) -> int:
        return self.test.batches(task, self.batch_size)

    def evaluate(
        self,
        net: IncrementalNet,
        task: int,
        bar: Any = None,
        dist: Dist = Dist(),  # noqa: B008
        scores: Callable[[NetOutput], Tensor] | None = None,
    ) -> tuple[np.ndarray, ...]:
        """(correct, count) per task 0..task after ``task`` (:meth:`TestSet.evaluate`)."""
        return self.test.evaluate(net, task, self.batch_size, bar, dist, scores)
