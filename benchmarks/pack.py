"""Pack a sweep directory (or one run directory) so that its unfinished runs continue on another machine, in at most
``--limit`` bytes: what a machine lent for a while can hand back is limited (a GPU window returns a few files of
16 MiB), and nothing else of it survives.

    python benchmarks/pack.py SWEEP_DIR OUT.tgz [--limit 15M] [--cache DIR]

What a resume reads, and only that: every run's records and logs (config.yaml, meta.json, metrics.jsonl, run.log,
summary.json, ...), the sweep's own files, and for each unfinished run one checkpoint and the static state it refers
to. That checkpoint is the newest (``checkpoints/last.pt``) where the pack stays within the limit, else the run's last
task boundary (``checkpoints/boundary.pt``: no generator and no optimiser, a few MB), carried as ``last.pt``; the
runs whose newest checkpoint saves the most go back to their boundary first. Finished runs carry no checkpoint,
``model.pt`` and the images stay behind. The compile cache (``--cache``, a folder inside the sweep directory) comes
along where it still fits. A pack that cannot fit is written anyway and split into pieces of ``--limit`` bytes
(``OUT.tgz.00``, ``OUT.tgz.01``, ...; ``cat`` joins them), with a warning.

On the other machine: ``mkdir -p DIR && tar xzf OUT.tgz -C DIR`` and the same ``dfcil sweep`` (or ``dfcil resume
DIR/RUN``): it continues from the packed checkpoints, with results identical to one uninterrupted run.

    python benchmarks/pack.py SWEEP_DIR --records DIR

copies instead, as plain files, the records of the finished runs only (each run's records, the sweep's own files and
the configs those runs were started from; no checkpoint, no image, no console log, which repeats ``run.log``): up to
a few hundred kB a run, small enough to keep in git beside the results they back.
``dfcil report DIR`` reads them as it reads the sweep, and the same ``dfcil sweep`` with ``--out`` on a copy of
``DIR`` skips those runs and starts the others afresh.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import sys
import tarfile
from pathlib import Path

from dfcil.checkpoint import Checkpointer, peek

LEFT_BEHIND = {"model.pt", ".lock", ".sweep.lock"}  # besides checkpoints/, images and the compile cache


@dataclasses.dataclass
class Carried:
    """An unfinished run's checkpoint choice: the newest (``last``) or its task boundary, with their sizes."""

    run: Path
    last: list[Path]  # the newest checkpoint and the static state it refers to
    boundary: list[Path] | None  # the boundary checkpoint and its static state; None where the run has none
    at_boundary: bool = False

    @property
    def files(self) -> list[Path]:
        return self.boundary if self.at_boundary and self.boundary is not None else self.last

    def size(self, at_boundary: bool | None = None) -> int:
        use = self.at_boundary if at_boundary is None else at_boundary
        files = self.boundary if use and self.boundary is not None else self.last
        return sum(f.stat().st_size for f in files)


def _with_static(checkpoint: Path) -> list[Path]:
    """``checkpoint`` and the static state file it refers to (none at most task boundaries)."""
    static = peek(checkpoint.read_bytes(), str(checkpoint)).get("static")
    if not static:
        return [checkpoint]
    files = Checkpointer(checkpoint.parent.parent)
    return [checkpoint, files.static_file(static["task"], static["digest"]) or files.static_path(static["task"])]


def runs_of(root: Path) -> list[Path]:
    """The run directories in ``root`` (itself, or its sub-folders at any depth): folders with a run's config, its
    summary or its checkpoints; compile caches and the sweep's logs are none."""
    marks = ("config.yaml", "summary.json", "checkpoints/last.pt")
    if any((root / m).is_file() for m in marks):
        return [root]
    found = {p.parent for m in marks for p in root.rglob(m)}
    found = {p.parent if p.name == "checkpoints" else p for p in found}
    return sorted(p for p in found if ".compile-cache" not in p.parts and "logs" not in p.relative_to(root).parts)


def records(root: Path, cache: Path | None) -> list[Path]:
    """Every file but checkpoints, model files, images, locks and the compile cache."""
    out = []
    for top, dirs, files in os.walk(root):
        here = Path(top)
        dirs[:] = [d for d in dirs if d != "checkpoints" and (cache is None or (here / d).resolve() != cache.resolve())]
        out += [here / f for f in files if f not in LEFT_BEHIND and not f.endswith(".png") and not f.endswith(".tmp")]
    return sorted(out)


def keep_records(root: Path, dest: Path) -> list[str]:
    """Copy the records of ``root``'s finished runs into ``dest`` as plain files (see the module's docstring); returns
    a line per run and one for the copy. ``root`` may be one run directory: it goes to ``dest/<its name>``. A file
    already in ``dest`` is replaced."""
    runs = runs_of(root)
    finished = [run for run in runs if (run / "summary.json").exists()]
    lines = [f"{run.relative_to(root.parent).as_posix() if run == root else run.relative_to(root).as_posix()}: "
             f"{'kept' if run in finished else 'unfinished, left out'}" for run in runs]  # fmt: skip
    base = root.parent if runs == [root] else root  # a run directory keeps its own name under dest
    copied = [f for run in finished for f in records(run, None)]
    if base == root:  # a sweep: its own files, and the configs the kept runs were started from (their console
        copied += [p for p in root.iterdir() if p.is_file() and p.name not in LEFT_BEHIND]  # logs repeat run.log)
        started = {f"{run.relative_to(root).as_posix()}.config.yaml" for run in finished}
        logs = root / "logs"
        copied += [p for p in sorted(logs.iterdir()) if p.name in started] if logs.is_dir() else []
    for f in copied:
        target = dest / f.relative_to(base)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(f, target)
    size = sum(f.stat().st_size for f in copied)
    lines.append(f"{dest}: {len(finished)} finished runs, {len(copied)} files, {size / 2**10:.0f} kB")
    return lines


