"""What a run costs on this machine: before it starts (``dfcil train --dry-run``) and, while it runs, how long it has
left (the console's lines, :class:`~dfcil.training.callbacks.ConsoleLogger`).

A run's work is its :func:`plan`, in run order: per task the method's task start, its inversion steps, each phase's
training steps (epochs × batches per epoch), the method's work at the phases' and the task's end, and the evaluation
(test images). Its seconds are each stretch's steps times the seconds of a step of its kind
(:func:`seconds_by_part`, :func:`seconds_left`), measured

* before the run by :func:`estimate_run`: a few steps of each kind timed on a throwaway build of the run, in task 0
  and in the first incremental task (the later tasks' steps are taken to be as fast as that one's), and a phase that
  first trains after it in the first task that trains it (joint trained in the last task only);
* while it runs by :class:`RunClock`: each kind's seconds so far in the run, the estimate's (or nothing) for a kind
  that has not run yet.

This module sits below the engine, whose console logger keeps a :class:`RunClock`; :func:`estimate_run` runs the
engine's own phase loop, which its caller passes in (:func:`dfcil.training.engine.fit_task`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch

from dfcil.compute.runtime import process_state_kept
from dfcil.config import RunConfig
from dfcil.context import Phase, Task, TaskContext
from dfcil.progress import rough_duration
from dfcil.training.budget import end_work, units_of
from dfcil.training.loop import Callback, Loop
from dfcil.training.state import Position

log = logging.getLogger("dfcil")

# the parts of a task besides its phases (which go by their names)
SETUP, INVERSION, END, EVALUATION = "setup", "inversion", "task end", "evaluation"


def kind_of(task: int, what: str) -> str:
    """Whose seconds per step a stretch of ``what`` (a part) in task ``task`` takes: task 0's steps are of their own
    kinds (no teacher, no synthetic replay), every later task's those of the first incremental task; evaluation is one
    kind, per test image."""
    return what if what == EVALUATION or task > 0 else f"task 0 {what}"


@dataclasses.dataclass(frozen=True)
class Stretch:
    """``steps`` steps of one kind in task ``task``: what the run spends on it is ``steps`` × that kind's seconds."""

    task: int
    part: str  # what the time goes to, as reported: "inversion", a phase's name ("rrl"), "evaluation", ...
    kind: str  # whose seconds per step it takes (:func:`kind_of`)
    steps: int  # inversion or training steps; test images for evaluation; 1 for a task's start and end


def task_plan(
    task: int, phases: Sequence[Phase], batches: int, inversion_steps: int, test_images: int, end_units: int = 1
) -> list[Stretch]:
    """Task ``task``'s stretches in run order: its start (the method's ``on_task_start``: one step; part of the
    inversion where the task inverts), its ``inversion_steps``, each phase's epochs × ``batches`` steps, the method's
    work at the phases' and the task's end (``end_units`` steps: :meth:`~dfcil.methods.Method.end_units`), and the
    evaluation of ``test_images`` (every seen class's)."""
    setup = INVERSION if inversion_steps else SETUP
    plan = [Stretch(task, setup, kind_of(task, SETUP), 1)]
    if inversion_steps:
        plan.append(Stretch(task, INVERSION, kind_of(task, INVERSION), inversion_steps))
    plan += [Stretch(task, p.name, kind_of(task, p.name), p.epochs * batches) for p in phases]
    end = Stretch(task, END, kind_of(task, END), end_units)
    return [*plan, end, Stretch(task, EVALUATION, EVALUATION, test_images)]


