"""The GPU queue: what the next GPU windows run, in order, and each item's device time estimated from the step times
measured on an H200 (docs/gpu.md, "The queue"). The items and their states are in benchmarks/queue.yaml.

    python benchmarks/gpu_queue.py table             # the queue as docs/gpu.md's Markdown table
    python benchmarks/gpu_queue.py plan --left 540   # a window of 540 s: the first item not done, what each of its runs
                                                 #   reaches, and the cell stage's settings as shell lines, which
                                                 #   `gpu_check.sh queue` evals; exit 3 where the item is refused
    python benchmarks/gpu_queue.py calibrate         # the model against every task time measured on a card

Every time printed is an estimate of a model, not a measurement of the item. A run's time is, task by task, each
phase's steps times the step time measured for that kind of phase (STEP_MS), plus fixed costs; the runs of a cell
share the card, each slowed by SHARE_2 - 1 per further run. How close it comes (`calibrate`, at commit 3104b3e): the
5-task R-DFCIL run alone within 0.5 % (689 s; no independent check, its own epochs gave the step times); the one
cell measured at full size, R-DFCIL+ beside DPCR at 10 tasks, to which SHARE_2 is fitted: R-DFCIL+'s first task
-12 %, its later tasks -2 to +23 % (120-150 s measured each), its tasks 0-3 together -3 to +18 %; DPCR's first
task -12 %, its later tasks -8 to +5 % (35-40 s), its whole run -7 % (422 s). So within 25 % on a task and 20 % on
a run, where measurements reach. They do not reach more than two full-size runs sharing the card (extrapolated
from two), compiled steps on real images, nor any backbone but ResNet-32 (ResNet-18 counts as an upper bound).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import shlex
import sys
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
QUEUE = HERE / "queue.yaml"
WINDOW_S = 540.0  # a window's seconds for the item: gpu_check.sh queue's default QUEUE_LEFT (docs/gpu.md)

# Milliseconds per step on one NVIDIA H200, fp32, channels_last, ResNet-32, 128 real images a step, by phase kind and
# engine mode (measured, never estimated here):
# graphs: whole-step CUDA graphs; the 5-task CIFAR-100 R-DFCIL run at commit 2d68b76 (docs/performance.md, "Steps":
#   4.4 ms in task 0, 5.5 in the inversion, 9.6-9.8 in RRL, 2.8-3.0 in CHR; by task in docs/notes/measurements.md
#   §3.1, each a phase's epoch times over its 78 steps an epoch: task 0 4.37, RRL 9.57-9.80, CHR 2.84-3.00).
# compiled: model.static_head + engine.compile: step, graphed; round2 at commit 94b1260 (docs/performance.md,
#   "Compiled steps and the static head"): its steady-state epochs of 78 steps (base 0.261 s, RRL 0.555 s, CHR
#   0.168 s) and the inversion's A/B median, 3.2 ms.
STEP_MS = {
    "graphs": {"base": 4.37, "inversion": 5.5, "rrl": 9.7, "chr": 2.9},
    "compiled": {"base": 261 / 78, "inversion": 3.2, "rrl": 555 / 78, "chr": 168 / 78},
}
# A phase's step by its name. "base" is the first task's plain cross-entropy step. The prototype methods' plain steps
# (DPCR's "train", AdaGauss's "train" and "detached", EFC's "efc") were never timed alone: they count as base steps,
# and a distilling method's later tasks (DISTILLING) add a frozen teacher's forward, FORWARD_SHARE of a step more.
# R-DFCIL+'s RRL and CHR steps (anti-collapse, replayed features) count as R-DFCIL's: the calibration shows what that
# misses.
PHASE_KIND = {"base": "base", "rrl": "rrl", "chr": "chr", "train": "base", "detached": "base", "efc": "base"}
DISTILLING = {"dpcr", "adagauss", "lwf", "efc"}  # methods whose later-task steps run the old network forward too
FORWARD_SHARE = 1 / 3  # a forward's share of a training step (docs/reference.md, "Compute per step": training is
# about 3x a forward), an assumption; AdaGauss's adapter passes (forward only) are counted with it too
STEP_IMAGES = 128  # a step of B images counts B / 128 measured steps: an upper bound where, as for ResNet-32 on a
# card, a step is bound by the number of its kernels rather than their size

# Fixed costs, seconds (docs/notes/measurements.md §3.1: the 5-task run at 2d68b76, alone on the H200):
PROCESS_START_S = 4.4  # a process's start: task 0's wall beyond its phase (59 - 54.6 s; a resume's start-up: 4 s)
TASK_EXTRA_S = 0.6  # a task's wall beyond its phases (158 - 157.4 s): evaluation, captures, its checkpoint
# Compiled steps: a process compiles the steps of the first task and those of the later tasks once each, and their
# first epochs carry cuDNN's and inductor's autotuning: round2 (94b1260) measured task 0 at 68.5 s (16.3 of them
# compiling) and task 1 at 215.8 s (66.8 compiling), against the steady-state steps above. Every process pays it,
# so every window does again; the compile cache a pack carries may shorten it (not measured on a card).
MEASURED_COMPILED_S = {"first": 68.5, "later": 215.8}
STEADY_COMPILED_S = {  # round2's tasks (N=5, 78 steps an epoch) at the steady-state steps
    "first": 160 * 78 * STEP_MS["compiled"]["base"] / 1e3 + TASK_EXTRA_S,
    "later": (5000 * STEP_MS["compiled"]["inversion"] + 160 * 78 * STEP_MS["compiled"]["rrl"]
              + 40 * 78 * STEP_MS["compiled"]["chr"]) / 1e3 + TASK_EXTRA_S,
}  # fmt: skip
# Runs sharing one card: each of K runs at once goes 1 + (K - 1) * (SHARE_2 - 1) times slower than alone. SHARE_2 is
# fitted (`calibrate`) to the one cell measured at full size: R-DFCIL+ beside DPCR, 10 tasks, under MPS (commit
# 8765261, docs/results.md). Short runs shared far better (docs/performance.md, "Runs sharing one card": 3 at once
# gave 2.99x one run's throughput, no slowing at all); more than two full-size runs were never measured, so three
# or four are planned as if each further run slowed the others as the second did: an upper bound, probably.
SHARE_2 = 1.58
# Backbones by their cost against ResNet-32's measured steps. ResNet-18 was never timed on a card: it counts as its
# forward MACs per 32-pixel image over ResNet-32's (555.4 M and 68.9 M, by torch.utils.flop_counter on
# dfcil.models' networks; a test recounts them), an upper bound, since ResNet-32's steps are bound by their many
# small kernels rather than by arithmetic.
BACKBONE_COST = {"resnet32": 1.0, "resnet18_cifar": 8.07, "resnet18_cifar_b64": 8.07}
MEASURED_BACKBONES = {"resnet32"}
DATASET = {"cifar100": (100, 500)}  # classes, training images per class, of the datasets whose steps were measured


def share(k: int) -> float:
    """How many times slower each of ``k`` runs sharing the card goes than one alone."""
    return 1.0 + max(k - 1, 0) * (SHARE_2 - 1.0)


@dataclasses.dataclass(frozen=True)
class Run:
    """One run of a cell and its tasks' seconds alone on the card at steady state (no start, no compiling)."""

    name: str  # the sweep's name for it where the cell has several orders: <method file>-order<k>
    tasks: tuple[float, ...]
    compiled: bool
    upper_bound: bool  # a backbone never timed: the seconds are an upper bound


