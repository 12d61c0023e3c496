"""A run's expected time (``dfcil train --dry-run``) and its time left: the arithmetic against hand computations, the
timing of a few steps of each kind on a throwaway build (every method, the process's random streams untouched), and
the time left of a resumed run from its earlier processes' timings."""

import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from conftest import smoke_configs
from dfcil.cli import main
from dfcil.context import Phase
from dfcil.load import load_config
from dfcil.methods import METHODS
from dfcil.progress import rough_duration, run_left
from dfcil.training import engine
from dfcil.training.estimate import (
    RunClock,
    Stretch,
    enough,
    estimate_run,
    seconds_by_part,
    seconds_left,
    spread,
    task_plan,
    timed_config,
    untimed,
)
from dfcil.training.loop import RunOptions
from dfcil.training.protocol import prepare

# 3 tasks: task 0 trains 2 epochs of 5 batches and tests 100 images; tasks 1 and 2 invert 10 steps, train 3 RRL
# epochs and 1 CHR epoch of 4 batches, and test 200 and 300 images
PLAN = [
    *task_plan(0, [Phase("base", 2, 0.1)], 5, 0, 100),
    *task_plan(1, [Phase("rrl", 3, 0.1), Phase("chr", 1, 0.1)], 4, 10, 200),
    *task_plan(2, [Phase("rrl", 3, 0.1), Phase("chr", 1, 0.1)], 4, 10, 300),
]
STEP_S = {
    "task 0 setup": 0.5, "task 0 base": 0.2, "task 0 task end": 0.0, "setup": 0.1, "inversion": 0.05, "rrl": 0.4,
    "chr": 0.1, "task end": 1.0, "evaluation": 0.001,
}  # fmt: skip


def test_the_plan_has_every_stretch_of_the_run_in_order():
    assert PLAN[:6] == [
        Stretch(0, "setup", "task 0 setup", 1), Stretch(0, "base", "task 0 base", 10),
        Stretch(0, "task end", "task 0 task end", 1), Stretch(0, "evaluation", "evaluation", 100),
        Stretch(1, "inversion", "setup", 1), Stretch(1, "inversion", "inversion", 10),
    ]  # fmt: skip
    assert [(s.part, s.steps) for s in PLAN[6:10]] == [("rrl", 12), ("chr", 4), ("task end", 1), ("evaluation", 200)]


def test_the_run_seconds_are_each_stretch_steps_times_its_kind_seconds():
    """By hand: task 0 = 0.5 + 10 × 0.2 + 0 + 100 × 0.001 = 2.6 s; task 1 = 0.1 + 10 × 0.05 + 12 × 0.4 + 4 × 0.1 + 1.0
    + 200 × 0.001 = 7.0 s; task 2 = 7.1 s (300 test images)."""
    parts = seconds_by_part(PLAN, STEP_S)
    assert list(parts) == ["setup", "base", "task end", "evaluation", "inversion", "rrl", "chr"]  # first met
    expected = {"setup": 0.5, "base": 2.0, "task end": 2.0, "evaluation": 0.6, "inversion": 1.2, "rrl": 9.6, "chr": 0.8}
    assert parts == pytest.approx(expected)
    assert seconds_left(PLAN, STEP_S, 0) == pytest.approx(16.7)
    rrl = PLAN.index(Stretch(1, "rrl", "rrl", 12))  # 5 RRL steps of task 1 done: 7 × 0.4 + 0.4 + 1.0 + 0.2 + 7.1
    assert seconds_left(PLAN, STEP_S, rrl, done=5) == pytest.approx(11.5)
    assert seconds_left(PLAN, STEP_S, len(PLAN)) == 0.0
    partial = {k: v for k, v in STEP_S.items() if k not in ("chr", "inversion")}  # not timed: counted as nothing
    assert untimed(PLAN, partial) == ["inversion", "chr"]
    assert seconds_left(PLAN, partial, rrl, done=5) == pytest.approx(11.5 - 0.4 - 0.5 - 0.4)


def test_the_spread_is_the_timed_steps_half_range_weighted_by_their_kinds_share():
    """RRL's steps 1.0, 1.2, 1.4 s (median 1.2, half range 0.2: 1/6) over 10 steps = 12 s; CHR's one step of 0.5 s
    (exact) over 10 = 5 s: ±(12 × 1/6) / 17 = 2/17."""
    plan = [Stretch(1, "rrl", "rrl", 10), Stretch(1, "chr", "chr", 10)]
    assert spread(plan, {"rrl": [1.0, 1.4, 1.2], "chr": [0.5]}) == pytest.approx(2 / 17)
    assert spread(plan, {}) == 0.0


