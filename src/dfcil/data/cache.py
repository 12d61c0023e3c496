"""Image files decoded once into a cache of uint8 arrays, which later runs memory-map.

A prepared dataset is a directory holding, per split, ``<split>_x.npy`` (uint8 ``[N, S, S, 3]``, RGB) and
``<split>_y.npy`` (int64 ``[N]``), and a ``manifest.json`` that says what it was built from (the source's path
and fingerprint), how (the base transform, the cache format) and what it holds (class names, counts, statistics).

Preparation decodes with Pillow in a pool of processes, a chunk of images per task, with a progress bar, into
memory-mapped files in a hidden ``.<name>.partial`` directory beside the cache; the directory is renamed into
place once every image is decoded, so a cache is whole or absent. An interrupted preparation (Ctrl-C, a kill)
continues where it stopped the next time; images that cannot be decoded fail it, naming them, and leave nothing.
Host memory stays bounded by the chunks in flight, whatever the dataset's size.

A cache that no longer matches its source is refused; ``data.rebuild`` prepares it again beside the old one, then
swaps the two (the old one is renamed aside, the new one into place, the old one removed). A process that has the
old arrays memory-mapped keeps reading them (a removed file lives on while it is mapped); a kill at any point
leaves the old cache, or nothing under the cache's name and a preparation that the next run continues or finishes.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import errno
import hashlib
import json
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from filelock import FileLock

from dfcil.data import decode
from dfcil.data.decode import CHUNK, BaseTransform, ImageFile
from dfcil.errors import DatasetError
from dfcil.io import fsync_dir, write_atomic
from dfcil.progress import make_progress

CACHE_FORMAT = 1  # raise it when the layout or the decoding changes: older caches are then refused


def default_cache_root() -> Path:
    """``$DFCIL_CACHE`` if set, else the per-user cache directory (e.g. ``~/.cache/dfcil/prepared``)."""
    env = os.environ.get("DFCIL_CACHE")
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("dfcil")) / "prepared"


def cache_dir(cache_root: str | os.PathLike | None, dataset: str, source: Path, size: int | None) -> Path:
    """Where the cache of ``dataset`` read from ``source`` at ``size`` pixels lives: one per source location and
    size. ``size`` None: the size chosen from the images (``data.image_size: auto``), which its manifest records."""
    root = Path(cache_root).expanduser() if cache_root else default_cache_root()
    where = hashlib.sha256(os.path.abspath(source.expanduser()).encode()).hexdigest()[:10]
    return root / f"{dataset}-{f'{size}px' if size else 'auto'}-{where}"


@dataclasses.dataclass(frozen=True)
class Split:
    """What one split of a prepared dataset holds: its images in order, and their labels."""

    images: Sequence[ImageFile]
    labels: np.ndarray  # (N,) int64

    def __post_init__(self) -> None:
        if len(self.images) != len(self.labels):
            raise ValueError("one label per image")


def rebuild_fix(path: Path) -> str:
    return f"run again with --data.rebuild true (or delete {path}) to prepare it again from the source"


def load_cache(path: Path, identity: dict[str, Any]) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], dict]:
    """The splits of a prepared dataset (images memory-mapped) and its manifest; ``identity``: what the manifest
    must say about the source and the preparation, else the cache is refused (built from another source or by
    another version). A cache that another process's rebuild replaced while it was being read is read again."""
    for _ in range(3):
        before = _inode(path / "manifest.json")
        try:
            loaded = _read_cache(path, identity)
        except DatasetError:
            if _inode(path / "manifest.json") == before:
                raise
            time.sleep(0.1)  # swapped for a rebuilt cache meanwhile (renamed aside, then in): read the new one
            continue
        if _inode(path / "manifest.json") == before:
            return loaded
    raise DatasetError(f"{path} was replaced three times while it was being read; run again once it is prepared")


def _inode(path: Path) -> int | None:
    try:
        return path.stat().st_ino
    except FileNotFoundError:
        return None


