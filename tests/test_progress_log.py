"""Progress lines in run.log: every tenth of an inversion's steps, and of a task's first epoch when it is slow; they
follow a resume's absolute steps and change nothing a run computes."""

import functools
import json
import logging
import re
from types import SimpleNamespace

import pytest
import torch

from conftest import CONFIGS, StopInSetup
from dfcil.checkpoint import loads
from dfcil.context import Phase
from dfcil.errors import RunInterrupted
from dfcil.load import load_config
from dfcil.progress import ProgressLog, duration
from dfcil.runs import runner
from dfcil.training import diagnostics as diagnose
from dfcil.training.callbacks import ConsoleLogger
from dfcil.training.loop import RunOptions
from dfcil.training.state import EpochProgress, Interrupt, Position


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def _lines(caplog):
    return [r.getMessage() for r in caplog.records if " step " in r.getMessage()]


@pytest.mark.parametrize(
    ("total", "start", "marks"),
    [
        (20, 0, [2, 4, 6, 8, 10, 12, 14, 16, 18, 20]),
        (25, 0, [3, 5, 8, 10, 13, 15, 18, 20, 23, 25]),
        (3, 0, [1, 2, 3]),  # fewer steps than tenths: a line per step
        (20, 7, [8, 10, 12, 14, 16, 18, 20]),  # resumed: the schedule goes on at the next tenth
        (20, 20, []),
    ],
)
def test_the_schedule_marks_every_tenth_of_the_absolute_steps(total, start, marks):
    lines = ProgressLog("x", total, start)
    due = []
    for step in range(start + 1, total + 1):
        if lines.due(step):
            due.append(step)
            lines.next = lines._mark_after(step)  # what log() does after its line
    assert due == marks


def test_a_line_has_the_step_the_terms_the_speed_since_the_start_and_the_time_left(caplog):
    clock = FakeClock()
    lines = ProgressLog("task 1 inversion", 200, start=60, clock=clock)  # resumed at step 60
    clock.now += 5.0  # 20 steps in 5 s: 4 steps/s, whatever the steps before the resume took
    with caplog.at_level(logging.INFO, logger="dfcil"):
        assert lines.due(80)
        lines.log(80, {"content": 1.5, "bn": 0.25})
    assert _lines(caplog) == ["task 1 inversion step 80/200 (40%): content=1.5000 bn=0.2500; 4.00 steps/s, 30s left"]
    assert not lines.due(99) and lines.due(100)
    assert [duration(s) for s in (0.4, 59, 185, 7620, float("inf"))] == ["0s", "59s", "3m05s", "2h07m", "?"]


def _fake_loop(steps, start=0, epochs=1, task=1, phases=None):
    """What ConsoleLogger reads of a run of 2 tasks of ``steps`` images in batches of one, in task ``task``'s first
    phase: the position, the epoch's progress, the data; and what the run's time left reads: the protocol, the
    method's phases (``phases(task_id)``; default: one of ``epochs`` epochs, ``base`` then ``rrl``) and inversion
    steps (none), the test set (10 images a task)."""
    ep = EpochProgress(torch.arange(steps), step=start)
    ep.names, ep.values = ["ce"], torch.ones(steps, 1)
    ctx = SimpleNamespace(task_id=task, data=range(steps))
    state = SimpleNamespace(position=Position(task, "train", 0, 0, start), epoch=ep)
    phases = phases or (lambda t: [Phase("rrl" if t else "base", epochs, 0.1)])
    method = SimpleNamespace(
        phases=lambda t: phases(t.task_id), batch_size=lambda t: 1, synthesizer=lambda: None, end_units=lambda t: 1
    )
    split = SimpleNamespace(num_tasks=2, offsets=[0, 5, 10], task_sizes=[5, 5])
    return SimpleNamespace(
        state=state, ctx=ctx, protocol=SimpleNamespace(split=split, train_images=(steps, steps)), method=method,
        batches=SimpleNamespace(seen=False), evaluator=SimpleNamespace(test=SimpleNamespace(seen=[10, 20])),
        callbacks=[],
    )  # fmt: skip