@pytest.mark.parametrize(
    ("laps", "done"),
    [
        ([9.0], False),  # the warm-up only, however long
        ([0.1, 0.1, 0.1], False),
        ([0.1, 0.1, 0.1, 0.1], True),  # a warm-up and 3 steps
        ([1.5, 1.5], True),  # 2 s spent: one step past the warm-up is enough
    ],
)
def test_a_kind_is_timed_after_its_steps_or_its_budget(laps, done):
    assert enough(laps, warmup=1, steps=3, budget_s=2.0) is done


def test_a_duration_says_two_figures_at_most():
    assert [rough_duration(s) for s in (0.04, 9.94, 42.4, 270, 720, 8280, float("inf"))] == [
        "0.0s", "9.9s", "42s", "4.5 min", "12 min", "2.3 h", "?"
    ]  # fmt: skip
    assert run_left(720, True) == "run: about 12 min left" and run_left(40, False) == "run: over 40s left"
    assert run_left(0.0, False) == "run: time left not known yet" and run_left(0.0, True) == "run: about 0.0s left"


def test_a_resumed_run_takes_the_seconds_of_its_earlier_processes_tasks():
    """Task 0's and task 1's timings (the Timer's, in the run's checkpoints): the time left of task 2 is known at once,
    task 1's inversion per step (its setup over its 10 steps), RRL per step (images over the batch of 4), LDC's drift
    at its end, the evaluation per test image."""
    clock = RunClock(PLAN)
    timings = [
        {"task": 0, "setup_s": 0.5, "phases": {"base": {"time_s": 2.0, "images": 40}}, "eval_s": 0.1},
        {"task": 1, "setup_s": 0.6, "eval_s": 0.2, "drift_s": 1.0, "compile_s": 3.0,
         "phases": {"rrl": {"time_s": 4.8, "images": 48}, "chr": {"time_s": 0.4, "images": 16}}},
    ]  # fmt: skip
    clock.load_timings(timings, batch_size=lambda task: 4)
    assert clock.step_s() == pytest.approx(STEP_S | {"setup": 0.0, "inversion": 0.06})
    # task 2: its start 0 (inside the inversion's seconds) + 10 × 0.06 + 12 × 0.4 + 4 × 0.1 + 1.0 + 300 × 0.001
    assert clock.left(2, "inversion", done=0) == (pytest.approx(7.1), True)  # an inverting task's start and steps
    assert clock.left(1, "evaluation") == (pytest.approx(7.1), True)


def test_end_work_per_old_class_is_estimated_per_old_class():
    """APR's ADC attacks every old class's images: its end work grows with the old classes (measured on a
    cifar100-mini run: 55, 173 and 306 s with 5, 10 and 15 old classes), where the other methods' is the same in
    every task. The plan counts APR's task end in old classes, so task 1's 50 s over 5 old classes predict 150 s for
    task 3 (15 old classes), not 50 s; a method of constant end work keeps one step a task."""
    from dfcil.context import Task
    from dfcil.training.estimate import END, plan

    apr_cfg, protocol, loop = _smoke("apr")
    tasks = [Task(task_id=t, n_old=3 * t, n_new=3, num_tasks=4) for t in range(4)]
    assert [loop.method.end_units(t) for t in tasks] == [1, 3, 6, 9]
    ends = [s.steps for s in plan(loop) if s.part == END]
    split = protocol.split
    assert ends == [max(1, split.offsets[t]) for t in range(split.num_tasks)] and ends[-1] > 1
    clock = RunClock(plan(loop))
    clock.load_timings([{"task": 1, "setup_s": 0.0, "drift_s": 50.0, "phases": {}}], batch_size=lambda task: 4)
    per_class = 50.0 / ends[1]
    assert clock.step_s()["task end"] == pytest.approx(per_class)
    last = [s for s in plan(loop) if s.part == END][-1]
    assert last.steps * clock.step_s()["task end"] == pytest.approx(50.0 * ends[-1] / ends[1])
    # before the ADC is timed, the time left is a lower bound ("over"): the smoke run said "about 0.1s left", then
    # spent 37 s on ADC; a method whose end work is the same in every task stays "about" (it is small)
    for steps, complete in ((plan(loop), False), (plan(_smoke()[2]), True)):
        clock = RunClock(steps)
        for kind in {s.kind for s in steps if s.part != END}:
            clock.record(kind, 1, 0.01)
        last_phase = [s.part for s in steps if s.task == 1 and s.part not in (END, "evaluation")][-1]
        assert clock.left(1, last_phase)[1] is complete
    off = _smoke("apr", [("method.adc", "false")])[2]
    assert {s.steps for s in plan(off) if s.part == END} == {1}
    assert {s.steps for s in plan(_smoke()[2]) if s.part == END} == {1}  # R-DFCIL: the same end in every task


