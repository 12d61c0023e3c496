"""A process's time budget and the packs that carry a run to another machine (a GPU window of a few minutes that
returns a few small files): the run stops at a task boundary rather than start a task it cannot finish, and a run
carried in a pack within the size limit (its newest checkpoint, or its last task boundary where the newest is too
large) resumes elsewhere to the result of one uninterrupted run."""

import json
import shutil
import tarfile

import pytest
import torch

from conftest import CONFIGS, StopAfterEpochs
from dfcil.checkpoint import Checkpointer, loads, peek
from dfcil.cli import main
from dfcil.errors import BudgetSpent, RunInterrupted
from dfcil.load import load_config
from dfcil.runs.runner import resume, train
from dfcil.sweep.plan import run_status
from dfcil.training.budget import Budget, next_task_seconds, task_seconds
from dfcil.training.loop import RunOptions
from dfcil.training.state import Interrupt
from test_benchmarks import BENCH

# three tasks of the smoke preset: task 0 trains 2 epochs; tasks 1 and 2 invert, then 1 RRL and 1 CHR epoch
OVERRIDES = [
    ("data.num_tasks", "3"),
    ("train.epochs", "2"),
    ("train.milestones", "[]"),
    ("method.inversion.steps", "4"),
]
VOLATILE = {"timings", "wall_time_s", "total_time_s", "resumed", "run_id"}


def _load(name):
    """A benchmark script as a module (registered, as its dataclasses need)."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _cfg():
    return load_config([CONFIGS / "smoke.yaml"], OVERRIDES)[0]


@pytest.fixture(scope="module")
def whole(tmp_path_factory):
    out = tmp_path_factory.mktemp("whole") / "run"
    train(_cfg(), out, options=RunOptions(progress=False))
    return out


def assert_same_run(a, b):
    summary = [
        {k: v for k, v in json.loads((r / "summary.json").read_text()).items() if k not in VOLATILE} for r in (a, b)
    ]
    assert summary[0] == summary[1]
    wa, wb = (loads((r / "model.pt").read_bytes())["net"] for r in (a, b))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    records = [
        [json.loads(line).get("loss") for line in (r / "metrics.jsonl").read_text().splitlines()] for r in (a, b)
    ]
    assert records[0] == records[1]


def test_a_tasks_seconds_and_the_next_ones_estimate_by_hand():
    t0 = {"task": 0, "phases": {"base": {"time_s": 10.0}}, "eval_s": 1.0, "peak_memory_mb": 5.0}
    t1 = {"task": 1, "setup_s": 20.0, "phases": {"rrl": {"time_s": 30.0}, "chr": {"time_s": 5.0}}, "eval_s": 1.0,
          "drift_s": 2.0, "compile_s": 8.0}  # fmt: skip
    assert task_seconds(t0) == 11.0 and task_seconds(t1) == 58.0  # compile_s is inside setup and phases
    assert next_task_seconds([t0], 1, False) is None  # nothing to judge an incremental task by
    assert next_task_seconds([t0, t1], 0, False) is None
    assert next_task_seconds([t0, t1], 2, True) == 50.0  # its steps compiled in this process
    assert next_task_seconds([t0, t1], 2, False) == 58.0  # a new process compiles (or loads) them again
    t2 = t1 | {"task": 2, "setup_s": 24.0, "compile_s": 0.0}
    assert next_task_seconds([t0, t1, t2], 3, True) == 62.0  # the latest task, its compile time 0
    # a method whose end work grows (APR's ADC per old class): task 2 recorded 4 units, task 3 has 6
    grows = t2 | {"drift_s": 4.0, "end_units": 4}
    assert next_task_seconds([t0, t1, grows], 3, True, units=6) == 66.0  # 60 + drift 4 s x 6/4
    assert next_task_seconds([t0, t1, t2], 3, True, units=6) == 62.0  # a task that did not record its units
    assert Budget(100.0, lambda: 40.0, trained=1).refuses([t0, t1, grows], 3, units=6) == (
        "task 3 would take about 66 s, and 60 s of --budget-s are left"
    )
    # a plugin's end_units of 0 is read as 1 everywhere (the estimate divided by it; the budget dropped the work)
    from types import SimpleNamespace

    from dfcil.training.budget import units_of

    assert units_of(SimpleNamespace(end_units=lambda task: 0), None) == 1
    assert units_of(SimpleNamespace(end_units=lambda task: 7), None) == 7
    budget = Budget(deadline=100.0, clock=lambda: 45.0)
    assert budget.refuses([t0, t1], 2) == "task 2 would take about 58 s, and 55 s of --budget-s are left"
    budget.trained = 1  # this process trained task 1: its steps are compiled
    assert budget.refuses([t0, t1], 2) is None  # 50 s needed, 55 s left
    budget.clock = lambda: 55.0
    assert budget.refuses([t0, t1, t2], 3) == "task 3 would take about 62 s, and 45 s of --budget-s are left"


def test_a_run_out_of_budget_stops_at_a_task_boundary_and_resumes_to_the_same_run(whole, tmp_path):
    """With no time left, task 0's end cannot judge (no incremental task timed yet): task 1 runs; its end judges
    task 2 by it and stops there, checkpointed, with the boundary kept apart."""
    out = tmp_path / "run"
    no_time = Budget(deadline=0.0, clock=lambda: 0.0)
    with pytest.raises(BudgetSpent, match=r"stopped after task 1 at its checkpoint: task 2 would take about \d+ s"):
        train(_cfg(), out, options=RunOptions(progress=False, budget=no_time))
    files = Checkpointer(out)
    assert peek(files.last.read_bytes())["position"] == {"task": 2, "stage": "start", "phase": 0, "epoch": 0, "step": 0}
    assert files.boundary.read_bytes() == files.last.read_bytes()
    resume(out, options=RunOptions(progress=False))
    assert_same_run(whole, out)


def test_the_command_line_says_how_to_go_on_with_exit_status_4(tmp_path, capsys, monkeypatch):
    import dfcil.training.budget

    monkeypatch.setattr(dfcil.training.budget.time, "time", lambda: 1000.0)  # the clock stands still: no time left
    out = tmp_path / "run"
    over = [a for (k, v) in OVERRIDES for a in (f"--{k}", v)]
    argv = ["train", "--config", str(CONFIGS / "smoke.yaml"), *over, "--out", str(out), "--no-progress"]
    assert main([*argv, "--budget-s", "0.5"]) == 4
    assert f"Continue with: dfcil resume {out}" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:
        main(["train", "--config", str(CONFIGS / "smoke.yaml"), "--budget-s", "0", "--out", str(tmp_path / "other")])
    assert stop.value.code == 2 and not (tmp_path / "other").exists()
    assert "argument --budget-s: '0' is not a number of seconds above 0" in capsys.readouterr().err


def _interrupted_in_task_2(tmp_path):
    """A run stopped inside task 2's RRL (after 4 epochs: task 0's 2, task 1's RRL and CHR)."""
    out = tmp_path / "src" / "run"
    interrupt = Interrupt()
    with pytest.raises(RunInterrupted):
        train(
            _cfg(),
            out,
            options=RunOptions(progress=False, interrupt=interrupt, callbacks=[StopAfterEpochs(interrupt, 4)]),
        )
    return out


