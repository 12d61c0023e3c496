"""THE training engine, top to bottom:

* :func:`run`: build the network, the method and the run state, restore a checkpoint when resuming, then
  :func:`run_task` for every task left;
* :func:`run_task`: grow the head, the method's task setup (inversion), :func:`fit_task`, evaluate, record;
* :func:`fit_task`: the task's phases; per phase freeze or unfreeze, then per epoch the lr and :func:`train_epoch`;
* :func:`train_epoch`: one :class:`TrainStep` per batch (zero_grad, loss terms, backward, clipping, step); with
  ``engine.cuda_graphs`` on, a CUDA graph replays that step body (:mod:`dfcil.compute.graphs`).

Methods supply the loss terms (:mod:`dfcil.methods`); checkpoints, timings and logs are callbacks
(:mod:`dfcil.training.callbacks`) the engine calls at fixed points, ``loop.emit(hook, ...)``; the live run they see is a
:class:`~dfcil.training.loop.Loop`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from dfcil.compute import distributed
from dfcil.compute.graphs import StepGraph
from dfcil.compute.optim import (
    OPTIMIZER_KINDS,
    fill_momentum,
    load_optimizer_state,
    phase_optimizer,
    set_hyperparameters,
)
from dfcil.compute.runtime import Runtime, compile_cache, process_state_kept, resolve_device, seed_everything
from dfcil.config import RunConfig, changed_from_defaults, config_to_dict
from dfcil.data.device import Normalizer
from dfcil.data.splits import ClassIncrementalSplit
from dfcil.errors import BudgetSpent, RunInterrupted
from dfcil.methods import Method, Phase, TaskContext, build_method, loss_terms
from dfcil.models.network import backbone_for, build_network
from dfcil.progress import make_progress
from dfcil.training.budget import units_of
from dfcil.training.callbacks import Checkpointing, Timer
from dfcil.training.estimate import END, EVALUATION, SETUP, RunEstimate, estimate_run, plan, timed_config
from dfcil.training.guard import LossGuard
from dfcil.training.loop import Loop, RunOptions
from dfcil.training.protocol import Evaluator, Protocol, TaskBatches, TestSet, prepare, tasks_of
from dfcil.training.state import EpochProgress, Position, RunState
from dfcil.training.task0 import Task0Cache
from dfcil.version import __version__

log = logging.getLogger("dfcil")

SUMMARY_FORMAT = 1  # summary.json's layout, for readers without the engine (reports); raise it when a key changes


def stopping(loop: Loop) -> bool:
    """Whether an interrupt was requested here or, over several processes, in any (all then stop at this point)."""
    loop.interrupt.requested = loop.runtime.dist.flag(loop.interrupt.requested)
    return loop.interrupt.requested


def stop(loop: Loop, where: str) -> None:
    """Checkpoint (``on_interrupt``) and stop the run."""
    loop.emit("on_interrupt")
    loop.runtime.dist.barrier()  # several processes: none exits (torchrun would stop the rest) before it is saved
    raise RunInterrupted(f"interrupted {where}")


def run(
    cfg: RunConfig,
    run_dir: Path | None = None,
    resume: bool = False,
    options: RunOptions | None = None,
    protocol: Protocol | None = None,
) -> dict[str, Any]:
    """Train ``cfg.method`` through every task of the protocol and return the summary (:mod:`dfcil.metrics`).

    ``run_dir``: where checkpoints (``run_dir/checkpoints``) and ``metrics.jsonl`` live; None: no checkpoints.
    ``resume``: continue from the newest usable checkpoint in ``run_dir``. ``options``: progress bars, the
    caller's callbacks, and the interrupt: when its flag is set, the run finishes the step, checkpoints and raises
    :class:`RunInterrupted`. ``protocol``: the prepared data, where the caller has it already. The process's global
    random streams and cuDNN switch are as before afterwards (:func:`dfcil.compute.runtime.process_state_kept`).
    """
    if resume and run_dir is None:
        raise ValueError("resume continues a run directory's checkpoints: give run_dir")
    options = options or RunOptions()
    started = time.perf_counter()
    with process_state_kept(), contextlib.ExitStack() as stack:
        protocol = protocol or prepare(cfg, make_progress(options.progress))
        if cfg.engine.compile != "none":  # what earlier runs compiled is loaded, not compiled again
            kept = stack.enter_context(compile_cache(cfg.engine.compile_cache))
            log.info("compile cache: %s", kept or "off (every graph compiled, nothing kept)")
        loop = build(cfg, protocol, options)
        intervals = (cfg.checkpoint_interval_s, cfg.epoch_checkpoint_interval_s)
        saver = Checkpointing(run_dir, config_to_dict(cfg), *intervals) if run_dir is not None else None
        cache = Task0Cache(cfg, protocol, loop.method) if cfg.task0_cache else None
        writers = (saver, cache) if loop.runtime.dist.main else ()  # one process writes the run's files
        loop.callbacks = [Timer(), *options.callbacks, *(c for c in writers if c is not None)]
        payload = None
        if resume:
            payload = saver.load()
        elif cache is not None:  # a shared first-task model, if one is stored: task 0 is not trained again
            payload = cache.load(loop.runtime.dist)
        ctx = restore(loop, payload) if payload is not None else None  # the context of the task to continue
        loop.runtime.dist.barrier()  # every process has read the checkpoint before the first writes a new one
        loop.emit("on_run_start", loop)
        state = loop.state
        if cache is not None and cache.loaded:
            record = state.task_record(0, protocol.split) | loop.fields("task_fields", 0)
            loop.emit("on_task_end", record | {"shared_task0": str(cache.path)})
        for task in range(state.position.task, protocol.split.num_tasks):
            run_task(loop, ctx if ctx is not None and ctx.task_id == task else task_context(loop, task))
        split = protocol.split
        summary = {
            "format": SUMMARY_FORMAT, "dfcil": __version__, "method": cfg.method.name, "stores": loop.method.stores,
            "method_changed": changed_from_defaults(cfg.method),  # method keys away from the method's defaults
            **({"scoring": loop.method.info.scoring} if loop.method.info.scoring else {}),
            **({"unscored_tasks": unscored} if (unscored := unscored_tasks(loop.method, split)) else {}),
            "dataset": protocol.dataset.name, "augment": cfg.data.augment,
            "class_order": list(split.class_order), "tasks": split.tasks, "task_sizes": list(split.task_sizes),
            **state.acc.summary(), "wall_time_s": round(time.perf_counter() - started, 2),
            "total_time_s": round(state.elapsed_s(), 2), "resumed": resume, "device": str(loop.runtime.device),
            "seed": cfg.seed, **({"class_names": list(protocol.dataset.classes)} if protocol.dataset.classes else {}),
            **loop.fields("summary_fields"),  # the timings, the inversion diagnostics
        }  # fmt: skip
        loop.emit("on_run_end", summary)
        return summary


def unscored_tasks(method: Method, split: ClassIncrementalSplit) -> list[int]:
    """The tasks after which the model is not the method's answer yet (:meth:`Method.scored`): their rows of the
    accuracy matrix are no results, and the summary lists them for the reports."""
    return [task.task_id for task in tasks_of(split) if not method.scored(task)]


def build(cfg: RunConfig, protocol: Protocol, options: RunOptions | None = None) -> Loop:
    """The network, the method and the run state of a new run, seeded from ``cfg.seed``."""
    options = options or RunOptions()
    dist = distributed.current()  # several processes under torchrun: this one's rank (docs/distributed.md)
    device = distributed.device_of(resolve_device(cfg.device), dist)
    seed_everything(cfg.seed)
    method = build_method(cfg.method, cfg.train)
    backbone = backbone_for(cfg.model.backbone, protocol.dataset.image_size)
    capacity = sum(protocol.split.task_sizes) if cfg.model.static_head else None  # prepare() checked the method
    net = build_network(backbone, method.head, cfg.model.head_init_std, capacity).to(device)
    if cfg.engine.channels_last:
        net.to(memory_format=torch.channels_last)
    if dist.active and cfg.engine.sync_bn:
        net.sync_batch_norm(dist)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = cfg.engine.cudnn_benchmark
    if cfg.engine.compile not in ("none", "step"):  # step: Runtime.compiler compiles the steps instead
        net.compile_backbone(mode=None if cfg.engine.compile == "default" else cfg.engine.compile)
    if cfg.engine.cuda_graphs == "on" and not method.graph_safe:
        why = method.eager_reason or f"{method.name} is not graph_safe"  # a method that overrides graph_safe alone
        log.warning("%s: its steps run eagerly (try cuda_graphs: check)", why)
    state = RunState.new(protocol.split.num_tasks, cfg.seed, device)
    runtime = Runtime.from_config(cfg.engine, device, make_progress(options.progress), dist, cfg.train.max_loss)
    normalizer = Normalizer(
        protocol.dataset.mean, protocol.dataset.std, device, cfg.engine.channels_last, cfg.data.crop_fill
    )
    test = TestSet.build(protocol, cfg.data.test_per_class, normalizer, device)
    # what the engine reads of the config, resolved here once: nothing below reads the config itself
    seen = method.info.train_data == "seen"
    batches = TaskBatches(
        protocol, cfg.data.train_per_class, cfg.train.batch_size, normalizer, device, seen, dist, cfg.data.augment
    )
    return Loop(
        net=net, method=method, state=state, runtime=runtime, protocol=protocol, batches=batches,
        evaluator=Evaluator(test, cfg.train.eval_batch_size), guard=LossGuard(cfg.train.max_loss),
        interrupt=options.interrupt, budget=options.budget,
    )  # fmt: skip


def estimate(cfg: RunConfig, protocol: Protocol, min_steps: int = 0) -> RunEstimate | None:
    """The run's expected seconds on this machine (:func:`dfcil.training.estimate.estimate_run`): a few steps of
    each kind timed on a throwaway build of the run (eager steps where it compiles: :func:`timed_config`). Nothing is
    written, and the process's random streams are as before. None for a run of fewer than ``min_steps`` training
    and inversion steps (over in seconds: not worth the timing)."""
    timed, notes = timed_config(cfg)
    loop = build(timed, protocol, RunOptions(progress=False))
    if sum(s.steps for s in plan(loop) if s.part not in (SETUP, END, EVALUATION)) < min_steps:
        return None
    return estimate_run(loop, fit_task, task_context, notes=notes)


def restore(loop: Loop, payload: dict[str, Any]) -> TaskContext:
    """Continue from a checkpoint's payload (:meth:`Loop.snapshot`): the network, the method, then the run state.
    Returns the context of the task the run continues (a finished run's: its last task's)."""
    for n in payload["head_sizes"][len(loop.net.head.sizes) :]:
        loop.net.expand(n)
    loop.net.load_state_dict(payload["net"])
    task, last = payload["position"]["task"], loop.protocol.split.num_tasks - 1
    # The last checkpoint of a finished run has no task left to continue, but the method's state is still the
    # run's (FeCAM's class statistics, DPCR's ridge head, ...): the final model file keeps it, so it is restored as
    # the last task left it, in that task's context
    ctx = task_context(loop, min(task, last))
    loop.method.load_state_dict(payload["method"], ctx, payload.get("static_state") or None)
    loop.restore_callbacks(payload)
    loop.state.load_state_dict(payload)  # last: building the network and the method consumed random numbers
    return ctx


def task_context(loop: Loop, task: int) -> TaskContext:
    """Task ``task``'s context: its classes and its training images on the device, in the method's batches."""
    split = loop.protocol.split
    data = loop.batches(task, loop.state.rngs["data"], loop.method.batch_size(task))
    return TaskContext(
        task_id=task, n_old=split.offsets[task], n_new=split.task_sizes[task], num_tasks=split.num_tasks,
        net=loop.net, data=data, rng=loop.state.rngs["method"], runtime=loop.runtime,
    )  # fmt: skip


def setup_step(loop: Loop) -> None:
    """A consistent point inside a task's setup (the method calls it after every inversion step): stop there on an
    interrupt, else let callbacks checkpoint."""
    if stopping(loop):
        stop(loop, f"in task {loop.state.position.task}, setup")
    loop.emit("on_setup_step")


def run_task(loop: Loop, ctx: TaskContext) -> None:
    """One task: grow the head, the method's setup, the phases, evaluation; continues a resumed task."""
    state, task, method = loop.state, ctx.task_id, loop.method
    loop.ctx = ctx
    begun = state.position.stage != "start"  # by an earlier process of this run, which checkpointed inside it
    if not begun:
        loop.net.expand(ctx.n_new)
        state.position = Position(task, "setup")
    phases = method.phases(ctx)
    info = {"task": task, "num_tasks": ctx.num_tasks, "n_new": ctx.n_new, "n_seen": ctx.n_seen}
    info |= {"train_images": len(ctx.data.x), "phases": [dataclasses.asdict(p) for p in phases]}
    loop.emit("on_task_start", info | ({"resumed_at": dataclasses.asdict(state.position)} if begun else {}))
    if not begun:
        method.on_task_start(ctx)  # once per task: a resumed task has the method's state restored instead
    if state.position.stage == "setup":
        method.synthesize(ctx, functools.partial(setup_step, loop))  # model inversion; a resumed one continues
        state.position = Position(task, "train")
        loop.emit("on_setup_end")
        if stopping(loop):
            raise RunInterrupted(f"interrupted after the setup of task {task}")
    fit_task(loop, ctx, phases)
    method.on_task_end(ctx)
    evaluator = loop.evaluator
    loop.emit("on_eval_start")
    with ctx.runtime.progress(total=evaluator.batches(task), desc=f"task {task} eval") as bar, ctx.runtime.autocast():
        state.acc.record(task, *evaluator.evaluate(loop.net, task, bar, ctx.runtime.dist, method.eval_logits))
    loop.emit("on_eval_end")
    state.position = Position(task + 1, "start")
    loop.emit("on_task_end", state.task_record(task, loop.protocol.split) | loop.fields("task_fields", task))
    loop.ctx = None
    if task + 1 < ctx.num_tasks:
        check_budget(loop, task)
    if stopping(loop) and task + 1 < ctx.num_tasks:
        raise RunInterrupted(f"interrupted after task {task}")


