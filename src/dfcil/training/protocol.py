"""The protocol of a run: the dataset, how it is cut into tasks, and the test set evaluated after every task.

Three separate jobs, so that each command does only those it needs:

* :func:`validate`: the config across its sections (the method's own checks, the backbone and head names, engine
  switches the method or the launch cannot use); no data, no file system;
* :func:`check_environment`: what training writes or compiles beside the run (the shared first-task models'
  directory, the compile cache, the compiler): only a run that trains needs them;
* :func:`load_protocol`: the data read (decoded and cached the first time) and cut into tasks, for training and
  for evaluating a finished run alike; :func:`check_training` then refuses a protocol the method cannot train.

:func:`prepare` does all four before a run starts, so that bad input is refused before a run directory exists.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from dfcil.compute import distributed
from dfcil.compute.distributed import Dist
from dfcil.compute.runtime import check_compiler, compile_cache_dir, resolve_device
from dfcil.config import RunConfig, TrainConfig
from dfcil.data.datasets import ImageDataset, build_dataset
from dfcil.data.device import Normalizer, TrainBatches, class_indices, to_device
from dfcil.data.splits import ClassIncrementalSplit
from dfcil.errors import ConfigError, DatasetError, SplitError
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


def check_engine(cfg: RunConfig, method: Any) -> None:
    """Refuse engine and model switches that ``method`` or this launch cannot use: a static head, compiled steps,
    several processes (:mod:`dfcil.compute.distributed`)."""
    if cfg.model.static_head and not method.info.static_head:
        able = ", ".join(n for n in METHODS.names() if METHODS.get(n).info.static_head)
        raise ConfigError(
            f"model.static_head: {method.name} compares logit columns by slicing with the task's class counts, "
            f"which a static head's fixed width does not allow; the methods that support it: {able}. Set "
            f"model.static_head: false"
        )
    dist = distributed.current()
    if dist.active:
        able = ", ".join(n for n in METHODS.names() if METHODS.get(n).info.distributed)
        if not method.info.distributed:
            raise ConfigError(
                f"{method.name} does not train over several processes yet (its batch-level terms are computed per "
                f"process); the methods that do: {able}. Run it as one process"
            )
        if cfg.engine.cuda_graphs == "on" or cfg.engine.compile != "none":
            raise ConfigError(
                "engine.cuda_graphs: on and engine.compile do not work over several processes yet; set "
                "engine.cuda_graphs: off and engine.compile: none, or run one process"
            )
        dist.check_batch(cfg.train.batch_size)
        inversion = getattr(cfg.method, "inversion", None)
        if inversion is not None and inversion.batch_size and cfg.engine.distributed_inversion == "split":
            dist.check_batch(inversion.batch_size, "method.inversion.batch_size")
    if cfg.engine.compile == "step" and not cfg.model.static_head:
        raise ConfigError(
            "engine.compile: step compiles each step once per run, which needs shapes that do not change between "
            "tasks: add model.static_head: true (or use engine.compile: default, which compiles the backbones)"
        )


def validate(cfg: RunConfig) -> Method:
    """Refuse a config that cannot run, across its sections: the method's own cross-field checks (building it),
    an unknown backbone or head, engine and model switches the method or this launch cannot use. Reads no data and
    touches no file. Returns the method built (unused but for its checks and what it declares)."""
    resolve_device(cfg.device)  # a device this machine has
    method = build_method(cfg.method, cfg.train)  # cross-field checks of the method's config
    if cfg.model.backbone != "auto":
        BACKBONES.get(cfg.model.backbone)  # an unknown backbone or head is refused before anything is written
    HEADS.get(method.head)
    check_engine(cfg, method)
    return method


def check_environment(cfg: RunConfig) -> None:
    """Refuse what only training needs and this machine cannot give: a compiler for ``engine.compile``, and the
    directories ``task0_cache`` and ``engine.compile_cache`` name, which must be creatable. Evaluating a finished
    run needs none of them."""
    if cfg.engine.compile != "none" and cfg.engine.compile_backend == "inductor":
        check_compiler(resolve_device(cfg.device))
    kept = compile_cache_dir(cfg.engine.compile_cache) if cfg.engine.compile != "none" else None
    for path, what, fix in (
        (cfg.task0_cache, "task0_cache", "set it to a directory or leave it unset"),
        (kept, "engine.compile_cache", "set it to a writable directory, or off"),
    ):
        try:
            if path:
                check_creatable_dir(path, what, fix)
        except ValueError as err:
            raise ConfigError(str(err)) from None


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


def check_training(cfg: RunConfig, method: Method, protocol: Protocol) -> None:
    """Refuse a protocol that ``method`` cannot train (:func:`training_problems`), naming every problem at once."""
    refuse(training_problems(cfg, method, protocol.dataset, protocol))


def training_problems(
    cfg: RunConfig, method: Method, dataset: ImageDataset, protocol: Protocol | None
) -> list[Exception]:
    """Every reason ``method`` cannot train the protocol: a task with fewer images than a batch (it would never
    train), lr milestones outside their phase, a schedule key no phase reads, an image size the method or its
    synthesizer is not built for. Without a protocol (its tasks could not be cut) the batch is checked against all
    the kept classes' images and the phases against a first and a later task, so that one dry run lists them all."""
    problems = batch_problems(cfg, dataset, protocol)
    tasks = tasks_of(protocol.split) if protocol else stand_in_tasks(cfg.data.num_tasks)
    for check in (check_phases, check_schedule_read):
        try:
            check(cfg, method, tasks)
        except ConfigError as err:
            problems.append(err)
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
    """Raise the one problem as it is, or every problem in one :class:`ConfigError`, one numbered line each."""
    if len(problems) == 1:
        raise problems[0]
    if problems:
        lines = "".join(f"\n  {i}. {p}" for i, p in enumerate(problems, 1))
        raise ConfigError(f"{len(problems)} problems, each with its fix:{lines}")


