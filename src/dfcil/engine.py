"""THE training engine: ``run`` (task loop) → ``fit_task`` (phases and epochs) → ``train_epoch`` (batches), plus
``evaluate``. Methods supply loss terms; everything about optimisation, checkpoints and resume lives here."""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from dfcil.callbacks import Callback
from dfcil.config import ConfigError, RunConfig, TrainConfig, config_to_dict
from dfcil.data.datasets import ImageDataset, build_dataset
from dfcil.data.device import Normalizer, TrainBatches, select_classes
from dfcil.data.splits import ClassIncrementalSplit, SplitError
from dfcil.methods import Batch, Method, Phase, TaskContext, build_method
from dfcil.metrics import AccuracyMatrix
from dfcil.models.network import IncrementalNet, build_network
from dfcil.progress import ProgressFactory, make_progress
from dfcil.state import Checkpointer, Position, capture_rng, restore_rng


class NonFiniteLossError(FloatingPointError):
    """A loss term became NaN or infinite."""


class RunInterrupted(Exception):
    """The run stopped on request (Ctrl-C, SIGTERM) after writing a checkpoint."""


@dataclasses.dataclass
class Interrupt:
    """Set by a signal handler; the engine finishes the current step, checkpoints and stops."""

    requested: bool = False


@dataclasses.dataclass(frozen=True)
class Protocol:
    """A validated run setting: the dataset and how it is cut into tasks."""

    dataset: ImageDataset
    split: ClassIncrementalSplit
    train_images: tuple[int, ...]  # training images per task
    test_images: tuple[int, ...]  # test images per task


@dataclasses.dataclass
class EpochProgress:
    """A partly done epoch: its batch order, batches done and loss sums so far (for mid-epoch checkpoints)."""

    perm: Tensor
    step: int = 0
    names: list[str] | None = None
    sums: Tensor | None = None
    first_bad: Tensor | None = None

    def state_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"device: {name!r} is not a device; use auto, cpu, cuda or cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device {name!r} requested but CUDA is not available here; use --device cpu")
    return device