def run_costs(row: str, overrides: dict[str, Any], order: int, compiled: bool) -> Run:
    """The estimated seconds of each task of the run ``row`` (its setting and method files joined by ``+``)."""
    from dfcil.context import Task
    from dfcil.data.splits import task_sizes
    from dfcil.load import load_config
    from dfcil.methods import build_method

    cfg, _ = load_config([REPO / f for f in row.split("+")], [(k, str(v)) for k, v in overrides.items()])
    # auto: the reference's ResNet-32 at CIFAR's 32 pixels (dfcil.models.network.backbone_for)
    backbone = "resnet32" if cfg.model.backbone == "auto" and cfg.data.name == "cifar100" else cfg.model.backbone
    if cfg.data.name not in DATASET or backbone not in BACKBONE_COST:
        raise SystemExit(f"queue: no step times for {cfg.data.name} with {cfg.model.backbone} ({row})")
    classes, per_class = DATASET[cfg.data.name]
    sizes = task_sizes(cfg.data.num_classes or classes, cfg.data.num_tasks, cfg.data.base_classes)
    per_class = cfg.data.train_per_class or per_class
    method, m = build_method(cfg.method, cfg.train), cfg.method
    ms = STEP_MS["compiled" if compiled else "graphs"]
    inversion, adapter = getattr(m, "inversion", None), getattr(m, "adapter", None)
    tasks, seen = [], 0
    for t, n_new in enumerate(sizes):
        images, batch = n_new * per_class, method.batch_size(t)
        step_images = batch * (4 if t == 0 and getattr(m, "rotation", False) else 1)  # AdaGauss: each with 3 rotations
        work_ms = 0.0
        for phase in method.phases(Task(task_id=t, n_old=seen, n_new=n_new, num_tasks=len(sizes))):
            if phase.name not in PHASE_KIND:
                raise SystemExit(f"queue: no step time for {m.name}'s phase {phase.name!r} (PHASE_KIND)")
            step = ms[PHASE_KIND[phase.name]] * (1 + FORWARD_SHARE * (t >= 1 and m.name in DISTILLING))
            work_ms += phase.epochs * (images // batch) * step * step_images / STEP_IMAGES  # drop_last batches
        if t >= 1 and inversion is not None:
            work_ms += inversion.steps * ms["inversion"] * (inversion.batch_size or batch) / STEP_IMAGES
        if t >= 1 and adapter is not None and getattr(m, "adapt", False):  # old and new network over the images
            work_ms += adapter.passes * 2 * images / STEP_IMAGES * FORWARD_SHARE * ms["base"]
        tasks.append(TASK_EXTRA_S + work_ms * BACKBONE_COST[backbone] / 1e3)
        seen += n_new
    name = f"{Path(row.split('+')[-1]).stem}-order{order}"
    return Run(name, tuple(tasks), compiled, backbone not in MEASURED_BACKBONES)


def compile_extra(run: Run, task: int) -> float:
    """What the first task of its kind in a process (task 0, or a later task) costs a compiled run beyond its steps:
    compiling and the first epochs' autotuning, as round2 measured them."""
    kind = "first" if task == 0 else "later"
    return MEASURED_COMPILED_S[kind] - STEADY_COMPILED_S[kind] if run.compiled else 0.0


@dataclasses.dataclass
class Window:
    """What a window does to a cell's runs: the tasks each had finished before it and after it."""

    before: dict[str, int]
    after: dict[str, int]
    stopped: dict[str, str]  # why each unfinished run stopped: "paused" at a boundary, or "deadline" inside a task
    used: float  # seconds of the card until the last run stopped


def window(runs: list[Run], done: dict[str, int], left: float) -> Window:
    """The cell's sweep for ``left`` seconds from ``done`` (tasks finished, by run), as the sweep's budget runs it:
    every unfinished run starts at once in a new process; at a task boundary a run that has timed a later task does
    not start one it would not finish in the time left (judged at the current sharing), and one that has not goes
    on; at the deadline every run still inside a task stops there. Only finished tasks count: a task boundary is
    the resumable point every pack keeps."""
    after = {r.name: done.get(r.name, 0) for r in runs}
    compiled_here: dict[str, set[str]] = {r.name: set() for r in runs}

    def work(run: Run) -> float:  # seconds alone of its next task, with what its process compiles for it
        t = after[run.name]
        kind = "first" if t == 0 else "later"
        extra = 0.0 if kind in compiled_here[run.name] else compile_extra(run, t)
        compiled_here[run.name].add(kind)
        return run.tasks[t] + extra

    rest = {r.name: PROCESS_START_S + work(r) for r in runs if after[r.name] < len(r.tasks)}  # seconds alone left
    by_name, stopped, now = {r.name: r for r in runs}, {}, 0.0
    while rest:
        slow = share(len(rest))
        step = min(rest.values()) * slow
        if now + step > left:
            stopped |= dict.fromkeys(rest, "deadline")
            return Window(dict(done), after, stopped, left)
        now += step
        for name in list(rest):
            rest[name] -= step / slow
            if rest[name] > 1e-9:
                continue
            run = by_name[name]
            after[name] += 1
            del rest[name]
            if after[name] == len(run.tasks):
                continue
            if after[name] >= 2 and run.tasks[after[name]] * share(len(rest) + 1) > left - now:
                stopped[name] = "paused"  # --budget-s: the next task would not end in the time left
            else:
                rest[name] = work(run)
    return Window(dict(done), after, stopped, now)


@dataclasses.dataclass(frozen=True)
class Item:
    """One item of the queue (benchmarks/queue.yaml's header says what each field means)."""

    id: str
    title: str
    rows: tuple[str, ...]
    orders: tuple[int, ...]
    compile: str
    state: str = "not run"
    done_orders: tuple[int, ...] = ()
    overrides: dict[str, Any] = dataclasses.field(default_factory=dict)
    pack: str | None = None
    progress: dict[str, int] = dataclasses.field(default_factory=dict)
    result: str | None = None
    covered_by: tuple[str, ...] = ()
    note: str = ""

    def orders_left(self) -> tuple[int, ...]:
        return tuple(o for o in self.orders if o not in self.done_orders)

    def runs(self, compiled: bool | None = None) -> list[Run]:
        on = self.compile == "step" if compiled is None else compiled
        return [run_costs(row, self.overrides, o, on) for row in self.rows for o in self.orders_left()]

    def cell_env(self) -> dict[str, str]:
        """The settings of gpu_check.sh's cell stage that run this item."""
        return {
            "QUEUE_ID": self.id,
            "CELL_CONFIG": " ".join(self.rows),
            "CELL_ORDERS": ",".join(map(str, self.orders_left())),
            "CELL_ARGS": " ".join(f"--{k} {v}" for k, v in self.overrides.items()),
            "CELL_COMPILE": self.compile,
        }


STATES = ("not run", "partial", "done")


def load_queue(path: Path = QUEUE) -> list[Item]:
    """The queue's items, checked: known keys and states, config files that exist, a pack for a partial item, a
    result for a done one, covered_by naming items of the queue (and no state of its own)."""
    fields, items = {f.name for f in dataclasses.fields(Item)}, []
    for entry in yaml.safe_load(path.read_text())["items"]:
        what = f"{path}: item {entry.get('id')}"
        if set(entry) - fields:
            raise SystemExit(f"{what}: unknown keys {sorted(set(entry) - fields)} (valid: {sorted(fields)})")
        tuples = {k: tuple(entry[k]) for k in ("rows", "orders", "done_orders", "covered_by") if k in entry}
        item = Item(**(entry | tuples))
        if item.state not in STATES or item.compile not in ("step", "none"):
            raise SystemExit(f"{what}: state must be one of {STATES}, and compile step or none")
        if item.covered_by and "state" in entry:
            raise SystemExit(f"{what}: an item covered by others has no state of its own")
        if item.state == "partial" and not item.pack:
            raise SystemExit(f"{what} is partial: name its pack (pack: /work/packs/{item.id}/cell.tgz)")
        if item.state == "done" and not item.result:
            raise SystemExit(f"{what} is done: name its result (result: results.md#...)")
        missing = [f for row in item.rows for f in row.split("+") if not (REPO / f).is_file()]
        if missing:
            raise SystemExit(f"{what}: no such config file {missing}")
        items.append(item)
    ids = {i.id for i in items}
    for item in items:
        if set(item.covered_by) - ids:
            raise SystemExit(f"{path}: item {item.id}: covered_by names no item of the queue: {item.covered_by}")
    return items


def is_done(item: Item, items: list[Item]) -> bool:
    if item.covered_by:
        return all(is_done(i, items) for i in items if i.id in item.covered_by)
    return item.state == "done" or not item.orders_left()


@dataclasses.dataclass
class Estimate:
    one_go: float  # seconds of the card for the item (what is left of it) in one go
    windows: int | None  # windows of WINDOW_S it takes; None: its next task never ends within one
    in_windows: float  # seconds of the card over those windows, each one's starts (and compiling) again
    upper_bound: bool


def estimate(item: Item, compiled: bool | None = None, left: float = WINDOW_S) -> Estimate:
    """The device time left to the item: in one go, and in windows of ``left`` seconds."""
    runs = item.runs(compiled)
    bound, one_go = any(r.upper_bound for r in runs), window(runs, item.progress, math.inf).used
    done, count, total = dict(item.progress), 0, 0.0
    while any(done.get(r.name, 0) < len(r.tasks) for r in runs):
        w = window(runs, done, left)
        if all(w.after[r.name] == done.get(r.name, 0) for r in runs):
            return Estimate(one_go, None, math.inf, bound)
        done, count, total = w.after, count + 1, total + w.used
    return Estimate(one_go, count, total, bound)


def minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f}"


