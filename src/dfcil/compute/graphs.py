"""One optimisation step as one CUDA graph: loss terms, backward and the optimiser update replayed with a single
launch. At ResNet-32's size a step is bound by kernel launches and Python dispatch, not arithmetic; a replay
removes both (docs/results.md, "Speed").

A replay repeats the captured kernels on the captured memory. That is right only if every step would have issued
those kernels on that memory, so a step function must

* read its per-step inputs only through its arguments (they are copied into fixed buffers before each replay);
* update every other tensor it reads in place (``copy_``, ``+=``), never rebind it to a new tensor;
* not depend on Python numbers that change between steps (the lr is part of the key: a new key, a new graph);
* not synchronise with the host (``.item()``, ``.tolist()``, data-dependent shapes, tensors made from Python data);
* draw random numbers only from the default generator or the generators it declares.

``mode="check"`` verifies these rules eagerly, on any device: the first step after warm-up is recorded operator by
operator, and every later step must issue the same operators on the same outside tensors with the same Python
arguments; a host sync fails at once. Run a method's smoke preset with ``engine.cuda_graphs: check`` on a CPU
before trusting it to ``on`` (``tests/test_graphs.py`` does this for every method marked ``graph_safe``).
"""

from __future__ import annotations

import linecache
import logging
import os
import sys
import time
from collections.abc import Callable, Hashable, Sequence
from typing import Any, Literal

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from dfcil.errors import GraphCaptureError, GraphSafetyError

__all__ = ["GraphCaptureError", "GraphMode", "GraphSafetyError", "StepGraph"]

log = logging.getLogger("dfcil")

GraphMode = Literal["off", "on", "check"]


