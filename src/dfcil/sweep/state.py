"""A sweep's state: its runs in ``sweep.json`` (with each run's full config, state, attempts, time and result) and
the lines it prints about them."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dfcil.io import write_json
from dfcil.sweep.plan import DamagedSummary, SweepRun

FORMAT = 1  # sweep.json's layout
MAX_ATTEMPTS = 2  # a failing run is retried once per invocation of the sweep


class Sweep:
    """The sweep directory: its runs, their states in ``sweep.json``, and the console lines."""

    def __init__(self, out: Path, runs: list[SweepRun], command: Sequence[str], launcher: str) -> None:
        self.out, self.runs, self.command, self.launcher = out, runs, list(command), launcher
        self.started = time.time()
        old = self._load()
        for r in runs:
            r.job_id = old.get(r.name, {}).get("job_id")
        names = {r.name for r in runs}
        # runs of earlier sweeps into this directory that this one does not plan (other configs sharing it): their
        # records stay in sweep.json as they were
        self.others = [record for name, record in old.items() if name not in names]

    def _load(self) -> dict[str, dict[str, Any]]:
        path = self.out / "sweep.json"
        if not path.exists():
            return {}
        try:
            return {r["name"]: r for r in json.loads(path.read_text()).get("runs", [])}
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            # the run directories hold the results; what is lost is the records' history (and SLURM job ids)
            print(
                f"dfcil sweep: {path} cannot be read ({type(err).__name__}: {err}); writing it anew from this "
                f"sweep's runs (their directories keep their results)",
                file=sys.stderr,
            )
            return {}

    def save(self) -> None:
        write_json(
            self.out / "sweep.json",
            {
                "format": FORMAT,
                "command": self.command,
                "launcher": self.launcher,
                "runs": [r.record() for r in self.runs] + self.others,
            },
        )

    def say(self, run: SweepRun, what: str) -> None:
        i = self.runs.index(run) + 1
        print(f"[{i}/{len(self.runs)}] {run.name}: {what}", flush=True)

    def finished(
        self, run: SweepRun, ok: bool, seconds: float, error: str | None, resumed: bool, retry: bool = True
    ) -> None:
        """Record a run's end. ``retry`` False: a failure the same command would meet again (bad input, a
        diverged training), not tried a second time."""
        run.time_s = round((run.time_s or 0) + seconds, 1)
        if ok:
            try:
                run.read_result(self.out)
            except DamagedSummary as err:  # the run said it finished but left no readable summary
                ok, error, retry = False, str(err), False
        if ok:
            run.state, run.error = ("resumed" if resumed else "done"), None
            self.say(run, f"{run.state} in {seconds:.0f} s, A_N {run.result['last_acc']:.2f}")
        else:
            run.error = error
            retry = retry and run.attempts < MAX_ATTEMPTS
            run.state = "pending" if retry else "failed"
            self.say(run, f"failed ({error}){'; retrying' if retry else ''}")
        self.save()

    def table(self) -> str:
        lines = ["| run | state | attempts | time (s) | A_N |", "|---|---|---:|---:|---:|"]
        own = False  # a run finished before this invocation (by it earlier, `dfcil resume`, another machine)
        for r in self.runs:
            acc = f"{r.result['last_acc']:.2f}" if r.result else "—"
            t = f"{r.time_s:.0f}" if r.time_s is not None else "—"
            if r.time_s is None and r.result and isinstance(r.result.get("total_time_s"), int | float):
                t, own = f"{r.result['total_time_s']:.0f}*", True
            lines.append(f"| {r.name} | {r.state} | {r.attempts} | {t} | {acc} |")
        counts: dict[str, int] = {}
        for r in self.runs:
            counts[r.state] = counts.get(r.state, 0) + 1
        lines.append("")
        if own:
            lines.append("*: the run's own time (its summary.json's total_time_s): it finished before this invocation")
        lines.append(
            ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) + f"; {time.time() - self.started:.0f} s in all"
        )
        return "\n".join(lines)