def test_a_busy_cpu_is_said_beside_the_estimate():
    """Timed beside a sweep's other runs, the estimate holds only while they run (a new-user probe read 5.2 h for a
    run of one hour, timed niced under a two-run sweep): the lines say the machine was busy."""
    from dfcil.training.estimate import busy_note

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert busy_note(cpu, lambda: 0.3, 2) is None and busy_note(cuda, lambda: 5.0, 2) is None
    assert busy_note(cpu, lambda: 2.1, 16) is None and busy_note(cpu, lambda: 8.0, 16) is not None  # half the cores
    note = busy_note(cpu, lambda: 2.1, 2)
    assert note == "timed while the machine was busy (load average 2.1 on 2 cores): it holds while that load lasts"

    def unknown():
        raise OSError

    assert busy_note(cpu, unknown, 2) is None


def _smoke(method="rdfcil", overrides=()):
    cfg, _ = load_config(smoke_configs(method), [("method.name", method), *overrides])
    protocol = prepare(cfg)
    return cfg, protocol, engine.build(cfg, protocol, RunOptions(progress=False))


def test_the_estimate_times_every_kind_and_leaves_the_process_random_streams_as_they_were():
    cfg, protocol, loop = _smoke()
    before = random.random(), np.random.rand(), torch.rand(1)
    random.seed(5), np.random.seed(5), torch.manual_seed(5)
    estimate = estimate_run(loop, engine.fit_task, engine.task_context, steps=2, budget_s=0.5)
    after = random.random(), np.random.rand(), torch.rand(1)
    random.seed(5), np.random.seed(5), torch.manual_seed(5)
    assert after == (random.random(), np.random.rand(), torch.rand(1)) and after[0] != before[0]
    kinds = ["task 0 setup", "task 0 base", "task 0 task end", "setup", "inversion", "rrl", "chr", "task end"]
    assert list(estimate.samples) == [*kinds, "evaluation"]
    assert all(0 < len(estimate.samples[k]) <= 2 for k in ("task 0 base", "inversion", "rrl", "chr", "evaluation"))
    first, how = estimate.lines()
    assert first.startswith("expected time on this machine (cpu): about ") and " (±" in first
    assert "inversion " in first and ", rrl " in first and "later tasks' steps taken as task 1's" in how
    assert estimate.total_s == pytest.approx(sum(seconds_by_part(estimate.plan, estimate.step_s).values()))


@pytest.mark.parametrize("method", METHODS.names())
def test_every_method_can_be_timed(method):
    """The timing cuts each phase short and then calls the method's end work (statistics, drift) on what it
    trained: every method's second task must run on that."""
    cfg, _, loop = _smoke(method)
    estimate = estimate_run(loop, engine.fit_task, engine.task_context, steps=1, budget_s=0.1)
    assert estimate.total_s > 0 and not untimed(estimate.plan, estimate.step_s)


def test_a_phase_first_trained_in_a_later_task_is_timed_there():
    """Joint trained in the last task only (here task 3 of 4) has no training step in tasks 0 and 1: its steps, the
    whole run's training, are timed in task 3, not counted as nothing (which said "about" a run's evaluation only)."""
    over = [("method.last_only", "true"), ("data.num_tasks", "4")]
    _, _, loop = _smoke("joint", over)
    estimate = estimate_run(loop, engine.fit_task, engine.task_context, steps=1, budget_s=0.1)
    assert not untimed(estimate.plan, estimate.step_s) and estimate.samples["train"]
    assert [s.task for s in estimate.plan if s.part == "train"] == [3] and estimate.tasks == (0, 1, 3)
    first, how = estimate.lines()
    assert ": train " in first and "in tasks 0, 1 and 3 " in how and "not timed" not in how
    train = seconds_by_part(estimate.plan, estimate.step_s)["train"]
    assert train > seconds_by_part(estimate.plan, estimate.step_s)["evaluation"]
    # a run whose every phase trains in tasks 0 and 1 is timed there only, as before
    every = estimate_run(_smoke("joint")[2], engine.fit_task, engine.task_context, steps=1, budget_s=0.1)
    assert every.tasks == (0, 1) and "later tasks' steps taken as task 1's; " in every.lines()[1]
    assert "(a phase first trained later: that task's)" in how
    # a method whose later task's start needs the tasks the timing skips: said, and the run is not stopped
    _, _, loop = _smoke("joint", over)
    start = loop.method.on_task_start

    def needs_earlier_tasks(ctx):
        if ctx.task_id >= 2:
            raise RuntimeError("statistics of task 2\nmore")
        start(ctx)

    loop.method.on_task_start = needs_earlier_tasks
    cut = estimate_run(loop, engine.fit_task, engine.task_context, steps=1, budget_s=0.1)
    assert cut.tasks == (0, 1) and untimed(cut.plan, cut.step_s) == ["train"]
    said = cut.lines()[1]
    assert "train not timed in task 3, the first to train it (RuntimeError: statistics of task 2)" in said
    assert "not timed (counted as nothing): train" in said


