"""Around a run: the synthetic grids, the CSV and TensorBoard logs, and the commands on a finished run directory
(eval, export, inspect). One smoke run, trained with every logger, is shared by the tests of this module."""

import csv
import json
import shutil
import sys

import pytest
import torch
from PIL import Image

from conftest import CONFIGS
from dfcil.cli import main
from dfcil.errors import ConfigError
from dfcil.load import load_config
from dfcil.training.callbacks import Callback
from dfcil.training.loop import RunOptions
from dfcil.training.state import Position

SMOKE = str(CONFIGS / "smoke.yaml")


@pytest.fixture
def finished(smoke_run):
    return smoke_run  # the session's shared smoke run (conftest): read, never changed


def _jsonl(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _number(text):
    return None if text == "" else float(text)


# ------------------------------------------------------------------------------------------ synthetic grids


def test_each_inversion_leaves_a_grid_of_64_synthetic_images(finished):
    with Image.open(finished / "synthetic_task1.png") as image:
        assert image.format == "PNG" and image.mode == "RGB"
        assert image.size == (8 * 16 + 9 * 2, 8 * 16 + 9 * 2)  # 8 × 8 tiles of 16 pixels, 2-pixel borders
    assert not (finished / "synthetic_task0.png").exists()  # task 0 inverts nothing


class _Final(Callback):
    """The final weights of a run, kept at its end."""

    def on_run_start(self, loop):
        self.loop = loop

    def on_run_end(self, summary):
        self.weights = {k: v.clone() for k, v in self.loop.net.state_dict().items()}


def test_the_grids_and_loggers_leave_the_results_unchanged(finished):
    """The shared run (grids, CSV, TensorBoard) against the bare engine: same accuracy matrix, same weights."""
    from dfcil.checkpoint import loads
    from dfcil.training.engine import run

    final = _Final()
    bare = run(load_config([SMOKE])[0], options=RunOptions(callbacks=[final], progress=False))
    summary = json.loads((finished / "summary.json").read_text())
    assert bare["correct_matrix"] == summary["correct_matrix"]
    weights = loads((finished / "model.pt").read_bytes())["net"]
    assert weights.keys() == final.weights.keys()
    assert all(torch.equal(weights[k], final.weights[k]) for k in weights)


def test_sampling_a_grid_touches_no_random_stream_and_keeps_the_generators_mode():
    from dfcil.models.generator import build_generator
    from dfcil.training.grid import grid_seed, sample_images, tile_images

    generator = build_generator(32, zdim=8).train()
    before = {k: v.clone() for k, v in generator.state_dict().items()}
    rng = torch.get_rng_state()
    a, b = sample_images(generator, 4, grid_seed(1, 1)), sample_images(generator, 4, grid_seed(1, 1))
    assert torch.equal(a, b) and not torch.equal(a, sample_images(generator, 4, grid_seed(1, 2)))
    assert generator.training and torch.equal(torch.get_rng_state(), rng)
    assert all(torch.equal(v, generator.state_dict()[k]) for k, v in before.items())  # BN statistics untouched
    assert 0 <= grid_seed(2**63 - 1, 100) < 2**63
    picture = tile_images(torch.zeros(5, 3, 4, 3, dtype=torch.uint8).numpy(), per_row=2, pad=1)
    assert picture.shape == (3 * 3 + 4, 2 * 4 + 3, 3)


def test_a_generator_that_gives_non_finite_images_leaves_no_grid(tmp_path, monkeypatch, caplog):
    """A generator whose images hold a NaN: no grid of noise is written, and the log says why."""
    from types import SimpleNamespace

    from dfcil.training import grid
    from dfcil.training.state import RunState

    monkeypatch.setattr(grid, "trained_generator", lambda method: object())
    monkeypatch.setattr(grid, "sample_images", lambda generator, n, seed: torch.full((n, 3, 8, 8), float("nan")))
    state = RunState.new(2, 1, torch.device("cpu"))
    state.position = Position(1, "train")
    callback = grid.SyntheticGrid(tmp_path, seed=1)
    callback.on_run_start(SimpleNamespace(method=None, state=state, protocol=None))
    callback.on_setup_end()
    assert not callback.path(1).exists() and "non-finite images; no synthetic_task1.png" in caplog.text


# ---------------------------------------------------------------------------------------------------- loggers


def test_csv_rows_are_the_jsonl_records(finished):
    records = _jsonl(finished)
    epochs, tasks = [r for r in records if r["type"] == "epoch"], [r for r in records if r["type"] == "task"]
    rows = _csv(finished / "metrics.csv")
    assert [(int(r["task"]), r["phase"], int(r["epoch"])) for r in rows] == [
        (r["task"], r["phase"], r["epoch"]) for r in epochs
    ]
    for row, record in zip(rows, epochs, strict=True):
        assert float(row["lr"]) == pytest.approx(record["lr"], rel=1e-9)
        assert float(row["time_s"]) == pytest.approx(record["time_s"], rel=1e-9)
        terms = {k[5:]: float(v) for k, v in row.items() if k.startswith("loss_") and v != ""}
        assert terms == pytest.approx(record["loss"], rel=1e-9)
        assert float(row["loss"]) == pytest.approx(sum(record["loss"].values()))
    rows = _csv(finished / "tasks.csv")
    assert len(rows) == len(tasks) == 2
    for row, record in zip(rows, tasks, strict=True):
        assert [_number(row[k]) for k in ("acc", "new_acc", "old_acc")] == [
            record[k] for k in ("acc", "new_acc", "old_acc")
        ]
        assert [_number(row[f"acc_task{j}"]) for j in range(2)][: record["task"] + 1] == record["acc_row"]
        # the task's seconds by part, and their sum: the task's whole (the end work a method's own, e.g. drift_s)
        t = record["timing"]
        train = sum(p["time_s"] for p in t["phases"].values())
        end = sum(v for k, v in t.items() if k.endswith("_s") and k not in ("setup_s", "eval_s", "compile_s"))
        parts = [float(row[k]) for k in ("setup_s", "train_s", "end_s", "eval_s")]
        assert parts == pytest.approx([t.get("setup_s", 0.0), train, end, t["eval_s"]], rel=1e-9)
        assert float(row["task_s"]) == pytest.approx(sum(parts), rel=1e-9) and train > 0


def test_tasks_csv_counts_a_methods_end_work():
    from dfcil.training.loggers import task_row

    timing = {"setup_s": 2.0, "phases": {"rrl": {"time_s": 10.0}, "chr": {"time_s": 3.0}}, "drift_s": 4.5,
              "compile_s": 1.0, "eval_s": 0.5, "peak_memory_mb": 9.0}  # fmt: skip
    record = {"task": 1, "n_seen": 4, "acc": 50.0, "acc_task_avg": 50.0, "new_acc": 60.0, "old_acc": 40.0,
              "acc_row": [40.0, 60.0], "timing": timing}  # fmt: skip
    row = task_row(record)
    # compile_s lies inside the phases' and setup's seconds: not counted twice; memory is no time
    assert (row["setup_s"], row["train_s"], row["end_s"], row["eval_s"], row["task_s"]) == (2.0, 13.0, 4.5, 0.5, 20.0)
    assert task_row({**record, "timing": {}})["task_s"] is None  # a record without timings (an old run's)


def test_csv_floats_have_ten_significant_digits():
    from dfcil.training.loggers import csv_text

    lr = 0.1 * 0.1  # 0.010000000000000002
    text = csv_text(["lr", "loss", "epoch", "old_acc"], [{"lr": lr, "loss": 2 / 3, "epoch": 3, "old_acc": None}])
    assert text == "lr,loss,epoch,old_acc\n0.01,0.6666666667,3,\n"
    assert csv_text(["x"], [{"x": 1e-12}, {"x": 1234567.0}], header=False) == "1e-12\n1234567\n"


def test_the_log_the_jsonl_and_the_csv_count_epochs_alike(finished):
    """Epochs count from 0 in everything a user reads: the log line of each epoch names the same (task, phase,
    epoch) as its metrics.jsonl record and its metrics.csv row, and its last epoch as epochs - 1."""
    import re

    logged = re.findall(r"task (\d+) (\w+) epoch (\d+) \(of 0\.\.(\d+)\) lr=", (finished / "run.log").read_text())
    epochs = [r for r in _jsonl(finished) if r["type"] == "epoch"]
    assert [(int(t), p, int(e), int(last)) for t, p, e, last in logged] == [
        (r["task"], r["phase"], r["epoch"], r["epochs"] - 1) for r in epochs
    ]
    assert [(int(r["task"]), r["phase"], int(r["epoch"])) for r in _csv(finished / "metrics.csv")] == [
        (int(t), p, int(e)) for t, p, e, _ in logged
    ]
    assert epochs[0]["epoch"] == 0


def _scalars(run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    tags = events.Tags()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in tags["scalars"]}, tags["images"]


def test_tensorboard_holds_losses_lr_accuracies_and_the_grids(finished):
    scalars, images = _scalars(finished)
    assert {"loss/ce", "loss/lce", "loss/hkd", "loss/rkd", "loss/gce", "loss/total", "lr"} <= set(scalars)
    assert {"accuracy/A_t", "accuracy/new", "accuracy/old", "accuracy/task0", "accuracy/task1"} <= set(scalars)
    assert images == ["synthetic/task1"]
    epochs = [r for r in _jsonl(finished) if r["type"] == "epoch"]
    # task 0: setup 0, epochs 1-2, evaluation 3; task 1: setup 4, RRL 5-6, CHR 7, evaluation 8
    assert [s for s, _ in scalars["lr"]] == [1, 2, 5, 6, 7]
    assert [v for _, v in scalars["lr"]] == pytest.approx([r["lr"] for r in epochs])
    tasks = [r for r in _jsonl(finished) if r["type"] == "task"]
    assert scalars["accuracy/A_t"] == [(3, pytest.approx(tasks[0]["acc"])), (8, pytest.approx(tasks[1]["acc"]))]


def test_the_step_axis_gives_each_checkpoint_position_a_step():
    from dfcil.training.loggers import StepAxis

    axis = StepAxis(((2,), (2, 1)))
    assert [axis.setup(0), axis.epoch(0, 0, 0), axis.epoch(0, 0, 1), axis.evaluation(0)] == [0, 1, 2, 3]
    assert [axis.setup(1), axis.epoch(1, 0, 0), axis.epoch(1, 1, 0), axis.evaluation(1)] == [4, 5, 7, 8]
    assert axis.resume(Position(1, "setup")) == axis.resume(Position(1, "start")) == 4
    assert axis.resume(Position(1, "train", 0, 1, 3)) == 6  # mid-epoch: that epoch is not logged yet
    assert axis.resume(Position(1, "train", 1, 1)) == axis.evaluation(1)  # the end of the last phase
    assert axis.resume(Position(2, "start")) == 9


class _Crash(Callback):
    """Fail the run (as a kill would) at the end of the ``n``-th epoch, after the loggers wrote it."""

    def __init__(self, n):
        self.n = n

    def on_epoch_end(self, record):
        self.n -= 1
        if self.n == 0:
            raise RuntimeError("killed")


def test_loggers_and_grids_survive_a_crash_and_resume_without_repeating_rows(finished, tmp_path):
    """Killed after the first RRL epoch, whose records follow the last checkpoint (task 1's setup end): the resumed
    run logs that epoch again, the CSV files hold it once, TensorBoard purges the first copy, and the grid that
    was deleted meanwhile is drawn again from the restored generator."""
    from dfcil.runs.runner import train

    cfg = load_config([SMOKE], [("log", "[csv, tensorboard]"), ("epoch_checkpoint_interval_s", "3600")])[0]
    out = tmp_path / "run"
    with pytest.raises(RuntimeError, match="killed"):
        train(cfg, out, options=RunOptions(progress=False, callbacks=[_Crash(3)]))
    assert len(_csv(out / "metrics.csv")) == 3
    (out / "synthetic_task1.png").unlink()
    assert main(["resume", str(out), "--no-progress", "--log", "csv", "--log", "tensorboard"]) == 0
    summary, reference = (json.loads((run / "summary.json").read_text()) for run in (out, finished))
    assert summary["resumed"] is True and summary["correct_matrix"] == reference["correct_matrix"]
    assert (out / "synthetic_task1.png").read_bytes() == (finished / "synthetic_task1.png").read_bytes()
    epochs = [r for r in _jsonl(out) if r["type"] == "epoch"]
    assert [(int(r["task"]), r["phase"], int(r["epoch"])) for r in _csv(out / "metrics.csv")] == [
        (r["task"], r["phase"], r["epoch"]) for r in epochs
    ]
    assert [int(r["task"]) for r in _csv(out / "tasks.csv")] == [0, 1]
    scalars, _ = _scalars(out)
    assert [s for s, _ in scalars["loss/total"]] == [1, 2, 5, 6, 7]
    assert [v for _, v in scalars["loss/lce"]] == pytest.approx([r["loss"]["lce"] for r in epochs[2:4]])


def _wandb_records(path):
    """The records of a wandb ``.wandb`` file (its LevelDB-style log: a 7-byte header, then 32 KiB blocks of
    records, each a CRC, a length and a kind: whole, first, middle or last part), as protobuf ``Record``s."""
    import struct

    from wandb.proto import wandb_internal_pb2

    data, block, header = path.read_bytes(), 32768, 7
    assert data[:4] == b":W&B"
    records, pos, parts = [], header, b""
    while pos + header <= len(data):
        if block - pos % block < header:  # a block's tail too short for a record header: padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + header])
        if pos + header + length > len(data):  # a record cut off where a killed process's last write ended
            break
        parts += data[pos + header : pos + header + length]
        pos += header + length
        if kind in (1, 4):  # a whole record, or its last part
            record = wandb_internal_pb2.Record()
            record.ParseFromString(parts)
            records.append(record)
            parts = b""
    return records


def _wandb_history(run_dir):
    """Per offline wandb run in ``run_dir/wandb`` (in the order the processes ran): its id and its history rows
    ({key: value} with ``_step``), read back from the files wandb wrote."""
    runs = []
    for folder in sorted((run_dir / "wandb").glob("offline-run-*")):
        (file,) = folder.glob("*.wandb")
        rows, run_id = [], None
        for record in _wandb_records(file):
            if record.WhichOneof("record_type") == "run":
                run_id = record.run.run_id
            if record.WhichOneof("record_type") == "history":
                rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item})
        runs.append((run_id, rows))
    return runs


