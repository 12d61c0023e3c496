"""``dfcil sweep``: many runs from one command, restartable, packed onto the visible GPUs or submitted to SLURM.

A sweep is the product of its config groups (``--config``, each one or more files merged with ``+``) and its grid
(``--grid key=v1,v2``; several keys multiply), with fixed overrides (``--key value``) applied to every run
(:mod:`~dfcil.sweep.plan`). ``sweep.json`` at the top lists every run with its full config and state
(:mod:`~dfcil.sweep.state`).

Running the same command again is safe: a finished run (``summary.json``) is skipped, an unfinished one is resumed
(``dfcil train`` on an existing run directory with the same config resumes it), and a run that fails is retried
once, then reported. Every run is a separate process (:mod:`~dfcil.sweep.local`: ``python -m dfcil train ...``
placed by :mod:`~dfcil.sweep.gpus`; or :mod:`~dfcil.sweep.slurm`: a submitit job that trains it through the
runner's API), so a failing or killed run never takes the others with it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from filelock import FileLock, Timeout

from dfcil.errors import EXIT_BUDGET, ConfigError
from dfcil.io import FOREIGN_DIRS, check_creatable_dir, check_writable_tree, shared_lock_note
from dfcil.sweep.gpus import default_jobs, free_gpu_memory, placement, run_gib, uses_gpu
from dfcil.sweep.local import run_local
from dfcil.sweep.mps import MpsSetting, mps
from dfcil.sweep.plan import (
    RESERVED,
    DamagedSummary,
    SweepRun,
    check_existing,
    check_sweep_dir,
    keep_earlier_names,
    plan,
    run_status,
)
from dfcil.sweep.slurm import run_slurm
from dfcil.sweep.state import Sweep
from dfcil.training.budget import Budget


@dataclasses.dataclass(frozen=True, kw_only=True)
class SweepSpec:
    """What ``dfcil sweep`` was asked for."""

    configs: Sequence[Sequence[str]]  # a row of runs per group: the group's config files, merged in order
    grid: Sequence[tuple[str, Sequence[str]]] = ()  # (key, values): every combination is a run of every row
    fixed: Sequence[tuple[str, str]] = ()  # (key, value) overrides applied to every run
    out: Path  # the sweep directory: a run directory per run, sweep.json, logs/
    jobs: int | None = None  # local runs at once; None: one on the CPU, else as many as fit the GPUs' free memory
    dry_run: bool = False  # print the runs and their states, run nothing
    launcher: Literal["local", "slurm"] = "local"
    slurm: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # --slurm.KEY options (and cluster)
    wait: bool = True  # slurm: wait for the jobs (else submit and return)
    command: Sequence[str] = ()  # the command line, recorded in sweep.json
    plugins: Sequence[str] = ()  # --plugin: modules or .py files every run imports (added to its config's plugins)
    trust_plugins: bool = False  # --trust-plugins: a run directory's config.yaml given as --config may name plugins
    mps: MpsSetting = "auto"  # CUDA MPS for runs sharing GPUs (dfcil.sweep.mps)
    budget_s: float | None = None  # the sweep's time: local runs are given what is left (dfcil.sweep.local)


def sweep(spec: SweepSpec, gpus: Callable[[], list[tuple[int, float]]] = free_gpu_memory) -> int:
    """Plan, then run or submit, every run of the sweep into ``spec.out``; 0 when every run finished, 1 when one
    failed, 3 while submitted jobs are not finished yet, 130 when interrupted. ``gpus``: the visible GPUs' free
    memory (tests give their own)."""
    out, budget = Path(spec.out), Budget.of(spec.budget_s)  # the sweep's time, its planning included
    runs = plan(spec.configs, spec.grid, spec.fixed, spec.plugins, spec.trust_plugins)
    if kept := keep_earlier_names(runs, out):
        print(f"dfcil sweep: {kept} runs keep the names an earlier dfcil gave them (key=value)", flush=True)
    check_existing(runs, out)
    if spec.jobs is not None and spec.jobs < 1:
        raise ConfigError(f"--jobs {spec.jobs}: give at least 1")
    if spec.budget_s is not None and spec.launcher != "local":
        raise ConfigError("--budget-s times the runs this machine starts: it needs --launcher local")
    check_sweep_dir(out, [r.name for r in runs])  # a dry run refuses what the sweep would refuse
    check_writable_sweep_dir(out)
    if spec.dry_run:
        print(f"sweep of {len(runs)} runs into {out}:")
        for r in runs:
            print(f"  {r.name} [{run_status(out / r.name)}]: dfcil {' '.join(r.argv(out / r.name))}")
        return 0
    out.mkdir(parents=True, exist_ok=True)
    lock = FileLock(out / ".sweep.lock")  # one sweep at a time in a sweep directory, for as long as it runs
    try:
        lock.acquire(timeout=0)
    except Timeout:
        raise ConfigError(
            f"sweep directory {out} is in use by another dfcil sweep; wait for it to end (or stop it) and run the "
            f"command again{shared_lock_note(out / '.sweep.lock')}"
        ) from None
    try:
        return _run(spec, out, runs, gpus, budget)
    finally:
        lock.release()


def check_writable_sweep_dir(out: Path) -> None:
    """Refuse, before any run starts, a sweep directory that cannot be created or written, or whose writes would
    leave it (links to elsewhere in a sweep directory received from someone else)."""
    try:
        if out.exists():
            check_writable_tree(out, "sweep directory", "or give another --out", tuple(RESERVED), (), FOREIGN_DIRS)
        else:
            check_creatable_dir(out, "sweep directory", "give another --out")
    except ValueError as err:
        raise ConfigError(str(err)) from None


def _run(
    spec: SweepSpec,
    out: Path,
    runs: list[SweepRun],
    gpus: Callable[[], list[tuple[int, float]]],
    budget: Budget | None = None,
) -> int:
    """The sweep proper, its directory locked: skip the finished runs, run or submit the others, report."""
    status = {r.name: run_status(out / r.name) for r in runs}
    s = Sweep(out, runs, spec.command, spec.launcher)
    todo = []
    for r in runs:
        if status[r.name] == "done":
            try:
                r.read_result(out)
                r.state = "skipped"
            except DamagedSummary as err:  # that run is reported failed; the others go on
                r.state, r.error = "failed", str(err)
                print(f"dfcil sweep: {r.name}: {err}", flush=True)
        else:
            todo.append(r)
    print(f"dfcil sweep: {len(runs)} runs in {out} ({len(runs) - len(todo)} finished before, skipped)", flush=True)
    for r in todo:  # what each run trains, fixed now: config files edited while the sweep runs change nothing
        r.write_planned_config(out / "logs")
    s.save()
    ok = True
    if todo and spec.launcher == "slurm":
        ok = run_slurm(s, todo, dict(spec.slurm), spec.wait, spec.slurm.get("cluster"))
    elif todo:
        visible = gpus() if any(uses_gpu(r) for r in todo) else []
        jobs, why = default_jobs(todo, visible)
        if spec.jobs is None:
            print(f"dfcil sweep: jobs: {why}", flush=True)
        jobs = min(spec.jobs or jobs, len(todo))
        need = max(run_gib(r.image_size) for r in todo)
        with mps(spec.mps, bool(visible) and jobs > 1) as env:  # kernels of concurrent runs at once on a card
            ok = run_local(s, todo, jobs, placement(visible, need, jobs) if visible else [], env, budget)
    s.save()
    print(s.table(), flush=True)
    return _exit_code(s, ok)


def _exit_code(s: Sweep, ok: bool) -> int:
    """Say how the sweep ended, and return its exit code."""
    if not ok:
        print(f"dfcil sweep: interrupted; run the same command again to resume ({s.out / 'sweep.json'})", flush=True)
        return 130
    failed = [r.name for r in s.runs if r.state == "failed"]
    if failed:
        print(f"dfcil sweep: {len(failed)} runs failed: see {s.out / 'logs'} and sweep.json", flush=True)
        return 1
    stopped = [r.name for r in s.runs if r.state in ("paused", "interrupted", "not started")]
    if stopped:  # only the budget stops runs without a signal
        print(f"dfcil sweep: --budget-s is spent, {len(stopped)} runs to go ({', '.join(stopped[:3])}, ...): run the "
              f"same command again to continue them", flush=True)  # fmt: skip
        return EXIT_BUDGET
    waiting = [r.name for r in s.runs if r.state not in ("done", "resumed", "skipped")]
    if waiting:
        print(f"dfcil sweep: {len(waiting)} runs not finished yet ({', '.join(waiting[:3])}, ...)", flush=True)
        return 3
    return 0