def test_compiled_steps_are_timed_eagerly_and_said_so():
    cfg, _ = load_config(smoke_configs("rdfcil"), [("engine.compile", "default")])
    timed, notes = timed_config(cfg)
    assert timed.engine.compile == "none" and "eager steps timed" in notes[0]
    assert timed_config(timed) == (timed, ())


def test_the_dry_run_prints_the_expected_time_and_writes_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--config", "smoke", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.count("expected time on this machine (cpu): about ") == 1 and "±: those steps' spread" in out
    assert main(["train", "--config", "smoke", "--dry-run", "--no-estimate"]) == 0
    out = capsys.readouterr().out
    assert "task 1: 5 classes" in out and "expected time" not in out
    assert list(tmp_path.iterdir()) == []


def test_the_estimate_says_what_it_could_not_time():
    """A kind without timed steps (here CHR's, removed) counts as nothing, and the second line says so."""
    _, _, loop = _smoke()
    estimate = estimate_run(loop, engine.fit_task, engine.task_context, steps=1, budget_s=0.1)
    cut = SimpleNamespace(**{f: getattr(estimate, f) for f in ("device", "plan", "timed", "seconds", "notes")})
    lines = type(estimate)(**vars(cut), samples={k: v for k, v in estimate.samples.items() if k != "chr"}).lines()
    assert "not timed (counted as nothing): chr" in lines[1]


@pytest.mark.parametrize("method", ["rdfcil", "dpcr"])
def test_a_run_that_logs_its_estimate_first_computes_the_same_run(tmp_path, caplog, monkeypatch, method):
    """The estimate at a new run's start times steps on a throwaway build: the run itself is the one without it,
    to the bit, and its console's time left is an estimate ("about") from its first epoch on."""
    from dfcil.model_file import load_model
    from dfcil.runs import runner
    from dfcil.runs.runner import train

    monkeypatch.setattr(runner, "ESTIMATE_MIN_STEPS", 0)  # the smoke preset's 40 steps: else too short to time

    cfg, _ = load_config(smoke_configs(method), [("method.name", method)])
    with caplog.at_level("INFO", logger="dfcil"):
        timed = train(cfg, tmp_path / "timed", RunOptions(progress=False, estimate=True))
    text = caplog.text
    plain = train(cfg, tmp_path / "plain", RunOptions(progress=False))
    assert text.count("expected time on this machine (cpu): about ") == 1
    first_epoch = next(line for line in text.splitlines() if "task 0 " in line and " epoch 0 (of" in line)
    assert "run: about " in first_epoch
    assert timed["accuracy_matrix"] == plain["accuracy_matrix"]
    a, b = load_model(tmp_path / "timed" / "model.pt"), load_model(tmp_path / "plain" / "model.pt")
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))


def test_a_resumed_run_does_not_time_steps_again(tmp_path, caplog, monkeypatch):
    """A resume takes its earlier processes' timings: no estimate at its start."""
    from dfcil.runs import runner
    from dfcil.runs.runner import resume, train

    monkeypatch.setattr(runner, "ESTIMATE_MIN_STEPS", 0)
    cfg, _ = load_config(smoke_configs("finetune"), [("method.name", "finetune")])
    train(cfg, tmp_path / "run", RunOptions(progress=False, estimate=True))
    (tmp_path / "run" / "summary.json").rename(tmp_path / "summary.old.json")
    caplog.clear()
    with caplog.at_level("INFO", logger="dfcil"):
        resume(tmp_path / "run", options=RunOptions(progress=False, estimate=True))
    assert "expected time" not in caplog.text


def test_a_short_run_is_not_timed_first(tmp_path, caplog):
    """A run of under ESTIMATE_MIN_STEPS steps (the smoke preset: 40) starts at once."""
    from dfcil.runs.runner import train

    cfg, _ = load_config(smoke_configs("finetune"), [("method.name", "finetune")])
    with caplog.at_level("INFO", logger="dfcil"):
        train(cfg, tmp_path / "run", RunOptions(progress=False, estimate=True))
    assert "expected time" not in caplog.text and "follows from their times so far" in caplog.text
