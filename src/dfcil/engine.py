"""THE training engine: ``run`` (task loop) → ``fit_task`` (phases and epochs) → ``train_epoch`` (batches), plus
``evaluate``. Methods supply loss terms; everything about optimisation, checkpoints and resume lives here."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from dfcil import __version__
from dfcil.callbacks import Callback
from dfcil.config import RunConfig, TrainConfig
from dfcil.data.device import Normalizer, TrainBatches, select_classes
from dfcil.graphs import GraphMode, StepGraph
from dfcil.methods import Batch, Method, Phase, TaskContext
from dfcil.models.network import IncrementalNet
from dfcil.progress import ProgressFactory, make_progress
from dfcil.session import (
    EpochProgress,
    Protocol,
    Session,
    check_same_config,
    prepare,
    process_state_kept,
    resolve_device,
    seed_everything,
)
from dfcil.state import Checkpointer, Position, load_optimizer_state

__all__ = ["Interrupt", "NonFiniteLossError", "Protocol", "RunInterrupted", "evaluate", "fit_task", "prepare"]
__all__ += ["TrainStep", "resolve_device", "run", "seed_everything", "set_trainable", "train_epoch"]


log = logging.getLogger("dfcil")

# summary.json's layout, for readers that do without the engine (a report); raise it when a key changes meaning
SUMMARY_FORMAT = 1


class NonFiniteLossError(FloatingPointError):
    """A loss term became NaN or infinite."""


class RunInterrupted(Exception):
    """The run stopped on request (Ctrl-C, SIGTERM) after writing a checkpoint."""


@dataclasses.dataclass
class Interrupt:
    """Set by a signal handler; the engine finishes the current step, checkpoints and stops."""

    requested: bool = False


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
        x, y = select_classes(ds.test, split.label_map(ds.num_classes), range(split.num_classes), per_class)
        order = np.argsort(y, kind="stable")
        x, y = x[order], y[order]
        seen = np.searchsorted(y, split.offsets[1:])
        labels = torch.as_tensor(split.task_of_label(), device=device)
        return cls(torch.from_numpy(x).to(device), torch.from_numpy(y).to(device), seen, labels, normalizer)

    def evaluate(self, net: IncrementalNet, task: int, batch_size: int, bar: Any = None) -> tuple[np.ndarray, ...]:
        n = int(self.seen[task])
        return evaluate(net, self.x[:n], self.y[:n], self.task_of_label, task + 1, self.normalizer, batch_size, bar)


def run(
    cfg: RunConfig,
    callbacks: Sequence[Callback] = (),
    progress: bool | None = None,
    protocol: Protocol | None = None,
    run_dir: Path | None = None,
    resume: bool = False,
    interrupt: Interrupt | None = None,
    save_every_s: float | None = None,
) -> tuple[dict[str, Any], IncrementalNet]:
    """Train ``cfg.method`` through every task of the protocol.

    Args:
        run_dir: where checkpoints go (``run_dir/checkpoints``) and ``metrics.jsonl`` lives; None: no checkpoints.
        resume: continue from the newest usable checkpoint in ``run_dir``.
        interrupt: when its flag is set, finish the step, checkpoint and raise :class:`RunInterrupted`.
        save_every_s: extra checkpoints inside long task setups (inversion), at most this often; default
            ``cfg.checkpoint_interval_s``. Epoch ends write one at most every ``cfg.epoch_checkpoint_interval_s``
            (default 0: every epoch); task ends, phase ends, the end of a task's setup and interrupts always do.

    Returns:
        The summary (see :mod:`dfcil.metrics`) and the trained network.

    The process's global random streams and cuDNN switch are as before afterwards (:func:`process_state_kept`).
    """
    with process_state_kept():
        return _run(cfg, callbacks, progress, protocol, run_dir, resume, interrupt, save_every_s)


def _run(
    cfg: RunConfig,
    callbacks: Sequence[Callback],
    progress: bool | None,
    protocol: Protocol | None,
    run_dir: Path | None,
    resume: bool,
    interrupt: Interrupt | None,
    save_every_s: float | None,
) -> tuple[dict[str, Any], IncrementalNet]:
    started = time.perf_counter()
    protocol = protocol or prepare(cfg)
    ckpt = Checkpointer(run_dir) if run_dir is not None else None
    s = Session(cfg, protocol, ckpt, run_dir / "metrics.jsonl" if run_dir is not None else None)
    interrupt = interrupt or Interrupt()
    resumed: dict[str, Any] = {"optimizer": None, "epoch": None}
    if resume:
        payload = ckpt.load_latest()
        check_same_config(payload.get("config"), cfg)
        resumed = s.restore(payload)
        if s.metrics is not None:
            rewind_log(s.metrics, payload["metrics_bytes"])
    elif s.load_task0():  # a shared first-task model: task 0 is not trained again
        record = _task_record(s, 0) | {"shared_task0": str(s.task0_path())}
        for cb in callbacks:
            cb.on_task_end(record)
        s.save()
    if cfg.engine.cuda_graphs == "on" and not type(s.method).graph_safe:
        log.warning(
            "%s is not marked graph_safe: its steps run eagerly (check it with cuda_graphs: check)", s.method.name
        )
    normalizer = Normalizer(protocol.dataset.mean, protocol.dataset.std, s.device, cfg.engine.channels_last)
    test = TestSet.build(protocol, cfg.data.test_per_class, normalizer, s.device)
    loop = _TaskLoop(s, test, callbacks, make_progress(progress), interrupt, save_every_s)
    for task in range(s.pos.task, protocol.split.num_tasks):
        loop.run_task(task, resumed, resuming=resume and task == s.pos.task)
        resumed = {"optimizer": None, "epoch": None}

    split = protocol.split
    summary = {
        "format": SUMMARY_FORMAT,
        "dfcil": __version__,
        "method": cfg.method.name,
        "dataset": protocol.dataset.name,
        "class_order": list(split.class_order),
        "tasks": split.tasks,
        "task_sizes": list(split.task_sizes),
        **s.acc.summary(),
        "timings": s.timings,
        "wall_time_s": round(time.perf_counter() - started, 2),
        "total_time_s": round(s.elapsed_s(), 2),
        "resumed": resume,
        "device": str(s.device),
        "seed": cfg.seed,
    }
    for cb in callbacks:
        cb.on_run_end(summary)
    return summary, s.net


def rewind_log(path: Path, size: int) -> None:
    """Cut the JSON-lines log ``path`` back to ``size`` bytes, its length at the checkpoint a run resumes from.

    A log found shorter (cut or deleted since) cannot be made whole again: keep its complete lines and say so.
    """
    found = path.stat().st_size if path.exists() else 0
    if found < size:
        log.warning(
            "%s holds %d bytes, fewer than the %d it held at the checkpoint: the records it lost are not restored "
            "(the accuracies in summary.json come from the checkpoint and are complete)",
            path,
            found,
            size,
        )
        size = path.read_bytes().rfind(b"\n") + 1 if found else 0  # whole records only: the next starts a line
    if found:
        with open(path, "r+b") as f:  # drop records written after the checkpoint
            f.truncate(size)


@dataclasses.dataclass
class _TaskLoop:
    """One task: grow the head, the method's setup (inversion), its phases, evaluation, checkpoints."""

    s: Session
    test: TestSet
    callbacks: Sequence[Callback]
    progress: ProgressFactory
    interrupt: Interrupt
    save_every_s: float | None
    setup_clock: tuple[float, float] | None = None  # while a setup runs: (its start here, seconds kept before)

    def due(self, every: float) -> bool:
        """Whether ``every`` seconds have passed since the last checkpoint."""
        return time.monotonic() - self.s.last_save >= every

    def save_point(self) -> None:
        """Inside a task's setup: checkpoint now and then, and on interrupt."""
        s = self.s
        if self.interrupt.requested:
            self.note_setup()
            s.save()
            raise RunInterrupted(f"interrupted in task {s.pos.task}, setup")
        if self.due(s.cfg.checkpoint_interval_s if self.save_every_s is None else self.save_every_s):
            self.note_setup()
            s.save()

    def note_setup(self) -> None:
        """The running task's setup time so far (earlier processes' and this one's) and peak memory, to checkpoint."""
        if self.setup_clock is not None:
            started, kept = self.setup_clock
            self.s.task_timing["setup_s"] = round(kept + time.perf_counter() - started, 3)
        self.note_memory()

    def note_memory(self) -> None:
        timing = self.s.task_timing
        timing["peak_memory_mb"] = max(timing.get("peak_memory_mb", 0.0), peak_memory_mb(self.s.device))

    def run_task(self, task: int, resumed: dict[str, Any], resuming: bool) -> None:
        s, cfg, device, interrupt = self.s, self.s.cfg, self.s.device, self.interrupt
        ds, lut = s.protocol.dataset, s.protocol.split.label_map(s.protocol.dataset.num_classes)
        ctx = s.context(task, self.progress, self.save_point)
        if s.pos.stage == "start":
            s.net.expand(ctx.n_new)
            s.pos = Position(task, "setup")
        first = 0 if type(s.method).train_data == "seen" else ctx.n_old  # the joint upper bound sees all tasks
        x, y = select_classes(ds.train, lut, range(first, ctx.n_seen), cfg.data.train_per_class)
        batches = TrainBatches(
            torch.from_numpy(x).to(device), torch.from_numpy(y).to(device), cfg.train.batch_size,
            self.test.normalizer, s.rngs["data"],
        )  # fmt: skip
        ctx.task_data = batches
        phases = s.method.phases(ctx)
        info = {"task": task, "num_tasks": s.protocol.split.num_tasks, "n_new": ctx.n_new, "n_seen": ctx.n_seen}
        info |= {"train_images": len(x), "phases": [dataclasses.asdict(p) for p in phases]}
        info |= {"resumed_at": dataclasses.asdict(s.pos)} if resuming else {}
        for cb in self.callbacks:
            cb.on_task_start(info)

        # the task's times so far: a resumed task's checkpoint kept what earlier processes spent on it
        timing = s.task_timing if s.task_timing.get("task") == task else {"task": task}
        s.task_timing = timing
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        if s.pos.stage == "setup":
            self.setup_clock = (time.perf_counter(), timing.get("setup_s", 0.0))
            s.method.on_task_start(ctx)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            self.note_setup()
            self.setup_clock = None
            s.pos = Position(task, "train")
            s.save()
            if interrupt.requested:
                raise RunInterrupted(f"interrupted after the setup of task {task}")

        def checkpoint(
            pos: Position, optimizer: torch.optim.Optimizer, epoch: EpochProgress | None, required: bool
        ) -> None:
            s.pos = pos
            if required or self.due(cfg.epoch_checkpoint_interval_s):  # default: every epoch
                self.note_memory()
                s.save(optimizer, epoch)

        timing["phases"] = timing.get("phases", {})  # fit_task keeps it up to date for the checkpoints
        fit_task(
            s.net, s.method, ctx, batches, phases, cfg.train, self.callbacks, self.progress, start=s.pos,
            optimizer_state=resumed["optimizer"], epoch_state=resumed["epoch"], checkpoint=checkpoint,
            interrupt=interrupt, fused=cfg.engine.fused_optimizer, graphs=cfg.engine.cuda_graphs,
            times=timing["phases"],
        )  # fmt: skip
        s.method.on_task_end(ctx)

        t0 = time.perf_counter()
        batch = cfg.train.eval_batch_size
        with self.progress(total=-(-int(self.test.seen[task]) // batch), desc=f"task {task} eval") as bar, s.autocast():
            correct, count = self.test.evaluate(s.net, task, batch, bar)
        timing["eval_s"] = round(time.perf_counter() - t0, 3)
        self.note_memory()
        s.acc.record(task, correct, count)
        s.timings.append(timing)
        s.task_timing = {}
        for cb in self.callbacks:
            cb.on_task_end(_task_record(s, task))
        s.pos = Position(task + 1, "start")
        s.save()
        if task == 0:
            s.store_task0()
        if interrupt.requested and task + 1 < s.protocol.split.num_tasks:
            raise RunInterrupted(f"interrupted after task {task}")


def peak_memory_mb(device: torch.device) -> float:
    """Peak device memory since the last reset (CUDA), or the process's peak resident memory (CPU)."""
    if device.type == "cuda":
        return round(torch.cuda.max_memory_allocated(device) / 2**20, 1)
    import resource

    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)  # Linux reports KiB


def _task_record(s: Session, task: int) -> dict[str, Any]:
    row = s.acc.summary()
    return {
        "task": task, "n_seen": s.protocol.split.offsets[task + 1], "classes": s.protocol.split.tasks[task],
        "acc": row["acc_per_task"][task], "acc_task_avg": row["acc_per_task_task_avg"][task],
        "acc_row": row["accuracy_matrix"][task][: task + 1], "new_acc": row["new_acc"][task],
        "old_acc": row["old_acc"][task], "correct_row": row["correct_matrix"][task][: task + 1],
        "count_row": row["count_matrix"][task][: task + 1], "timing": s.timings[task],
    }  # fmt: skip


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


Checkpoint = Callable[[Position, torch.optim.Optimizer, "EpochProgress | None", bool], None]


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
    fused: bool = False,
    graphs: GraphMode = "off",
    times: dict[str, dict[str, Any]] | None = None,
) -> dict[str, dict[str, Any]]:
    """Run the phases of one task with one SGD optimiser (momentum carries over unless a phase resets it).

    Args:
        start: position to continue from (phase, epochs done, steps done); default the beginning.
        optimizer_state, epoch_state: the optimiser and the partly done epoch at ``start``.
        checkpoint: called with (position, optimiser, partial epoch, required) after every epoch and on interrupt;
            ``required`` is true on interrupt and at a phase's end, where a checkpoint must be written; elsewhere
            the callee may skip it (the engine writes one at most every ``epoch_checkpoint_interval_s``).
        fused: use the fused SGD kernel where the parameters live on CUDA.
        graphs: each phase's step as one CUDA graph (``on``), or checked for it (``check``); see :mod:`dfcil.graphs`.
        times: the phases' records that earlier processes of a resumed run kept; updated in place before every
            checkpoint and returned.

    Returns:
        Per phase, over all the processes of the run: wall time, real images trained and images per second; with
        ``graphs`` on (or check), the mode its steps ran in last (``off`` if a graph could not be set up, with the
        reason in ``graph_failure``), the graphs captured (or steps recorded under ``check``: one per phase and
        learning rate) and, under ``on``, the seconds spent capturing.
    """
    progress = progress or make_progress(False)
    start = start if start is not None and start.stage == "train" else Position(ctx.task_id, "train")
    extra = method.extra_modules(ctx)
    params = [p for m in (net, *extra) for p in m.parameters()]
    optimizer: torch.optim.Optimizer | None = None
    out: dict[str, dict[str, Any]] = {} if times is None else times
    for index, phase in enumerate(phases):
        if index < start.phase:
            continue
        first_epoch = start.epoch if index == start.phase else 0
        if optimizer is None or (phase.reset_optimizer and first_epoch == 0):
            optimizer = torch.optim.SGD(
                params,
                lr=phase.lr,
                momentum=train.momentum,
                weight_decay=train.weight_decay,
                **fused_kwargs(params, fused),
            )
            if optimizer_state is not None:
                load_optimizer_state(optimizer, optimizer_state)
                optimizer_state = None
        set_trainable(net, extra, phase.trainable)
        for part in method.frozen(ctx, phase):  # e.g. UCIR's and PODNet's old classifier blocks
            part.requires_grad_(False)
        fill_momentum(optimizer)
        mode = graphs if method.graph_safe or graphs == "check" else "off"  # run() has warned about the method
        step = StepGraph(
            TrainStep(net, method, ctx, phase, batches), optimizer, mode, ctx.device,
            generators=(ctx.rng, batches.generator), clip=_clip(net, method),
        )  # fmt: skip
        clock = _PhaseClock(out.setdefault(phase.name, {}), step, graphs)
        total = phase.epochs * len(batches)
        initial = first_epoch * len(batches) + (epoch_state.step if epoch_state else 0)
        with progress(total=total, desc=f"task {ctx.task_id} {phase.name}", unit="step", initial=initial) as bar:
            for epoch in range(first_epoch, phase.epochs):
                lr = phase.lr * train.gamma ** sum(epoch >= m for m in phase.milestones)
                for group in optimizer.param_groups:
                    group["lr"] = lr
                pos = Position(ctx.task_id, "train", index, epoch)
                done_before = epoch_state.step if epoch_state is not None else 0  # steps a resumed epoch had done

                def on_interrupt(
                    ep: EpochProgress, pos: Position = pos, opt: torch.optim.Optimizer = optimizer,
                    clock: _PhaseClock = clock, done_before: int = done_before,
                ) -> None:  # fmt: skip
                    clock.update((ep.step - done_before) * batches.batch_size)
                    if checkpoint is not None:
                        checkpoint(dataclasses.replace(pos, step=ep.step), opt, ep, True)

                t0 = time.perf_counter()
                trained = (len(batches) - done_before) * batches.batch_size  # images this epoch trains here
                losses = train_epoch(
                    net, method, batches, optimizer, ctx, phase, epoch, bar, epoch_state, interrupt, on_interrupt, step
                )
                epoch_state = None
                method.on_epoch_end(ctx, phase)
                dt = time.perf_counter() - t0
                bar.set_postfix({k: f"{v:.3f}" for k, v in losses.items()})
                record = {
                    "task": ctx.task_id, "phase": phase.name, "epoch": epoch, "epochs": phase.epochs, "lr": lr,
                    "loss": losses, "time_s": round(dt, 3), "images_per_s": trained / dt,
                }  # fmt: skip
                clock.images += trained
                clock.update()
                for cb in callbacks:
                    cb.on_epoch_end(record)
                stop = interrupt is not None and interrupt.requested
                if checkpoint is not None:
                    required = stop or epoch + 1 == phase.epochs
                    checkpoint(Position(ctx.task_id, "train", index, epoch + 1), optimizer, None, required)
                if stop:
                    raise RunInterrupted(f"interrupted in task {ctx.task_id}, phase {phase.name}, after epoch {epoch}")
        clock.update()
    return out


