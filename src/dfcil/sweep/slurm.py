"""A sweep's runs as SLURM jobs, through submitit: a job array (or one job per run), each job one run, requeued
when preempted or out of time, resuming from the run's newest checkpoint."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from dfcil.errors import ConfigError
from dfcil.sweep.plan import SweepRun, run_status
from dfcil.sweep.state import MAX_ATTEMPTS, Sweep


class SweepJob:
    """A submitit job: one run, in-process through the runner's API (:func:`dfcil.runs.runner.train` on the run's
    resolved config, which resumes an unfinished run directory); with ``procs`` > 1, its ``dfcil train`` command
    line (``argv``) under ``torchrun --standalone --nproc-per-node procs`` (one process per GPU of the job;
    docs/distributed.md). A preempted or timed-out job is requeued (``checkpoint``) and resumes from the run's
    newest checkpoint."""

    def __init__(self, config: dict[str, Any], out: str, argv: list[str], procs: int = 1) -> None:
        self.config, self.out, self.argv, self.procs = config, out, argv, procs

    def __call__(self) -> int:
        if self.procs > 1:  # torchrun forwards a preemption's SIGTERM to every process: they stop together
            torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node"]
            code = subprocess.call([*torchrun, str(self.procs), "-m", "dfcil", *self.argv])
            if code != 0:
                raise RuntimeError(f"dfcil {' '.join(self.argv)} exited with {code}")
            return code
        from dfcil.load import build_config
        from dfcil.progress import log_to_console
        from dfcil.runs.runner import RunOptions, train
        from dfcil.runs.signals import stop_on_signals

        log_to_console()
        options = RunOptions(progress=False, argv=self.argv)
        with stop_on_signals(options.interrupt):  # SIGTERM: a checkpoint, then RunInterrupted
            train(build_config(self.config), Path(self.out), options)
        return 0

    def checkpoint(self) -> Any:
        import submitit

        return submitit.helpers.DelayedSubmission(SweepJob(self.config, self.out, self.argv, self.procs))


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
    fns = [SweepJob(r.config, str(sweep.out / r.name), r.argv(sweep.out / r.name), procs) for r in submit]
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