class StepGraph:
    """Replays one optimisation step as a CUDA graph (``on``), or checks eagerly that a replay would do the same
    work (``check``).

    Args:
        step: the whole step from its per-step tensor inputs: ``zero_grad``, loss terms, ``backward``, clipping and
            the optimiser's step; returns the loss terms as a 1-D tensor.
        optimizer: the optimiser ``step`` updates. Its gradients are released before a capture (they are then
            allocated in the graph's memory pool), and ``check`` does not record its update (an eager Adam reads
            its step count on the host). Under ``on`` an Adam must be ``capturable``; an SGD needs nothing.
        mode: ``off``: eager. ``on``: eager for ``warmup`` steps of each key, then captured once and replayed (CUDA
            only; eager on other devices). If the graph cannot be set up (e.g. a PyTorch without
            ``register_generator_state``) the steps run eagerly, with a warning and :attr:`failure` set; a capture
            that fails once begun raises :class:`GraphCaptureError` (it can leave random generators and the
            current stream in capture state, so eager steps would not be safe either).
            ``check``: eager, verifying that ``on`` would replay the same work.
        device: where the step runs.
        generators: random streams the step draws from besides the default one (registered with the graph).
        warmup: eager steps of each key before the capture (lazy state such as momentum buffers, cuDNN autotuning).

    Calling returns the step's loss terms, detached. Under ``on`` and ``check`` that tensor is overwritten by the
    next call: read or copy it first.
    """

    def __init__(
        self,
        step: Callable[..., Tensor],
        optimizer: torch.optim.Optimizer,
        mode: GraphMode = "off",
        device: torch.device | None = None,
        generators: Sequence[torch.Generator] = (),
        warmup: int = 2,
    ) -> None:
        if mode not in ("off", "on", "check"):
            raise ValueError(f"unknown graph mode {mode!r}; expected off, on or check")
        self.step, self.optimizer = step, optimizer
        self.generators, self.warmup = generators, warmup
        self.mode: GraphMode = "off" if mode == "on" and (device is None or device.type != "cuda") else mode
        self.device = device
        self.key: Hashable = None
        self.failure: str | None = None  # why a capture failed (the step then runs eagerly)
        self.captures = 0  # graphs captured (on) or steps recorded (check) so far: one per key
        self.capture_s = 0.0  # wall time spent capturing (on): recording the kernels, not running them
        self._reset()

    def _reset(self) -> None:
        self.calls = 0  # steps under the current key
        self.graph: Any = None
        self.recording: _Recording | None = None
        self.static_in: list[Tensor] = []
        self.static_out: Tensor | None = None

    def __call__(self, key: Hashable, *inputs: Tensor) -> Tensor:
        """One step with ``inputs``; ``key`` names the graph (same key ⇒ same work, e.g. (phase, lr))."""
        if self.mode == "off":
            return self.step(*inputs)
        if key != self.key:
            self._reset()
            self.key = key
        self.calls += 1
        if self.calls <= self.warmup:
            return self._warm(inputs)
        if self.static_out is None:  # the first step past warm-up: fixed input buffers, then capture or record
            self.static_in = [x.detach().clone() for x in inputs]
            self.captures += 1
            if self.mode == "check":
                return self._checked_step()
            try:
                graph = self._new_graph()
            except Exception as err:  # noqa: BLE001 - nothing was captured yet: eager steps are safe
                log.warning("cannot set up a CUDA graph for %r; the step runs eagerly from here on: %s", key, err)
                self.mode, self.failure = "off", f"{type(err).__name__}: {err}"
                self._reset()
                return self.step(*inputs)
            return self._capture(graph)
        for buffer, x in zip(self.static_in, inputs, strict=True):
            if buffer.shape != x.shape or buffer.dtype != x.dtype:
                raise GraphSafetyError(
                    f"step input changed from {tuple(buffer.shape)} {buffer.dtype} to {tuple(x.shape)} {x.dtype} "
                    f"under one graph key; give steps of another shape another key"
                )
            buffer.copy_(x)
        if self.mode == "on":
            self.graph.replay()
            return self.static_out
        return self._checked_step()

    def _warm(self, inputs: Sequence[Tensor]) -> Tensor:
        if self.mode != "on":
            return self.step(*inputs)
        with torch.cuda.device(self.device):  # streams and graphs belong to the step's device, not the current one
            side = torch.cuda.Stream()  # the documented warm-up: a side stream, as the capture will use
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                out = self.step(*inputs)
            torch.cuda.current_stream().wait_stream(side)
        return out

    def _new_graph(self) -> Any:
        graph = torch.cuda.CUDAGraph()
        for generator in self.generators:
            graph.register_generator_state(generator)
        return graph

    def _capture(self, graph: Any) -> Tensor:
        self.optimizer.zero_grad(set_to_none=True)  # gradients are allocated inside the graph's memory pool
        torch.cuda.synchronize(self.device)
        t0 = time.perf_counter()
        stream = torch.cuda.current_stream(self.device)
        try:
            with torch.cuda.device(self.device), torch.cuda.graph(graph):
                self.static_out = self.step(*self.static_in)
        except Exception as err:
            torch.cuda.set_stream(stream)  # torch.cuda.graph leaves its capture stream current when capturing fails
            raise GraphCaptureError(
                f"capturing the step {self.key!r} as a CUDA graph failed ({type(err).__name__}: {err}). A failed "
                f"capture can leave this process's random generators and CUDA streams unusable, so the run stops "
                f"here, after its last checkpoint; continue it without graphs: "
                f"dfcil resume <run dir> --engine.cuda_graphs off"
            ) from err
        self.capture_s += time.perf_counter() - t0  # the capture synchronises when it ends
        self.graph = graph
        graph.replay()  # the capture ran nothing: this is the step
        return self.static_out

    def _checked_step(self) -> Tensor:
        recorder = _Recorder(self.generators)
        # the optimiser's own update is not recorded: a replay runs it as captured (a capturable Adam)
        pause = self.optimizer.register_step_pre_hook(lambda *_: setattr(recorder, "paused", True))
        resume = self.optimizer.register_step_post_hook(lambda *_: setattr(recorder, "paused", False))
        try:
            with recorder:
                values = self.step(*self.static_in)
        finally:
            pause.remove()
            resume.remove()
        if self.recording is None:
            self.recording = recorder.recording
            self.static_out = values.clone()
        else:
            self.recording.compare(recorder.recording, self.key)
            self.static_out.copy_(values)
        return self.static_out


_HOST_SYNC = {
    "_local_scalar_dense", "is_nonzero", "equal", "nonzero", "masked_select", "_unique", "_unique2", "unique_dim",
    "unique_consecutive",
}  # fmt: skip
_FROM_PYTHON = {"lift_fresh", "lift_fresh_copy", "lift"}


def _caller() -> tuple[str, int] | None:
    """The innermost stack frame outside torch and this module (the step's line that issued the operator), as
    (file, line); cheap enough to take for every operator, the source is read only for a message."""
    torch_dir = os.path.dirname(torch.__file__)
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename
        if not name.startswith(torch_dir) and name != __file__:
            return name, frame.f_lineno
        frame = frame.f_back
    return None


def _at(location: tuple[str, int] | None) -> str:
    """`` (at file:line: source)`` for an error message, or nothing."""
    if location is None:
        return ""
    name, line = location
    return f" (at {name}:{line}: {linecache.getline(name, line).strip()})"