def check_budget(loop: Loop, task: int) -> None:
    """After task ``task`` (checkpointed): stop here rather than start the next task where it would not end within
    the process's budget (:class:`~dfcil.training.budget.Budget`); over several processes, where any says so."""
    budget = loop.budget
    if budget is None:
        return
    budget.trained += task >= 1
    units = units_of(loop.method, tasks_of(loop.protocol.split)[task + 1])
    why = budget.refuses(loop.fields("summary_fields").get("timings", []), task + 1, units)
    if loop.runtime.dist.flag(why is not None):
        raise BudgetSpent(f"stopped after task {task} at its checkpoint: {why or 'another process is out of time'}")


def fit_task(loop: Loop, ctx: TaskContext, phases: Sequence[Phase]) -> None:
    """Run the phases of one task with one SGD optimiser (momentum carries over unless a phase resets it),
    from ``loop.state.position`` on (a resumed task continues where its checkpoint stood)."""
    state, method = loop.state, loop.method
    extra = method.extra_modules(ctx)
    params = [p for m in (ctx.net, *extra) for p in m.parameters()]
    start = state.position if state.position.stage == "train" else Position(ctx.task_id, "train")
    for index, phase in enumerate(phases[start.phase :], start=start.phase):
        first_epoch = start.epoch if index == start.phase else 0
        other_kind = state.optimizer is not None and OPTIMIZER_KINDS[type(state.optimizer)] != phase.optimizer
        if state.optimizer is None or other_kind or (phase.reset_optimizer and first_epoch == 0):
            kind, fused = phase.optimizer, ctx.runtime.fused
            state.optimizer = phase_optimizer(kind, params, phase.lr, phase.momentum, phase.weight_decay, fused)
            if state.optimizer_handoff is not None:  # a checkpoint's optimiser state, for this optimiser
                load_optimizer_state(state.optimizer, state.optimizer_handoff)
                state.optimizer_handoff = None
        set_hyperparameters(state.optimizer, phase.weight_decay, phase.momentum)  # a phase's own, optimiser kept
        ctx.net.set_trainable(phase.trainable, extra)  # "head": the backbone frozen in eval mode
        for part in method.frozen(ctx, phase):  # e.g. UCIR's and PODNet's old classifier blocks
            part.requires_grad_(False)
        fill_momentum(state.optimizer)
        step = TrainStep(method, ctx, phase, state.optimizer)
        graphs = ctx.runtime.graphs if method.graph_safe or ctx.runtime.graphs == "check" else "off"
        if graphs != "off":  # the step body captured and replayed (on), or checked for it (check)
            loop.graph = StepGraph(step, state.optimizer, graphs, ctx.device, (ctx.rng, ctx.data.generator))
        state.position = Position(ctx.task_id, "train", index, first_epoch, start.step if index == start.phase else 0)
        loop.emit("on_phase_start", phase)
        done = first_epoch * len(ctx.data) + state.position.step
        bar = ctx.runtime.progress(
            total=phase.epochs * len(ctx.data), desc=f"task {ctx.task_id} {phase.name}", unit="step", initial=done
        )
        with bar:
            for epoch in range(first_epoch, phase.epochs):
                for group in state.optimizer.param_groups:
                    group["lr"] = phase.lr_at(epoch)
                train_epoch(loop, ctx, phase, step, bar)
                if stopping(loop) and epoch + 1 < phase.epochs:
                    stop(loop, f"in task {ctx.task_id}, phase {phase.name}, after epoch {epoch}")
        method.on_phase_end(ctx, phase)  # before the phase's checkpoint; called again by a run resumed from it
        loop.emit("on_phase_end", phase)
        loop.graph = None
        if stopping(loop):
            raise RunInterrupted(f"interrupted in task {ctx.task_id}, at the end of phase {phase.name}")
    state.optimizer = None