def _drive(logger, loop, clock, seconds_per_step, epochs=1):
    phase = Phase("rrl", epochs, 0.1)
    logger.on_run_start(loop)
    info = {"task": 1, "num_tasks": 2, "n_new": 5, "n_seen": 10, "train_images": 100, "phases": []}
    logger.on_task_start(info)
    logger.on_phase_start(phase)
    ep = loop.state.epoch
    for epoch in range(epochs):
        while ep.step < len(ep.perm):
            clock.now += seconds_per_step
            ep.step += 1
            logger.on_step_end()
        ep.step = 0
        record = {"task": 1, "phase": "rrl", "epoch": epoch, "epochs": epochs, "lr": 0.1, "loss": {"ce": 1.0}}
        logger.on_epoch_end(record | {"time_s": 1.0, "images_per_s": 1.0})


@pytest.mark.parametrize(("seconds_per_step", "expected"), [(0.2, []), (0.5, list(range(10, 100, 10)))])
def test_a_first_epoch_gets_lines_only_when_it_projects_past_the_threshold(caplog, seconds_per_step, expected):
    """100 steps: 0.2 s each projects 20 s (fast, silent), 0.5 s each 50 s (slow: a line at every tenth but the
    last, which the epoch's own line follows); the second epoch gets none."""
    clock = FakeClock()
    with caplog.at_level(logging.INFO, logger="dfcil"):
        loop = _fake_loop(100, epochs=2)
        _drive(ConsoleLogger(slow_epoch_s=30.0, clock=clock), loop, clock, seconds_per_step, epochs=2)
    lines = _lines(caplog)
    assert [int(re.search(r"step (\d+)/100", line).group(1)) for line in lines] == expected
    if expected:  # the run's time left: 190 steps of 0.5 s, and the evaluation, not timed yet
        assert lines[0] == (
            "task 1 rrl epoch 0 (of 0..1) step 10/100 (10%): ce=1.0000 (epoch means so far); 2.00 steps/s, 45s left; "
            "run: over 1.6 min left"
        )


def test_a_resumed_first_epoch_continues_at_its_step(caplog):
    clock = FakeClock()
    with caplog.at_level(logging.INFO, logger="dfcil"):
        _drive(ConsoleLogger(slow_epoch_s=30.0, clock=clock), _fake_loop(100, start=35), clock, 1.0)
    lines = _lines(caplog)
    assert [int(re.search(r"step (\d+)/100", line).group(1)) for line in lines] == [40, 50, 60, 70, 80, 90]
    assert lines[0].endswith("1.00 steps/s, 1m00s left; run: over 1.0 min left")  # 60 steps of this process's 1 s


def test_the_lines_give_the_run_time_left_from_the_steps_timed_so_far(caplog):
    """A fake run of 2 tasks of 10 steps an epoch, driven through the engine's hooks in their order on a fake clock:
    task 0 trains 2 epochs at 0.1 s a step and evaluates 10 images at 0.01 s; task 1 inverts 4 steps at 0.5 s, trains
    2 RRL epochs at 0.2 s a step, spends 0.3 s at RRL's end and trains a CHR epoch at 0.05 s a step. Each line's time
    left is its work left times those seconds, "over" while a kind left (the inversion, RRL, CHR) has not run."""
    clock = FakeClock()
    phases = {0: [Phase("base", 2, 0.1)], 1: [Phase("rrl", 2, 0.1), Phase("chr", 1, 0.1)]}
    loop = _fake_loop(10, phases=phases.get)
    loop.method.synthesizer = lambda: SimpleNamespace(cfg=SimpleNamespace(steps=4))
    logger = ConsoleLogger(slow_epoch_s=1e9, clock=clock)
    info = {"num_tasks": 2, "n_new": 5, "n_seen": 5, "train_images": 10, "phases": []}
    timing = {"phases": {}, "eval_s": 0.1, "peak_memory_mb": 1.0}
    task = {"n_seen": 5, "acc": 1.0, "new_acc": 1.0, "old_acc": None, "acc_row": [1.0], "timing": timing}

    def train(phase, epochs, seconds):
        logger.on_phase_start(phase)
        for epoch in range(epochs):
            clock.now += 10 * seconds
            record = {"phase": phase.name, "epoch": epoch, "epochs": epochs, "lr": 0.1, "loss": {"ce": 1.0}}
            logger.on_epoch_end(record | {"task": loop.ctx.task_id, "time_s": 1.0, "images_per_s": 1.0})
        logger.on_phase_end(phase)

    def evaluate(t):
        logger.on_eval_start()
        clock.now += 0.1
        logger.on_eval_end()
        logger.on_task_end(task | {"task": t})

    with caplog.at_level(logging.INFO, logger="dfcil"):
        logger.on_run_start(loop)
        loop.ctx.task_id, loop.state.position = 0, Position(0, "train")
        logger.on_task_start(info | {"task": 0})
        logger.on_setup_end()
        train(Phase("base", 2, 0.1), 2, 0.1)
        evaluate(0)
        loop.ctx.task_id, loop.state.position = 1, Position(1, "train")
        logger.on_task_start(info | {"task": 1})
        for _ in range(4):
            clock.now += 0.5
            logger.on_setup_step()
        logger.on_setup_end()
        train(Phase("rrl", 2, 0.1), 2, 0.2)
        clock.now += 0.3
        train(Phase("chr", 1, 0.1), 1, 0.05)
        evaluate(1)
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0].startswith("run: 50 training and 4 inversion steps in 2 tasks")
    left = [re.search(r"run: (.*) left", line).group(1) for line in lines if "run: " in line[5:]]
    assert left == [
        "over 1.0s", "time",  # task 0: base's second epoch ("time left not known yet": the evaluation not timed)
        "over 0.2s",  # after task 0: task 1's evaluation (20 images)
        "over 0.2s",  # task 1's inversion line ("task 1 inversion: 4 steps in 2.0s")
        "over 2.2s", "over 0.2s",  # RRL: its second epoch and the evaluation; CHR not timed yet
        "about 0.2s",  # CHR's epoch: every kind timed (the task's end, 0.3 s, done)
    ]  # fmt: skip
    assert "task 1 inversion: 4 steps in 2.0s (0.500s each); run: over 0.2s left" in lines
    assert logger.run.step_s()["task end"] == pytest.approx(0.3)