def prepare(cfg: RunConfig) -> Protocol:
    """Load the data and build the protocol, raising a clear error for anything that cannot run."""
    build_method(cfg.method, cfg.train)  # cross-field checks of the method's config
    resolve_device(cfg.device)
    d = cfg.data
    dataset = build_dataset(d.name, d.root, download=d.download, num_classes=d.num_classes)
    split = ClassIncrementalSplit.build(
        dataset.num_classes, d.num_tasks, d.base_classes, d.class_order, d.class_order_seed, d.num_classes
    )
    lut, offsets = split.label_map(dataset.num_classes), split.offsets
    train_n, test_n = [], []
    for t in range(split.num_tasks):
        labels = range(offsets[t], offsets[t + 1])
        train_n.append(len(select_classes(dataset.train, lut, labels, d.train_per_class)[1]))
        test_n.append(len(select_classes(dataset.test, lut, labels, d.test_per_class)[1]))
    for t, n in enumerate(train_n):
        if n < cfg.train.batch_size:
            raise SplitError(
                f"task {t} has {n} training images, fewer than train.batch_size={cfg.train.batch_size}; with drop_last "
                f"it would never train. Use fewer tasks, more images per class or a smaller batch"
            )
    if min(test_n) == 0:
        raise SplitError(f"a task has no test images (per task: {test_n}); check data.test_per_class")
    return Protocol(dataset, split, tuple(train_n), tuple(test_n))


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # also seeds every CUDA device


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Session:
    """All mutable state of one run, with its checkpoint payload. Built identically for a fresh run and a resume."""

    def __init__(self, cfg: RunConfig, protocol: Protocol, checkpointer: Checkpointer | None, metrics: Path | None):
        self.cfg, self.protocol = cfg, protocol
        self.device = resolve_device(cfg.device)
        self.checkpointer, self.metrics = checkpointer, metrics
        seed_everything(cfg.seed)
        self.method = build_method(cfg.method, cfg.train)
        self.net = build_network(cfg.model.backbone, type(self.method).head, cfg.model.head_init_std).to(self.device)
        self.rngs = {  # shuffling and augmentation; the method's latent codes
            "data": torch.Generator(device=self.device).manual_seed(cfg.seed),
            "method": torch.Generator(device=self.device).manual_seed(cfg.seed + 1),
        }
        self.acc = AccuracyMatrix(protocol.split.num_tasks)
        self.pos = Position()
        self.timings: list[dict[str, Any]] = []
        self.static_ref: dict[str, Any] | None = None
        self.last_save = time.monotonic()

    def payload(self, optimizer: torch.optim.Optimizer | None = None, epoch: EpochProgress | None = None) -> dict:
        static = self.method.static_state_dict()
        if static and (self.static_ref is None or self.static_ref["task"] != self.pos.task):
            self.static_ref = {"task": self.pos.task, "digest": self.checkpointer.save_static(self.pos.task, static)}
        return {
            "position": dataclasses.asdict(self.pos),
            "head_sizes": [b.out_features for b in self.net.head.blocks],
            "net": self.net.state_dict(),
            "optimizer": optimizer.state_dict() if optimizer is not None else None,
            "method": self.method.state_dict(),
            "static": self.static_ref if static else None,
            "epoch_progress": epoch.state_dict() if epoch is not None else None,
            "acc": self.acc.state_dict(),
            "timings": self.timings,
            "rng": capture_rng(self.rngs),
            "metrics_bytes": self.metrics.stat().st_size if self.metrics and self.metrics.exists() else 0,
            "config": config_to_dict(self.cfg),
        }

    def save(self, optimizer: torch.optim.Optimizer | None = None, epoch: EpochProgress | None = None) -> None:
        if self.checkpointer is not None:
            self.checkpointer.save(self.payload(optimizer, epoch))
            self.last_save = time.monotonic()

    def restore(self, payload: dict[str, Any]) -> dict[str, Any]:
        """Load a checkpoint payload; returns what the task loop needs to continue (optimizer, epoch state)."""
        self.pos = Position(**payload["position"])
        for n in payload["head_sizes"][len(self.net.head.blocks) :]:
            self.net.expand(n)
        self.net.load_state_dict(payload["net"])
        self.method.load_state_dict(
            payload["method"], self.context(self.pos.task), (payload.get("static_state") or {}) or None
        )
        self.static_ref = payload["static"]
        self.acc.load_state_dict(payload["acc"])
        self.timings = list(payload["timings"])
        restore_rng(payload["rng"], self.rngs)  # last: building the state above consumed random numbers
        epoch = payload["epoch_progress"]
        if epoch:
            epoch = EpochProgress(**{k: v.to(self.device) if isinstance(v, Tensor) else v for k, v in epoch.items()})
        return {"optimizer": payload["optimizer"], "epoch": epoch or None}

    def context(self, task: int, progress: ProgressFactory | None = None, save_point=None) -> TaskContext:
        o = self.protocol.split.offsets
        n_old, n_new = o[min(task, len(o) - 2)], o[min(task, len(o) - 2) + 1] - o[min(task, len(o) - 2)]
        return TaskContext(
            task, n_old, n_new, self.protocol.split.num_tasks, self.net, self.device, self.protocol.dataset.image_size,
            self.cfg.train.batch_size, self.rngs["method"], progress or make_progress(False),
            save_point or (lambda: None),
        )  # fmt: skip


