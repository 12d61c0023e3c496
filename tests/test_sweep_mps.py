"""CUDA MPS for a sweep's concurrent GPU runs (dfcil.sweep.mps), with a stand-in nvidia-cuda-mps-control: started
for the sweep where no daemon runs and stopped after it, an existing daemon used as it is, and plain time slicing
(said in the log) where the control program is missing or fails."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from dfcil.errors import ConfigError
from dfcil.sweep.mps import mps

# A stand-in for the control program: `-d` starts a "daemon" (a control file in the pipe directory), stdin "quit"
# stops it; every call is appended to $FAKE_MPS_LOG. FAKE_MPS_FAIL=1 makes `-d` fail as a driver without MPS does.
FAKE = """#!/bin/sh
pipe=${CUDA_MPS_PIPE_DIRECTORY:-/tmp/nvidia-mps}
if [ "$1" = "-d" ]; then
  echo "start $pipe" >> "$FAKE_MPS_LOG"
  [ "${FAKE_MPS_FAIL:-0}" = 1 ] && { echo "An instance of this daemon is already running" >&2; exit 1; }
  touch "$pipe/control"; exit 0
fi
read cmd; echo "$cmd $pipe" >> "$FAKE_MPS_LOG"; [ "$cmd" = quit ] && rm -f "$pipe/control"; exit 0
"""


@pytest.fixture
def fake_control(tmp_path, monkeypatch) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "nvidia-cuda-mps-control"
    exe.write_text(FAKE)
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_MPS_LOG", str(tmp_path / "calls.txt"))
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path / "no-daemon-here"))
    return tmp_path / "calls.txt"


def test_a_daemon_is_started_for_the_sweep_its_runs_see_it_and_it_is_stopped_after(fake_control) -> None:
    said = []
    with mps("auto", True, said.append) as env:
        pipe = Path(env["CUDA_MPS_PIPE_DIRECTORY"])
        assert (pipe / "control").exists() and Path(env["CUDA_MPS_LOG_DIRECTORY"]).is_dir()
        child = subprocess.run(
            [sys.executable, "-c", "import os; print(os.environ['CUDA_MPS_PIPE_DIRECTORY'])"],
            env={**os.environ, **env}, capture_output=True, text=True, check=True,
        )  # fmt: skip
        assert child.stdout.strip() == str(pipe)
    assert fake_control.read_text().splitlines() == [f"start {pipe}", f"quit {pipe}"]
    assert not pipe.parent.exists()  # the sweep's temporary pipe and log directories are gone
    assert said[0].startswith("dfcil sweep: MPS: on (a daemon started for this sweep") and "stopped" in said[-1]


def test_a_running_daemon_is_used_as_it_is(fake_control, tmp_path, monkeypatch) -> None:
    (tmp_path / "theirs").mkdir()
    (tmp_path / "theirs" / "control").touch()
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path / "theirs"))
    said = []
    with mps("auto", True, said.append) as env:
        assert env == {}  # the runs inherit the pipe directory the user set
    assert not fake_control.exists()  # neither started nor stopped
    assert (tmp_path / "theirs" / "control").exists()
    assert said == ["dfcil sweep: MPS: on (the MPS daemon already running here serves the runs)"]


def test_without_the_control_program_or_a_daemon_the_runs_time_slice_and_the_log_says_so(
    fake_control, monkeypatch
) -> None:
    monkeypatch.setenv("FAKE_MPS_FAIL", "1")
    said = []
    with mps("auto", True, said.append) as env:
        assert env == {}
    assert "MPS: off (its daemon did not start (An instance of this daemon is already running))" in said[0]
    refused = pytest.raises(ConfigError, match="--mps on: CUDA MPS cannot be used: its daemon did not start")
    with refused, mps("on", True, said.append):
        pass
    monkeypatch.setenv("PATH", "/nonexistent")
    said.clear()
    with mps("auto", True, said.append) as env:
        assert env == {}
    assert said == [
        "dfcil sweep: MPS: off (nvidia-cuda-mps-control is not on PATH (it comes with the NVIDIA driver's "
        "utilities)); the runs on a GPU take turns on it"
    ]


def test_off_or_one_run_at_a_time_leaves_the_gpu_alone(fake_control) -> None:
    for setting, concurrent in (("off", True), ("auto", False), ("on", False)):
        with mps(setting, concurrent, lambda line: None) as env:
            assert env == {}
    assert not fake_control.exists()


def test_a_cpu_sweep_passes_the_extra_environment_to_its_runs(tmp_path) -> None:
    """run_local adds the MPS variables to every child's environment (what a GPU sweep does under MPS)."""
    from dfcil.sweep.local import LocalRuns
    from dfcil.sweep.plan import SweepRun
    from dfcil.sweep.state import Sweep

    run = SweepRun(name="r", configs=(), overrides=(), config={"device": "cuda"}, image_size=32)
    pool = LocalRuns(Sweep(tmp_path, [run], [], "local"), 2, [0], {"CUDA_MPS_PIPE_DIRECTORY": "/x/pipe"})
    env, where = pool._environment(run, 0)
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/x/pipe" and env["CUDA_VISIBLE_DEVICES"] == "0" and where == "GPU 0"