def prepare(cfg: RunConfig, progress: ProgressFactory | None = None) -> Protocol:
    """Everything a run checks before it starts (:func:`validate`, :func:`check_environment`, the data, the tasks
    and :func:`training_problems`), raising a clear error for anything that cannot run: the method's, the
    protocol's and the schedule's problems all in one error; returns the protocol."""
    try:
        method, problems = validate(cfg), []
    except ConfigError as err:  # the method's own checks (chr_epochs against train.epochs): the data's still run
        method, problems = None, [err]
    check_environment(cfg)
    try:
        dataset = build_dataset(cfg.data, progress=progress)
    except DatasetError:  # no data to check the rest against: the config's own problems first, else the data's
        refuse(problems)
        raise
    try:
        protocol = cut_tasks(cfg, dataset)
    except SplitError as err:
        protocol = None
        problems.append(err)
    if method is None:
        problems += batch_problems(cfg, dataset, protocol)
    else:
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


def check_schedule_read(cfg: RunConfig, method: Method, tasks: Sequence[Task]) -> None:
    """Refuse a schedule key of ``train`` (:data:`SCHEDULE_KEYS`) set away from its default that no phase of any
    task reads: the method's phases stay the same when the key takes another value (EFC's Adam phases read neither
    ``train.lr`` nor ``train.momentum``). A value that some phase uses anyway (a preset repeating a method's own
    lr there) is accepted: it changes nothing, and says nothing false."""
    defaults, phases = TrainConfig(), [p for task in tasks for p in method.phases(task)]
    for key in unread_schedule_keys(cfg, method, tasks):
        value = getattr(cfg.train, key)
        if value == getattr(defaults, key) or value == () or value in {getattr(p, key) for p in phases}:
            continue
        described = "; ".join(dict.fromkeys(p.describe() for p in phases))
        raise ConfigError(
            f"train.{key} ({list(value) if isinstance(value, tuple) else value}) changes nothing: no phase of "
            f"{method.name} reads it (its phases: {described or 'none'}); drop it, or set the method's own keys "
            f"(dfcil train --print-config lists them)"
        )


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


def check_phases(cfg: RunConfig, method: Method, tasks: Sequence[Task]) -> None:
    """Refuse a phase whose lr milestones (counted from the phase's start) do not fall inside it: such a milestone
    never lowers the lr, silently (R-DFCIL's RRL phase, for one, is ``train.epochs - method.chr_epochs`` long)."""
    for task in tasks:
        for phase in method.phases(task):
            late = [m for m in phase.milestones if m >= phase.epochs]
            if late:
                raise ConfigError(
                    f"the {phase.name} phase of task {task.task_id} lasts {phase.epochs} epochs, but its lr "
                    f"milestones {list(phase.milestones)} (epochs from the phase's start) reach {late[0]}: a "
                    f"milestone there never lowers the lr. Use milestones below {phase.epochs}, or fractions of "
                    f"each phase (train.milestones: [0.5, 0.75] lowers the lr at half and three quarters of it); "
                    f"dfcil train --dry-run prints every phase's schedule"
                )


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

    def __call__(self, task: int, rng: torch.Generator, batch_size: int | None = None) -> TrainBatches:
        """Task ``task``'s batches of ``batch_size`` real images (default: ``train.batch_size``), shuffled and
        augmented with ``rng`` (the run's data stream)."""
        x, y = self.protocol.train_tensors(task, self.seen, self.per_class, self.device)
        return TrainBatches(x, y, batch_size or self.batch_size, self.normalizer, rng, self.dist)


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
