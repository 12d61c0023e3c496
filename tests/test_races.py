"""Processes that race for one run or sweep directory, and processes whose parent dies: real processes, started
together. One writer per run directory and per sweep; no child outlives a killed parent."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from conftest import CONFIGS

# A one-task run of about a second: fine-tuning on 8 generated images per class.
TINY_RUN = [
    "--config", str(CONFIGS / "smoke.yaml"), "--method.name", "finetune", "--data.num_tasks", "1",
    "--train.epochs", "1", "--train.milestones", "[]", "--data.train_per_class", "8", "--data.test_per_class", "4",
    "--train.batch_size", "8", "--no-progress",
]  # fmt: skip

RACER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from dfcil.cli import main
    base, tries, me, args = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4:]
    for i in range(tries):
        (base / f"ready-{i}-{me}").touch()
        while not (base / f"go-{i}").exists():
            time.sleep(0.0005)
        code = main(["train", *args, "--out", str(base / f"run{i}")])
        (base / f"done-{i}-{me}.tmp").write_text(str(code))
        (base / f"done-{i}-{me}.tmp").rename(base / f"done-{i}-{me}")  # whole when the test sees it
""")


def _wait_for(paths: list[Path], timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not all(p.exists() for p in paths):
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout} s for {[str(p) for p in paths if not p.exists()]}")
        time.sleep(0.01)


def test_two_trainings_started_together_on_one_new_directory_never_wipe_the_winner(tmp_path):
    """Two `dfcil train` on the same new --out, started at the same instant, 20 times: one trains the run to the
    end, the other is refused with one line, and the run directory is whole (config.yaml, summary.json)."""
    tries, late = 20, 0
    logs = [open(tmp_path / f"racer-{me}.log", "w") for me in "ab"]  # noqa: SIM115 - closed below
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", RACER, str(tmp_path), str(tries), me, *TINY_RUN], stdout=log, stderr=log
        )
        for me, log in zip("ab", logs, strict=True)
    ]
    try:
        for i in range(tries):
            _wait_for([tmp_path / f"ready-{i}-{me}" for me in "ab"])
            (tmp_path / f"go-{i}").touch()
            _wait_for([tmp_path / f"done-{i}-{me}" for me in "ab"])
            codes = sorted(int((tmp_path / f"done-{i}-{me}").read_text()) for me in "ab")
            run = tmp_path / f"run{i}"
            # the loser is refused (2), or, where it started so late that the winner had finished, finds the run
            # finished and trains nothing (0)
            assert codes in ([0, 2], [0, 0]), f"try {i}: exit codes {codes}"
            late += codes == [0, 0]
            assert (run / "config.yaml").exists() and (run / "summary.json").exists(), f"try {i}"
            assert (run / "model.pt").exists() and (run / "meta.json").exists(), f"try {i}"
    finally:
        for p in racers:
            p.kill()
            p.wait()
        for log in logs:
            log.close()
    text = "".join((tmp_path / f"racer-{me}.log").read_text() for me in "ab")
    refusals = [line for line in text.splitlines() if line.startswith("dfcil: error:")]
    assert len(refusals) == tries - late and all("another dfcil process" in line for line in refusals), refusals


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, dead but not yet reaped by its new parent, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry.name))
            except (OSError, IndexError, ValueError):
                continue
    return found


def _runs(out: Path) -> dict[str, dict]:
    try:
        return {r["name"]: r for r in json.loads((out / "sweep.json").read_text())["runs"]}
    except (OSError, ValueError, KeyError):
        return {}


def _wait_until(condition, timeout: float = 120.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout} s for {what}")
        time.sleep(0.05)


linux_only = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads processes from /proc (Linux)")


def test_a_second_sweep_on_a_running_sweeps_directory_is_refused(tmp_path):
    """The second sweep on one --out is refused with one line while the first runs; the first finishes its runs and
    its sweep.json agrees with the run directories."""
    out = tmp_path / "sweep"
    longer = [*TINY_RUN[:-1], "--train.epochs", "30"]  # seconds a run: still running when the second sweep, slow to
    args = [sys.executable, "-m", "dfcil", "sweep", *longer, "--grid", "seed=1,2", "--out", str(out)]  # start, looks
    first = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        _wait_until(lambda: any(r["state"] == "running" for r in _runs(out).values()), what="the first sweep's run")
        second = subprocess.run(args, capture_output=True, text=True, timeout=120)
        assert second.returncode == 2, second.stdout + second.stderr
        assert second.stderr.strip().splitlines() == [
            f"dfcil: error: sweep directory {out} is in use by another dfcil sweep; wait for it to end (or stop it) "
            f"and run the command again"
        ]
        assert first.wait(timeout=300) == 0, first.stdout.read()
    finally:
        first.kill()
    runs = _runs(out)
    assert sorted(runs) == ["seed1", "seed2"] and all(r["state"] == "done" for r in runs.values())
    assert all((out / name / "summary.json").exists() for name in runs)


