"""How long the dfcil commands a newcomer types first take to start, each run as a fresh process.

    python benchmarks/archive/startup.py                         # the working tree
    python benchmarks/archive/startup.py --before 7dbfd37        # that revision beside the working tree
    python benchmarks/archive/startup.py --before 7dbfd37 --after HEAD --runs 5

Each command runs as ``python -m dfcil ...`` with ``PYTHONPATH`` at the ``src`` of the code measured and the
working directory at its checkout (so ``configs/smoke.yaml`` is that revision's). A revision other than the
working tree is checked out with ``git worktree add`` into a temporary directory, removed afterwards. The runs
alternate between the two sides round by round, so that a machine busy with other work slows both alike; one
untimed run per command and side comes first (file cache). The table gives the median and the minimum wall time
in seconds; the commands with a target must start within ``TARGET_S``, the dry run is there for information (it
imports torch and prepares the data).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TARGET_S = 1.5  # the start-up a listing or --help may take on a 2-core CPU (issue 31)

# name → (arguments of `python -m dfcil`, whether TARGET_S applies)
COMMANDS: dict[str, tuple[list[str], bool]] = {
    "help": (["--help"], True),
    "methods": (["methods"], True),
    "datasets": (["datasets"], True),
    "dry-run": (["train", "--config", "configs/smoke.yaml", "--dry-run"], False),
}


@contextlib.contextmanager
def checkout(rev: str | None) -> Iterator[Path]:
    """The root of the code to measure: the working tree for None, else a temporary worktree at ``rev``."""
    if rev is None:
        yield REPO
        return
    with tempfile.TemporaryDirectory(prefix="dfcil-startup-") as tmp:
        root = Path(tmp) / "tree"
        git = ["git", "-C", str(REPO), "worktree"]
        subprocess.run([*git, "add", "--detach", "--quiet", str(root), rev], check=True)
        try:
            yield root
        finally:
            subprocess.run([*git, "remove", "--force", str(root)], check=True)


def seconds(root: Path, args: list[str]) -> float:
    """Wall time of one ``python -m dfcil ARGS`` run of the code under ``root``."""
    env = {**os.environ, "PYTHONPATH": str(root / "src")}
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "dfcil", *args], cwd=root, env=env, check=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    return time.perf_counter() - start


def imported_from(root: Path) -> Path:
    """Where ``import dfcil`` finds the package with the environment :func:`seconds` gives."""
    env = {**os.environ, "PYTHONPATH": str(root / "src")}
    code = "import dfcil; print(dfcil.__file__)"
    done = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, check=True, capture_output=True, text=True)
    return Path(done.stdout.strip()).parent


def measure(roots: dict[str, Path], names: list[str], runs: int, warmup: int) -> dict[str, dict[str, list[float]]]:
    """``{side: {command: [seconds per run]}}``, the sides alternating within each round."""
    for side, root in roots.items():
        found = imported_from(root)
        if found != root / "src" / "dfcil":
            raise RuntimeError(f"{side}: python imports dfcil from {found}, not from {root / 'src'}")
    times: dict[str, dict[str, list[float]]] = {side: {name: [] for name in names} for side in roots}
    for round_ in range(warmup + runs):
        for name in names:
            for side, root in roots.items():
                t = seconds(root, COMMANDS[name][0])
                if round_ >= warmup:
                    times[side][name].append(t)
    return times


def table(times: dict[str, dict[str, list[float]]]) -> str:
    sides = list(times)
    head = " | ".join(f"{side} median s | {side} min s" for side in sides)
    lines = [f"| command | {head} | target |", "|---|" + "---:|---:|" * len(sides) + "---|"]
    for name in next(iter(times.values())):
        args, timed = COMMANDS[name]
        cells = " | ".join(f"{statistics.median(t[name]):.2f} | {min(t[name]):.2f}" for t in times.values())
        target = f"< {TARGET_S:g} s" if timed else "information"
        lines.append(f"| `dfcil {' '.join(args)}` | {cells} | {target} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", metavar="REV", help="also measure this git revision, in a column of its own")
    p.add_argument("--after", metavar="REV", help="measure this revision instead of the working tree")
    p.add_argument("--runs", type=int, default=5, help="timed runs of each command (default 5)")
    p.add_argument("--warmup", type=int, default=1, help="untimed runs of each command first (default 1)")
    p.add_argument(
        "--commands", default=",".join(COMMANDS), help=f"comma list of commands to time (default {','.join(COMMANDS)})"
    )
    args = p.parse_args(argv)
    names = [n.strip() for n in args.commands.split(",") if n.strip()]
    if not names or set(names) - set(COMMANDS):
        p.error(f"--commands: a comma list from {', '.join(COMMANDS)}")
    if args.runs < 1 or args.warmup < 0:
        p.error("--runs must be at least 1 and --warmup at least 0")
    sides = {args.after or "working tree": args.after}  # column name → revision (None: the working tree)
    if args.before:
        sides = {f"{args.before} (before)": args.before, **sides}
    with contextlib.ExitStack() as stack:
        roots = {side: stack.enter_context(checkout(rev)) for side, rev in sides.items()}
        times = measure(roots, names, args.runs, args.warmup)
    print(f"start-up of `python -m dfcil ...`, {args.runs} runs each, {os.cpu_count()} CPUs\n")
    print(table(times))
    return 0


if __name__ == "__main__":
    sys.exit(main())