class TrainStep:
    """One optimisation step on one batch, from the batch's image indices to the loss terms (loading and
    augmentation included, so that a CUDA graph of it replays them too)."""

    def __init__(self, method: Method, ctx: TaskContext, phase: Phase, optimizer: torch.optim.Optimizer) -> None:
        self.method, self.ctx, self.phase, self.optimizer = method, ctx, phase, optimizer
        self.names: list[str] = []  # the loss terms' names
        self.terms = ctx.runtime.compiled(loss_terms)  # engine.compile: step compiles it
        self.params = [p for group in optimizer.param_groups for p in group["params"]]

    def __call__(self, idx: Tensor) -> Tensor:
        ctx, optimizer = self.ctx, self.optimizer
        optimizer.zero_grad(set_to_none=True)
        x, y = ctx.data.load(idx)
        terms = self.terms(self.method, ctx.net, ctx, self.phase, x, y, idx)
        if self.names and list(terms) != self.names:  # eager steps; a graph replays its capture's terms
            raise RuntimeError(
                f"{self.method.name} changed its loss terms within a phase: {self.names} → {list(terms)}"
            )
        self.names = list(terms)
        losses = torch.stack([v.float() for v in terms.values()])
        losses.sum().backward()
        ctx.runtime.dist.average_gradients(self.params)  # several processes: the global batch's gradient
        if (clip := self.method.info.grad_clip_value) is not None:
            nn.utils.clip_grad_value_(ctx.net.parameters(), clip)
        if (norm := self.method.info.grad_clip_norm) is not None:  # over everything the optimiser steps
            nn.utils.clip_grad_norm_(self.params, norm)
        optimizer.step()
        ctx.runtime.dist.share_buffers(ctx.net)  # engine.sync_bn false: the first process's BN statistics
        return ctx.runtime.dist.mean(losses.detach())  # the global batch's terms (each process has its share's)