class _Recording:
    """The operators of one step, each with its arguments: outside tensors by storage, Python values by value."""

    def __init__(self) -> None:
        self.ops: list[tuple[str, tuple[Any, ...]]] = []
        self.where: list[tuple[str, int] | None] = []  # the step's line that issued each operator
        self.alive: list[Tensor] = []  # keeps outside tensors alive, so a rebound tensor cannot reuse the address

    def compare(self, other: _Recording, key: Hashable) -> None:
        where = f"under graph key {key!r}"
        for i, ((name, sig), (name2, sig2)) in enumerate(zip(self.ops, other.ops, strict=False)):
            if name != name2:
                raise GraphSafetyError(
                    f"operator {i} of the step was {name} when captured and is {name2} now {where}: the step's "
                    f"control flow changes between steps, which a replay cannot follow{_at(other.where[i])}"
                )
            if sig != sig2:
                raise GraphSafetyError(f"operator {i} ({name}) {where}: {_difference(sig, sig2)}{_at(other.where[i])}")
        if len(self.ops) != len(other.ops):
            raise GraphSafetyError(
                f"the step issued {len(self.ops)} operators when captured and {len(other.ops)} now {where}"
            )


def _difference(captured: tuple[Any, ...], now: tuple[Any, ...]) -> str:
    if len(captured) != len(now):
        return f"takes {len(now)} arguments now, {len(captured)} when captured"
    for a, b in zip(captured, now, strict=True):
        if a == b:
            continue
        if isinstance(a, tuple) and a[:1] == ("tensor",) and isinstance(b, tuple) and b[:1] == ("tensor",):
            return (
                "reads a different tensor than when captured (a tensor was replaced, not updated in place: "
                "use t.copy_(new) or an in-place op instead of rebinding t)"
            )
        return f"a Python argument changed from {a!r} to {b!r}; a replay would keep the captured value"
    return "arguments differ"


class _Recorder(TorchDispatchMode):
    """Records one step's operators; fails on host syncs, Python data and undeclared random streams."""

    def __init__(self, generators: Sequence[torch.Generator]) -> None:
        super().__init__()
        self.paused = False  # inside the optimiser's step: run operators without recording them
        self.recording = _Recording()
        self.generators = list(generators)
        self.fresh: set[int] = set()  # storages allocated inside this step

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        kwargs = kwargs or {}
        if self.paused or func.name().startswith("profiler::"):  # the optimiser's update; profiler markers
            return func(*args, **kwargs)
        name = func.overloadpacket.__name__
        if name in _HOST_SYNC:
            raise GraphSafetyError(
                f"the step synchronises with the host ({name}: .item(), .tolist(), a data-dependent shape or "
                f"boolean indexing); a graph cannot capture that. Keep the value on the device{_at(_caller())}."
            )
        if name in _FROM_PYTHON:
            raise GraphSafetyError(
                "the step makes a tensor from Python data (torch.tensor(...)), a host-to-device copy a graph cannot "
                f"capture; build it once outside the step, or with torch.full/arange on the device{_at(_caller())}"
            )
        flat, _ = tree_flatten((args, kwargs))
        inputs: set[int] = set()
        sig: list[Any] = []
        for a in flat:
            if isinstance(a, Tensor):
                ptr = a.untyped_storage().data_ptr()
                inputs.add(ptr)
                if ptr in self.fresh:
                    sig.append(("fresh", tuple(a.shape), a.dtype))
                else:
                    sig.append(("tensor", ptr, a.storage_offset(), tuple(a.shape), a.dtype))
                    self.recording.alive.append(a)
            elif isinstance(a, torch.Generator):  # a fresh Python wrapper per call: match declared ones by state
                state = a.get_state()
                index = next((i for i, g in enumerate(self.generators) if torch.equal(g.get_state(), state)), None)
                if index is None:
                    raise GraphSafetyError(
                        "the step draws from a random generator it did not declare; pass it in StepGraph's "
                        f"generators so the graph advances it{_at(_caller())}"
                    )
                sig.append(("generator", index))
            else:
                sig.append(a)
        out = func(*args, **kwargs)
        for o in tree_flatten(out)[0]:
            if isinstance(o, Tensor):
                ptr = o.untyped_storage().data_ptr()
                if ptr not in inputs:
                    self.fresh.add(ptr)
        self.recording.ops.append((name, tuple(sig)))
        self.recording.where.append(_caller())
        return out
