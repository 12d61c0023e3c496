"""A sweep's runs as child processes on this machine, ``jobs`` at once, each an ordinary ``python -m dfcil train``
in a session of its own, with its log under ``logs/``; GPU runs get a card of their own by ``CUDA_VISIBLE_DEVICES``
and the CPU cores are shared out between the runs.

The first Ctrl-C or SIGTERM stops the sweep cleanly: every running run checkpoints and stops (rerunning the sweep
resumes it); a second one stops the runs at once (their last checkpoints stay). With a budget (``--budget-s``) each
run is given the time left when it starts, so that it stops at a task boundary rather than in a task it cannot
finish ("paused"); no run starts once the time is up, and a run still going then is stopped as by a signal.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from dfcil.children import die_with_parent
from dfcil.errors import EXIT_BAD_INPUT, EXIT_BUDGET, EXIT_DIVERGED
from dfcil.io import own_copies
from dfcil.sweep.gpus import usable_cores, uses_gpu, visible_device
from dfcil.sweep.plan import SweepRun, run_status
from dfcil.sweep.state import Sweep
from dfcil.training.budget import Budget

MIN_START_S = 1.0  # a run is not started with less time left than this: it would only load and stop


@dataclasses.dataclass
class Running:
    """A run's child process, with what the sweep needs when it ends."""

    run: SweepRun
    started: float
    resumed: bool  # the run directory held an unfinished run when it started
    slot: int  # which of the sweep's ``jobs`` places it holds (and so which GPU)
    log: IO[str]


class LocalRuns:
    """The child processes of a sweep: :meth:`start` one run in a free slot, :meth:`reap` those that ended."""

    def __init__(
        self,
        sweep: Sweep,
        jobs: int,
        gpus: Sequence[int],
        env: Mapping[str, str] | None = None,
        budget: Budget | None = None,
    ) -> None:
        self.sweep, self.jobs, self.gpus = sweep, jobs, gpus  # gpus[k]: the visible GPU of slot k (GPU runs)
        self.budget = budget  # the sweep's time (--budget-s): each run gets what is left when it starts
        self.env = dict(env or {})  # added to every child's environment (the MPS pipe directory)
        self.logs = sweep.out / "logs"
        self.running: dict[subprocess.Popen, Running] = {}
        self.free = list(range(jobs))
        self.threads = max(1, usable_cores() // jobs)
        self.stopping = False  # a signal, or the end of the budget, asked the sweep to stop
        self.signalled = False  # a signal did

    def _environment(self, run: SweepRun, slot: int) -> tuple[dict[str, str], str]:
        """The child's environment, and where it runs in words."""
        env, where = {**os.environ, **self.env, "PYTHONUNBUFFERED": "1"}, "CPU"
        if self.jobs > 1:  # the cores are shared out, on a GPU machine too (its runs need few)
            env["OMP_NUM_THREADS"] = str(self.threads)
            where = f"CPU, {self.threads} thread{'s' if self.threads > 1 else ''}"
        if self.gpus and uses_gpu(run):
            env["CUDA_VISIBLE_DEVICES"] = visible_device(self.gpus[slot])
            where = f"GPU {env['CUDA_VISIBLE_DEVICES']}"
        return env, where

    def start(self, run: SweepRun) -> None:
        """Start ``run`` (or resume it, where its directory holds an unfinished run) in a free slot."""
        slot = self.free.pop(0)
        run.attempts += 1
        env, where = self._environment(run, slot)
        run_dir = self.sweep.out / run.name
        resumed = run_status(run_dir) == "unfinished"
        own_copies(self.logs, (f"{run.name}.log",))  # appended to: a `cp -al` copy's other name keeps its own
        log = open(self.logs / f"{run.name}.log", "a")  # noqa: SIM115 (closed when the child ends)
        log.write(f"--- attempt {run.attempts}: dfcil {' '.join(run.argv(run_dir))}\n")
        log.flush()
        cmd = [sys.executable, "-m", "dfcil", *run.argv(run_dir)]
        if self.budget is not None:
            cmd += ["--budget-s", f"{self.budget.left():.1f}"]
        # a session of its own: a terminal's Ctrl-C reaches the sweep only, which stops each run once; and a
        # SIGTERM from the kernel if the sweep dies without stopping it (SIGKILL): the run checkpoints and stops
        p = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
            preexec_fn=functools.partial(die_with_parent, signal.SIGTERM, os.getpid()) if os.name == "posix" else None,
        )  # fmt: skip
        self.running[p] = Running(run, time.time(), resumed, slot, log)
        run.state = "running"
        self.sweep.say(run, f"{'resuming' if resumed else 'start'} (attempt {run.attempts}, {where})")
        self.sweep.save()

    def reap(self) -> list[SweepRun]:
        """Record the runs whose process ended; returns those to try again."""
        retry = []
        for p in [p for p in self.running if p.poll() is not None]:
            r = self.running.pop(p)
            r.log.close()
            self.free.append(r.slot)
            seconds = time.time() - r.started
            # finished is what the run directory says: a run another process completed meanwhile is done too
            ok = (self.sweep.out / r.run.name / "summary.json").exists()
            if not ok and p.returncode in (130, -signal.SIGKILL) and self.stopping:
                r.run.state, r.run.time_s = "interrupted", round((r.run.time_s or 0) + seconds, 1)
                self.sweep.say(r.run, "interrupted (run the sweep again to resume it from its newest checkpoint)")
                self.sweep.save()
                continue
            if not ok and p.returncode == EXIT_BUDGET:  # stopped at a task boundary: not a failure
                r.run.state, r.run.time_s = "paused", round((r.run.time_s or 0) + seconds, 1)
                why = _tail(self.logs / f"{r.run.name}.log")
                self.sweep.say(r.run, f"paused at a task boundary ({why}); run the sweep again to continue it")
                self.sweep.save()
                continue
            error = None if ok else f"exit {p.returncode}: {_tail(self.logs / f'{r.run.name}.log')}"
            again = p.returncode not in (EXIT_BAD_INPUT, EXIT_DIVERGED)  # those fail the same way a second time
            self.sweep.finished(r.run, ok, seconds, error, r.resumed, retry=again)
            if r.run.state == "pending":
                retry.append(r.run)
        return retry

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self.stopping:  # a second signal: the runs stop at once (their last checkpoints stay)
            for p in self.running:
                p.kill()
            print("dfcil sweep: stopping the runs now, without a new checkpoint", flush=True)
            return
        self.signalled = True
        self.stop(f"{signal.Signals(signum).name}: the running runs checkpoint and stop")

    def stop(self, why: str) -> None:
        """Start no more runs; each running one checkpoints and stops (SIGTERM)."""
        self.stopping = True
        print(f"dfcil sweep: {why}", flush=True)
        for p in self.running:
            p.send_signal(signal.SIGTERM)

    def out_of_time(self) -> bool:
        """Whether the sweep's budget leaves too little to start a run."""
        return self.budget is not None and self.budget.left() < MIN_START_S

    @contextlib.contextmanager
    def signals(self) -> Iterator[None]:
        """Ctrl-C and SIGTERM stop the runs (:meth:`_on_signal`) while the block runs."""
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for s, old in previous.items():
                signal.signal(s, old)