def _read_cache(path: Path, identity: dict[str, Any]) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], dict]:
    manifest_path = path / "manifest.json"
    fix = rebuild_fix(path)
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, ValueError) as err:
        raise DatasetError(f"{manifest_path} cannot be read ({err}); {fix}") from None
    if manifest.get("cache_format") != CACHE_FORMAT:
        raise DatasetError(
            f"{path} was prepared by another version of dfcil (cache format {manifest.get('cache_format')}, this one "
            f"reads {CACHE_FORMAT}); {fix}"
        )
    for key, want in identity.items():
        if manifest.get(key) != want:
            what = "another source" if key in ("source", "fingerprint") else "other settings"
            found, want = (repr(v) if len(repr(v)) < 90 else repr(v)[:80] + "...]" for v in (manifest.get(key), want))
            raise DatasetError(
                f"{path} was prepared from {what} ({key}: {found}, expected {want}): the source changed since; "
                f"{fix}, or set data.cache to another directory"
            )
    splits = {}
    for name, count in manifest["counts"].items():
        try:
            x = np.load(path / f"{name}_x.npy", mmap_mode="r", allow_pickle=False)
            y = np.load(path / f"{name}_y.npy", allow_pickle=False)
        except (OSError, ValueError) as err:
            raise DatasetError(f"{path}: the {name} arrays are missing or corrupt ({err}); {fix}") from None
        size = manifest["transform"]["size"]
        if x.shape != (count, size, size, 3) or x.dtype != np.uint8 or y.shape != (count,):
            raise DatasetError(f"{path}: the {name} arrays do not match the manifest; {fix}")
        classes = len(manifest.get("classes") or ())
        if classes and count and not (y.dtype == np.int64 and y.min() >= 0 and y.max() < classes):
            raise DatasetError(
                f"{path}: the {name} labels are not the manifest's {classes} classes (found {y.min()}..{y.max()}, "
                f"{y.dtype}); the cache is damaged: {fix}"
            )
        splits[name] = (x, y)
    return splits, manifest


@dataclasses.dataclass
class _Partial:
    """An unfinished preparation: its directory, which chunks of each split are decoded, and the images that
    could not be (by any attempt so far: a chunk decoded before an interrupt is not decoded again)."""

    path: Path
    done: dict[str, np.ndarray]
    bad: list[str] = dataclasses.field(default_factory=list)

    def save(self) -> None:
        write_atomic(self.path / "bad.json", json.dumps(self.bad))  # first: a chunk marked done has its bad images
        for name, mask in self.done.items():
            np.save(self.path / f"{name}_done.npy", mask)