def train_epoch(loop: Loop, ctx: TaskContext, phase: Phase, step: TrainStep, bar: Any = None) -> dict[str, float]:
    """One pass over the task's batches (continuing ``loop.state.epoch`` after a mid-epoch resume); emits
    ``on_epoch_end`` with the mean of each loss term, kept on the device and read at the end.

    Raises:
        NonFiniteLossError: naming the first non-finite term, with task, phase, epoch and step.
        LossLimitError: naming a term whose epoch mean passed ``train.max_loss``.
    """
    state, data = loop.state, ctx.data
    epoch, lrs = state.position.epoch, tuple(group["lr"] for group in state.optimizer.param_groups)
    key = (phase.name, lrs)  # a new lr: a new graph
    ep = state.epoch = state.epoch or EpochProgress(data.permutation())
    done_before, t0 = ep.step, time.perf_counter()
    for idx in data.indices(ep.perm, start=ep.step):
        losses = step(idx) if loop.graph is None else loop.graph(key, idx)  # a graph replays the same step
        ep.record(losses, step.names, len(data))
        if bar is not None:
            bar.update(1)
        loop.emit("on_step_end")
        if stopping(loop) and ep.step < len(data):
            state.position = dataclasses.replace(state.position, step=ep.step)
            stop(loop, f"in task {ctx.task_id}, phase {phase.name}, epoch {epoch}")
    means = loop.guard.check(ep, f"task {ctx.task_id}, phase {phase.name}, epoch {epoch}")  # diverged: stop
    loop.method.on_epoch_end(ctx, phase)
    state.epoch, state.position = None, dataclasses.replace(state.position, epoch=epoch + 1, step=0)
    dt = time.perf_counter() - t0
    if bar is not None:
        bar.set_postfix({k: f"{v:.3f}" for k, v in means.items()})
    record = {
        "task": ctx.task_id, "phase": phase.name, "epoch": epoch, "epochs": phase.epochs, "lr": lrs[0], "loss": means,
        "time_s": round(dt, 3), "images_per_s": (len(data) - done_before) * data.batch_size / dt,
    }  # fmt: skip
    loop.emit("on_epoch_end", record)
    return means