def in_windows(e: Estimate) -> str:
    """``23 (3)``: device minutes over how many windows."""
    return "never: a task longer than a window" if e.windows is None else f"{minutes(e.in_windows)} ({e.windows})"


def table(items: list[Item]) -> str:
    """The queue as docs/gpu.md's table."""
    lines = [
        f"| # | item | runs (`configs/cifar100/`), orders | command | est. device min: in one go / in {WINDOW_S:.0f}-s "
        "windows (how many) | state |",
        "|---|---|---|---|---|---|",
    ]
    bound = False
    for item in items:
        rows = ", ".join(f"`{row.replace('configs/cifar100/', '').replace('.yaml', '')}`" for row in item.rows)
        args = f"; `{item.cell_env()['CELL_ARGS']}`" if item.overrides else ""
        runs = (
            f"{rows}; {'order' if len(item.orders_left()) == 1 else 'orders'} {', '.join(map(str, item.orders_left()))}"
        )
        if item.covered_by:
            with_ = " and ".join(item.covered_by)
            command, cost = "—", f"in items {with_}"
            state = f"{'done' if is_done(item, items) else 'not run'}: with items {with_}"
        else:
            e = estimate(item)
            mark, bound = "≤ " if e.upper_bound else "", bound or e.upper_bound
            command = f"`QUEUE_ITEM={item.id} bash benchmarks/gpu_check.sh queue`"
            cost = f"{mark}{minutes(e.one_go)} / {mark if e.windows else ''}{in_windows(e)}"
            state = state_words(item)
        lines.append(f"| {item.id} | {item.title} | {runs}{args} | {command} | {cost} | {state} |")
    if bound:
        lines += ["", "≤: an upper bound; ResNet-18's steps were never timed and count as ResNet-32's times its MACs."]
    return "\n".join(lines)


