"""``dfcil sweep``: many runs from one command, restartable, packed onto the visible GPUs or submitted to SLURM.

A sweep is the product of its config groups (``--config``, each one or more files merged with ``+``) and its grid
(``--grid key=v1,v2``; several keys multiply), with fixed overrides (``--key value``) applied to every run. Each run
is an ordinary ``dfcil train`` in its own directory under the sweep directory, named from what varies (the config's
name when there are several, then ``key=value`` for each grid key with more than one value). ``sweep.json`` at the
top lists every run with its full config and state.

Running the same command again is safe: a finished run (``summary.json``) is skipped, an unfinished one is resumed
(``dfcil train`` on an existing run directory with the same config resumes it), and a run that fails is retried
once, then reported. Every run is a separate process (``python -m dfcil train ...``, or a submitit job calling the
same command line in-process), so a failing or killed run never takes the others with it.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from dfcil.config import ConfigError, RunConfig, changed_keys, config_to_dict, load_config, with_absolute_paths
from dfcil.io import write_json

log = logging.getLogger("dfcil")

FORMAT = 1
RESERVED = frozenset({"logs", "slurm"})  # the sweep's own folders
PATH_KEYS = frozenset({"data.root", "data.cache", "task0_cache"})
MAX_ATTEMPTS = 2  # a failing run is retried once per invocation of the sweep
GPU_RUN_GIB = {64: 3.0}  # a run's GPU memory, estimated from its image size: small images, else LARGE_RUN_GIB
LARGE_RUN_GIB = 24.0
MAX_RUNS_PER_GPU = 6  # beyond about six small runs a card gains nothing (docs/experiments.md)


@dataclasses.dataclass
class SweepRun:
    """One run of a sweep: how to start it (config files and overrides) and what it resolved to."""

    name: str
    configs: tuple[str, ...]
    overrides: tuple[tuple[str, str], ...]
    config: dict[str, Any]
    image_size: int
    # pending, running, done, resumed, failed, interrupted, not started, skipped, submitted
    state: str = "pending"
    attempts: int = 0
    time_s: float | None = None
    error: str | None = None
    job_id: str | None = None
    result: dict[str, Any] | None = None  # from its summary.json, read once when the run is found or ends finished

    def argv(self, run_dir: Path) -> list[str]:
        """``dfcil train`` arguments that start (or, on an existing run directory, resume) this run; paths are
        absolute, so that the command works from any directory (a SLURM job's, for one)."""
        args = ["train"]
        for path in self.configs:
            args += ["--config", os.path.abspath(path)]
        for key, value in self.overrides:
            if key in PATH_KEYS and value.lower() not in ("null", "none", "~", ""):
                value = os.path.abspath(os.path.expanduser(value))
            if key == "log":  # dfcil train's own option takes names, not a YAML list
                value = ",".join(self.config.get("log") or []) or "[]"
                if value == "[]":
                    continue
            args += [f"--{key}", value]
        return [*args, "--out", os.path.abspath(run_dir), "--no-progress"]

    def record(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["dir"] = self.name
        d["overrides"] = [list(o) for o in self.overrides]
        if self.result is None:
            del d["result"]
        return d

    def read_result(self, out: Path) -> None:
        s = json.loads((out / self.name / "summary.json").read_text())
        self.result = {k: s.get(k) for k in ("last_acc", "avg_inc_acc", "forgetting", "total_time_s")}


# ------------------------------------------------------------------------------------------------------ planning


def split_values(text: str) -> list[str]:
    """``"0,1,2"`` -> ``["0", "1", "2"]``; commas inside brackets or quotes belong to the value (``[1,2],[3]``)."""
    out, depth, quote, current = [], 0, None, ""
    for ch in text:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append(current.strip())
            current = ""
            continue
        current += ch
    out.append(current.strip())
    if any(v == "" for v in out):
        raise ConfigError(f"--grid value list {text!r} has an empty value")
    return out


def parse_grid(specs: Sequence[str]) -> list[tuple[str, list[str]]]:
    """``["data.class_order_seed=0,1,2", ...]`` -> ``[("data.class_order_seed", ["0", "1", "2"]), ...]``."""
    grid: list[tuple[str, list[str]]] = []
    for spec in specs:
        key, sep, values = spec.partition("=")
        key = key.strip().removeprefix("--")
        if not sep or not key or not values.strip():
            raise ConfigError(f"--grid {spec!r}: write KEY=V1,V2,... (e.g. --grid data.class_order_seed=0,1,2)")
        if any(key == k for k, _ in grid):
            raise ConfigError(f"--grid gives {key} twice; list all its values in one --grid")
        grid.append((key, split_values(values)))
    return grid


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._=+-]+", "_", text).strip("_") or "run"


def _config_labels(groups: Sequence[Sequence[str]]) -> list[str]:
    """Short distinct names for the config groups: the last file's stem, with its folder where stems repeat."""
    labels = [Path(g[-1]).stem for g in groups]
    if len(set(labels)) < len(labels):
        labels = [f"{Path(g[-1]).parent.name}-{Path(g[-1]).stem}" for g in groups]
    if len(set(labels)) < len(labels):
        labels = ["+".join(Path(p).stem for p in g) for g in groups]
    return [_slug(label) for label in labels]


def plan(
    config_groups: Sequence[Sequence[str]],
    grid: Sequence[tuple[str, Sequence[str]]] = (),
    fixed: Sequence[tuple[str, str]] = (),
) -> list[SweepRun]:
    """Every run of the sweep, validated (a bad key or value fails here, before anything runs)."""
    if not config_groups:
        raise ConfigError("dfcil sweep needs at least one --config FILE.yaml (several files of one run: a.yaml+b.yaml)")
    labels = _config_labels(config_groups)
    varying = [(k, vs) for k, vs in grid if len(vs) > 1]
    short = [k.rsplit(".", 1)[-1] for k, _ in varying]
    if len(set(short)) < len(short):
        short = [k for k, _ in varying]
    runs, names = [], set()
    for label, files in zip(labels, config_groups, strict=True):
        for values in itertools.product(*(vs for _, vs in grid)) if grid else [()]:
            assigned = list(zip((k for k, _ in grid), values, strict=True))
            overrides = (*fixed, *assigned)
            try:
                cfg, _ = load_config(files, overrides)
            except ConfigError as err:
                shown = " ".join(f"{k}={v}" for k, v in assigned)
                raise ConfigError(f"{'+'.join(files)}{' with ' + shown if shown else ''}: {err}") from None
            cfg = with_absolute_paths(cfg)
            if cfg.log:
                from dfcil.loggers import LOGGERS

                for logger in cfg.log:
                    LOGGERS.get(logger)  # an unknown logger fails here, not in every run
            chosen = dict(assigned)
            parts = ([label] if len(config_groups) > 1 else []) + [
                _slug(f"{s}={chosen[k]}") for s, (k, _) in zip(short, varying, strict=True)
            ]
            name = "-".join(parts) or label
            if name in RESERVED:
                raise ConfigError(f"a run would be named {name!r}, as the sweep's own folder: rename its config")
            if name in names:
                raise ConfigError(
                    f"two runs of the sweep would both be named {name!r}: give distinct configs or values"
                )
            names.add(name)
            runs.append(SweepRun(name, tuple(files), tuple(overrides), config_to_dict(cfg), _image_size(cfg)))
    return runs


NATIVE_SIZES = {"tiny_imagenet200": 64, "imagenet100": 224}  # datasets whose images are not 32 px by default


def _image_size(cfg: RunConfig) -> int:
    """The run's image size (for the GPU memory estimate only), without reading its data."""
    return cfg.data.image_size or NATIVE_SIZES.get(cfg.data.name, 32)


def check_existing(runs: Sequence[SweepRun], out: Path) -> None:
    """Refuse a sweep directory whose run directories hold runs with other configs (one clear error, up front)."""
    for r in runs:
        saved = out / r.name / "config.yaml"
        if not saved.exists():
            continue
        try:
            old = config_to_dict(with_absolute_paths(load_config([saved])[0]))
        except ConfigError as err:
            raise ConfigError(
                f"{saved} cannot be read ({err}); move the directory away or choose another --out"
            ) from None
        changed = changed_keys(old, r.config)
        if changed:
            raise ConfigError(
                f"{out / r.name} holds a run with another config ({', '.join(changed[:5])}); this is not the sweep "
                f"that made {out}: choose another --out"
            )


def run_status(run_dir: Path) -> str:
    """``done`` (summary written), ``unfinished`` (a run directory without summary) or ``new``."""
    if (run_dir / "summary.json").exists():
        return "done"
    return "unfinished" if (run_dir / "config.yaml").exists() else "new"


# ------------------------------------------------------------------------------------------------- GPU placement


def free_gpu_memory() -> list[tuple[int, float]]:
    """``(index, free GiB)`` of each visible GPU, queried in a short child process (the sweep's own process never
    holds a CUDA context); empty without CUDA."""
    code = (
        "import json, torch\n"
        "n = torch.cuda.device_count() if torch.cuda.is_available() else 0\n"
        "print(json.dumps([torch.cuda.mem_get_info(i)[0] / 2**30 for i in range(n)]))\n"
    )
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
        free = json.loads(done.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return []
    return list(enumerate(free))


def run_gib(image_size: int) -> float:
    """Estimated GPU memory of one run of this image size."""
    return next((gib for size, gib in sorted(GPU_RUN_GIB.items()) if image_size <= size), LARGE_RUN_GIB)


def default_jobs(runs: Sequence[SweepRun], gpus: Sequence[tuple[int, float]]) -> tuple[int, str]:
    """How many runs to start at once, and why: one on the CPU; on GPUs as many as fit in free memory, at most
    ``MAX_RUNS_PER_GPU`` per card."""
    if not gpus or not any(_uses_gpu(r) for r in runs):
        return 1, "one run at a time on the CPU (--jobs K to change; each run then gets cores/K threads)"
    need = max(run_gib(r.image_size) for r in runs)
    jobs = max(1, min(len(runs), sum(_capacity(gpus, need))))
    each = ", ".join(f"GPU {i}: {free:.0f} GiB free" for i, free in gpus)
    return jobs, f"{jobs} at once ({each}; about {need:g} GiB per run, at most {MAX_RUNS_PER_GPU} per GPU)"


def _capacity(gpus: Sequence[tuple[int, float]], need: float) -> list[int]:
    """Runs of ``need`` GiB that fit on each card (at most ``MAX_RUNS_PER_GPU``)."""
    return [min(MAX_RUNS_PER_GPU, int(free // need)) for _, free in gpus]


def placement(gpus: Sequence[tuple[int, float]], need: float, jobs: int) -> list[int]:
    """The card (index among the visible ones) of each of ``jobs`` slots: cards filled in turn up to their
    capacity, so that a nearly full card gets no run while another has room; beyond every card's capacity (an
    explicit ``--jobs``), round-robin over all of them."""
    left = _capacity(gpus, need)
    slots: list[int] = []
    while len(slots) < jobs and any(left):
        for k, (i, _) in enumerate(gpus):
            if left[k] and len(slots) < jobs:
                slots.append(i)
                left[k] -= 1
    while len(slots) < jobs:
        slots.append(gpus[len(slots) % len(gpus)][0])
    return slots


def visible_device(index: int) -> str:
    """The ``CUDA_VISIBLE_DEVICES`` entry of the ``index``-th GPU this process sees (its own list, if it has one:
    indices count within it)."""
    mine = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    return mine[index] if index < len(mine) else str(index)


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))  # what this process may use (taskset, SLURM, containers)
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _uses_gpu(run: SweepRun) -> bool:
    return str(run.config.get("device", "auto")) in ("auto", "cuda")


# ------------------------------------------------------------------------------------------------------ running


class Sweep:
    """The sweep directory: its runs, their states in ``sweep.json``, and the console lines."""

    def __init__(self, out: Path, runs: list[SweepRun], command: Sequence[str], launcher: str) -> None:
        self.out, self.runs, self.command, self.launcher = out, runs, list(command), launcher
        self.started = time.time()
        old = self._load()
        for r in runs:
            r.job_id = old.get(r.name, {}).get("job_id")

    def _load(self) -> dict[str, dict[str, Any]]:
        path = self.out / "sweep.json"
        if not path.exists():
            return {}
        try:
            return {r["name"]: r for r in json.loads(path.read_text()).get("runs", [])}
        except (ValueError, KeyError, TypeError, AttributeError):
            return {}

    def save(self) -> None:
        write_json(
            self.out / "sweep.json",
            {
                "format": FORMAT,
                "command": self.command,
                "launcher": self.launcher,
                "runs": [r.record() for r in self.runs],
            },
        )

    def say(self, run: SweepRun, what: str) -> None:
        i = self.runs.index(run) + 1
        print(f"[{i}/{len(self.runs)}] {run.name}: {what}", flush=True)

    def finished(self, run: SweepRun, ok: bool, seconds: float, error: str | None, resumed: bool) -> None:
        run.time_s = round((run.time_s or 0) + seconds, 1)
        if ok:
            run.state, run.error = ("resumed" if resumed else "done"), None
            run.read_result(self.out)
            self.say(run, f"{run.state} in {seconds:.0f} s, A_N {run.result['last_acc']:.2f}")
        else:
            run.error = error
            retry = run.attempts < MAX_ATTEMPTS
            run.state = "pending" if retry else "failed"
            self.say(run, f"failed ({error}){'; retrying' if retry else ''}")
        self.save()

    def table(self) -> str:
        lines = ["| run | state | attempts | time (s) | A_N |", "|---|---|---:|---:|---:|"]
        for r in self.runs:
            acc = f"{r.result['last_acc']:.2f}" if r.result else "—"
            t = f"{r.time_s:.0f}" if r.time_s is not None else "—"
            lines.append(f"| {r.name} | {r.state} | {r.attempts} | {t} | {acc} |")
        counts: dict[str, int] = {}
        for r in self.runs:
            counts[r.state] = counts.get(r.state, 0) + 1
        lines.append("")
        lines.append(
            ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) + f"; {time.time() - self.started:.0f} s in all"
        )
        return "\n".join(lines)


def _tail(path: Path, n: int = 1) -> str:
    """The last non-empty line(s) of a log, as the reason a run failed."""
    try:
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "no log"
    return " / ".join(lines[-n:]) if lines else "no output"


def run_local(sweep: Sweep, todo: list[SweepRun], jobs: int, gpus: Sequence[int]) -> bool:
    """Run ``todo`` as child processes, ``jobs`` at once; slot k's GPU runs go to visible GPU ``gpus[k]``.

    Returns False if the sweep was interrupted (Ctrl-C or SIGTERM: every running child checkpoints and stops).
    """
    logs = sweep.out / "logs"
    logs.mkdir(exist_ok=True)
    queue = list(todo)
    running: dict[subprocess.Popen, tuple[SweepRun, float, bool, Any]] = {}
    slots = list(range(jobs))
    stop = {"requested": False}

    def handler(signum, frame):
        if stop["requested"]:  # a second signal: the runs stop at once (their last checkpoints stay)
            for p in running:
                p.kill()
            print("dfcil sweep: stopping the runs now, without a new checkpoint", flush=True)
            return
        stop["requested"] = True
        print(f"dfcil sweep: {signal.Signals(signum).name}: the running runs checkpoint and stop", flush=True)
        for p in running:
            p.send_signal(signal.SIGTERM)

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    threads = max(1, usable_cores() // jobs)
    free_slots = list(slots)
    try:
        while (queue and not stop["requested"]) or running:
            while queue and free_slots and not stop["requested"]:
                run, slot = queue.pop(0), free_slots.pop(0)
                run.attempts += 1
                env = dict(os.environ, PYTHONUNBUFFERED="1")
                where = "CPU"
                if jobs > 1:  # the cores are shared out, on a GPU machine too (its runs need few)
                    env["OMP_NUM_THREADS"] = str(threads)
                    where = f"CPU, {threads} threads"
                if gpus and _uses_gpu(run):
                    env["CUDA_VISIBLE_DEVICES"] = visible_device(gpus[slot])
                    where = f"GPU {env['CUDA_VISIBLE_DEVICES']}"
                resumed = run_status(sweep.out / run.name) == "unfinished"
                log_file = open(logs / f"{run.name}.log", "a")  # noqa: SIM115 (closed when the child ends)
                log_file.write(f"--- attempt {run.attempts}: dfcil {' '.join(run.argv(sweep.out / run.name))}\n")
                log_file.flush()
                cmd = [sys.executable, "-m", "dfcil", *run.argv(sweep.out / run.name)]
                # a session of its own: a terminal's Ctrl-C reaches the sweep only, which stops each run once
                p = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, env=env, start_new_session=True)
                running[p] = (run, time.time(), resumed, (slot, log_file))
                run.state = "running"
                sweep.say(run, f"{'resuming' if resumed else 'start'} (attempt {run.attempts}, {where})")
                sweep.save()
            time.sleep(0.2)
            for p in [p for p in running if p.poll() is not None]:
                run, t0, resumed, (slot, log_file) = running.pop(p)
                log_file.close()
                free_slots.append(slot)
                ok = p.returncode == 0 and (sweep.out / run.name / "summary.json").exists()
                if p.returncode in (130, -signal.SIGKILL) and stop["requested"]:
                    run.state, run.time_s = "interrupted", round((run.time_s or 0) + time.time() - t0, 1)
                    sweep.say(run, "interrupted (run the sweep again to resume it from its newest checkpoint)")
                    sweep.save()
                    continue
                error = None if ok else f"exit {p.returncode}: {_tail(logs / f'{run.name}.log')}"
                sweep.finished(run, ok, time.time() - t0, error, resumed)
                if run.state == "pending":
                    queue.append(run)
    finally:
        for s, old in previous.items():
            signal.signal(s, old)
    for run in queue:  # stopped before they started
        run.state = "not started"
    sweep.save()
    return not stop["requested"]


# -------------------------------------------------------------------------------------------------------- SLURM


class SweepJob:
    """A submitit job: one run's ``dfcil train`` command line, in-process; with ``procs`` > 1 under
    ``torchrun --standalone --nproc-per-node procs`` (one process per GPU of the job; docs/distributed.md). A
    preempted or timed-out job is requeued (``checkpoint``) and resumes from the run's newest checkpoint."""

    def __init__(self, argv: list[str], procs: int = 1) -> None:
        self.argv, self.procs = argv, procs

    def __call__(self) -> int:
        if self.procs > 1:  # torchrun forwards a preemption's SIGTERM to every process: they stop together
            torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node"]
            code = subprocess.call([*torchrun, str(self.procs), "-m", "dfcil", *self.argv])
        else:
            from dfcil.cli import main

            code = main(self.argv)
        if code != 0:
            raise RuntimeError(f"dfcil {' '.join(self.argv)} exited with {code}")
        return code

    def checkpoint(self) -> Any:
        import submitit

        return submitit.helpers.DelayedSubmission(SweepJob(self.argv, self.procs))


SLURM_OPTIONS = {  # --slurm.<key>: (type, submitit parameter, help)
    "partition": (str, "slurm_partition", "the partition"),
    "gpus_per_node": (int, "gpus_per_node", "GPUs per run (default: procs)"),
    "procs": (int, None, "processes per run (default 1); more start each run under torchrun, one per GPU"),
    "cpus_per_task": (int, "cpus_per_task", "CPU cores per run"),
    "mem_gb": (float, "mem_gb", "host memory per run, GB"),
    "timeout_min": (int, "timeout_min", "time limit per job, minutes (a job that hits it is requeued)"),
    "account": (str, "slurm_account", "the account"),
    "qos": (str, "slurm_qos", "the QOS"),
    "array_parallelism": (int, "slurm_array_parallelism", "runs of the job array running at once"),
}


def run_slurm(sweep: Sweep, todo: list[SweepRun], options: dict[str, Any], wait: bool, cluster: str | None) -> bool:
    """Submit ``todo`` through submitit (a job array, or one job per run with ``array: false``); wait for them
    unless ``wait`` is False. Runs whose recorded job is still queued or running are not submitted again."""
    try:
        import submitit
    except ImportError:
        raise ConfigError("--launcher slurm needs submitit: pip install 'dfcil[slurm]'") from None
    folder = sweep.out / "slurm"
    executor = submitit.AutoExecutor(folder=folder / "%j", cluster=cluster)
    procs = options.get("procs") or 1
    params = {"gpus_per_node": procs, "timeout_min": 24 * 60, "slurm_signal_delay_s": 120}
    submitit_keys = {k: v[1] for k, v in SLURM_OPTIONS.items() if v[1] is not None}  # procs is dfcil's own
    params |= {submitit_keys[k]: v for k, v in options.items() if k in submitit_keys and v is not None}
    if cluster == "local":  # the local executor knows no SLURM keys
        params = {k: v for k, v in params.items() if not k.startswith("slurm_")}
    executor.update_parameters(name="dfcil-sweep", **params)
    active = {"PENDING", "RUNNING", "REQUEUED", "CONFIGURING", "COMPLETING", "RESIZING", "SUSPENDED"}
    submit = []
    queued = []  # (run, job) of runs whose job from an earlier invocation is still queued or running
    for run in todo:
        if run.job_id and cluster != "local":
            job = submitit.SlurmJob(folder=folder / "%j", job_id=run.job_id)
            if job.state.split()[0] in active:
                run.state = "submitted"
                sweep.say(run, f"job {run.job_id} is {job.state.lower()}; not submitted again")
                queued.append((run, job))
                continue
        submit.append(run)
    resumed = {r.name: run_status(sweep.out / r.name) == "unfinished" for r in submit}
    fns = [SweepJob(r.argv(sweep.out / r.name), procs) for r in submit]
    if options.get("array", True):
        jobs = executor.submit_array(fns) if fns else []
    else:
        jobs = [executor.submit(fn) for fn in fns]
    for run, job in zip(submit, jobs, strict=True):
        run.job_id, run.state = str(job.job_id), "submitted"
        run.attempts += 1
        sweep.say(run, f"submitted as job {job.job_id}")
    sweep.save()
    if not wait:
        print(f"dfcil sweep: {len(jobs)} jobs submitted; run the same command again to see their states", flush=True)
        return True
    resumed |= {run.name: True for run, _ in queued}
    for run, job in [*queued, *zip(submit, jobs, strict=True)]:
        t0 = time.time()
        try:
            job.result()
            sweep.finished(run, True, time.time() - t0, None, resumed[run.name])
        except Exception as err:  # noqa: BLE001 (a failed job is reported, the others go on)
            run.attempts = MAX_ATTEMPTS
            sweep.finished(run, False, time.time() - t0, str(err).strip().splitlines()[-1][:300], resumed[run.name])
    return True


# ----------------------------------------------------------------------------------------------------- the command


def sweep(
    config_groups: Sequence[Sequence[str]],
    grid: Sequence[tuple[str, Sequence[str]]],
    fixed: Sequence[tuple[str, str]],
    out: str | os.PathLike,
    jobs: int | None = None,
    dry_run: bool = False,
    launcher: str = "local",
    slurm: dict[str, Any] | None = None,
    wait: bool = True,
    command: Sequence[str] = (),
    gpus: Callable[[], list[tuple[int, float]]] = free_gpu_memory,
) -> int:
    """Plan, then run or submit, every run of the sweep into ``out``; 0 when every run finished."""
    out = Path(out)
    runs = plan(config_groups, grid, fixed)
    check_existing(runs, out)
    status = {r.name: run_status(out / r.name) for r in runs}
    if dry_run:
        print(f"sweep of {len(runs)} runs into {out}:")
        for r in runs:
            print(f"  {r.name} [{status[r.name]}]: dfcil {' '.join(r.argv(out / r.name))}")
        return 0
    if jobs is not None and jobs < 1:
        raise ConfigError(f"--jobs {jobs}: give at least 1")
    check_sweep_dir(out, [r.name for r in runs])
    out.mkdir(parents=True, exist_ok=True)
    s = Sweep(out, runs, command, launcher)
    todo = []
    for r in runs:
        if status[r.name] == "done":
            r.state = "skipped"
            r.read_result(out)
        else:
            todo.append(r)
    skipped = len(runs) - len(todo)
    print(f"dfcil sweep: {len(runs)} runs in {out} ({skipped} finished before, skipped)", flush=True)
    s.save()
    ok = True
    if todo and launcher == "slurm":
        ok = run_slurm(s, todo, slurm or {}, wait, (slurm or {}).get("cluster"))
    elif todo:
        visible = gpus() if any(_uses_gpu(r) for r in todo) else []
        chosen, why = default_jobs(todo, visible)
        if jobs is None:
            jobs = chosen
            print(f"dfcil sweep: jobs: {why}", flush=True)
        jobs = min(jobs, len(todo))
        need = max(run_gib(r.image_size) for r in todo)
        ok = run_local(s, todo, jobs, placement(visible, need, jobs) if visible else [])
    s.save()
    print(s.table(), flush=True)
    if not ok:
        print(f"dfcil sweep: interrupted; run the same command again to resume ({out / 'sweep.json'})", flush=True)
        return 130
    failed = [r.name for r in runs if r.state == "failed"]
    if failed:
        print(f"dfcil sweep: {len(failed)} runs failed: see {out / 'logs'} and sweep.json", flush=True)
        return 1
    waiting = [r.name for r in runs if r.state not in ("done", "resumed", "skipped")]
    if waiting:
        print(f"dfcil sweep: {len(waiting)} runs not finished yet ({', '.join(waiting[:3])}, ...)", flush=True)
        return 3
    return 0


def check_sweep_dir(out: Path, names: Sequence[str]) -> None:
    """Refuse an ``--out`` that is a file, a run directory, or a folder holding anything but this sweep's runs."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file; give a directory for the sweep")
    if (out / "config.yaml").exists():
        raise ConfigError(f"--out {out} is a run directory; give a new directory (or an earlier sweep's) instead")
    if out.is_dir() and not (out / "sweep.json").exists():
        ours = {*names, *RESERVED}
        others = sorted(p.name for p in out.iterdir() if p.name not in ours and not p.name.startswith("."))
        if others:
            raise ConfigError(
                f"--out {out} holds no sweep.json and other things than this sweep's runs ({', '.join(others[:3])}): "
                f"choose a new directory for the sweep"
            )