class _PhaseClock:
    """A phase's record over all the processes of a run: what earlier ones kept (in ``record``) plus this one's."""

    def __init__(self, record: dict[str, Any], step: StepGraph, graphs: GraphMode) -> None:
        self.record, self.step, self.graphs = record, step, graphs
        self.kept = {k: record.get(k, 0) for k in ("time_s", "images", "captures", "capture_s")}
        self.started = time.perf_counter()
        self.images = 0  # real images this process trained in the phase's finished epochs

    def update(self, partial: int = 0) -> None:
        """Write the record so far; ``partial``: images of an unfinished epoch (an interrupt)."""
        dt = self.kept["time_s"] + time.perf_counter() - self.started
        n = self.kept["images"] + self.images + partial
        self.record.update(time_s=round(dt, 3), images=n, images_per_s=round(n / dt, 1) if dt > 0 else 0.0)
        if self.graphs != "off":  # whether the phase's steps really were replayed (by this process, the last)
            step = self.step
            self.record.update(cuda_graphs=step.mode, captures=self.kept["captures"] + step.captures)
            if step.mode == "on":
                self.record["capture_s"] = round(self.kept["capture_s"] + step.capture_s, 3)
            if step.failure:
                self.record["graph_failure"] = step.failure
            else:  # the failure of an earlier process, which this one's mode replaces
                self.record.pop("graph_failure", None)


