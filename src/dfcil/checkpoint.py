"""Checkpoint files: everything a run needs to continue exactly, written atomically, loaded strictly and safely.

File format: ``DFCILCK2`` magic (8 bytes) + SHA-256 of the rest (32 bytes) + the length of the archive (8 bytes) + a
``torch.save`` archive of plain containers that refer to tensors by index + the tensors' bytes in one block.
Loading checks the magic and the digest (truncation, bit rot, tampering) and then uses
``torch.load(weights_only=True)``, which refuses arbitrary pickled objects, so a crafted file cannot run code; the
tensor index is checked against the block.

Layout of ``<run>/checkpoints``: ``last.pt`` (newest), ``prev.pt`` (the one before, the fallback), and
``task<t>-static.pt`` (per-task state that never changes once written: frozen teacher, trained generator, fixed
views), referenced by digest so that per-epoch checkpoints stay small. A part's static state can appear later in the
task than another's (R-DFCIL+'s pseudo-replay views at the task's start, the generator after the inversion): the
file is then written again, whole, and the one it replaces kept as ``task<t>-static.prev.pt`` for the checkpoints
that still refer to it. What a checkpoint holds is :meth:`dfcil.training.loop.Loop.snapshot` plus the static file's
reference and ``metrics.jsonl``'s length (:class:`dfcil.training.callbacks.Checkpointing`).
"""

from __future__ import annotations

import collections
import hashlib
import io
import logging
import math
import os
import pickle
import re
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from dfcil.errors import CheckpointError
from dfcil.io import fsync_dir, write_atomic

log = logging.getLogger("dfcil")

MAGIC = b"DFCILCK2"  # an archive of the containers, then every tensor's bytes in one block
FORMAT = 1


def dumps(payload: dict[str, Any]) -> bytes:
    """Checkpoint bytes for ``payload`` (plain containers and tensors): ``MAGIC``, the SHA-256 of the rest, the
    length of the archive, a ``torch.save`` archive of the containers, and the bytes of every tensor in one block.

    ``torch.save`` of the tensors themselves spends ~20 µs on each (a zip record, its CRC and pickling) and, on a
    GPU, one device-to-host copy each: a ResNet-32 checkpoint with its SGD state holds ~300 tensors.
    """
    skeleton, block = _pack(payload)
    buf = io.BytesIO()
    torch.save(skeleton, buf)
    archive = buf.getvalue()
    rest = len(archive).to_bytes(8, "little") + archive + block
    return MAGIC + hashlib.sha256(rest).digest() + rest


def _split(data: bytes, source: str) -> tuple[memoryview, memoryview, memoryview, memoryview]:
    """(digest, the bytes it covers, the archive, the tensors' block), all views of ``data``."""
    if len(data) < len(MAGIC) + 32 or data[: len(MAGIC)] != MAGIC:
        raise CheckpointError(f"{source} is not a dfcil checkpoint (bad header) or is truncated")
    view = memoryview(data)  # slices below are views: the tensors' bytes are copied once, into their own storage
    digest, rest = view[len(MAGIC) : len(MAGIC) + 32], view[len(MAGIC) + 32 :]
    n = int.from_bytes(rest[:8], "little")  # an archive beyond the end is a short one: torch.load refuses it
    return digest, rest, rest[8 : 8 + n], rest[8 + n :]