def run(
    cfg: RunConfig,
    callbacks: Sequence[Callback] = (),
    progress: bool | None = None,
    protocol: Protocol | None = None,
    run_dir: Path | None = None,
    resume: bool = False,
    interrupt: Interrupt | None = None,
    save_every_s: float = 60.0,
) -> tuple[dict[str, Any], IncrementalNet]:
    """Train ``cfg.method`` through every task of the protocol.

    Args:
        run_dir: where checkpoints go (``run_dir/checkpoints``) and ``metrics.jsonl`` lives; None: no checkpoints.
        resume: continue from the newest usable checkpoint in ``run_dir``.
        interrupt: when its flag is set, finish the step, checkpoint and raise :class:`RunInterrupted`.
        save_every_s: extra checkpoints inside long task setups (inversion), at most this often.

    Returns:
        The summary (see :mod:`dfcil.metrics`) and the trained network.
    """
    started = time.perf_counter()
    protocol = protocol or prepare(cfg)
    ckpt = Checkpointer(run_dir) if run_dir is not None else None
    s = Session(cfg, protocol, ckpt, run_dir / "metrics.jsonl" if run_dir is not None else None)
    interrupt = interrupt or Interrupt()
    resumed: dict[str, Any] = {"optimizer": None, "epoch": None}
    if resume:
        payload = ckpt.load_latest()
        resumed = s.restore(payload)
        if s.metrics is not None and s.metrics.exists():
            with open(s.metrics, "r+") as f:  # drop records written after the checkpoint
                f.truncate(payload["metrics_bytes"])
    ds, split, device = protocol.dataset, protocol.split, s.device
    normalizer = Normalizer(ds.mean, ds.std, device)
    lut, offsets = split.label_map(ds.num_classes), split.offsets
    test_x, test_y = select_classes(ds.test, lut, range(split.num_classes), cfg.data.test_per_class)
    order = np.argsort(test_y, kind="stable")  # sorted by label: the seen classes' images are a prefix
    test_x, test_y = torch.from_numpy(test_x[order]).to(device), torch.from_numpy(test_y[order]).to(device)
    test_seen = np.searchsorted(test_y.cpu().numpy(), offsets[1:])  # images of classes < offsets[t + 1]
    task_of_label = torch.as_tensor(split.task_of_label(), device=device)
    progress_bar = make_progress(progress)

    def save_point() -> None:  # inside a task's setup: checkpoint now and then, and on interrupt
        if interrupt.requested:
            s.save()
            raise RunInterrupted(f"interrupted in task {s.pos.task}, setup")
        if time.monotonic() - s.last_save > save_every_s:
            s.save()

    for task in range(s.pos.task, split.num_tasks):
        ctx = s.context(task, progress_bar, save_point)
        if s.pos.stage == "start":
            s.net.expand(ctx.n_new)
            s.pos = Position(task, "setup")
        x, y = select_classes(ds.train, lut, range(ctx.n_old, ctx.n_seen), cfg.data.train_per_class)
        batches = TrainBatches(
            torch.from_numpy(x).to(device), torch.from_numpy(y).to(device), cfg.train.batch_size, normalizer,
            s.rngs["data"],
        )  # fmt: skip
        phases = s.method.phases(ctx)
        info = {"task": task, "num_tasks": split.num_tasks, "n_new": ctx.n_new, "n_seen": ctx.n_seen}
        info |= {"train_images": len(x), "phases": [dataclasses.asdict(p) for p in phases]}
        info |= {"resumed_at": dataclasses.asdict(s.pos)} if resume and task == s.pos.task else {}
        for cb in callbacks:
            cb.on_task_start(info)

        timing: dict[str, Any] = {"task": task}
        if s.pos.stage == "setup":
            t0 = time.perf_counter()
            s.method.on_task_start(ctx)
            _sync(device)
            timing["setup_s"] = round(time.perf_counter() - t0, 3)
            s.pos = Position(task, "train")
            s.save()
            if interrupt.requested:
                raise RunInterrupted(f"interrupted after the setup of task {task}")

        def checkpoint(pos: Position, optimizer: torch.optim.Optimizer, epoch: EpochProgress | None) -> None:
            s.pos = pos
            s.save(optimizer, epoch)

        timing["phases"] = fit_task(
            s.net, s.method, ctx, batches, phases, cfg.train, callbacks, progress_bar, start=s.pos,
            optimizer_state=resumed["optimizer"], epoch_state=resumed["epoch"], checkpoint=checkpoint,
            interrupt=interrupt,
        )  # fmt: skip
        resumed = {"optimizer": None, "epoch": None}
        s.method.on_task_end(ctx)

        t0 = time.perf_counter()
        n_test = int(test_seen[task])
        with progress_bar(total=-(-n_test // cfg.train.eval_batch_size), desc=f"task {task} eval", unit="batch") as bar:
            correct, count = evaluate(
                s.net, test_x[:n_test], test_y[:n_test], task_of_label, task + 1, normalizer,
                cfg.train.eval_batch_size, bar,
            )  # fmt: skip
        timing["eval_s"] = round(time.perf_counter() - t0, 3)
        s.acc.record(task, correct, count)
        s.timings.append(timing)
        row = s.acc.summary()
        record = {
            "task": task, "n_seen": ctx.n_seen, "classes": split.tasks[task], "acc": row["acc_per_task"][task],
            "acc_task_avg": row["acc_per_task_task_avg"][task], "acc_row": row["accuracy_matrix"][task][: task + 1],
            "new_acc": row["new_acc"][task], "old_acc": row["old_acc"][task], "timing": timing,
        }  # fmt: skip
        for cb in callbacks:
            cb.on_task_end(record)
        s.pos = Position(task + 1, "start")
        s.save()
        if interrupt.requested and task + 1 < split.num_tasks:
            raise RunInterrupted(f"interrupted after task {task}")

    summary = {
        "method": cfg.method.name,
        "dataset": ds.name,
        "class_order": list(split.class_order),
        "tasks": split.tasks,
        "task_sizes": list(split.task_sizes),
        **s.acc.summary(),
        "timings": s.timings,
        "wall_time_s": round(time.perf_counter() - started, 2),
        "resumed": resume,
        "device": str(device),
        "seed": cfg.seed,
    }
    for cb in callbacks:
        cb.on_run_end(summary)
    return summary, s.net


def set_trainable(net: IncrementalNet, extra: Sequence[nn.Module], trainable: str) -> None:
    """Train everything, or only the head with the backbone frozen in eval mode (BN running stats fixed)."""
    if trainable == "all":
        for m in (net, *extra):
            m.train()
            m.requires_grad_(True)
    elif trainable == "head":
        net.backbone.eval()
        net.backbone.requires_grad_(False)
        net.head.train()
        net.head.requires_grad_(True)
        for m in extra:
            m.requires_grad_(False)
    else:
        raise ValueError(f"unknown trainable set {trainable!r}")


Checkpoint = Callable[[Position, torch.optim.Optimizer, "EpochProgress | None"], None]


def fit_task(
    net: IncrementalNet,
    method: Method,
    ctx: TaskContext,
    batches: TrainBatches,
    phases: Sequence[Phase],
    train: TrainConfig,
    callbacks: Sequence[Callback] = (),
    progress: ProgressFactory | None = None,
    start: Position | None = None,
    optimizer_state: dict | None = None,
    epoch_state: EpochProgress | None = None,
    checkpoint: Checkpoint | None = None,
    interrupt: Interrupt | None = None,
) -> dict[str, dict[str, float]]:
    """Run the phases of one task with one SGD optimiser (momentum carries over unless a phase resets it).

    Args:
        start: position to continue from (phase, epochs done, steps done); default the beginning.
        optimizer_state, epoch_state: the optimiser and the partly done epoch at ``start``.
        checkpoint: called with (position, optimiser, partial epoch) after every epoch and on interrupt.

    Returns:
        Per phase: wall time and real images per second.
    """
    progress = progress or make_progress(False)
    start = start if start is not None and start.stage == "train" else Position(ctx.task_id, "train")
    extra = method.extra_modules(ctx)
    params = [p for m in (net, *extra) for p in m.parameters()]
    optimizer: torch.optim.Optimizer | None = None
    out: dict[str, dict[str, float]] = {}
    for index, phase in enumerate(phases):
        if index < start.phase:
            continue
        first_epoch = start.epoch if index == start.phase else 0
        if optimizer is None or (phase.reset_optimizer and first_epoch == 0):
            optimizer = torch.optim.SGD(params, lr=phase.lr, momentum=train.momentum, weight_decay=train.weight_decay)
            if optimizer_state is not None:
                optimizer.load_state_dict(optimizer_state)
                optimizer_state = None
        set_trainable(net, extra, phase.trainable)
        t_phase = time.perf_counter()
        total = phase.epochs * len(batches)
        initial = first_epoch * len(batches) + (epoch_state.step if epoch_state else 0)
        with progress(total=total, desc=f"task {ctx.task_id} {phase.name}", unit="step", initial=initial) as bar:
            for epoch in range(first_epoch, phase.epochs):
                lr = phase.lr * train.gamma ** sum(epoch >= m for m in phase.milestones)
                for group in optimizer.param_groups:
                    group["lr"] = lr
                pos = Position(ctx.task_id, "train", index, epoch)

                def on_interrupt(
                    ep: EpochProgress, pos: Position = pos, opt: torch.optim.Optimizer = optimizer
                ) -> None:
                    if checkpoint is not None:
                        checkpoint(dataclasses.replace(pos, step=ep.step), opt, ep)

                t0 = time.perf_counter()
                losses = train_epoch(
                    net, method, batches, optimizer, ctx, phase, epoch, bar, epoch_state, interrupt, on_interrupt
                )
                epoch_state = None
                method.on_epoch_end(ctx, phase)
                dt = time.perf_counter() - t0
                bar.set_postfix({k: f"{v:.3f}" for k, v in losses.items()})
                record = {
                    "task": ctx.task_id, "phase": phase.name, "epoch": epoch, "epochs": phase.epochs, "lr": lr,
                    "loss": losses, "time_s": round(dt, 3), "images_per_s": len(batches) * batches.batch_size / dt,
                }  # fmt: skip
                for cb in callbacks:
                    cb.on_epoch_end(record)
                if checkpoint is not None:
                    checkpoint(Position(ctx.task_id, "train", index, epoch + 1), optimizer, None)
                if interrupt is not None and interrupt.requested:
                    raise RunInterrupted(f"interrupted in task {ctx.task_id}, phase {phase.name}, after epoch {epoch}")
        dt = time.perf_counter() - t_phase
        images = (phase.epochs - first_epoch) * len(batches) * batches.batch_size
        out[phase.name] = {"time_s": round(dt, 3), "images_per_s": round(images / dt, 1) if dt > 0 else 0.0}
    return out


def train_epoch(
    net: IncrementalNet,
    method: Method,
    batches: TrainBatches,
    optimizer: torch.optim.Optimizer,
    ctx: TaskContext,
    phase: Phase,
    epoch: int = 0,
    bar: Any = None,
    state: EpochProgress | None = None,
    interrupt: Interrupt | None = None,
    on_interrupt: Callable[[EpochProgress], None] | None = None,
) -> dict[str, float]:
    """One pass over the task's batches. Loss terms are summed on the device and read once, at the end.

    Args:
        state: a partly done epoch to continue (from a mid-epoch checkpoint).
        interrupt: checked after every step; when set, ``on_interrupt`` gets the epoch so far and
            :class:`RunInterrupted` is raised.

    Raises:
        NonFiniteLossError: naming the first non-finite term, with task, phase, epoch and step.
    """
    ep = state or EpochProgress(batches.permutation())
    for x, y in batches.iterate(ep.perm, start=ep.step):
        terms = method.training_step(net, Batch(x, y), ctx, phase)
        if ep.names is None:
            ep.names = list(terms)
            ep.first_bad = torch.full((len(ep.names),), -1, device=x.device)
        elif list(terms) != ep.names:
            raise RuntimeError(f"{method.name} changed its loss terms within an epoch: {ep.names} → {list(terms)}")
        values = torch.stack([v.float() for v in terms.values()])
        loss = values.sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        values = values.detach()
        ep.sums = values if ep.sums is None else ep.sums + values
        ep.first_bad = torch.where(~torch.isfinite(values) & (ep.first_bad < 0), ep.step, ep.first_bad)
        ep.step += 1
        if bar is not None:
            bar.update(1)
        if interrupt is not None and interrupt.requested and ep.step < len(batches):
            if on_interrupt is not None:
                on_interrupt(ep)
            raise RunInterrupted(f"interrupted in task {ctx.task_id}, phase {phase.name}, epoch {epoch}")
    if ep.names is None:
        return {}
    means = (ep.sums / ep.step).tolist()  # the one host sync of the epoch
    bad = ep.first_bad.tolist()
    for name, value, at in zip(ep.names, means, bad, strict=True):
        if at >= 0 or not np.isfinite(value):
            raise NonFiniteLossError(
                f"loss term {name!r} became non-finite in task {ctx.task_id}, phase {phase.name}, epoch {epoch}, "
                f"step {at}. Lower the learning rate or this term's weight; the run directory keeps the checkpoint "
                f"of the last good epoch."
            )
    return dict(zip(ep.names, means, strict=True))


@torch.no_grad()
def evaluate(
    net: IncrementalNet,
    x: torch.Tensor,
    y: torch.Tensor,
    task_of_label: torch.Tensor,
    n_tasks: int,
    normalizer: Normalizer,
    batch_size: int = 1000,
    bar: Any = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Top-1 accuracy counts per task, argmax over all classes the head has (all seen classes).

    Returns:
        (correct, count) per task 0..n_tasks-1.
    """
    was_training = net.training
    net.eval()
    correct = torch.zeros(n_tasks, dtype=torch.long, device=x.device)
    count = torch.zeros(n_tasks, dtype=torch.long, device=x.device)
    for i in range(0, len(x), batch_size):
        xb, yb = x[i : i + batch_size], y[i : i + batch_size]
        pred = net(normalizer(xb)).logits.argmax(dim=1)
        task = task_of_label[yb]
        correct.index_add_(0, task, (pred == yb).long())
        count.index_add_(0, task, torch.ones_like(yb))
        if bar is not None:
            bar.update(1)
    net.train(was_training)
    return correct.cpu().numpy(), count.cpu().numpy()
