"""THE training engine: ``run`` (task loop) → ``fit_task`` (phases and epochs) → ``train_epoch`` (batches), plus
``evaluate``. Methods supply loss terms; everything about optimisation lives here."""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from dfcil.callbacks import Callback
from dfcil.config import ConfigError, RunConfig, TrainConfig
from dfcil.data.datasets import ImageDataset, build_dataset
from dfcil.data.device import Normalizer, TrainBatches, select_classes
from dfcil.data.splits import ClassIncrementalSplit, SplitError
from dfcil.methods import Batch, Method, Phase, TaskContext, build_method
from dfcil.metrics import AccuracyMatrix
from dfcil.models.network import IncrementalNet, build_network
from dfcil.progress import ProgressFactory, make_progress


class NonFiniteLossError(FloatingPointError):
    """A loss term became NaN or infinite."""


@dataclasses.dataclass(frozen=True)
class Protocol:
    """A validated run setting: the dataset and how it is cut into tasks."""

    dataset: ImageDataset
    split: ClassIncrementalSplit
    train_images: tuple[int, ...]  # training images per task
    test_images: tuple[int, ...]  # test images per task


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


def run(
    cfg: RunConfig,
    callbacks: Sequence[Callback] = (),
    progress: bool | None = None,
    protocol: Protocol | None = None,
) -> dict[str, Any]:
    """Train ``cfg.method`` through every task of the protocol and return the summary (see :mod:`dfcil.metrics`)."""
    started = time.perf_counter()
    protocol = protocol or prepare(cfg)
    device = resolve_device(cfg.device)
    ds, split = protocol.dataset, protocol.split
    seed_everything(cfg.seed)
    method = build_method(cfg.method, cfg.train)
    net = build_network(cfg.model.backbone, type(method).head, cfg.model.head_init_std).to(device)
    data_rng = torch.Generator(device=device).manual_seed(cfg.seed)  # shuffling and augmentation
    method_rng = torch.Generator(device=device).manual_seed(cfg.seed + 1)  # synthesis latents
    normalizer = Normalizer(ds.mean, ds.std, device)
    lut, offsets = split.label_map(ds.num_classes), split.offsets
    test_x, test_y = select_classes(ds.test, lut, range(split.num_classes), cfg.data.test_per_class)
    order = np.argsort(test_y, kind="stable")  # sorted by label: the seen classes' images are a prefix
    test_x, test_y = torch.from_numpy(test_x[order]).to(device), torch.from_numpy(test_y[order]).to(device)
    test_seen = np.searchsorted(test_y.cpu().numpy(), offsets[1:])  # images of classes < offsets[t + 1]
    task_of_label = torch.as_tensor(split.task_of_label(), device=device)
    progress_bar = make_progress(progress)
    acc = AccuracyMatrix(split.num_tasks)
    timings: list[dict[str, Any]] = []

    for task in range(split.num_tasks):
        n_old, n_new = offsets[task], offsets[task + 1] - offsets[task]
        ctx = TaskContext(
            task, n_old, n_new, split.num_tasks, net, device, ds.image_size, cfg.train.batch_size, method_rng,
            progress_bar,
        )  # fmt: skip
        net.expand(n_new)
        x, y = select_classes(ds.train, lut, range(n_old, n_old + n_new), cfg.data.train_per_class)
        batches = TrainBatches(
            torch.from_numpy(x).to(device), torch.from_numpy(y).to(device), cfg.train.batch_size, normalizer, data_rng
        )
        phases = method.phases(ctx)
        info = {"task": task, "num_tasks": split.num_tasks, "n_new": n_new, "n_seen": ctx.n_seen}
        info |= {"train_images": len(x), "phases": [dataclasses.asdict(p) for p in phases]}
        for cb in callbacks:
            cb.on_task_start(info)

        t0 = time.perf_counter()
        method.on_task_start(ctx)
        _sync(device)
        timing: dict[str, Any] = {"task": task, "setup_s": time.perf_counter() - t0}
        timing["phases"] = fit_task(net, method, ctx, batches, phases, cfg.train, callbacks, progress_bar)
        method.on_task_end(ctx)

        t0 = time.perf_counter()
        n_test = int(test_seen[task])
        with progress_bar(total=-(-n_test // cfg.train.eval_batch_size), desc=f"task {task} eval", unit="batch") as bar:
            correct, count = evaluate(
                net, test_x[:n_test], test_y[:n_test], task_of_label, task + 1, normalizer, cfg.train.eval_batch_size,
                bar,
            )  # fmt: skip
        timing["eval_s"] = time.perf_counter() - t0
        acc.record(task, correct, count)
        timings.append(timing)
        row = acc.summary()
        record = {
            "task": task,
            "n_seen": ctx.n_seen,
            "classes": split.tasks[task],
            "acc": row["acc_per_task"][task],
            "acc_task_avg": row["acc_per_task_task_avg"][task],
            "acc_row": row["accuracy_matrix"][task][: task + 1],
            "new_acc": row["new_acc"][task],
            "old_acc": row["old_acc"][task],
            "timing": timing,
        }
        for cb in callbacks:
            cb.on_task_end(record)

    summary = {
        "method": cfg.method.name,
        "dataset": ds.name,
        "class_order": list(split.class_order),
        "tasks": split.tasks,
        "task_sizes": list(split.task_sizes),
        **acc.summary(),
        "timings": timings,
        "wall_time_s": round(time.perf_counter() - started, 2),
        "device": str(device),
        "seed": cfg.seed,
    }
    for cb in callbacks:
        cb.on_run_end(summary)
    return summary


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


def fit_task(
    net: IncrementalNet,
    method: Method,
    ctx: TaskContext,
    batches: TrainBatches,
    phases: Sequence[Phase],
    train: TrainConfig,
    callbacks: Sequence[Callback] = (),
    progress: ProgressFactory | None = None,
) -> dict[str, dict[str, float]]:
    """Run the phases of one task with one SGD optimiser (momentum carries over unless a phase resets it).

    Returns:
        Per phase: wall time and real images per second.
    """
    progress = progress or make_progress(False)
    extra = method.extra_modules(ctx)
    params = [p for m in (net, *extra) for p in m.parameters()]
    optimizer: torch.optim.Optimizer | None = None
    out: dict[str, dict[str, float]] = {}
    for phase in phases:
        if optimizer is None or phase.reset_optimizer:
            optimizer = torch.optim.SGD(params, lr=phase.lr, momentum=train.momentum, weight_decay=train.weight_decay)
        set_trainable(net, extra, phase.trainable)
        t_phase = time.perf_counter()
        total = phase.epochs * len(batches)
        with progress(total=total, desc=f"task {ctx.task_id} {phase.name}", unit="step") as bar:
            for epoch in range(phase.epochs):
                lr = phase.lr * train.gamma ** sum(epoch >= m for m in phase.milestones)
                for group in optimizer.param_groups:
                    group["lr"] = lr
                t0 = time.perf_counter()
                losses = train_epoch(net, method, batches, optimizer, ctx, phase, epoch, bar)
                method.on_epoch_end(ctx, phase)
                dt = time.perf_counter() - t0
                bar.set_postfix({k: f"{v:.3f}" for k, v in losses.items()})
                record = {
                    "task": ctx.task_id, "phase": phase.name, "epoch": epoch, "epochs": phase.epochs, "lr": lr,
                    "loss": losses, "time_s": round(dt, 3), "images_per_s": len(batches) * batches.batch_size / dt,
                }  # fmt: skip
                for cb in callbacks:
                    cb.on_epoch_end(record)
        dt = time.perf_counter() - t_phase
        images = phase.epochs * len(batches) * batches.batch_size
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
) -> dict[str, float]:
    """One pass over the task's batches. Loss terms are summed on the device and read once, at the end.

    Raises:
        NonFiniteLossError: naming the first non-finite term, with task, phase, epoch and step.
    """
    names: list[str] | None = None
    sums = first_bad = None
    steps = 0
    for step, (x, y) in enumerate(batches):
        terms = method.training_step(net, Batch(x, y), ctx, phase)
        if names is None:
            names = list(terms)
            first_bad = torch.full((len(names),), -1, device=x.device)
        elif list(terms) != names:
            raise RuntimeError(f"{method.name} changed its loss terms within an epoch: {names} → {list(terms)}")
        values = torch.stack([v.float() for v in terms.values()])
        loss = values.sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        values = values.detach()
        sums = values if sums is None else sums + values
        first_bad = torch.where(~torch.isfinite(values) & (first_bad < 0), step, first_bad)
        steps += 1
        if bar is not None:
            bar.update(1)
    if names is None:
        return {}
    means = (sums / steps).tolist()  # the one host sync of the epoch
    bad = first_bad.tolist()
    for name, value, at in zip(names, means, bad, strict=True):
        if at >= 0 or not np.isfinite(value):
            raise NonFiniteLossError(
                f"loss term {name!r} became non-finite in task {ctx.task_id}, phase {phase.name}, epoch {epoch}, "
                f"step {at}. Lower the learning rate or this term's weight."
            )
    return dict(zip(names, means, strict=True))


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