def _sizes(pack, run):
    """The bytes a pack carries of ``run`` with its newest checkpoint, and with its task boundary (each with the
    static state it refers to: inside a task, the frozen teacher and the generator)."""
    files = Checkpointer(run)
    carried = pack.Carried(run, pack._with_static(files.last), pack._with_static(files.boundary))
    return carried.size(False), carried.size(True)


def _unpack(pack, where):
    where.mkdir(parents=True)
    with tarfile.open(pack) as tar:
        tar.extractall(where, filter="data")
    return where


@pytest.mark.parametrize("limit", ["large", "small"])
def test_a_pack_within_its_limit_carries_the_run_to_another_place_and_it_ends_as_one_run(whole, tmp_path, limit):
    """A pack large enough carries the newest checkpoint (inside task 2); a limit below it the task boundary after
    task 1, carried as last.pt. Either way the run, unpacked in another directory, resumes to the uninterrupted
    run's summary, weights and records; nothing but what a resume reads is packed."""
    pack = _load("pack")
    src = _interrupted_in_task_2(tmp_path)
    newest, boundary = _sizes(pack, src)
    assert boundary < newest  # a boundary holds no optimiser state, and no teacher or generator
    size = {"large": 10 * newest, "small": (newest + boundary) // 2 + 20_000}[limit]  # records: ~10 kB, gzipped
    lines = pack.pack(src, tmp_path / "run.tgz", size)
    assert (
        "its last task boundary, task 2 start" if limit == "small" else "its newest checkpoint, task 2 train"
    ) in lines[0]
    assert (tmp_path / "run.tgz").stat().st_size <= size
    with tarfile.open(tmp_path / "run.tgz") as tar:
        names = set(tar.getnames())
    assert "checkpoints/last.pt" in names and not {"checkpoints/prev.pt", "checkpoints/boundary.pt", "model.pt"} & names
    there = _unpack(tmp_path / "run.tgz", tmp_path / "elsewhere" / "run")
    assert main(["resume", str(there), "--no-progress"]) == 0
    assert_same_run(whole, there)


def test_a_sweep_pack_sends_back_the_runs_that_save_most_and_splits_what_cannot_fit(tmp_path):
    pack = _load("pack")
    sweep = tmp_path / "sweep"
    for name in ("a", "b"):
        shutil.copytree(_interrupted_in_task_2(tmp_path / name), sweep / name)
    (sweep / "sweep.json").write_text("{}")
    newest, boundary = _sizes(pack, sweep / "a")
    lines = pack.pack(sweep, tmp_path / "one.tgz", newest + boundary + 40_000)  # room for one newest checkpoint
    assert sorted(line.split(":")[1].split(",")[0].strip() for line in lines[:2]) == [
        "its last task boundary", "its newest checkpoint"]  # fmt: skip
    lines = pack.pack(sweep, tmp_path / "tiny.tgz", 100_000)
    assert lines[-1].startswith("warning: over the limit even at task boundaries: in ")
    pieces = sorted(tmp_path.glob("tiny.tgz.*"))
    assert len(pieces) > 1 and all(p.stat().st_size <= 100_000 for p in pieces)
    (tmp_path / "joined.tgz").write_bytes(b"".join(p.read_bytes() for p in pieces))
    with tarfile.open(tmp_path / "joined.tgz") as tar:
        assert {"a/checkpoints/last.pt", "b/checkpoints/last.pt", "sweep.json"} <= set(tar.getnames())


@pytest.mark.slow  # the sweep's own deadline, in real seconds; the paused run below is the default suite's
def test_a_sweep_out_of_budget_pauses_its_runs_and_the_same_command_finishes_them(tmp_path, capsys):
    """Two 3-task runs, one at a time, 8 s for the sweep (a run takes about as long here, its start included): the
    first run is given what is left and stops at a task boundary (or is stopped by the sweep when the time is up;
    on a fast machine it finishes and the second is paused or stopped); a run is not started in the last second. The
    sweep says so with exit status 4, and the same command without the budget finishes both."""
    out = tmp_path / "sweep"
    over = [a for (k, v) in OVERRIDES for a in (f"--{k}", v)]
    argv = [
        "sweep",
        "--config",
        str(CONFIGS / "smoke.yaml"),
        "--grid",
        "seed=1,2",
        *over,
        "--jobs",
        "1",
        "--out",
        str(out),
    ]
    assert main([*argv, "--budget-s", "8"]) == 4
    said = capsys.readouterr().out
    assert "--budget-s is spent" in said and "run the same command again to continue them" in said
    runs = {r["name"]: r for r in json.loads((out / "sweep.json").read_text())["runs"]}
    states = [runs[name]["state"] for name in ("seed1", "seed2")]
    assert runs["seed1"]["attempts"] == 1 and states[1] in ("paused", "interrupted", "not started"), states
    assert states[0] in ("done", "paused", "interrupted")
    assert main(argv) == 0
    assert all((out / name / "summary.json").exists() for name in ("seed1", "seed2"))


def test_a_run_of_a_sweep_that_stops_at_a_task_boundary_is_paused_not_failed(tmp_path, capsys, monkeypatch):
    """A run given almost no time (the sweep's own time ample) trains task 1, stops at its boundary with exit
    status 4, and is "paused": not retried, not failed; the same command continues it."""
    import subprocess

    import dfcil.sweep.local

    popen = subprocess.Popen

    def little_time(cmd, *args, **kwargs):  # the run is told 0.01 s are left, whatever the sweep has
        return popen([*cmd[: cmd.index("--budget-s") + 1], "0.01"], *args, **kwargs)

    monkeypatch.setattr(dfcil.sweep.local.subprocess, "Popen", little_time)
    out = tmp_path / "sweep"
    over = [a for (k, v) in OVERRIDES for a in (f"--{k}", v)]
    argv = ["sweep", "--config", str(CONFIGS / "smoke.yaml"), *over, "--out", str(out)]
    assert main([*argv, "--budget-s", "600"]) == 4
    (run,) = json.loads((out / "sweep.json").read_text())["runs"]
    assert (run["state"], run["attempts"]) == ("paused", 1)
    assert "paused at a task boundary (dfcil: stopped after task 1 at its checkpoint: task 2 would take" in (
        capsys.readouterr().out
    )
    monkeypatch.undo()
    assert main(argv) == 0 and (out / run["name"] / "summary.json").exists()


@pytest.mark.slow
def test_a_task_boundary_of_rdfcil_plus_at_cifar100_size_fits_one_16_mib_file(tmp_path):
    """R-DFCIL+ on CIFAR-100's 10 tasks (ResNet-32, 100 classes' Gaussians; generated images, a few per class and a
    short schedule: the state's size does not depend on them): its largest task boundary, after the last task,
    packs into one 16 MiB file; a checkpoint inside a task refers to the task's teacher and generator (35 MB)."""
    pack = _load("pack")
    out = tmp_path / "run"
    argv = ["train", "--config", str(CONFIGS / "cifar100" / "n10.yaml"), "--config",
            str(CONFIGS / "cifar100" / "rdfcil_plus.yaml"), "--data.name", "fake", "--data.num_classes", "100",
            "--data.train_per_class", "8", "--data.test_per_class", "2", "--data.image_size", "32",
            "--train.epochs", "2", "--train.milestones", "[]", "--method.chr_epochs", "1",
            "--method.inversion.steps", "2", "--train.batch_size", "32", "--out", str(out),
            "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    (out / "summary.json").unlink()  # packed as a run to continue
    _, boundary = _sizes(pack, out)
    assert boundary <= 16 * 2**20 < (out / "checkpoints" / "task9-static.pt").stat().st_size
    lines = pack.pack(out, tmp_path / "run.tgz", 16 * 2**20)
    assert "its newest checkpoint, task 10 start" in lines[0] and (tmp_path / "run.tgz").stat().st_size <= 16 * 2**20


def test_the_records_of_a_sweep_are_its_finished_runs_without_weights_and_report_reads_them(whole, tmp_path):
    """``pack.py SWEEP --records DIR``: the finished runs' records as plain files (no checkpoint, no model, nothing of
    an unfinished run, the logs of the runs kept), which ``dfcil report`` reads and a sweep takes as done."""
    pack = _load("pack")
    sweep = tmp_path / "sweep"
    shutil.copytree(whole, sweep / "done")
    shutil.copytree(_interrupted_in_task_2(tmp_path), sweep / "stopped")
    (sweep / "sweep.json").write_text("{}")
    (sweep / "logs").mkdir()
    for name in ("done.log", "done.config.yaml", "stopped.log", "done-too.log"):
        (sweep / "logs" / name).write_text(name)
    lines = pack.keep_records(sweep, tmp_path / "kept")
    assert lines[:2] == ["done: kept", "stopped: unfinished, left out"]
    files = {p.relative_to(tmp_path / "kept").as_posix() for p in (tmp_path / "kept").rglob("*") if p.is_file()}
    assert {"sweep.json", "done/summary.json", "done/config.yaml", "done/metrics.jsonl", "done/run.log"} <= files
    assert "logs/done.config.yaml" in files
    assert not [f for f in files if "stopped" in f or "done-too" in f or f.endswith((".pt", ".png", ".lock"))]
    assert not [f for f in files if f.startswith("logs/") and f.endswith(".log")]  # run.log says it all
    assert run_status(tmp_path / "kept" / "done") == "done"
    assert main(["report", str(tmp_path / "kept")]) == 0


@pytest.mark.slow  # three runs through `dfcil sweep`, each its own process
def test_the_same_sweep_on_a_copy_of_its_records_runs_only_the_runs_not_kept(tmp_path):
    """The records of a sweep with one run unfinished, copied elsewhere: the same sweep there skips the kept run
    and runs the other afresh, to the same result."""
    pack = _load("pack")
    out, over = tmp_path / "sweep", [a for (k, v) in OVERRIDES for a in (f"--{k}", v)]
    argv = ["sweep", "--config", str(CONFIGS / "smoke.yaml"), "--grid", "seed=1,2", *over, "--data.num_tasks", "2"]
    assert main([*argv, "--out", str(out)]) == 0
    seed2 = {k: v for k, v in json.loads((out / "seed2" / "summary.json").read_text()).items() if k not in VOLATILE}
    (out / "seed2" / "summary.json").unlink()  # seed2 as if stopped before its end
    pack.keep_records(out, tmp_path / "kept")
    again = tmp_path / "again"
    shutil.copytree(tmp_path / "kept", again)
    kept_summary = (again / "seed1" / "summary.json").read_bytes()
    assert main([*argv, "--out", str(again)]) == 0
    assert (again / "seed1" / "summary.json").read_bytes() == kept_summary  # skipped, not run again
    rerun = json.loads((again / "seed2" / "summary.json").read_text())
    assert {k: v for k, v in rerun.items() if k not in VOLATILE} == seed2  # run afresh, to the same result