def state_words(item: Item) -> str:
    words = item.state
    if item.state == "partial":
        words += f", pack `{item.pack}`" + "".join(f", {k}: {v} tasks done" for k, v in item.progress.items())
    if item.result and item.state == "done":
        words += f": [result]({item.result})"
    elif item.result:
        words += f" (order {', '.join(map(str, item.done_orders))} done: [result]({item.result}))"
    return words


def describe(w: Window, runs: list[Run]) -> list[str]:
    """Each run's fate in the window, in words."""
    lines = []
    for run in runs:
        n, a, b = len(run.tasks), w.before.get(run.name, 0), w.after[run.name]
        done = f"task {a}" if b - a == 1 else f"tasks {a}-{b - 1}"
        if a == n:
            continue
        if b == n:
            lines.append(f"run {run.name}: {done} of {n}, runs to the end")
        elif b == a:
            lines.append(f"run {run.name}: reaches no task boundary (task {a} of {n} does not end in the time left)")
        else:
            why = "pauses there" if w.stopped.get(run.name) == "paused" else f"then stops inside task {b}"
            lines.append(f"run {run.name}: reaches task boundary {b} of {n} ({done}), {why}")
    return lines


def pack_here(item: Item) -> str | None:
    """Where the partial item's pack is on this machine: its kept place, or the repository root's cell.tgz."""
    for place in (item.pack, "cell.tgz"):
        if place and ((REPO / place).is_file() or (REPO / f"{place}.00").is_file()):
            return str(REPO / place)
    return None