def test_wandb_logs_tensorboards_records_and_a_resume_continues_its_run_without_repeating_a_step(
    finished, tmp_path, monkeypatch
):
    """In wandb's offline mode (no network), read back from wandb's own files: killed after the first RRL epoch,
    then resumed, the run logs to one wandb run id; the epoch it logged after its last checkpoint, which wandb wrote
    when the failed process exited, is not sent again, so its steps never repeat; the values are the run's records,
    on TensorBoard's step axis."""
    wandb = pytest.importorskip("wandb")
    from dfcil.runs.runner import train

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    process_hooks = sys.exit, sys.excepthook
    monkeypatch.setattr(sys, "exit", sys.exit)  # put back after the test, whatever wandb does
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)
    keys = [("log", "[wandb]"), ("epoch_checkpoint_interval_s", "3600"), ("wandb.project", "dfcil-test")]
    cfg = load_config([SMOKE], keys)[0]
    out = tmp_path / "run"
    with pytest.raises(RuntimeError, match="killed"):
        train(cfg, out, options=RunOptions(progress=False, callbacks=[_Crash(3)]))
    wandb.finish(exit_code=1)  # what the killed process's exit does, and its end takes wandb's hooks with it:
    sys.exit, sys.excepthook = process_hooks
    assert main(["resume", str(out), "--no-progress"]) == 0
    assert (sys.exit, sys.excepthook) == process_hooks  # wandb's hooks end with its run: nothing else sees them
    (first_id, first), (second_id, second) = _wandb_history(out)
    assert json.loads((out / "wandb.json").read_text()) == {"id": first_id, "held_step": 8}
    assert first_id == second_id
    # task 0's epochs and evaluation, task 1's grid, then RRL's first epoch (after the last checkpoint)
    assert [r["_step"] for r in first] == [1, 2, 3, 4, 5]
    assert [r["_step"] for r in second] == [6, 7, 8]  # step 5, computed again, is not sent again
    rows = {r["_step"]: r for r in first + second}
    epochs = [r for r in _jsonl(out) if r["type"] == "epoch"]
    assert [rows[s]["lr"] for s in (1, 2, 5, 6, 7)] == pytest.approx([r["lr"] for r in epochs])
    assert rows[6]["loss/lce"] == pytest.approx(epochs[3]["loss"]["lce"])
    assert rows[5]["loss/lce"] == pytest.approx(epochs[2]["loss"]["lce"])  # the copy before the kill: the same
    tasks = [r for r in _jsonl(out) if r["type"] == "task"]
    assert rows[3]["accuracy/A_t"] == pytest.approx(tasks[0]["acc"]) and rows[8]["accuracy/A_t"] == tasks[1]["acc"]
    assert {"accuracy/old", "accuracy/task1"} <= set(rows[8]) and {"loss/total", "speed/images_per_s"} <= set(rows[7])
    assert rows[4]["synthetic/task1/_type"] == "image-file" and rows[4]["synthetic/task1/width"] == 8 * 16 + 9 * 2