def fill_momentum(optimizer: torch.optim.SGD) -> None:
    """Give every trainable parameter without a momentum buffer a zero one, once some parameter has one.

    A parameter trained in a later phase of the same optimiser (frozen before) has none, and the fused SGD kernel
    refuses a mix of buffers and missing ones. With no dampening a zero buffer gives exactly eager SGD's first
    step for that parameter (the buffer becomes the gradient).
    """
    if not any("momentum_buffer" in s for s in optimizer.state.values()):
        return
    for group in optimizer.param_groups:
        for p in group["params"] if group["momentum"] else ():
            if p.requires_grad and optimizer.state[p].get("momentum_buffer") is None:
                optimizer.state[p]["momentum_buffer"] = torch.zeros_like(p)


def fused_kwargs(params: Sequence[torch.Tensor], fused: bool) -> dict[str, bool]:
    """``{"fused": True}`` when asked for and every parameter is a floating CUDA tensor, else nothing."""
    ok = fused and params and all(p.is_cuda and p.is_floating_point() for p in params)
    return {"fused": True} if ok else {}


class TrainStep:
    """The method's loss terms for one batch, from the batch's image indices to one vector of terms (the
    ``compute`` of a :class:`StepGraph`: loading and augmentation are part of the captured step). The terms'
    names are kept in :attr:`names`, from the first call on."""

    def __init__(
        self, net: IncrementalNet, method: Method, ctx: TaskContext, phase: Phase, batches: TrainBatches
    ) -> None:
        self.net, self.method, self.ctx, self.phase, self.batches = net, method, ctx, phase, batches
        self.names: list[str] | None = None

    def __call__(self, idx: torch.Tensor) -> torch.Tensor:
        x, y = self.batches.load(idx)
        with self.ctx.autocast():
            terms = self.method.training_step(self.net, Batch(x, y), self.ctx, self.phase)
        if self.names is None:
            self.names = list(terms)
        elif list(terms) != self.names:
            raise RuntimeError(
                f"{self.method.name} changed its loss terms within a phase: {self.names} → {list(terms)}"
            )
        return torch.stack([v.float() for v in terms.values()])