def _load_archive(archive: memoryview, source: str) -> Any:
    try:
        return torch.load(io.BytesIO(archive), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:  # what the weights-only unpickler refuses: a global (code, a class)
        raise CheckpointError(_refused(err, source)) from None
    except Exception as err:  # anything else the archive fails with (a malformed one)
        raise CheckpointError(f"{source} holds data that is not allowed in a checkpoint ({err})") from err


def _refused(err: pickle.UnpicklingError, source: str) -> str:
    """Why a file is refused, without torch's advice to load it again with ``weights_only=False`` (or to allow its
    globals): that would run the code of a received file. The refused global is named where torch names it."""
    found = re.search(r"GLOBAL ([\w.]*\w)", str(err.__context__ or err))
    named = f" ({found[1]})" if found else ""
    return (
        f"{source} is refused: it holds code or objects that dfcil does not load{named}, which are not allowed in a "
        f"dfcil file (only tensors and plain values are): it was not written by dfcil, or was altered; do not load "
        f"it by other means"
    )


def peek(data: bytes, source: str = "checkpoint") -> dict[str, Any]:
    """The payload saved in checkpoint bytes without its tensors (each stands as a one-key dict of its index) and
    without checking the digest: its position, its static state's reference, the config; for tools that choose
    checkpoints. Resume with :func:`loads`."""
    _, _, archive, _ = _split(data, source)
    return _load_archive(archive, source)["payload"]


def peek_position(data: bytes, source: str = "checkpoint") -> dict[str, Any]:
    """The position saved in checkpoint bytes, read from the small archive alone: neither
    the checksum nor the tensors are read (milliseconds, where :func:`loads` of a whole checkpoint takes tens of
    them). For watching a running process, whose checkpoints are renamed into place whole; resume with
    :func:`loads`."""
    _, _, archive, _ = _split(data, source)
    return _load_archive(archive, source)["payload"]["position"]


def loads(data: bytes, source: str = "checkpoint") -> dict[str, Any]:
    """Verify and load checkpoint bytes; never unpickles anything but tensors and plain containers."""
    digest, rest, archive, block = _split(data, source)
    if hashlib.sha256(rest).digest() != digest:
        raise CheckpointError(f"{source} is truncated or corrupt (checksum mismatch)")
    payload = _unpack(_load_archive(archive, source), block, source)
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise CheckpointError(f"{source} has an unknown checkpoint format")
    return payload


_TENSOR = "__dfcil_tensor__"  # in an archive, {_TENSOR: i} stands for the i-th tensor of the block
_DTYPES = {str(d).removeprefix("torch."): d for d in vars(torch).values() if isinstance(d, torch.dtype)}


def _map(obj: Any, leaf: Callable[[Any], Any | None]) -> Any:
    """``obj`` with every dict (and OrderedDict), list and tuple rebuilt and every other value ``v`` replaced by
    ``leaf(v)`` unless that is None; a dict for which ``leaf`` returns a value is replaced as a whole."""
    new = leaf(obj)
    if new is not None:
        return new
    if type(obj) in (dict, collections.OrderedDict):
        return type(obj)((k, _map(v, leaf)) for k, v in obj.items())
    if type(obj) in (list, tuple):
        return type(obj)(_map(v, leaf) for v in obj)
    return obj


def _pack(payload: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
    """``payload`` with each tensor replaced by a reference, and the tensors' bytes in one block (one
    concatenation and one copy to the host per device)."""
    tensors: list[torch.Tensor] = []

    def leaf(obj: Any) -> Any | None:
        if isinstance(obj, torch.Tensor) and obj.layout == torch.strided and not obj.is_quantized:
            tensors.append(obj.detach())
            return {_TENSOR: len(tensors) - 1}
        if type(obj) is dict and len(obj) == 1 and _TENSOR in obj:
            raise ValueError(f"{_TENSOR!r} is reserved for checkpoints' tensor references; use another key")
        return None

    skeleton = _map(payload, leaf)
    by_device: dict[torch.device, list[int]] = {}
    for i, t in enumerate(tensors):
        by_device.setdefault(t.device, []).append(i)
    offsets, parts, base = [0] * len(tensors), [], 0
    for members in by_device.values():
        views = [tensors[i].contiguous().reshape(-1).view(torch.uint8) for i in members]
        for i, v in zip(members, views, strict=True):
            offsets[i], base = base, base + v.numel()
        parts.append(torch.cat(views).cpu().numpy().tobytes())
    index = [(str(t.dtype).removeprefix("torch."), tuple(t.shape), offsets[i]) for i, t in enumerate(tensors)]
    return {"tensors": index, "payload": skeleton}, b"".join(parts)


def _unpack(archive: Any, block: memoryview, source: str) -> Any:
    if not isinstance(archive, dict) or set(archive) != {"tensors", "payload"}:
        raise CheckpointError(f"{source} has an unknown checkpoint format")
    if len(block):
        with warnings.catch_warnings():  # a read-only buffer: nothing writes to it, every tensor is cloned
            warnings.simplefilter("ignore", UserWarning)
            data = torch.frombuffer(block, dtype=torch.uint8)
    else:
        data = torch.empty(0, dtype=torch.uint8)
    tensors = []
    try:
        for name, shape, offset in archive["tensors"]:
            dtype = _DTYPES[name]
            n = math.prod(shape) * dtype.itemsize
            if not 0 <= offset <= offset + n <= data.numel():
                raise ValueError(f"bytes {offset}..{offset + n} are outside the block of {data.numel()}")
            tensors.append(data[offset : offset + n].clone().view(dtype).reshape(shape))  # own, aligned storage
    except (KeyError, TypeError, ValueError, RuntimeError) as err:
        raise CheckpointError(f"{source} has a malformed tensor index ({err!r})") from err

    def leaf(obj: Any) -> Any | None:
        if type(obj) is dict and len(obj) == 1 and _TENSOR in obj:
            i = obj[_TENSOR]
            if type(i) is not int or not 0 <= i < len(tensors):
                raise CheckpointError(f"{source} refers to a tensor it does not hold ({i!r})")
            return tensors[i]
        return None

    return _map(archive["payload"], leaf)


def digest_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def static_parts(static: dict[str, Any]) -> dict[str, list[str]]:
    """What a method's static state holds: each part's name and its keys. A checkpoint's reference to the static
    file keeps it, so that a part whose static state appears later in the task has the file written again."""
    return {name: sorted(part) if isinstance(part, dict) else [] for name, part in sorted(static.items())}


class Checkpointer:
    """Writes and finds the checkpoints of one run directory."""

    def __init__(self, run_dir: str | os.PathLike) -> None:
        self.dir = Path(run_dir) / "checkpoints"

    @property
    def last(self) -> Path:
        return self.dir / "last.pt"

    @property
    def prev(self) -> Path:
        return self.dir / "prev.pt"

    def exists(self) -> bool:
        return self.last.exists() or self.prev.exists()

    @property
    def boundary(self) -> Path:
        """A copy of the newest checkpoint written at a task's end (:meth:`save` with ``boundary``): the run's state
        where it is smallest, which a run can be carried elsewhere with when its newest checkpoint is too large (one
        inside an inversion holds the generator and its optimiser)."""
        return self.dir / "boundary.pt"

    def save(self, payload: dict[str, Any], boundary: bool = False) -> None:
        """Write ``payload`` as the newest checkpoint; the previous newest becomes ``prev.pt``. ``boundary``: the
        payload is a task boundary's, also kept as :attr:`boundary`.

        At every instant at least one complete checkpoint is on disk: the new file is written and fsynced under
        a temporary name before the renames.
        """
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp, data = self.dir / ".last.pt.tmp", dumps({"format": FORMAT, **payload})
        write_atomic(tmp, data)
        if self.last.exists():
            os.replace(self.last, self.prev)
        os.replace(tmp, self.last)
        fsync_dir(self.dir)
        if boundary:
            write_atomic(self.boundary, data)

    def static_path(self, task: int) -> Path:
        return self.dir / f"task{task}-static.pt"

    def static_prev_path(self, task: int) -> Path:
        return self.dir / f"task{task}-static.prev.pt"

    def save_static(self, task: int, payload: dict[str, Any], referred: str | None = None) -> str:
        """Write task ``task``'s static state; returns its digest for the per-epoch checkpoints. ``referred``: the
        digest of the static file the newest checkpoint refers to, if any. Written again when a part's state
        appeared, that file becomes :meth:`static_prev_path`, which the checkpoints written before still find by
        their digest (:meth:`load_static`); a file no checkpoint refers to (left by a process killed between its
        two writes) is replaced, and ``.prev`` (which one may) kept."""
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.static_path(task)
        if path.exists() and referred is not None and digest_of(path) == referred:
            os.replace(path, self.static_prev_path(task))
        write_atomic(path, dumps({"format": FORMAT, **payload}))
        return digest_of(path)

    def drop_replaced_static(self, before: int) -> None:
        """Delete the replaced static files (:meth:`static_prev_path`) of the tasks before ``before``: at a task's
        boundary checkpoint, which refers to no static file, and the checkpoint before it, which refers to the
        task's newest one, neither refers to them."""
        for path in self.dir.glob("task*-static.prev.pt"):
            task = path.name.removeprefix("task").removesuffix("-static.prev.pt")
            if task.isdigit() and int(task) < before:
                path.unlink(missing_ok=True)

    def _static_bytes(self, task: int, digest: str) -> tuple[Path, bytes] | None:
        """The file of task ``task``'s static state whose digest is ``digest``, and its bytes (read once)."""
        for path in (self.static_path(task), self.static_prev_path(task)):
            if path.exists() and hashlib.sha256(data := path.read_bytes()).hexdigest() == digest:
                return path, data
        return None

    def static_file(self, task: int, digest: str) -> Path | None:
        """The file of task ``task``'s static state whose digest is ``digest``; None where neither file is it."""
        found = self._static_bytes(task, digest)
        return found[0] if found else None

    def load_static(self, task: int, digest: str) -> dict[str, Any]:
        found = self._static_bytes(task, digest)
        if found is None:
            path = self.static_path(task)
            if not path.exists():
                raise CheckpointError(f"{path} is missing")
            raise CheckpointError(f"{path} does not match the checkpoint that refers to it")
        path, data = found
        return loads(data, str(path))

    def load_latest(self) -> dict[str, Any]:
        """The newest usable checkpoint: ``last.pt``, else ``prev.pt`` (with a warning saying why)."""
        errors = []
        for path in (self.last, self.prev):
            if not path.exists():
                errors.append(f"{path.name}: missing")
                continue
            try:
                payload = loads(path.read_bytes(), str(path))
                static = payload.get("static")
                if static is not None:
                    payload["static_state"] = self.load_static(static["task"], static["digest"])
            except CheckpointError as err:
                if path == self.last:
                    log.warning("cannot use %s: %s; trying the previous checkpoint", path, err)
                errors.append(f"{path.name}: {err}")
                continue
            return payload
        raise CheckpointError(
            f"no usable checkpoint in {self.dir} ({'; '.join(errors)}). The run cannot continue from it: start it "
            f"again in a new run directory (or delete {self.dir} to start over in this one)"
        )