# A process of a run with --log wandb that SIGKILLs itself (as the kernel's OOM killer or a preemption would: no exit
# handler runs, and wandb's service process stops when it sees its parent gone) at the n-th call of a hook, after the
# loggers ran it and before the checkpoint of that point is written; WANDB__TRANSACTION_LOG_FLUSH_INTERVAL says when
# wandb writes its records to the offline file (0: only when its 32 KiB buffer fills or the run finishes; the default
# is every 15 s), and wait_s how long the process runs on before the kill.
_KILLED_RUN = """
import json, os, signal, sys, time
from pathlib import Path
from dfcil.load import load_config
from dfcil.runs.runner import resume, train
from dfcil.training.callbacks import Callback
from dfcil.training.loop import RunOptions

class Kill(Callback):
    def __init__(self, hook, n, wait_s):
        self.n, self.wait_s = n, wait_s
        setattr(self, hook, self.tick)

    def tick(self, *args):
        self.n -= 1
        if self.n == 0:
            time.sleep(self.wait_s)
            os.kill(os.getpid(), signal.SIGKILL)

config, keys, out, hook, n, wait_s = sys.argv[1:]
options = RunOptions(progress=False, callbacks=[Kill(hook, int(n), float(wait_s))])
if Path(out).exists():
    resume(out, options=options)
else:
    train(load_config([config], [tuple(k) for k in json.loads(keys)])[0], out, options=options)
"""


