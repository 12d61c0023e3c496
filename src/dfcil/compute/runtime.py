"""Where and how a run computes: the device, the engine's switches as one :class:`Runtime`, and the process-wide
settings a run touches (global random streams, cuDNN's autotuner), which it gives back when it ends."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import random
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from dfcil.compute.distributed import Dist
from dfcil.compute.graphs import GraphMode
from dfcil.config import EngineConfig
from dfcil.errors import ConfigError
from dfcil.progress import ProgressFactory, make_progress


@dataclasses.dataclass(frozen=True, kw_only=True)
class Runtime:
    """How the engine computes, for the steps a method runs itself (model inversion, imprinting) and the
    modules it builds. None of it changes what is computed beyond rounding, except ``precision``."""

    device: torch.device = torch.device("cpu")
    precision: Literal["fp32", "bf16"] = "fp32"  # bf16: autocast around forward passes, fp32 weights and losses
    merge_teacher: bool = True  # one eval-mode pass over [real; synthetic] where it is exact (teacher, CHR)
    merge_student: bool = False  # one train-mode student pass over [real; synthetic] with per-half BN statistics
    channels_last: bool = False  # modules a method builds (generators) use NHWC
    fused: bool = False  # optimisers a method builds may use fused kernels (CUDA only)
    graphs: GraphMode = "off"  # engine.cuda_graphs, for the steps a method runs itself
    progress: ProgressFactory = dataclasses.field(default_factory=lambda: make_progress(False))
    compiler: StepCompiler | None = None  # engine.compile: step; None: steps run as written
    dist: Dist = Dist()  # this process's place in a run over several processes (torchrun)
    split_inversion: bool = True  # engine.distributed_inversion: split (else every process inverts alike)
    # train.max_loss: a loss term of a method's own optimisation (model inversion) above it stops the run as
    # diverged, as a non-finite one does; None: no limit
    max_loss: float | None = 1e10

    def compiled(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` through :attr:`compiler` under ``engine.compile: step``, else ``fn`` itself."""
        return self.compiler(fn) if self.compiler is not None else fn

    def eager(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` kept out of compiled graphs under ``engine.compile: step`` (run eagerly between them), else ``fn``
        itself. Applied per run rather than as a decorator, because ``torch.compiler.disable`` imports the compiler
        (seconds of start-up) for every command that merely imports the module."""
        return torch.compiler.disable(fn) if self.compiler is not None else fn

    @classmethod
    def from_config(
        cls,
        engine: EngineConfig,
        device: torch.device,
        progress: ProgressFactory,
        dist: Dist = Dist(),  # noqa: B008 - frozen
        max_loss: float | None = 1e10,
    ) -> Runtime:
        merge = engine.merge_passes
        if merge == "auto":  # a merged 256-image pass is slower than two 128-image ones on a CPU
            merge = "all" if device.type == "cuda" else "teacher"
        return cls(
            device=device, precision=engine.precision, merge_teacher=merge != "none", merge_student=merge == "all",
            channels_last=engine.channels_last, fused=engine.fused_optimizer and device.type == "cuda",
            graphs=engine.cuda_graphs, progress=progress,
            compiler=StepCompiler(engine.compile_backend, engine.compile_mode) if engine.compile == "step" else None,
            dist=dist,
            split_inversion=engine.distributed_inversion == "split", max_loss=max_loss,
        )  # fmt: skip

    def autocast(self) -> AbstractContextManager:
        """bf16 autocast around forward passes when ``precision`` is bf16; weights stay fp32. In fp32 no autocast
        context at all: even a disabled one is an op in a compiled step's graph, and AOTAutograd's on-disk cache
        refuses graphs that hold it (every later run would compile them again)."""
        if self.precision != "bf16":
            return contextlib.nullcontext()
        cache = self.graphs == "off"  # casts cached across a captured step would not be replayed
        return torch.autocast(self.device.type, dtype=torch.bfloat16, cache_enabled=cache)


class StepCompiler:
    """``engine.compile: step``: step functions through ``torch.compile`` with ``backend``, counting the compilations
    and the wall time of the calls that compiled (reported in each task's timings).

    Compiled code is cached per function (its code object) for the process, so a step function defined once at
    module level compiles once for each set of guards it meets (phase kind, train or eval mode, shapes), however
    many tasks call it. What it compiles is also kept on disk (:func:`compile_cache`, ``engine.compile_cache``), so
    that later runs, a sweep's or another machine's that carries the directory, load it instead.
    """

    def __init__(self, backend: str = "inductor", mode: str = "default") -> None:
        self.backend = backend
        self.mode = None if mode == "default" or backend != "inductor" else mode  # modes are inductor's
        self.compiles = 0  # frames (graphs) compiled so far
        self.seconds = 0.0  # wall time of the calls that compiled, the compiled step's one run included
        self.loaded = 0  # of their forward/backward graphs, those loaded from the disk cache (engine.compile_cache)

    def __call__(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        compiled = torch.compile(fn, backend=self.backend, mode=self.mode, dynamic=False)

        def call(*args: Any) -> Any:
            before, hits, t0 = _frames_compiled(), _cache_hits(), time.perf_counter()
            out = compiled(*args)
            if (n := _frames_compiled() - before) > 0:
                self.compiles += n
                self.seconds += time.perf_counter() - t0
                self.loaded += _cache_hits() - hits
            return out

        return call


def compile_cache_dir(setting: str) -> Path | None:
    """The directory ``engine.compile_cache`` names: None for ``off``; for ``auto`` $TORCHINDUCTOR_CACHE_DIR where
    set, else ``$XDG_CACHE_HOME/dfcil/torch-compile`` (``~/.cache/dfcil/torch-compile``): outside the temporary
    directory, which torch's own default is and which a reboot or a fresh job's ``/tmp`` empties."""
    if setting == "off":
        return None
    if setting == "auto":
        if env := os.environ.get("TORCHINDUCTOR_CACHE_DIR"):
            return Path(env)
        base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
        return Path(base) / "dfcil" / "torch-compile"
    return Path(setting).expanduser().absolute()


@contextlib.contextmanager
def compile_cache(setting: str) -> Iterator[Path | None]:
    """While the block runs, torch.compile reads and writes its on-disk caches (inductor's FX graphs, AOTAutograd's
    forward/backward pairs, generated kernels) in :func:`compile_cache_dir`, so that a run whose graphs an earlier
    run compiled loads them instead of compiling again; ``off``: every cache disabled, generated code in a temporary
    directory removed afterwards. The process's environment and inductor's config are as before afterwards.
    Dynamo's tracing of the Python code is not cached by torch: it is what a warm run still spends."""
    import torch._inductor.config as inductor  # imported only by runs that compile

    path, previous = compile_cache_dir(setting), os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    disabled = inductor.force_disable_caches
    with contextlib.ExitStack() as stack:
        if path is None:
            path_for_code = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="dfcil-compile-")))
            inductor.force_disable_caches = True
        else:
            path_for_code = path
        try:
            path_for_code.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise ConfigError(
                f"engine.compile_cache: cannot create {path_for_code} ({err.strerror}); set it to a writable "
                f"directory, or off"
            ) from None
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(path_for_code)
        try:
            yield path
        finally:
            inductor.force_disable_caches = disabled
            if previous is None:
                os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
            else:
                os.environ["TORCHINDUCTOR_CACHE_DIR"] = previous


def _frames_compiled() -> int:
    """Frames torch.compile has compiled in this process (dynamo's counter)."""
    from torch._dynamo.utils import counters

    return counters["frames"]["ok"]


def _cache_hits() -> int:
    """Graphs AOTAutograd has loaded from its disk cache in this process instead of compiling them."""
    from torch._dynamo.utils import counters

    return counters["aot_autograd"]["autograd_cache_hit"]


def resolve_device(name: str) -> torch.device:
    """``auto`` → cuda if available, else cpu; anything else is checked against this machine."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"device: {name!r} is not a device; use auto, cpu, cuda or cuda:N") from None
    if device.type not in ("cpu", "cuda"):
        raise ConfigError(f"device: {name!r} is not supported (dfcil trains on cpu and cuda); use auto, cpu or cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device {name!r} requested but CUDA is not available here; use --device cpu")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ConfigError(
            f"device {name!r} requested but this machine has {torch.cuda.device_count()} CUDA device(s); "
            f"use cuda:0 to cuda:{torch.cuda.device_count() - 1}"
        )
    return device


def check_compiler(device: torch.device) -> None:
    """Refuse ``engine.compile`` where inductor cannot generate code for ``device`` (Triton on CUDA, a C++
    compiler on the CPU), before a run directory exists: the failure would otherwise come at the first step."""
    fix = "or set engine.compile: none"
    if device.type == "cuda":
        from torch.utils._triton import has_triton

        if not has_triton():
            raise ConfigError(f"engine.compile needs Triton for CUDA, which this PyTorch lacks; install triton {fix}")
    elif device.type == "cpu":
        from torch._inductor.cpp_builder import get_cpp_compiler
        from torch._inductor.exc import InvalidCxxCompiler

        try:
            get_cpp_compiler()
        except InvalidCxxCompiler:
            raise ConfigError(
                f"engine.compile needs a C++ compiler on the CPU and found none (g++ on PATH, or $CXX); install one "
                f"{fix}"
            ) from None


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # also seeds every CUDA device


@contextlib.contextmanager
def process_state_kept() -> Iterator[None]:
    """Give the process back as the run found it: Python's, NumPy's and torch's global random streams and cuDNN's
    autotuner switch, which a run sets (:func:`seed_everything`, ``engine.cudnn_benchmark``).

    A library caller's own random draws go on after a run as if it had not happened (CUDA's streams where CUDA was
    initialised before the run), and two runs in one process do not depend on each other or on their order.
    """
    py, npy, cpu = random.getstate(), np.random.get_state(), torch.get_rng_state()
    cuda = (
        [torch.cuda.get_rng_state(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_initialized() else []
    )
    benchmark = torch.backends.cudnn.benchmark
    try:
        yield
    finally:
        random.setstate(py)
        np.random.set_state(npy)
        torch.set_rng_state(cpu)
        for i, state in enumerate(cuda):
            torch.cuda.set_rng_state(state, i)
        torch.backends.cudnn.benchmark = benchmark


def peak_memory_mb(device: torch.device) -> float:
    """Peak device memory since the last reset (CUDA), or the process's peak resident memory (CPU)."""
    if device.type == "cuda":
        return round(torch.cuda.max_memory_allocated(device) / 2**20, 1)
    import resource

    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)  # Linux reports KiB