def plan(items: list[Item], left: float, wanted: str | None = None, force: bool = False) -> tuple[list[str], bool]:
    """The window's plan as shell lines (comments, then the cell stage's settings) and whether it may run."""
    todo = [i for i in items if not is_done(i, items) and not i.covered_by]
    if wanted is not None:
        todo = [i for i in todo if i.id == wanted]
        if not todo:
            return [f"# queue: item {wanted} is not an item left to run (done, covered by others, or none)"], False
    if not todo:
        return ["# queue: every item is done"], False
    item = todo[0]
    runs, e, other = item.runs(), estimate(item), estimate(item, compiled=item.compile != "step")
    w = window(runs, item.progress, left)
    mode = ("graphed", "compiled") if item.compile != "step" else ("compiled", "graphed")

    def spent(name: str, x: Estimate) -> str:
        windows = f"{minutes(x.in_windows)} in {x.windows} windows" if x.windows else "never in windows"
        return f"{name} steps: {minutes(x.one_go)} in one go, {windows} of {WINDOW_S:.0f} s"

    lines = [
        f"# queue item {item.id}: {item.title} ({item.state})",
        "# estimate (a model from step times measured on an H200, not a measurement), device min with "
        f"{spent(mode[0], e)}; with {spent(mode[1], other)}",
    ]
    if e.upper_bound:
        lines.append("# the estimate is an upper bound: the backbone's steps were never timed (BACKBONE_COST)")
    lines += [f"# in {left:.0f} s: {line}" for line in describe(w, runs)]
    env = item.cell_env() | {"CELL_BUDGET": f"{left:.0f}"}
    if item.state == "partial":
        if (where := pack_here(item)) is None:
            return [*lines, f"# refused: this partial item's pack ({item.pack}) is not here: put it (or its pieces) "
                    "at the repository root as cell.tgz"], False  # fmt: skip
        env["CELL_FROM"] = where
    unfinished = [r for r in runs if w.after[r.name] < len(r.tasks)]
    if not unfinished:
        lines.append("# verdict: runs to the end")
    elif all(w.after[r.name] > w.before.get(r.name, 0) for r in unfinished):
        reached = ", ".join(f"{w.after[r.name]} of run {r.name}" for r in unfinished)
        lines.append(f"# verdict: reaches task boundary {reached}, then packs")
    else:
        refused = "cannot reach a resumable point (the first task boundary) in the time left"
        if not force:
            return [*lines, f"# refused: {refused} (QUEUE_FORCE=1 runs it anyway)"], False
        lines.append(f"# forced (QUEUE_FORCE=1): {refused}; a run stopped inside a task resumes only from a pack that "
                     "holds its newest checkpoint")  # fmt: skip
    return lines + [f"{k}={shlex.quote(v)}" for k, v in env.items()], True