def prepare_cache(
    path: Path,
    splits: dict[str, Split],
    transform: BaseTransform,
    manifest: dict[str, Any],
    workers: int | None = None,
    progress: Callable[..., Any] | None = None,
) -> None:
    """Decode ``splits`` into the cache directory ``path``, continuing an interrupted preparation with the same
    ``manifest``; a cache already at ``path`` (a rebuild) is replaced once the new one is whole. Raises
    :class:`DatasetError` naming the images that cannot be decoded (and removes the unfinished cache)."""
    manifest = {"cache_format": CACHE_FORMAT, **manifest, "transform": transform.as_dict()}
    manifest["counts"] = {name: len(split.images) for name, split in splits.items()}
    shutil.rmtree(_aside(path), ignore_errors=True)  # an old cache a killed rebuild had renamed aside
    if _finished(_partial_dir(path), manifest):  # a preparation killed between its last write and its rename
        _swap_in(_partial_dir(path), path)
        return
    partial = _open_partial(path, splits, transform, manifest)
    bad = partial.bad  # what earlier, interrupted attempts found, and then this one's
    total = sum(len(s.images) for s in splits.values())
    done = sum(int(partial.done[n].sum()) * CHUNK for n in splits)
    bar_factory = progress or make_progress(False)
    with bar_factory(total=total, desc=f"preparing {path.name}", unit="img", initial=min(done, total)) as bar:
        for name, split in splits.items():
            saved = time.monotonic()
            try:
                with _Writer(partial.path / f"{name}_x.npy") as writer:
                    for start, images, bad_here in _decode_all(split, partial.done[name], transform, workers, writer):
                        bad += [b for b in bad_here if b not in bad]  # a chunk decoded again after a kill
                        partial.done[name][start // CHUNK] = True
                        bar.update(len(images))
                        if time.monotonic() - saved > 30:  # a kill loses at most half a minute of decoding
                            writer.sync()
                            partial.save()
                            saved = time.monotonic()
            finally:  # an interrupt keeps what is decoded: the next preparation continues from it
                partial.save()
    if bad:
        shutil.rmtree(partial.path, ignore_errors=True)
        shown = "; ".join(bad[:5]) + (f"; and {len(bad) - 5} more" if len(bad) > 5 else "")
        raise DatasetError(
            f"{len(bad)} of {total} images cannot be used: {shown}. Replace or remove them and run again "
            f"(nothing was cached)"
        )
    _finish(partial, splits, path, manifest)


class _Writer:
    """Writes decoded images into a split's ``.npy`` file with ``pwrite`` (faster than storing into fresh pages of
    a memory map), while a thread writes the file's dirty pages to disk every second (``fsync`` releases the GIL),
    so that the disk keeps pace with the decoding and the final sync has little left to do."""

    def __init__(self, path: Path) -> None:
        header = np.load(path, mmap_mode="r")
        self.offset, self.row = header.offset, int(np.prod(header.shape[1:]))
        del header
        self.path = path
        self.stop = threading.Event()
        self.error: OSError | None = None  # what the syncing thread met (the kernel reports a failed writeback once)

    def write(self, start: int, images: np.ndarray) -> None:
        self._raise()
        data = memoryview(np.ascontiguousarray(images, dtype=np.uint8)).cast("B")
        at = self.offset + start * self.row
        while data:  # pwrite may write less than asked (a nearly full disk): write the rest, or fail
            done = os.pwrite(self.fd, data, at)
            if done == 0:
                raise OSError(errno.ENOSPC, "no bytes written", str(self.path))
            data, at = data[done:], at + done

    def sync(self) -> None:
        self._raise()
        os.fsync(self.fd)

    def _raise(self) -> None:
        if self.error is not None:
            raise self.error

    def _run(self) -> None:
        while not self.stop.wait(1.0):
            try:
                os.fsync(self.fd)
            except OSError as err:  # kept for the decoding thread: a cache whose pages were lost is not finished
                self.error = err
                return

    def __enter__(self) -> _Writer:
        self.fd = os.open(self.path, os.O_WRONLY)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, kind: object, *exc: object) -> None:
        self.stop.set()
        self.thread.join()
        try:
            if kind is None:  # an exception already on its way (Ctrl-C) stays the one reported
                self._raise()
                os.fsync(self.fd)
        finally:
            os.close(self.fd)


def _partial_dir(path: Path) -> Path:
    return path.parent / f".{path.name}.partial"


def _aside(path: Path) -> Path:
    return path.parent / f".{path.name}.old"


def _finished(tmp: Path, manifest: dict) -> bool:
    """Whether ``tmp`` is a whole preparation of ``manifest`` (its statistics added, its bookkeeping removed)."""
    try:
        done = json.loads((tmp / "manifest.json").read_text())
    except (OSError, ValueError):
        return False
    return (
        isinstance(done, dict)
        and done.pop("stats", None) is not None
        and done == manifest
        and (not (tmp / "bad.json").exists())
    )


def _swap_in(new: Path, path: Path) -> None:
    """Rename the whole cache ``new`` to ``path``. A cache already there is renamed aside first and removed after:
    its files live on for the processes that have them memory-mapped."""
    if path.exists():
        os.replace(path, _aside(path))
    os.replace(new, path)
    fsync_dir(path.parent)
    shutil.rmtree(_aside(path), ignore_errors=True)