def choose(carried: list[Carried], base: int, limit: int) -> None:
    """Send runs back to their task boundary, the largest saving first, until ``base`` plus the checkpoints fit."""
    total = base + sum(c.size() for c in carried)
    for c in sorted(carried, key=lambda c: c.size(False) - c.size(True), reverse=True):
        if total <= limit or c.boundary is None:
            continue
        total -= c.size(False) - c.size(True)
        c.at_boundary = True


def write(root: Path, members: list[tuple[Path, str]], out: Path) -> int:
    """``members`` (file, name in the archive) as a gzipped tar at ``out``; returns its size."""
    with tarfile.open(out, "w:gz") as tar:
        for path, name in members:
            tar.add(path, arcname=name)
    return out.stat().st_size


def pack(root: Path, out: Path, limit: int, cache: Path | None = None) -> list[str]:
    """Pack ``root`` into ``out`` (see the module's docstring); returns what it says, a line per run and one for
    the pack."""
    runs = runs_of(root)
    lines, carried = [], []
    for run in runs:
        files = Checkpointer(run)
        if (run / "summary.json").exists() or not files.last.exists():
            lines.append(f"{run.relative_to(root) if run != root else run.name}: "
                         f"{'finished' if (run / 'summary.json').exists() else 'no checkpoint yet'}")  # fmt: skip
            continue
        boundary = _with_static(files.boundary) if files.boundary.exists() else None
        carried.append(Carried(run, _with_static(files.last), boundary))
    kept = records(root, cache)
    choose(carried, sum(p.stat().st_size for p in kept), limit)
    members = [(p, str(p.relative_to(root))) for p in kept]
    for c in carried:
        for f in c.files:  # a boundary checkpoint goes in as last.pt: the resume reads that one
            name = "last.pt" if f.name == "boundary.pt" else f.name
            members.append((f, str((f.parent / name).relative_to(root))))
        position = peek(c.files[0].read_bytes())["position"]
        where = "its last task boundary" if c.at_boundary else "its newest checkpoint"
        lines.append(f"{c.run.relative_to(root) if c.run != root else c.run.name}: {where}, task {position['task']} "
                     f"{position['stage']} ({c.size() / 2**20:.1f} MiB)")  # fmt: skip
    size = write(root, members, out)
    if cache is not None and cache.is_dir():
        with_cache = out.with_name(out.name + ".cache")
        cached = members + [(p, str(p.relative_to(root))) for p in sorted(cache.rglob("*")) if p.is_file()]
        if write(root, cached, with_cache) <= limit:
            os.replace(with_cache, out)
            size = out.stat().st_size
            lines.append(f"compile cache {cache.name}: carried")
        else:
            with_cache.unlink()
            lines.append(f"compile cache {cache.name}: left behind (the pack would pass {limit / 2**20:.1f} MiB)")
    lines.append(f"{out}: {size / 2**20:.1f} MiB, {len(carried)} runs to continue")
    if size > limit:
        lines.append(split(out, limit))
    return lines


def split(out: Path, limit: int) -> str:
    """Cut ``out`` into pieces of ``limit`` bytes (``out.00``, ``out.01``, ...) and remove it; says so."""
    data, names = out.read_bytes(), []
    for i in range(0, len(data), limit):
        piece = out.with_name(f"{out.name}.{i // limit:02d}")
        piece.write_bytes(data[i : i + limit])
        names.append(piece.name)
    out.unlink()
    return (
        f"warning: over the limit even at task boundaries: in {len(names)} pieces ({', '.join(names)}); cat joins them"
    )


def size_of(text: str) -> int:
    """``15M``, ``16MiB``, ``800K`` or bytes."""
    units = {"K": 2**10, "M": 2**20, "G": 2**30}
    text = text.strip().upper().removesuffix("IB").removesuffix("B")
    try:
        return int(float(text[:-1]) * units[text[-1]]) if text and text[-1] in units else int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (15M, 800K, bytes)") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", type=Path, help="a sweep directory, or one run directory")
    parser.add_argument("out", type=Path, nargs="?", help="the pack, a .tgz")
    parser.add_argument("--records", type=Path, metavar="DIR", help="copy the finished runs' records to DIR instead")
    parser.add_argument("--limit", type=size_of, default=size_of("15M"), help="the largest file (default 15M)")
    parser.add_argument("--cache", type=Path, help="a compile cache inside ROOT, carried where it fits")
    args = parser.parse_args(argv)
    if not args.root.is_dir():
        parser.error(f"{args.root} is not a directory")
    if (args.out is None) == (args.records is None):
        parser.error("give either OUT.tgz (a pack) or --records DIR (the finished runs' records)")
    if args.records is not None:
        for line in keep_records(args.root, args.records):
            print(line)
        return 0
    for line in pack(args.root, args.out, args.limit, args.cache):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