@dataclasses.dataclass(frozen=True)
class Measured:
    """Task times measured on the H200, which `calibrate` sets beside the model's."""

    what: str
    row: str
    tasks: tuple[int, int]  # the first and the last task the seconds cover
    seconds: tuple[float, float]  # low and high (each task's, where per_task)
    at_once: int  # runs sharing the card
    compiled: bool = False
    per_task: bool = False
    start: bool = False  # the process's start is inside the seconds
    fit: bool = False  # SHARE_2 is fitted to it
    source: str = ""


N5, N10 = "configs/cifar100/n5.yaml", "configs/cifar100/n10.yaml"
RDFCIL, PLUS, DPCR = "configs/cifar100/rdfcil.yaml", "configs/cifar100/rdfcil_plus.yaml", "configs/cifar100/dpcr.yaml"
MEASURED = [
    Measured("R-DFCIL N=5, whole run, alone", f"{N5}+{RDFCIL}", (0, 4), (689, 689), 1, start=True,
             source="results.md, 2d68b76"),
    Measured("R-DFCIL N=5, each later task, alone", f"{N5}+{RDFCIL}", (1, 4), (155, 159), 1, per_task=True,
             source="notes/measurements.md §3.1"),
    Measured("R-DFCIL+ N=10, task 0, beside DPCR", f"{N10}+{PLUS}", (0, 0), (50, 50), 2, fit=True,
             source="results.md, 8765261"),
    Measured("R-DFCIL+ N=10, tasks 1-3 each, beside DPCR", f"{N10}+{PLUS}", (1, 3), (120, 150), 2, per_task=True,
             fit=True, source="results.md, 8765261"),
    Measured("DPCR N=10, task 0, beside R-DFCIL+", f"{N10}+{DPCR}", (0, 0), (62, 62), 2, source="results.md, 8765261"),
    Measured("DPCR N=10, each later task, beside R-DFCIL+", f"{N10}+{DPCR}", (1, 9), (35, 40), 2, per_task=True,
             source="results.md, 8765261"),
    Measured("DPCR N=10, whole run, beside R-DFCIL+", f"{N10}+{DPCR}", (0, 9), (422, 422), 2, start=True, fit=True,
             source="results.md, 8765261"),
    Measured("R-DFCIL N=5 compiled (generated images), task 0", f"{N5}+{RDFCIL}", (0, 0), (68.5, 68.5), 1,
             compiled=True, source="performance.md, 94b1260"),
    Measured("R-DFCIL N=5 compiled (generated images), task 1", f"{N5}+{RDFCIL}", (1, 1), (215.8, 215.8), 1,
             compiled=True, source="performance.md, 94b1260"),
]  # fmt: skip