def _open_partial(path: Path, splits: dict[str, Split], transform: BaseTransform, manifest: dict) -> _Partial:
    tmp = _partial_dir(path)
    marker = tmp / "manifest.json"
    if tmp.exists():
        try:
            same = json.loads(marker.read_text()) == manifest
        except (OSError, ValueError):
            same = False
        if same:  # an interrupted preparation of the same thing: continue it
            try:
                done = {n: np.load(tmp / f"{n}_done.npy") for n in splits}
                bad = json.loads((tmp / "bad.json").read_text())
                if isinstance(bad, list) and all(isinstance(b, str) for b in bad):
                    return _Partial(tmp, done, bad)
            except (OSError, ValueError):
                pass
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    for name, split in splits.items():
        n = len(split.images)
        np.lib.format.open_memmap(
            tmp / f"{name}_x.npy", mode="w+", dtype=np.uint8, shape=(n, transform.size, transform.size, 3)
        )
        np.save(tmp / f"{name}_y.npy", np.asarray(split.labels, dtype=np.int64))
    partial = _Partial(tmp, {n: np.zeros(-(-len(s.images) // CHUNK), dtype=bool) for n, s in splits.items()})
    partial.save()
    write_atomic(marker, json.dumps(manifest, indent=1))
    return partial


def _decode_all(
    split: Split, done: np.ndarray, transform: BaseTransform, workers: int | None, writer: _Writer
) -> Iterator[tuple[int, Sequence[ImageFile], list[str]]]:
    """Decode the chunks not yet ``done`` and write them, a bounded number in flight; yields each finished chunk."""
    starts = [i * CHUNK for i in range(len(done)) if not done[i]]
    workers = workers or os.cpu_count() or 1
    if workers == 1:  # no pool: simpler to debug, and what a single core gets anyway
        for start in starts:
            images = split.images[start : start + CHUNK]
            out, bad = decode.decode_chunk(images, transform)
            writer.write(start, out)
            yield start, images, bad
        return
    start_worker, parent = decode.start_worker, (os.getpid(),)
    with concurrent.futures.ProcessPoolExecutor(workers, initializer=start_worker, initargs=parent) as pool:
        pending: dict[concurrent.futures.Future, int] = {}
        queue = iter(starts)
        for start in queue:
            pending[pool.submit(decode.decode_chunk, split.images[start : start + CHUNK], transform)] = start
            if len(pending) >= 2 * workers:
                break
        while pending:
            finished, _ = concurrent.futures.wait(pending, return_when=concurrent.futures.FIRST_COMPLETED)
            for future in finished:
                start = pending.pop(future)
                out, bad = future.result()
                writer.write(start, out)
                yield start, split.images[start : start + CHUNK], bad
                nxt = next(queue, None)
                if nxt is not None:
                    pending[pool.submit(decode.decode_chunk, split.images[nxt : nxt + CHUNK], transform)] = nxt


def channel_stats(x: np.ndarray | Path, budget: int = 2**24) -> dict[str, list[float]]:
    """Per-channel mean and (population) std of ``x / 255`` over every pixel, from a histogram of each channel's
    uint8 values (exact, and fast), read about ``budget`` values at a time. ``x``: images ``[N, S, S, 3]``, or the
    path of their ``.npy`` file, which is then read with plain reads (no memory map, so that the pages read do not
    stay in the process's resident memory)."""
    histogram = np.zeros((3, 256), dtype=np.int64)
    offsets = np.array([0, 256, 512], dtype=np.int32)
    for images in _chunks(x, budget):
        values = images.reshape(-1, 3).astype(np.int32) + offsets
        histogram += np.bincount(values.ravel(), minlength=768).reshape(3, 256)
    n = max(int(histogram[0].sum()), 1)
    levels = np.arange(256) / 255.0
    mean = histogram @ levels / n
    std = np.sqrt(np.maximum(histogram @ levels**2 / n - mean**2, 0.0))
    return {"mean": [round(float(v), 6) for v in mean], "std": [round(float(v), 6) for v in std]}


def _chunks(x: np.ndarray | Path, budget: int) -> Iterator[np.ndarray]:
    """Consecutive row blocks of an array, or of a uint8 ``.npy`` file, of about ``budget`` values each."""
    if not isinstance(x, Path):
        chunk = max(1, budget // max(int(np.prod(x.shape[1:])), 1))
        for i in range(0, len(x), chunk):
            yield np.asarray(x[i : i + chunk])
        return
    header = np.load(x, mmap_mode="r")
    shape, offset = header.shape, header.offset
    del header
    row = int(np.prod(shape[1:]))
    chunk = max(1, budget // max(row, 1))
    with open(x, "rb") as f:
        for i in range(0, shape[0], chunk):
            n = min(chunk, shape[0] - i)
            data = os.pread(f.fileno(), n * row, offset + i * row)
            yield np.frombuffer(data, dtype=np.uint8).reshape(n, *shape[1:])


def _finish(partial: _Partial, splits: dict[str, Split], path: Path, manifest: dict) -> None:
    """Statistics into the manifest, the bookkeeping files out, every file synced, then the rename into place."""
    if "train" in splits:
        manifest = manifest | {"stats": channel_stats(partial.path / "train_x.npy")}
    for name in splits:
        (partial.path / f"{name}_done.npy").unlink()
    (partial.path / "bad.json").unlink()
    for f in partial.path.iterdir():
        with open(f, "rb+") as handle:
            os.fsync(handle.fileno())
    write_atomic(partial.path / "manifest.json", json.dumps(manifest, indent=1))
    _swap_in(partial.path, path)


@dataclasses.dataclass(frozen=True)
class Preparation:
    """What a cache is prepared from: the splits' images, how they are transformed, and notes for the manifest
    (how the size was chosen)."""

    splits: dict[str, Split]
    transform: BaseTransform
    notes: dict[str, Any] = dataclasses.field(default_factory=dict)


def check_writable(path: Path) -> None:
    """Refuse a cache ``path`` whose folder cannot be created or written, before anything is decoded."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # a name of its own: runs of a sweep starting together probe the same folder at once
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}.write-test-"):
            pass
    except OSError as err:
        raise DatasetError(
            f"cannot write the decoded-image cache in {path.parent} ({err.strerror or err}); set data.cache (or "
            f"$DFCIL_CACHE) to a writable directory"
        ) from None


def load_or_prepare(
    path: Path,
    identity: dict[str, Any],
    plan: Callable[[], Preparation],
    workers: int | None = None,
    progress: Callable[..., Any] | None = None,
    rebuild: bool = False,
) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], dict]:
    """The cached splits at ``path`` (memory-mapped) and their manifest; the first time (or with ``rebuild``),
    ``plan()`` names the images and their transform, and they are decoded into the cache. ``identity`` (source,
    fingerprint, classes, transform where known, ...) must match an existing cache's manifest."""
    manifest_file = path / "manifest.json"
    if rebuild or not manifest_file.exists():
        asked_to_replace = _inode(manifest_file) if rebuild else None
        check_writable(path)
        # one process prepares a cache at a time (runs of a sweep may start together): the others wait, then read
        # it; a rebuild that another process finished meanwhile is not done twice. The lock file stays (empty,
        # hidden): removing it while another process waits on it would let a third process lock a new file of the
        # same name and prepare the cache beside the holder.
        lock = path.parent / f".{path.name}.lock"
        with FileLock(lock):
            current = _inode(manifest_file)
            if current is None or (rebuild and current == asked_to_replace):
                if path.exists() and current is None and not rebuild:  # a rename cannot leave this
                    raise DatasetError(
                        f"{path} exists but holds no manifest.json; run again with --data.rebuild true (or "
                        f"delete it) to prepare the cache again"
                    )
                p = plan()
                assert identity.get("transform", p.transform.as_dict()) == p.transform.as_dict()
                prepare_cache(path, p.splits, p.transform, identity | p.notes, workers, progress)
    return load_cache(path, identity)