@linux_only
def test_the_runs_of_a_killed_sweep_stop_and_the_sweep_finishes_them_when_run_again(tmp_path):
    """SIGKILL of `dfcil sweep`: its running child gets SIGTERM from the kernel, checkpoints and stops (no orphan
    trains on); the same command again resumes it and ends with every run finished."""
    out = tmp_path / "sweep"
    longer = [*TINY_RUN[:-1], "--train.epochs", "15", "--data.num_tasks", "2", "--epoch_checkpoint_interval_s", "600"]
    args = [sys.executable, "-m", "dfcil", "sweep", *longer, "--out", str(out)]
    sweep = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_until(lambda: any(r["state"] == "running" for r in _runs(out).values()), what="the sweep's run")
        _wait_until(lambda: _children(sweep.pid), what="the run's process")
        (child,) = _children(sweep.pid)
        _wait_until(lambda: (out / "smoke" / "metrics.jsonl").exists(), what="the run's first epoch")
        sweep.kill()
        sweep.wait()
        _wait_until(lambda: not _alive(child), timeout=60, what="the orphaned run to stop")
    finally:
        sweep.kill()
    assert not (out / "smoke" / "summary.json").exists()  # it stopped: it did not train on to the end
    assert (out / "smoke" / "checkpoints" / "last.pt").exists()  # as after Ctrl-C: a checkpoint first
    again = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    assert _runs(out)["smoke"]["state"] == "resumed" and (out / "smoke" / "summary.json").exists()


def test_a_run_finished_meanwhile_counts_as_finished(tmp_path):
    """A run whose directory another process completed while the sweep took it for unfinished: its `dfcil train`
    finds the same run finished, trains nothing (exit 0), and the sweep records the run as finished, not failed."""
    from dfcil.load import build_config
    from dfcil.runs.runner import train
    from dfcil.sweep.local import LocalRuns
    from dfcil.sweep.plan import plan
    from dfcil.sweep.state import Sweep
    from dfcil.training.loop import RunOptions

    out = tmp_path / "sweep"
    overrides = [(key.removeprefix("--"), value) for key, value in zip(TINY_RUN[2:-1:2], TINY_RUN[3:-1:2], strict=True)]
    (run,) = plan([[str(CONFIGS / "smoke.yaml")]], [], overrides)
    train(build_config(run.config), out / run.name, RunOptions(progress=False))  # finished by someone else
    (out / "logs").mkdir()
    sweep = Sweep(out, [run], ["dfcil", "sweep"], "local")
    pool = LocalRuns(sweep, 1, [])
    pool.start(run)
    retry: list = []
    _wait_until(lambda: retry.extend(pool.reap()) or not pool.running, what="the run's process")
    assert "holds this run, finished (summary.json exists" in (out / "logs" / f"{run.name}.log").read_text()
    assert retry == [] and run.state == "done" and run.error is None and run.result["last_acc"] is not None


PREPARE = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    import numpy as np
    import dfcil.data.cache as images
    import dfcil.data.decode as decode

    def slow_chunk(files, transform):  # a decoding task that outlasts the test: the workers are busy when killed
        time.sleep(300)

    decode.decode_chunk = slow_chunk  # the forked workers run it
    files = [decode.ImageFile(f"img{i}.png") for i in range(4 * decode.CHUNK)]
    split = images.Split(files, np.zeros(len(files), dtype=np.int64))
    transform = decode.BaseTransform(8, 8)
    images.prepare_cache(Path(sys.argv[1]) / "cache", {"train": split}, transform, {"source": "test"}, workers=2)
""")


@linux_only
def test_decoding_workers_do_not_outlive_a_killed_preparation(tmp_path):
    """SIGKILL of the process preparing a dataset with two decoding workers: the workers end with it."""
    main, workers = subprocess.Popen([sys.executable, "-c", PREPARE, str(tmp_path)]), []
    try:
        _wait_until(lambda: len(_children(main.pid)) >= 2, what="two decoding workers")
        workers = _children(main.pid)
        time.sleep(0.5)  # past their initializer
        main.kill()  # SIGKILL
        main.wait()
        _wait_until(lambda: not any(_alive(w) for w in workers), timeout=30, what="the workers to end")
    finally:
        main.kill()
        for w in workers:  # left alive by a failure: not past the test
            with contextlib.suppress(ProcessLookupError):
                os.kill(w, signal.SIGKILL)


def test_a_directory_whose_config_is_being_written_is_another_processs_run(tmp_path):
    """The window in which the winner of a race has written only the lock and config.yaml's temporary file: the
    other process is told another dfcil process is starting a run there, not that the folder is no run directory."""
    from dfcil.errors import ConfigError
    from dfcil.runs.runner import check_new_run_dir

    out = tmp_path / "run"
    out.mkdir()
    (out / ".lock").touch()
    (out / ".config.yaml.0123456789abcdef.tmp").write_text("method: {}")
    with pytest.raises(ConfigError, match="another dfcil process is starting a run in"):
        check_new_run_dir(out)
    (out / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="exists and is not a dfcil run directory"):
        check_new_run_dir(out)