def modelled_alone(m: Measured) -> float:
    """The model's seconds alone on the card for what ``m`` measured (the first task's, where per_task: a
    protocol's later tasks are alike), in one process."""
    run = run_costs(m.row, {}, 0, m.compiled)
    first, last = m.tasks if not m.per_task else (m.tasks[0], m.tasks[0])
    kinds = {min(t, 1) for t in range(first, last + 1)}  # task 0, and the first later task, compile
    return sum(run.tasks[first : last + 1]) + sum(compile_extra(run, t) for t in kinds) + PROCESS_START_S * m.start


def fitted_share() -> float:
    """SHARE_2 as fitted: the fit entries' measured seconds (midpoints, times their tasks) over the model's alone."""
    measured = alone = 0.0
    for m in MEASURED:
        n = (m.tasks[1] - m.tasks[0] + 1 if m.per_task else 1) * m.fit
        measured, alone = measured + n * sum(m.seconds) / 2, alone + n * modelled_alone(m)
    return measured / alone


def calibrate() -> str:
    """The model beside every measured task time, as a Markdown table."""
    lines = ["| measured | runs at once | measured s | model s | model against measured |", "|---|---:|---:|---:|---:|"]
    for m in MEASURED:
        model, (lo, hi) = modelled_alone(m) * share(m.at_once), m.seconds
        shown = f"{lo:g}" if lo == hi else f"{lo:g}-{hi:g}"
        off = f"{100 * (model / lo - 1):+.0f} %"
        off = off if lo == hi else f"{100 * (model / hi - 1):+.0f} to {off}"
        lines.append(f"| {m.what} ({m.source}) | {m.at_once} | {shown} | {model:.1f} | {off} |")
    return "\n".join([*lines, "", f"SHARE_2 = {SHARE_2} (fitted: {fitted_share():.3f})"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--queue", type=Path, default=QUEUE, help="the queue file (benchmarks/queue.yaml)")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("table", help="the queue as docs/gpu.md's table")
    p = sub.add_parser("plan", help="a window's plan, as shell lines for gpu_check.sh queue")
    p.add_argument("--left", type=float, default=WINDOW_S, help="the window's seconds for the item")
    p.add_argument("--item", help="this item rather than the first not done")
    p.add_argument("--force", action="store_true", help="plan an item that reaches no task boundary all the same")
    sub.add_parser("calibrate", help="the model beside the task times measured on a card")
    args = parser.parse_args(argv)
    if args.command == "calibrate":
        print(calibrate())
        return 0
    items = load_queue(args.queue)
    if args.command == "table":
        print(table(items))
        return 0
    lines, ok = plan(items, args.left, args.item, args.force)
    print("\n".join(lines))
    return 0 if ok else 3


if __name__ == "__main__":
    sys.exit(main())