def plan(loop: Loop) -> list[Stretch]:
    """The whole run's stretches (:func:`task_plan` of every task), from its protocol, method, batches and test set."""
    protocol, method = loop.protocol, loop.method
    split, images = protocol.split, protocol.train_images
    replay = method.synthesizer()
    out: list[Stretch] = []
    for t in range(split.num_tasks):
        task = Task(task_id=t, n_old=split.offsets[t], n_new=split.task_sizes[t], num_tasks=split.num_tasks)
        n = sum(images[: t + 1]) if loop.batches.seen else images[t]  # joint: every task's images so far
        inversion = replay.cfg.steps if replay is not None and t > 0 else 0
        test = int(loop.evaluator.test.seen[t])
        out += task_plan(t, method.phases(task), n // method.batch_size(t), inversion, test, units_of(method, task))
    return out


def end_units(plan: Sequence[Stretch], task: int) -> int:
    """The steps of task ``task``'s end in ``plan``: what its seconds of end work are divided by."""
    return next((s.steps for s in plan if s.task == task and s.part == END), 1)


def seconds_by_part(plan: Sequence[Stretch], step_s: Mapping[str, float]) -> dict[str, float]:
    """Seconds of each part (Σ steps × ``step_s[kind]`` over its stretches), parts in the order the plan first has
    them; a kind without seconds counts nothing (:func:`untimed` names it)."""
    out: dict[str, float] = {}
    for s in plan:
        out[s.part] = out.get(s.part, 0.0) + s.steps * step_s.get(s.kind, 0.0)
    return out


def seconds_left(plan: Sequence[Stretch], step_s: Mapping[str, float], at: int, done: int = 0) -> float:
    """Seconds of ``plan[at:]`` where ``done`` steps of ``plan[at]`` are behind (a kind without seconds: nothing)."""
    if at >= len(plan):
        return 0.0
    rest = sum(s.steps * step_s.get(s.kind, 0.0) for s in plan[at:])
    return rest - min(done, plan[at].steps) * step_s.get(plan[at].kind, 0.0)


def untimed(plan: Sequence[Stretch], step_s: Mapping[str, float]) -> list[str]:
    """The kinds of the plan's stretches with steps whose seconds are unknown, in plan order."""
    return list(dict.fromkeys(s.kind for s in plan if s.steps and s.kind not in step_s))


def typical(samples: Mapping[str, Sequence[float]]) -> dict[str, float]:
    """Each kind's seconds per step: the median of its timed steps (a step slowed by another process's burst of work
    moves it little)."""
    return {k: statistics.median(v) for k, v in samples.items() if v}


def spread(plan: Sequence[Stretch], samples: Mapping[str, Sequence[float]]) -> float:
    """The estimate's relative uncertainty from its timed steps: each kind's half range of seconds over their median,
    weighted by its share of the run's seconds (:func:`typical`); a kind of one timed step counts as exact."""
    step_s = typical(samples)
    seconds = {s.kind: 0.0 for s in plan}
    for s in plan:
        seconds[s.kind] += s.steps * step_s.get(s.kind, 0.0)
    total = sum(seconds.values())
    if total <= 0:
        return 0.0
    width = {k: (max(v) - min(v)) / 2 / step_s[k] for k, v in samples.items() if v and step_s[k] > 0}
    return sum(s * width.get(kind, 0.0) for kind, s in seconds.items()) / total


@dataclasses.dataclass(frozen=True)
class RunEstimate:
    """A run's seconds from a few timed steps of each kind (:func:`estimate_run`)."""

    device: str  # where the steps were timed, in words
    plan: tuple[Stretch, ...]
    samples: Mapping[str, tuple[float, ...]]  # each kind's timed steps' seconds (past the warm-up)
    timed: int  # steps timed per kind at most (fewer where a kind's steps are slow)
    seconds: float  # what the timing took
    notes: tuple[str, ...] = ()  # what it did not time, beyond what every estimate leaves out
    tasks: tuple[int, ...] = (0, 1)  # the tasks whose steps were timed (a later one: a phase first trained there)

    @property
    def step_s(self) -> dict[str, float]:
        """Each timed kind's seconds per step (:func:`typical`)."""
        return typical(self.samples)

    @property
    def total_s(self) -> float:
        return seconds_left(self.plan, self.step_s, 0)

    def lines(self) -> list[str]:
        """What the dry run prints and a run logs: the run's time, by part, and how good it is."""
        parts = seconds_by_part(self.plan, self.step_s)
        order = [SETUP, INVERSION, *(p for p in parts if p not in (SETUP, INVERSION, END, EVALUATION)), END, EVALUATION]
        total = self.total_s
        shown = ", ".join(f"{p} {rough_duration(parts[p])}" for p in order if parts.get(p, 0.0) > total / 200)
        percent = 5 * max(1, math.ceil(100 * spread(self.plan, self.samples) / 5))  # in steps of 5 %
        missing = untimed(self.plan, self.step_s)
        notes = [*self.notes, *([f"not timed (counted as nothing): {', '.join(missing)}"] if missing else [])]
        return [
            f"expected time on this machine ({self.device}): about {rough_duration(self.total_s)} "
            f"(±{percent} %): {shown or 'nothing to train'}",
            f"  from up to {self.timed} steps of each kind timed after a warm-up, in {in_tasks(self.tasks)} "
            f"({self.seconds:.1f}s); ±: those steps' spread; later tasks' steps taken as {as_timed(self.tasks)}; "
            f"not counted: checkpoints and logs{''.join(f'; {n}' for n in notes)}",
        ]


def in_tasks(tasks: Sequence[int]) -> str:
    """``"task 0 and task 1"``, ``"tasks 0, 1 and 9"`` (a phase first trained in task 9 timed there)."""
    if len(tasks) <= 2:
        return " and ".join(f"task {t}" for t in tasks)
    return f"tasks {', '.join(map(str, tasks[:-1]))} and {tasks[-1]}"


def as_timed(tasks: Sequence[int]) -> str:
    """Whose steps the untimed tasks' take: task 1's, and a later timed task's for the phases first trained there."""
    return "task 1's" if len(tasks) <= 2 else "task 1's (a phase first trained later: that task's)"


class _Enough(Exception):
    """Enough steps of one kind are timed: the loop that runs them stops here."""


def enough(laps: Sequence[float], warmup: int, steps: int, budget_s: float) -> bool:
    """Whether a kind is timed: ``warmup`` steps and ``steps`` more, or fewer once ``budget_s`` is spent (one past the
    warm-up at least)."""
    return len(laps) >= warmup + steps or (len(laps) > warmup and sum(laps) >= budget_s)


class Stopwatch(Callback):
    """Times each step of the loop that runs (the engine's ``on_step_end``, an inversion's ``on_step``: :meth:`lap`),
    the device synchronised, and stops that loop once :func:`enough` says so."""

    def __init__(self, device: torch.device, warmup: int, steps: int, budget_s: float) -> None:
        self.device, self.warmup, self.steps, self.budget_s = device, warmup, steps, budget_s
        self.laps: list[float] = []
        self.last = time.perf_counter()

    def _now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def start(self) -> None:
        self.laps, self.last = [], self._now()

    def elapsed(self) -> float:
        """Seconds since :meth:`start` or the last lap."""
        return self._now() - self.last

    def lap(self) -> None:
        now = self._now()
        self.laps.append(now - self.last)
        self.last = now
        if enough(self.laps, self.warmup, self.steps, self.budget_s):
            raise _Enough

    def timed(self) -> tuple[float, ...]:
        """The laps past the warm-up (all of them where a loop ended within its warm-up)."""
        return tuple(self.laps[self.warmup :] or self.laps)

    def on_phase_start(self, phase: Phase) -> None:
        self.start()

    def on_step_end(self) -> None:
        self.lap()


FitTask = Callable[[Loop, TaskContext, Sequence[Phase]], None]
ContextOf = Callable[[Loop, int], TaskContext]


def measure(
    loop: Loop, fit_task: FitTask, task_context: ContextOf, steps: int = 3, budget_s: float = 2.0
) -> tuple[dict[str, tuple[float, ...]], tuple[int, ...], tuple[str, ...]]:
    """Seconds of a few steps of each kind of tasks 0 and 1 of the freshly built run ``loop`` (which it trains a
    little: a throwaway), by kind (:func:`kind_of`): each task's start and end, its inversion steps (stopped after a
    few), its phases' training steps (a few of each, through ``fit_task``, the engine's own phase loop; a phase that
    trains first in a later task, in that task: :func:`_later_phases`), and the evaluation's seconds per test image
    (one batch). Returns them, the tasks whose steps were timed, and what could not be timed, in words."""
    device = loop.runtime.device
    graphs = loop.runtime.graphs == "on" and device.type == "cuda"
    warmup = 4 if graphs else 1  # with CUDA graphs: StepGraph's two eager steps, its capture and a first replay
    watch = Stopwatch(device, warmup, steps, budget_s)
    loop.callbacks = [watch]
    method = loop.method
    samples: dict[str, tuple[float, ...]] = {}
    for t in range(min(2, loop.protocol.split.num_tasks)):
        ctx = loop.ctx = task_context(loop, t)
        loop.net.expand(ctx.n_new)
        phases = method.phases(ctx)
        watch.start()
        method.on_task_start(ctx)
        samples[kind_of(t, SETUP)] = (watch.elapsed(),)
        watch.start()
        with contextlib.suppress(_Enough):
            method.synthesize(ctx, watch.lap)
        if watch.laps:
            samples[kind_of(t, INVERSION)] = watch.timed()
        end = 0.0
        for phase in phases:
            cut = _fit_phase(loop, fit_task, ctx, phase)  # shorter than its timing: run whole, end work included
            samples[kind_of(t, phase.name)] = watch.timed()
            if cut:  # the method's work at the phase's end (statistics, drift): the next task may need it
                watch.start()
                method.on_phase_end(ctx, phase)
                end += watch.elapsed()
        watch.start()
        method.on_task_end(ctx)
        samples[kind_of(t, END)] = ((end + watch.elapsed()) / units_of(method, ctx),)
    later, notes = _later_phases(loop, fit_task, task_context, watch, samples)
    samples[EVALUATION] = _evaluation(loop, watch)
    return samples, (*range(min(2, loop.protocol.split.num_tasks)), *later), tuple(notes)


def _fit_phase(loop: Loop, fit_task: FitTask, ctx: TaskContext, phase: Phase) -> bool:
    """Train ``phase`` of task ``ctx`` from its start through the engine's own phase loop until the stopwatch has
    enough laps; returns whether it was cut there (False: the phase ran whole, its end work included)."""
    state = loop.state
    state.position, state.epoch, state.optimizer, loop.graph = Position(ctx.task_id, "setup"), None, None, None
    try:
        fit_task(loop, ctx, [phase])
    except _Enough:
        return True
    return False


def _later_phases(
    loop: Loop, fit_task: FitTask, task_context: ContextOf, watch: Stopwatch, samples: dict[str, tuple[float, ...]]
) -> tuple[list[int], list[str]]:
    """Time the steps of each phase that no task before the third trains (joint trained in the last task only) in
    the first task that trains it, the tasks between only growing the head (their training is not what is timed):
    else those steps, often most of the run, would be counted as nothing. Returns the tasks timed, and a note where
    one could not be: a method whose task start needs the tasks before it (which the timing skips) stops the timing
    there, its phase then counted as nothing and said so, rather than the run."""
    method, split = loop.method, loop.protocol.split
    timed: list[int] = []
    for t in range(2, split.num_tasks):
        task = Task(task_id=t, n_old=split.offsets[t], n_new=split.task_sizes[t], num_tasks=split.num_tasks)
        phases = [p for p in method.phases(task) if p.epochs and kind_of(t, p.name) not in samples]
        if not phases:
            loop.net.expand(task.n_new)
            continue
        try:
            ctx = loop.ctx = task_context(loop, t)
            loop.net.expand(ctx.n_new)
            method.on_task_start(ctx)
            for phase in phases:
                _fit_phase(loop, fit_task, ctx, phase)
                samples[kind_of(t, phase.name)] = watch.timed()
        except Exception as err:  # noqa: BLE001 - a throwaway's timing: said in the estimate, never the run's end
            first = str(err).splitlines()[0] if str(err) else ""
            names = ", ".join(p.name for p in phases)
            return timed, [f"{names} not timed in task {t}, the first to train it ({type(err).__name__}: {first})"]
        timed.append(t)
    return timed, []


@torch.no_grad()
def _evaluation(loop: Loop, watch: Stopwatch) -> tuple[float, ...]:
    """Seconds per test image of the network's forward pass over one evaluation batch (the method's scoring of the
    outputs, cheap beside it, not timed)."""
    test, net = loop.evaluator.test, loop.net
    x = test.x[: loop.evaluator.batch_size]
    net.eval()
    watch.start()
    with contextlib.suppress(_Enough), loop.runtime.autocast():
        while True:
            net(test.normalizer(x))
            watch.lap()
    return tuple(s / len(x) for s in watch.timed())


def timed_config(cfg: RunConfig) -> tuple[RunConfig, tuple[str, ...]]:
    """The config whose steps :func:`estimate_run` times, and what that leaves out: compiled steps are timed eagerly
    (compiling them would take minutes)."""
    if cfg.engine.compile == "none":
        return cfg, ()
    note = f"engine.compile {cfg.engine.compile}: eager steps timed (compiled ones are faster; compiling not counted)"
    return dataclasses.replace(cfg, engine=dataclasses.replace(cfg.engine, compile="none")), (note,)


def device_name(device: torch.device) -> str:
    return f"{device}, {torch.cuda.get_device_name(device)}" if device.type == "cuda" else str(device)


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """No log lines from what the timing runs (the inversion's start and end, a method's notes)."""
    drop = logging.Filter("dfcil.quiet")  # passes only loggers under that name: none of dfcil's
    log.addFilter(drop)
    try:
        yield
    finally:
        log.removeFilter(drop)


def estimate_run(
    loop: Loop,
    fit_task: FitTask,
    task_context: ContextOf,
    steps: int = 3,
    budget_s: float = 2.0,
    notes: Sequence[str] = (),
) -> RunEstimate:
    """The run's seconds on this machine, from :func:`measure` of a freshly built ``loop`` (the engine's ``build``
    of the run's :func:`timed_config`; a throwaway: it is trained a little, and nothing is written). ``fit_task`` and
    ``task_context``: the engine's. At most ``steps`` steps of each kind are timed after the warm-up, fewer once a
    kind took ``budget_s`` seconds. The process's random streams are as before afterwards."""
    started = time.perf_counter()
    stretches = tuple(plan(loop))
    busy = busy_note(loop.runtime.device)  # before this process's own timing adds to the load
    with process_state_kept(), quiet():
        samples, tasks, missed = measure(loop, fit_task, task_context, steps, budget_s)
    return RunEstimate(
        device_name(loop.runtime.device), stretches, samples, steps, time.perf_counter() - started,
        (*notes, *([busy] if busy else []), *missed), tasks,
    )  # fmt: skip


def busy_note(device: torch.device, load: Callable[[], float] | None = None, cores: int | None = None) -> str | None:
    """On a CPU that other processes keep busy (a 1-minute load average of half its cores or more, one at least), a
    note that the steps were timed under that load: the estimate holds while it lasts, and is off by as much as it
    changes (a sweep's other runs starting or ending). None on a card, an idle CPU, or where the load is not known."""
    if device.type != "cpu":
        return None
    try:
        average = load() if load is not None else os.getloadavg()[0]
    except (OSError, AttributeError):  # no load average on this platform
        return None
    cores = cores or os.cpu_count() or 1
    if average < max(1.0, cores / 2):  # a core's worth of other work on 2 cores; half the cores on many
        return None
    said = f"load average {average:.1f} on {cores} cores"
    return f"timed while the machine was busy ({said}): it holds while that load lasts"


class RunClock(Callback):
    """A run's time left: its :func:`plan` less what is done, times each kind's seconds per step measured in this
    run where the kind has run (:meth:`record`, fed by the engine's hooks, on ``clock``), else ``fallback``'s (an
    estimate's), else unknown. The console logger, which prints it, passes its hooks on.

    What it times, besides the training steps (each epoch's, and a slow first epoch's at its logged steps,
    :meth:`time_steps`): a task's setup (its start and inversion, per inversion step where it inverts), the time from
    a phase's last step to the next phase or the evaluation (the method's work at the phase's and the task's end, a
    checkpoint), and the evaluation (per test image).
    """

    def __init__(
        self,
        stretches: Sequence[Stretch] = (),
        fallback: Mapping[str, float] | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.plan = list(stretches)
        self.fallback = dict(fallback or {})
        self.clock = clock
        self.measured: dict[str, tuple[int, float]] = {}  # kind: (steps, seconds) so far
        self.mark = clock()  # when what is timed now began: a setup, an epoch's steps, a task's end work, ...
        self.task, self.phase = 0, ""  # the running task and phase
        self.counted = 0  # the running epoch's steps timed already, or done before this process (a resumed one's)
        self.setup_steps = 0  # the running setup's inversion steps in this process
        self.ending = False  # whether the time since the mark is the task's work outside steps (a phase's end)
        self.end_s = 0.0  # the running task's such work so far

    def record(self, kind: str, steps: int, seconds: float) -> None:
        """``steps`` steps of ``kind`` took ``seconds``."""
        done, total = self.measured.get(kind, (0, 0.0))
        self.measured[kind] = (done + steps, total + seconds)

    def step_s(self) -> dict[str, float]:
        """Each kind's seconds per step: its mean in this run, the fallback's for a kind not run yet."""
        return self.fallback | {k: s / n for k, (n, s) in self.measured.items() if n > 0}

    def index(self, task: int, part: str, last: bool = False) -> int:
        """Where the (``last``: last) stretch of ``part`` in task ``task`` stands in the plan (past the end for none;
        an inverting task's start and its inversion steps are both its ``inversion``)."""
        found = [i for i, s in enumerate(self.plan) if s.task == task and s.part == part] or [len(self.plan)]
        return found[-1] if last else found[0]

    def left(self, task: int, part: str, done: int | None = None) -> tuple[float, bool]:
        """Seconds left from ``done`` steps into task ``task``'s ``part`` (None: all of it done), and whether every
        kind of step left is timed (else the seconds count only the timed ones: a lower bound). The method's work at
        a task's start and end counts once it has run, without making the time a lower bound before: a run times it
        only at the end of its first incremental task (it is mostly small beside the steps). A method whose end work
        grows over the run (:meth:`~dfcil.methods.Method.end_units` above 1: APR's ADC, minutes a task) is not
        small: until that work is timed, the time left is a lower bound."""
        step_s = self.step_s()
        at, done = (self.index(task, part, last=True) + 1, 0) if done is None else (self.index(task, part), done)
        grows = any(s.steps > 1 for s in self.plan if s.part == END)
        minor = {kind_of(t, w) for t in (0, 1) for w in (SETUP, *(() if grows else (END,)))}
        return seconds_left(self.plan, step_s, at, done), set(untimed(self.plan[at:], step_s)) <= minor

    def load_timings(self, timings: Sequence[Mapping[str, Any]], batch_size: Callable[[int], int]) -> None:
        """:meth:`record` the finished tasks' ``timings`` of the processes that ran the run before this one (the
        :class:`~dfcil.training.callbacks.Timer`'s), ``batch_size(task)`` the task's real images per step."""
        for timing in timings:
            t = int(timing["task"])
            steps = {s.kind: s.steps for s in self.plan if s.task == t}
            inversion = steps.get(kind_of(t, INVERSION), 0)
            setup = float(timing.get("setup_s", 0.0))
            if inversion:  # a task's start is inside its setup's seconds
                self.record(kind_of(t, SETUP), 1, 0.0)
                self.record(kind_of(t, INVERSION), inversion, setup)
            else:
                self.record(kind_of(t, SETUP), 1, setup)
            for name, phase in timing.get("phases", {}).items():
                if phase.get("images"):
                    self.record(kind_of(t, name), phase["images"] // batch_size(t), float(phase["time_s"]))
            self.record(kind_of(t, END), end_units(self.plan, t), sum(end_work(timing).values()))
            if "eval_s" in timing and steps.get(EVALUATION):
                self.record(EVALUATION, steps[EVALUATION], float(timing["eval_s"]))

    def _lap(self) -> float:
        """Seconds since the mark, which moves to now."""
        now = self.clock()
        seconds, self.mark = now - self.mark, now
        return seconds

    def time_steps(self, step: int) -> None:
        """Record the running epoch's steps up to ``step`` since the last record, and their seconds."""
        self.record(kind_of(self.task, self.phase), step - self.counted, self._lap())
        self.counted = step

    def on_run_start(self, loop: Loop) -> None:
        self.loop, self.plan = loop, plan(loop)

    def on_task_start(self, info: dict[str, Any]) -> None:
        self.task, self.setup_steps, self.ending, self.end_s = info["task"], 0, False, 0.0
        self._lap()

    def on_setup_step(self) -> None:
        self.setup_steps += 1

    def on_setup_end(self) -> None:
        seconds, task = self._lap(), self.task
        if self.setup_steps:  # the task's start is inside the inversion's seconds
            self.record(kind_of(task, SETUP), 1, 0.0)
            self.record(kind_of(task, INVERSION), self.setup_steps, seconds)
        else:
            self.record(kind_of(task, SETUP), 1, seconds)
        self.setup_s, self.ending = seconds, True

    def on_phase_start(self, phase: Phase) -> None:
        seconds = self._lap()
        if self.ending:  # since the setup or the last phase: a checkpoint, the method's work at the phase's end
            self.end_s += seconds
        self.phase, self.counted, self.ending = phase.name, self.loop.state.position.step, False

    def on_epoch_end(self, record: dict[str, Any]) -> None:
        self.time_steps(len(self.loop.ctx.data))
        self.counted = 0

    def on_phase_end(self, phase: Phase) -> None:
        self.ending = True

    def on_eval_start(self) -> None:
        seconds = self._lap()
        if self.ending:  # the last phase's end and the method's at the task's end
            self.record(kind_of(self.task, END), end_units(self.plan, self.task), self.end_s + seconds)
        self.ending = False

    def on_eval_end(self) -> None:
        self.record(EVALUATION, int(self.loop.evaluator.test.seen[self.task]), self._lap())
