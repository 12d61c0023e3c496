"""CUDA MPS (Multi-Process Service) for the runs a sweep packs on its GPUs.

Without MPS, the processes of concurrent runs take turns on a card (time slicing): one run's small kernels leave
most of the card idle while the others wait. Under MPS their kernels share the card at once. ``--mps auto`` (the
default) uses it wherever a sweep runs several runs at once on GPUs: an MPS control daemon the user (or the
cluster) already runs is used as it is; else the sweep starts its own, with its pipe and log directories in a
fresh temporary directory (no root needed, nothing shared with other users' sweeps), and stops it when the sweep
ends. Where ``nvidia-cuda-mps-control`` is missing or the daemon does not start, the runs time-slice as before;
the sweep says which in its log. ``--mps on`` makes that an error; ``--mps off`` never uses MPS.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Literal

from dfcil.errors import ConfigError

CONTROL = "nvidia-cuda-mps-control"  # the MPS control program, part of the NVIDIA driver's utilities
DEFAULT_PIPE = "/tmp/nvidia-mps"  # the pipe directory of a daemon started without CUDA_MPS_PIPE_DIRECTORY

MpsSetting = Literal["auto", "on", "off"]


def daemon_running(env: Mapping[str, str]) -> bool:
    """Whether an MPS control daemon listens in the pipe directory that ``env`` names (or the default one)."""
    return (Path(env.get("CUDA_MPS_PIPE_DIRECTORY") or DEFAULT_PIPE) / "control").exists()


@contextlib.contextmanager
def mps(setting: MpsSetting, concurrent_gpu_runs: bool, say=print) -> Iterator[dict[str, str]]:  # noqa: ANN001
    """While the block runs, MPS serves the sweep's GPU runs where ``setting`` and the machine allow. Yields the
    variables to add to the runs' environment (the pipe directory of a daemon started here; nothing where a daemon
    was running already or MPS is not used). ``concurrent_gpu_runs``: whether several runs share GPUs at all."""
    if setting == "off" or not concurrent_gpu_runs:
        if setting == "on":
            say("dfcil sweep: MPS: not needed (one run at a time, or no run on a GPU)")
        yield {}
        return
    control = shutil.which(CONTROL)
    if control is None:
        _refuse_or_say(setting, f"{CONTROL} is not on PATH (it comes with the NVIDIA driver's utilities)", say)
        yield {}
        return
    if daemon_running(os.environ):
        say("dfcil sweep: MPS: on (the MPS daemon already running here serves the runs)")
        yield {}
        return
    home = Path(tempfile.mkdtemp(prefix="dfcil-mps-"))  # short: the daemon's socket path has a length limit
    env = {"CUDA_MPS_PIPE_DIRECTORY": str(home / "pipe"), "CUDA_MPS_LOG_DIRECTORY": str(home / "log")}
    for d in env.values():
        Path(d).mkdir()
    try:
        started = subprocess.run([control, "-d"], env={**os.environ, **env}, capture_output=True, text=True, timeout=30)
        ok = started.returncode == 0
        why = (started.stderr or started.stdout).strip() or f"exit code {started.returncode}"
    except (OSError, subprocess.TimeoutExpired) as err:
        ok, why = False, str(err)
    if not ok:
        shutil.rmtree(home, ignore_errors=True)
        _refuse_or_say(setting, f"its daemon did not start ({why})", say)
        yield {}
        return
    say(f"dfcil sweep: MPS: on (a daemon started for this sweep, pipe {env['CUDA_MPS_PIPE_DIRECTORY']})")
    try:
        yield env
    finally:
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            subprocess.run([control], input="quit\n", env={**os.environ, **env}, capture_output=True, text=True,
                           timeout=30)  # fmt: skip
        shutil.rmtree(home, ignore_errors=True)
        say("dfcil sweep: MPS: its daemon stopped")


def _refuse_or_say(setting: MpsSetting, why: str, say) -> None:  # noqa: ANN001
    if setting == "on":
        raise ConfigError(f"--mps on: CUDA MPS cannot be used: {why}; use --mps auto (time slicing without it)")
    say(f"dfcil sweep: MPS: off ({why}); the runs on a GPU take turns on it")