def _killed(out, keys, hook, n, flush_s, wait_s=0.0):
    """Train ``out`` (or resume it, when it exists) in a new process SIGKILLed at the ``n``-th ``hook``; wandb flushes
    its offline file every ``flush_s`` seconds (0: not before the kill)."""
    import os
    import signal
    import subprocess

    # its own wandb service, as a run's process has: not the one an earlier test started in this process (wandb
    # hands it down in WANDB_SERVICE), which would outlive the kill and keep the killed process's wandb run open
    env = {k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"}
    env["WANDB__TRANSACTION_LOG_FLUSH_INTERVAL"] = str(flush_s)
    args = [sys.executable, "-c", _KILLED_RUN, SMOKE, json.dumps(keys), str(out), hook, str(n), str(wait_s)]
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == -signal.SIGKILL, done.stderr[-3000:]


def _wandb_steps(run_dir):
    """Every history row of the run's offline wandb files, by step (each step must be there once)."""
    rows = [row for _, history in _wandb_history(run_dir) for row in history]
    steps = [r["_step"] for r in rows]
    assert len(steps) == len(set(steps)), f"steps sent twice: {sorted(steps)}"
    return {r["_step"]: r for r in rows}


def _offline_wandb(monkeypatch):
    """wandb in offline mode, its hooks on sys.exit and sys.excepthook undone after the test."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setattr(sys, "exit", sys.exit)
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)


def test_wandb_sends_again_what_a_sigkill_lost_and_nothing_twice(tmp_path, monkeypatch):
    """A process SIGKILLed after task 1's second epoch, before wandb wrote anything to disk, then `dfcil resume`:
    wandb's offline files, read back, hold every step of the run once, as an uninterrupted run logs them. Task 0's
    epochs and evaluation (steps 1-4) come before the last checkpoint (task 1's setup end): the resume sends them
    again from metrics.jsonl; steps 6-7 follow it and are computed again. (That the steps an earlier process's
    wandb wrote are not sent twice: test_wandb_logs_tensorboards_records_... above, and the slow test below.)"""
    pytest.importorskip("wandb")
    _offline_wandb(monkeypatch)
    keys = [("method.name", "finetune"), ("log", "[wandb]"), ("epoch_checkpoint_interval_s", "3600"),
            ("wandb.project", "dfcil-test")]  # fmt: skip
    out = tmp_path / "run"
    _killed(out, keys, "on_epoch_end", 5, flush_s=0)
    assert main(["resume", str(out), "--no-progress"]) == 0
    rows = _wandb_steps(out)
    assert sorted(rows) == [1, 2, 3, 4, 6, 7, 8, 9]  # a slot per task's setup (no grid: finetune inverts nothing)
    epochs = [r for r in _jsonl(out) if r["type"] == "epoch"]
    assert [rows[s]["loss/ce"] for s in (1, 2, 3, 6, 7, 8)] == pytest.approx([r["loss"]["ce"] for r in epochs])
    assert [rows[s]["lr"] for s in (1, 2, 3, 6, 7, 8)] == pytest.approx([r["lr"] for r in epochs])
    tasks = [r for r in _jsonl(out) if r["type"] == "task"]
    assert [rows[s]["accuracy/A_t"] for s in (4, 9)] == pytest.approx([r["acc"] for r in tasks])
    state = json.loads((out / "wandb.json").read_text())
    assert state["held_step"] == 9  # the resumed process's wandb run finished: it holds every step
    # one wandb run over both processes (the killed one's file holds nothing but its header: it names none)
    assert {run_id for run_id, _ in _wandb_history(out)} - {None} == {state["id"]}


@pytest.mark.slow  # four processes of R-DFCIL's smoke run (30 s or more on 2 cores); the test above: the quick one
def test_wandb_history_of_a_run_killed_three_times_equals_an_uninterrupted_runs(finished, tmp_path, monkeypatch):
    """R-DFCIL's smoke run, SIGKILLed at the end of task 0's training (nothing on wandb's disk), inside task 1's
    inversion (steps 1-3 on disk) and after task 1's first epoch (its grid, step 4, before the checkpoint and not
    on disk: sent again from synthetic_task1.png), then resumed: wandb's offline files hold every step once, with
    the values of the uninterrupted shared run."""
    pytest.importorskip("wandb")
    _offline_wandb(monkeypatch)
    keys = [("log", "[wandb]"), ("epoch_checkpoint_interval_s", "3600"), ("wandb.project", "dfcil-test")]
    out = tmp_path / "run"
    _killed(out, keys, "on_epoch_end", 2, flush_s=0)
    _killed(out, keys, "on_setup_step", 3, flush_s=0.01, wait_s=0.5)
    _killed(out, keys, "on_epoch_end", 1, flush_s=0)
    assert main(["resume", str(out), "--no-progress"]) == 0
    summary, reference = (json.loads((run / "summary.json").read_text()) for run in (out, finished))
    assert summary["correct_matrix"] == reference["correct_matrix"]
    rows = _wandb_steps(out)
    assert sorted(rows) == list(range(1, 9))
    epochs = [r for r in _jsonl(finished) if r["type"] == "epoch"]
    for step, record in zip((1, 2, 5, 6, 7), epochs, strict=True):
        assert rows[step]["lr"] == pytest.approx(record["lr"])
        assert {k: rows[step][f"loss/{k}"] for k in record["loss"]} == pytest.approx(record["loss"])
    tasks = [r for r in _jsonl(finished) if r["type"] == "task"]
    assert [rows[s]["accuracy/A_t"] for s in (3, 8)] == pytest.approx([r["acc"] for r in tasks])
    assert rows[8]["accuracy/old"] == pytest.approx(tasks[1]["old_acc"])
    assert rows[4]["synthetic/task1/_type"] == "image-file"


def test_unknown_loggers_and_missing_extras_are_refused_before_a_run_directory_exists(tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    assert main(["train", "--config", SMOKE, "--out", str(out), "--log", "csv,tensorbord"]) == 2
    assert "unknown logger 'tensorbord'. Did you mean 'tensorboard'?" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # as if tensorboard were not installed
    assert main(["train", "--config", SMOKE, "--out", str(out), "--log", "tensorboard"]) == 2
    assert "pip install 'dfcil[tensorboard]'" in capsys.readouterr().err
    assert not out.exists()


def test_wandb_without_a_login_is_one_clear_error_and_leaves_no_run_directory(tmp_path, capsys, monkeypatch):
    """Online wandb without an API key raised wandb's UsageError through a 50-line traceback (a new-user probe)."""
    wandb = pytest.importorskip("wandb")

    def no_key(**kwargs):
        raise wandb.errors.UsageError("No API key configured. Use `wandb login` to log in.")

    monkeypatch.setattr(wandb, "init", no_key)
    hooks = sys.exit, sys.excepthook
    out = tmp_path / "run"
    assert main(["train", "--config", SMOKE, "--out", str(out), "--log", "wandb", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "--log wandb: No API key configured" in err and "WANDB_MODE=offline" in err and "Traceback" not in err
    assert not out.exists() and (sys.exit, sys.excepthook) == hooks


# ------------------------------------------------------------------------------------------------------- eval


def test_eval_reproduces_the_runs_last_accuracy_row(finished, capsys):
    from dfcil.analysis.tools import evaluate_run

    summary = json.loads((finished / "summary.json").read_text())
    report = evaluate_run(finished)
    assert [t["correct"] for t in report["tasks"]] == summary["correct_matrix"][-1]
    assert [t["count"] for t in report["tasks"]] == summary["count_matrix"][-1]
    assert report["acc"] == summary["last_acc"] and report["classes"] == summary["class_order"]
    assert report["old"]["acc"] == summary["old_acc"][-1] and report["new"]["acc"] == summary["new_acc"][-1]
    assert main(["eval", str(finished)]) == 0
    assert f"accuracy {summary['last_acc']:6.2f}%" in capsys.readouterr().out


def test_eval_of_chosen_classes_or_tasks(finished, capsys):
    from dfcil.analysis.tools import evaluate_run

    summary = json.loads((finished / "summary.json").read_text())
    first = summary["tasks"][0]
    by_task = evaluate_run(finished, tasks=[0])
    assert by_task == evaluate_run(finished, classes=[str(c) for c in first])
    assert by_task["correct"] == summary["correct_matrix"][-1][0] and by_task["new"] is None
    assert main(["eval", str(finished), "--classes", f"{first[0]},{summary['tasks'][1][0]}", "--json"]) == 0
    two = json.loads(capsys.readouterr().out)
    assert two["count"] == 32 and two["old"]["count"] == two["new"]["count"] == 16  # 16 test images per class
    # several values, as a shell passes them, mean the same as a comma list
    assert main(["eval", str(finished), "--classes", str(first[0]), str(summary["tasks"][1][0]), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == two
    assert main(["eval", str(finished), "--tasks", "0", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["count"] == summary["count_matrix"][-1][0] * 2
    assert main(["eval", str(finished), "--classes", str(first[0])]) == 0
    assert ": 1 class, 16 test images\n" in capsys.readouterr().out


def test_eval_refuses_other_data_than_the_run_was_trained_on_and_says_changed_pixels(finished, tmp_path, capsys):
    """As dfcil resume: meta.json records what the run trained on; eval with a --data.root holding other classes or
    another image count is refused (it scored 25.83 % on such data, silently), other pixels are said on stderr."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(finished, run)
    meta = json.loads((run / "meta.json").read_text())
    saved = dict(meta["data"])
    meta["data"]["train_images"] += 1  # as if --data.root held another dataset
    (run / "meta.json").write_text(json.dumps(meta))
    assert main(["eval", str(run)]) == 2
    err = capsys.readouterr().err
    assert "was trained on other data than" in err and "(its train_images differ)" in err and "--data.root" in err
    meta["data"] = saved | {"images": "0" * 64}  # the same classes and count, other pixels
    (run / "meta.json").write_text(json.dumps(meta))
    assert main(["eval", str(run)]) == 0
    assert "warning: the data's images differ from what" in capsys.readouterr().err


def test_eval_takes_the_classes_by_what_they_are_where_the_dataset_names_them_so(finished, capsys):
    """CIFAR-100 has no class names that runs record, but says what each class is (fine_names): eval --classes
    takes those words (a new-user probe: --classes cloud,bicycle was refused)."""
    import dataclasses

    from dfcil.analysis.tools import evaluate_run
    from dfcil.data.datasets import DATASETS

    fake = DATASETS.get("fake")

    def worded(*args, **kwargs):
        ds = fake(*args, **kwargs)
        return dataclasses.replace(ds, words=tuple(f"thing{i}" for i in range(ds.num_classes)))

    summary = json.loads((finished / "summary.json").read_text())
    first = summary["tasks"][0][0]
    with DATASETS.replaced("fake", worded):
        by_word = evaluate_run(finished, classes=[f"thing{first}"])
    assert by_word == evaluate_run(finished, classes=[str(first)]) and by_word["count"] == 16


def test_a_mistake_on_eval_prints_evals_usage(finished, capsys):
    with pytest.raises(SystemExit) as stop:
        main(["eval", str(finished), "--clases", "3"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: dfcil eval [-h]") and "error: unrecognized arguments: --clases 3" in err


def test_version_names_dfcil_and_torch(capsys):
    import torch

    from dfcil.version import __version__

    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    out = capsys.readouterr().out
    assert stop.value.code == 0 and out.startswith(f"dfcil {__version__}") and f"torch {torch.__version__}" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--classes", "42"], "class '42' is not one of this run's classes"),
        (["--tasks", "2"], "task 2 is not a task of this run (it has tasks 0..1)"),
        (["--tasks", "a"], "--tasks a: give task numbers"),
    ],
)
def test_eval_refuses_what_the_run_does_not_have(finished, capsys, args, message):
    assert main(["eval", str(finished), *args]) == 2
    assert message in capsys.readouterr().err


def test_a_class_name_not_in_the_run_is_refused_with_the_names_and_the_closest():
    from dfcil.analysis.tools import selected_labels
    from dfcil.data.splits import ClassIncrementalSplit

    split = ClassIncrementalSplit.build(12, 2, 0, class_order=list(range(12)))
    names = [f"fruit{i}" for i in range(10)] + ["apple", "pear"]
    assert selected_labels(split, names, ["apple", "3"]) == [3, 10]
    with pytest.raises(ConfigError) as err:
        selected_labels(split, names, ["aple"])
    text = str(err.value)
    assert text.startswith("class 'aple' is not one of this run's classes (raw class ids [0, 1, ")
    assert "or their names: fruit0, fruit1," in text and "and 2 more). Did you mean 'apple'?" in text


def test_commands_on_a_run_without_a_final_model_say_so(finished, tmp_path, capsys):
    from dfcil.analysis.tools import evaluate_run

    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    shutil.copy(finished / "config.yaml", unfinished)
    for command in (["eval"], ["export"], ["inspect", "--features"]):
        assert main([*command, str(unfinished)]) == 2
        assert "has no model.pt" in capsys.readouterr().err
    assert main(["eval", str(tmp_path)]) == 2
    assert "is not a dfcil run directory" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="classes or tasks, not both"):
        evaluate_run(finished, classes=["1"], tasks=[0])


# ----------------------------------------------------------------------------------------------------- export


def test_exported_safetensors_rebuild_the_final_network(finished, tmp_path, capsys):
    from safetensors.torch import load_file

    from dfcil.model_file import load_model
    from dfcil.models.network import build_network

    out = tmp_path / "export" / "net.safetensors"
    out.parent.mkdir()
    assert main(["export", str(finished), "--out", str(out)]) == 0
    assert capsys.readouterr().out.split() == [str(out), str(out.with_suffix(".json"))]
    card = json.loads(out.with_suffix(".json").read_text())
    summary = json.loads((finished / "summary.json").read_text())
    assert card["class_order"] == summary["class_order"] and card["num_classes"] == 10
    assert card["inputs"] == {"image_size": 16, "mean": [0.5] * 3, "std": [0.25] * 3}
    assert card["class_names"] == card["output_names"] == []  # the fake dataset names no classes
    net = build_network(card["backbone"], card["head"])
    for n in card["head_sizes"]:
        net.expand(n)
    net.load_state_dict(load_file(out))  # strict: every tensor, nothing else
    x = torch.randn(6, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(net.eval()(x).logits, load_model(finished / "model.pt")(x).logits)
    with pytest.raises(SystemExit, match="2"):  # argparse refuses it, listing dfcil.analysis.tools.EXPORT_FORMATS
        main(["export", str(finished), "--format", "onnx"])
    assert "invalid choice: 'onnx' (choose from 'safetensors')" in capsys.readouterr().err


def test_export_writes_its_own_earlier_export_again_and_refuses_to_replace_anything_else(finished, tmp_path, capsys):
    """An --out that exists is written again only where it is this run's export (its card names the run's id); an
    export of another run, or a file that is no export, is left as it is, with one line saying so."""
    out = tmp_path / "net.safetensors"
    assert main(["export", str(finished), "--out", str(out)]) == 0
    card = json.loads(out.with_suffix(".json").read_text())
    assert card["run_id"] == json.loads((finished / "summary.json").read_text())["run_id"]
    assert main(["export", str(finished), "--out", str(out)]) == 0  # the same run's export, again
    capsys.readouterr()
    out.with_suffix(".json").write_text(json.dumps({**card, "run_id": "another"}))
    theirs = {p: p.read_bytes() for p in (out, out.with_suffix(".json"))}
    assert main(["export", str(finished), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "already exists, an export of another run (another); remove it or choose" in err
    mine = tmp_path / "mine.safetensors"
    mine.write_bytes(b"a user's own file")
    assert main(["export", str(finished), "--out", str(mine)]) == 2
    assert "already exists, not an export of this run" in capsys.readouterr().err
    assert {p: p.read_bytes() for p in theirs} == theirs and mine.read_bytes() == b"a user's own file"
    assert not mine.with_suffix(".json").exists()


def test_the_card_names_classes_by_raw_id_as_the_summary_does_and_outputs_apart(finished):
    """summary.json and the model card index class_names by raw class id; the card's output_names go by output.
    model.pt keeps its names by output, as runs written before the card changed do, so their export reads alike."""
    import dataclasses

    from dfcil.analysis.tools import FinishedRun, model_card

    run = FinishedRun.open(finished)
    order, names = [3, 7, 0, 9, 1, 5, 2, 8, 4, 6], [f"class_{c}" for c in range(10)]
    named = dataclasses.replace(
        run,
        model=run.model | {"class_order": order, "class_names": [names[c] for c in order]},
        summary=run.summary | {"class_names": names},
    )
    card = model_card(named, "net.safetensors")
    assert card["format"] == 2 and card["class_order"] == order and card["class_names"] == names
    assert card["output_names"] == [card["class_names"][c] for c in card["class_order"]]
    subset = dataclasses.replace(
        named, model=run.model | {"class_order": [5, 2], "class_names": ["f", "c"]}, summary={}
    )
    card = model_card(subset, "net.safetensors")  # no summary names: rebuilt from the outputs
    assert card["class_names"] == [None, None, "c", None, None, "f"] and card["output_names"] == ["f", "c"]


def test_export_and_eval_refuse_bad_outputs_and_damaged_files_in_one_line(finished, tmp_path, capsys):
    """Each of these exits 2 with one line naming the problem and the fix, and writes nothing."""
    from dfcil.checkpoint import dumps, loads

    def refused(args, message):
        assert main(args) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("dfcil: error:") and message in err, err

    refused(["export", str(finished), "--out", str(tmp_path / "newdir" / "m.safetensors")], "does not exist")
    before = {p.name: p.read_bytes() for p in finished.iterdir() if p.is_file()}
    for clobber in (
        "model.pt",
        "config.yaml",
        "summary.x",
        "checkpoints/w.safetensors",
    ):  # summary.x: card summary.json
        refused(["export", str(finished), "--out", str(finished / clobber)], "would replace or add to the run's own")
    assert {p.name: p.read_bytes() for p in finished.iterdir() if p.is_file()} == before
    (tmp_path / "adir").mkdir()
    inside = tmp_path / "adir" / "model.safetensors"
    refused(["export", str(finished), "--out", str(tmp_path / "adir")], f"a directory; give a file name, e.g. {inside}")
    # a folder meant (a trailing slash) is not taken for a file name, whether it exists or not
    for folder in ("adir", "notyet"):
        refused(["export", str(finished), "--out", f"{tmp_path / folder}/"], "give the weights' file name, e.g.")
    assert not (tmp_path / "notyet").exists() and not (tmp_path / "notyet.json").exists()
    damaged = tmp_path / "damaged"
    shutil.copytree(finished, damaged)
    (damaged / "summary.json").write_text('{"last_acc": 5')
    refused(["eval", str(damaged)], "summary.json cannot be read")
    refused(["export", str(damaged)], "summary.json cannot be read")
    shutil.copy(finished / "summary.json", damaged / "summary.json")
    payload = loads((damaged / "model.pt").read_bytes())
    payload["head_sizes"] = [5, 4]  # the weights hold 5 + 5 classes
    (damaged / "model.pt").write_bytes(dumps(payload))
    refused(["eval", str(damaged)], "does not hold the network it describes (head sizes [5, 4]")
    refused(["export", str(damaged)], "does not hold the network it describes")
    assert not (damaged / "model.safetensors").exists() and not (damaged / "model.json").exists()


# ---------------------------------------------------------------------------------------------------- inspect


def test_inspect_plots_the_features_of_real_and_stored_synthetic_images(finished, tmp_path, capsys):
    out = tmp_path / "plots"
    args = ["inspect", str(finished), "--features", "--out", str(out), "--per-class", "6", "--synthetic-images", "24"]
    assert main(args) == 0
    png, pdf = (out / "features_tsne.png"), (out / "features_tsne.pdf")
    lines = capsys.readouterr().out.splitlines()  # the numbers' table (tests/test_diagnostics.py), then the files
    assert lines[0].split()[:3] == ["run", "method", "silhouette"] and lines[1].split()[:2] == [str(finished), "rdfcil"]
    assert lines[2:] == [str(png), str(pdf), str(out / "features_tsne.json")]
    assert pdf.read_bytes()[:5] == b"%PDF-" and pdf.stat().st_size > 1000
    with Image.open(png) as image:
        assert image.format == "PNG" and min(image.size) > 300
    with pytest.raises(SystemExit, match="2"):
        main(["inspect", str(finished), "--features", "--synthetic"])
    assert "not allowed with argument" in capsys.readouterr().err


def test_class_colours_never_take_the_legends_neutral_colour():
    """tab10's grey was the 8th class's colour and the legend's "real"/"synthetic" marker's too: a class that
    looked uncoloured. No class colour is grey or black (the neutral marker's), for up to 200 classes, and
    the classes of one figure have different colours."""
    import numpy as np

    from dfcil.analysis.features import NEUTRAL, class_colours

    for n in range(1, 201):
        colours = class_colours(n)
        rgb = colours[:, :3]
        assert colours.shape == (n, 4) and not (np.abs(colours - NEUTRAL).max(axis=1) < 0.05).any(), n
        assert (rgb.max(axis=1) - rgb.min(axis=1) > 0.12).all(), n  # chroma: no grey (tab20's palest, lavender: 0.15)
        assert len(np.unique(colours.round(4), axis=0)) == n, n


def test_the_embedding_legend_says_synthetic_points_are_coloured_by_predicted_class():
    import numpy as np

    from dfcil.analysis.features import NEUTRAL, plot_embedding

    labels = np.array([0, 1, 7, 7, 0])
    fig = plot_embedding(
        np.random.default_rng(0).normal(size=(5, 2)), labels, labels == 7, [f"c{k}" for k in range(10)], "t"
    )
    legend = fig.axes[0].get_legend()
    texts = [t.get_text() for t in legend.get_texts()]
    assert texts[:2] == ["real test image (colour: its class)", "synthetic (colour: predicted class)"]
    for handle in legend.legend_handles[:2]:  # hollow, black: no class's colour
        assert handle.get_markerfacecolor() == "none" and tuple(handle.get_markeredgecolor()) == NEUTRAL
    assert texts[2:] == [f"c{k}" for k in range(10)]


def test_inspect_inverts_a_generator_when_the_run_kept_none(finished, tmp_path, capsys):
    from dfcil.analysis.features import FeatureOptions, inspect_features, synthetic_images
    from dfcil.analysis.tools import FinishedRun

    run_dir = tmp_path / "run"
    shutil.copytree(finished, run_dir, ignore=shutil.ignore_patterns("tensorboard", "inspect"))
    (run_dir / "checkpoints" / "task1-static.pt").unlink()
    run = FinishedRun.open(run_dir)
    synthetic = synthetic_images(run, run.network(torch.device("cpu")), 8, steps=2, seed=0)
    assert synthetic.x.shape == (8, 3, 16, 16) and "inverted from the final model (2 steps)" in synthetic.source
    assert f"{run_dir} kept no generator; inverting its final model (2 steps" in capsys.readouterr().err
    assert int(synthetic.y.max()) < 10
    _, paths = inspect_features(run_dir, options=FeatureOptions(per_class=4, synthetic=8, inversion_steps=2))
    assert [p.relative_to(run_dir).as_posix() for p in paths] == [
        "inspect/features_tsne.png",
        "inspect/features_tsne.pdf",
        "inspect/features_tsne.json",
    ]
    assert all(p.stat().st_size > 0 for p in paths)


# ------------------------------------------------------------------------------------------------------- CUDA


@pytest.mark.gpu
def test_on_cuda_with_graphs_the_grids_logs_and_commands_work(tmp_path):
    """A graphed, channels-last CUDA run with every logger: the grid and the logs are written, eval reproduces the
    run's last row, the export gives the same logits, inspect plots with the stored and with a fresh generator.
    (Written for a GPU machine; not yet run on one.)"""
    from safetensors.torch import load_file

    from dfcil.analysis.features import FeatureOptions, fresh_generator, inspect_features
    from dfcil.analysis.tools import FinishedRun, evaluate_run
    from dfcil.models.network import build_network

    out = tmp_path / "run"
    engine = ["--device", "cuda", "--engine.cuda_graphs", "on", "--engine.channels_last", "true"]
    assert (
        main(["train", "--config", SMOKE, "--out", str(out), "--no-progress", "--log", "csv,tensorboard", *engine]) == 0
    )
    with Image.open(out / "synthetic_task1.png") as image:
        assert image.size == (274, 274)
    assert _scalars(out)[1] == ["synthetic/task1"] and len(_csv(out / "metrics.csv")) == 5
    summary = json.loads((out / "summary.json").read_text())
    report = evaluate_run(out)  # CUDA's kernels may pick other algorithms in another process: within an image
    assert [t["correct"] for t in report["tasks"]] == pytest.approx(summary["correct_matrix"][-1], abs=1)
    assert main(["export", str(out)]) == 0
    run = FinishedRun.open(out)
    card = json.loads((out / "model.json").read_text())
    net = build_network(card["backbone"], card["head"])
    for n in card["head_sizes"]:
        net.expand(n)
    net.load_state_dict(load_file(out / "model.safetensors"))
    x = torch.randn(6, 3, 32, 32, device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    with torch.no_grad():
        reference = run.network(torch.device("cuda"))(x).logits
        assert torch.allclose(net.cuda().eval()(x).logits, reference, atol=1e-4)
    _, paths = inspect_features(out, options=FeatureOptions(per_class=6, synthetic=24))
    assert all(p.stat().st_size > 0 for p in paths)
    generator, _, source = fresh_generator(run, run.network(torch.device("cuda")), 3, 0, torch.device("cuda"))
    assert next(generator.parameters()).is_cuda and "3 steps" in source


# ------------------------------------------------------------------------------------------ whose model.pt


def test_a_model_pt_from_another_run_is_refused_naming_both_runs(finished, tmp_path, capsys):
    """`cp OTHER/model.pt R/model.pt; dfcil eval R` printed another run's accuracy (45.31 % against the summary's
    46.88 %) with no warning. model.pt, summary.json and meta.json now carry the run's id."""
    from dfcil.checkpoint import dumps, loads

    summary, meta = (json.loads((finished / name).read_text()) for name in ("summary.json", "meta.json"))
    model = loads((finished / "model.pt").read_bytes())
    assert summary["run_id"] == meta["run_id"] == model["run"]["id"] and len(summary["run_id"]) == 32
    assert model["run"] == {"id": summary["run_id"], "dir": str(finished.absolute()), "method": "rdfcil",
                            "dataset": "fake"}  # fmt: skip
    run = tmp_path / "R"
    shutil.copytree(finished, run, ignore=shutil.ignore_patterns("tensorboard", "inspect"))
    other = dict(model, run={"id": "0" * 32, "dir": "/elsewhere/OTHER", "method": "fecam", "dataset": "fake"})
    (run / "model.pt").write_bytes(dumps(other))  # same shape: only the id tells them apart
    for command in (["eval", str(run)], ["export", str(run), "--out", str(tmp_path / "m.safetensors")],
                    ["inspect", str(run), "--out", str(tmp_path / "plots")]):  # fmt: skip
        assert main(command) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"{run / 'model.pt'} was written by run {'0' * 32} (fecam on fake, trained " \
            f"in /elsewhere/OTHER), not by run {summary['run_id']} of {run}" in err, err  # fmt: skip
    assert not (tmp_path / "m.safetensors").exists() and not (tmp_path / "plots").exists()
    del other["run"]  # a model of a dfcil before run ids, in a run that has one
    (run / "model.pt").write_bytes(dumps(other))
    assert main(["eval", str(run)]) == 2 and "written by a run of a dfcil before run ids" in capsys.readouterr().err


def test_runs_before_run_ids_compare_the_method_and_the_class_order_instead(finished, tmp_path, capsys):
    from dfcil.checkpoint import dumps, loads

    run = tmp_path / "old"
    shutil.copytree(finished, run, ignore=shutil.ignore_patterns("tensorboard", "inspect"))
    for name in ("summary.json", "meta.json"):  # as a dfcil before run ids wrote them
        record = json.loads((run / name).read_text())
        del record["run_id"]
        (run / name).write_text(json.dumps(record))
    model = loads((run / "model.pt").read_bytes())
    (run / "model.pt").write_bytes(dumps({k: v for k, v in model.items() if k != "run"}))
    assert main(["eval", str(run)]) == 0  # nothing to compare but what both files record: they agree
    capsys.readouterr()
    (run / "model.pt").write_bytes(dumps(dict(model, run={"method": "fecam"})))
    assert main(["eval", str(run)]) == 2 and "is a fecam model, and" in capsys.readouterr().err
    flipped = dict(model, class_order=list(reversed(model["class_order"])))
    del flipped["run"]
    (run / "model.pt").write_bytes(dumps(flipped))
    assert main(["eval", str(run)]) == 2 and "was trained on another class order" in capsys.readouterr().err


def test_a_class_order_the_data_does_not_give_names_the_data_read_not_none(finished, tmp_path, capsys):
    """The message said 'the data under None gives the class order ...': it names where the data was read from."""
    from dfcil.checkpoint import dumps, loads

    run = tmp_path / "R"
    shutil.copytree(finished, run, ignore=shutil.ignore_patterns("tensorboard", "inspect"))
    model, summary = loads((run / "model.pt").read_bytes()), json.loads((run / "summary.json").read_text())
    order = [*model["class_order"][1:], model["class_order"][0]]  # both files agree on another order
    (run / "model.pt").write_bytes(dumps(dict(model, class_order=order)))
    (run / "summary.json").write_text(json.dumps(dict(summary, class_order=order)))
    assert main(["eval", str(run)]) == 2
    err = capsys.readouterr().err
    assert "the data (generated) gives the class order" in err and "None" not in err, err


def test_a_finished_run_evaluates_where_its_training_only_paths_cannot_be_created(finished, tmp_path, capsys):
    """A run trained with a shared first-task cache and a compile cache, evaluated on a machine where neither
    directory can be made: eval, export and inspect need neither (issue 47: eval failed with a ConfigError)."""
    import yaml

    run = tmp_path / "R"
    shutil.copytree(finished, run, ignore=shutil.ignore_patterns("tensorboard", "inspect"))
    blocker = tmp_path / "a-file"
    blocker.write_text("a file, where the caches' parent directory should be")
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["task0_cache"] = str(blocker / "task0")
    config["engine"] |= {"compile": "default", "compile_cache": str(blocker / "compiled")}
    (run / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    summary = json.loads((run / "summary.json").read_text())
    assert main(["eval", str(run), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["acc"] == summary["last_acc"]
    assert main(["export", str(run), "--out", str(tmp_path / "m.safetensors")]) == 0
    capsys.readouterr()
    assert main(["resume", str(run)]) == 0  # finished: nothing to train, so no cache to make
    assert "holds this run, finished" in capsys.readouterr().err
    assert not (blocker.parent / "task0").exists()


def test_eval_confusion_says_where_each_tasks_images_go(finished, capsys):
    """benchmarks/task_confusion.py folded into dfcil eval: per task, the accuracy among its own classes and the
    shares predicted into earlier, own and later tasks' classes, which add up to all of its images."""
    from dfcil.analysis.tools import evaluate_run

    plain, report = evaluate_run(finished), evaluate_run(finished, with_confusion=True)
    assert "within" not in plain["tasks"][0] and [t["acc"] for t in plain["tasks"]] == [t["acc"] for t in
                                                                                         report["tasks"]]  # fmt: skip
    for task in report["tasks"]:
        assert task["to_old"] + task["to_own"] + task["to_later"] == pytest.approx(100.0)
        assert task["within"] >= task["acc"]  # fewer classes compete
        assert task["to_own"] >= task["acc"]
    assert report["tasks"][0]["to_old"] == 0.0 and report["tasks"][-1]["to_later"] == 0.0
    assert main(["eval", str(finished), "--confusion"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1].startswith("task 1") and "within" in lines[-1] and "to old" in lines[-1]