def test_run_log_has_the_lines_and_the_run_is_the_same_without_them(tmp_path, monkeypatch, caplog):
    """R-DFCIL without a progress bar, 20 inversion steps, 6 steps per epoch, every first epoch taken as slow: the
    inversion of a run stopped inside it and resumed logs each tenth once, and the run equals one without lines."""
    caplog.set_level(logging.INFO, logger="dfcil")  # as the command line's log_to_console
    monkeypatch.setattr(diagnose, "inversion_report", lambda loop, seed: None)  # seconds this test does not need
    overrides = {
        "method.inversion.steps": "20", "method.inversion.zdim": "32", "method.inversion.batch_size": "8",
        "train.epochs": "2", "train.milestones": "[]", "train.batch_size": "16", "data.num_classes": "4",
    }  # fmt: skip
    cfg, _ = load_config([CONFIGS / "smoke.yaml"], list(overrides.items()))
    with monkeypatch.context() as patch:  # no line at all
        patch.setattr(ProgressLog, "due", lambda self, step: False)
        runner.train(cfg, tmp_path / "quiet", options=RunOptions(progress=False))
    monkeypatch.setattr(runner, "ConsoleLogger", functools.partial(ConsoleLogger, slow_epoch_s=0.0))
    interrupt, out = Interrupt(), tmp_path / "logged"
    with pytest.raises(RunInterrupted, match="setup"):
        stop = StopInSetup(interrupt, 7)  # stops after step 8
        runner.train(cfg, out, options=RunOptions(progress=False, interrupt=interrupt, callbacks=[stop]))
    runner.resume(out, options=RunOptions(progress=False))

    log = (out / "run.log").read_text()
    inversion = re.findall(r"task 1 inversion step (\d+)/20 \(\d+%\): content=\S+ diversity=\S+ bn=\S+ prior=\S+; "
                           r"[\d.]+ steps/s, \S+ left", log)  # fmt: skip
    assert [int(s) for s in inversion] == list(range(2, 21, 2))
    epochs = re.findall(r"(task \d \w+ epoch 0 \(of 0\.\.0\)) step (\d)/6 \(\d+%\): .* \(epoch means so far\)", log)
    assert epochs == [("task 0 base epoch 0 (of 0..0)", str(s)) for s in range(1, 6)] + [
        ("task 1 rrl epoch 0 (of 0..0)", str(s)) for s in range(1, 6)
    ]  # the first epoch of each task only: not CHR's
    assert not re.search(r" step \d+/", (tmp_path / "quiet" / "run.log").read_text())

    quiet, logged = (json.loads((r / "summary.json").read_text()) for r in (tmp_path / "quiet", out))
    assert quiet["correct_matrix"] == logged["correct_matrix"]
    a, b = (loads((r / "model.pt").read_bytes())["net"] for r in (tmp_path / "quiet", out))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