def _clip(net: IncrementalNet, method: Method) -> Callable[[], None] | None:
    if method.grad_clip_value is None:
        return None
    value = method.grad_clip_value
    return lambda: torch.nn.utils.clip_grad_value_(net.parameters(), value)


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
    step: StepGraph | None = None,
) -> dict[str, float]:
    """One pass over the task's batches. Loss terms are summed on the device and read once, at the end.

    Args:
        state: a partly done epoch to continue (from a mid-epoch checkpoint).
        step: the phase's step (a :class:`TrainStep` under a :class:`StepGraph`); default an eager one.
        interrupt: checked after every step; when set, ``on_interrupt`` gets the epoch so far and
            :class:`RunInterrupted` is raised.

    Raises:
        NonFiniteLossError: naming the first non-finite term, with task, phase, epoch and step.
    """
    step = step or StepGraph(TrainStep(net, method, ctx, phase, batches), optimizer, clip=_clip(net, method))
    key = (phase.name, tuple(group["lr"] for group in optimizer.param_groups))  # a new lr: a new graph
    ep = state or EpochProgress(batches.permutation())
    if ep.values is not None and len(ep.values) < len(batches):  # converted from an earlier version's checkpoint
        ep.values = torch.cat([ep.values, ep.values.new_zeros(len(batches) - len(ep.values), ep.values.shape[1])])
    for idx in batches.indices(ep.perm, start=ep.step):
        values = step(key, idx)
        names = step.compute.names
        if ep.names is None:
            ep.names = names
            ep.values = values.new_zeros(len(batches), len(names))
        elif names != ep.names:
            raise RuntimeError(f"{method.name} changed its loss terms within an epoch: {ep.names} → {names}")
        ep.values[ep.step].copy_(values)  # the step's only bookkeeping on the device: one copy
        ep.step += 1
        if bar is not None:
            bar.update(1)
        if interrupt is not None and interrupt.requested and ep.step < len(batches):
            if on_interrupt is not None:
                on_interrupt(ep)
            raise RunInterrupted(f"interrupted in task {ctx.task_id}, phase {phase.name}, epoch {epoch}")
    if ep.names is None:
        return {}
    done = ep.values[: ep.step]
    means = (done.sum(dim=0) / ep.step).tolist()  # the one host sync of the epoch
    bad = (~torch.isfinite(done)).nonzero().tolist()  # (step, term), in step order
    if bad:  # name the term that went wrong first; later ones usually follow from it
        at, i = bad[0]
        raise NonFiniteLossError(
            f"loss term {ep.names[i]!r} became non-finite in task {ctx.task_id}, phase {phase.name}, epoch {epoch}, "
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