def run_local(
    sweep: Sweep,
    todo: list[SweepRun],
    jobs: int,
    gpus: Sequence[int],
    env: Mapping[str, str] | None = None,
    budget: Budget | None = None,
) -> bool:
    """Run ``todo`` as child processes, ``jobs`` at once; slot k's GPU runs go to visible GPU ``gpus[k]``; ``env``:
    variables added to every child's environment; ``budget``: the sweep's time (see the module's docstring).

    Returns False if the sweep was interrupted (Ctrl-C or SIGTERM: every running child checkpoints and stops); the
    end of the budget is no interruption: the runs it stopped are "paused", "interrupted" or "not started".
    """
    (sweep.out / "logs").mkdir(exist_ok=True)
    pool, queue = LocalRuns(sweep, jobs, gpus, env, budget), list(todo)
    with pool.signals():
        while (queue and not pool.stopping and not pool.out_of_time()) or pool.running:
            while queue and pool.free and not pool.stopping and not pool.out_of_time():
                pool.start(queue.pop(0))
            time.sleep(0.2)
            queue += pool.reap()
            if budget is not None and budget.left() <= 0 and pool.running and not pool.stopping:
                pool.stop("--budget-s is spent: the running runs checkpoint and stop")
    for run in queue:  # stopped before they started
        run.state = "not started"
    sweep.save()
    return not pool.signalled


def _tail(path: Path, n: int = 1) -> str:
    """The last non-empty line(s) of a log, as the reason a run failed."""
    try:
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "no log"
    return " / ".join(lines[-n:]) if lines else "no output"
