"""Everything a run is made of before and between its training steps: the validated protocol, the network, the
method, the random streams, the position, and the checkpoint payload that holds them all. The engine's loop
(:mod:`dfcil.engine`) works on a :class:`Session`, identically for a fresh run and a resume."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import random
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from dfcil.config import ConfigError, RunConfig, changed_keys, config_to_dict
from dfcil.data.datasets import ImageDataset, build_dataset
from dfcil.data.device import select_classes
from dfcil.data.splits import ClassIncrementalSplit, SplitError
from dfcil.io import check_creatable_dir, write_atomic
from dfcil.methods import TaskContext, build_method
from dfcil.metrics import AccuracyMatrix
from dfcil.models.heads import HEADS
from dfcil.models.network import build_network
from dfcil.models.resnet_cifar import BACKBONES
from dfcil.progress import ProgressFactory, make_progress
from dfcil.state import FORMAT, Checkpointer, CheckpointError, Position, capture_rng, dumps, loads, restore_rng

log = logging.getLogger("dfcil")


@dataclasses.dataclass(frozen=True)
class Protocol:
    """A validated run setting: the dataset and how it is cut into tasks."""

    dataset: ImageDataset
    split: ClassIncrementalSplit
    train_images: tuple[int, ...]  # training images per task
    test_images: tuple[int, ...]  # test images per task


@dataclasses.dataclass
class EpochProgress:
    """A partly done epoch: its batch order, batches done and each step's loss terms so far (for mid-epoch
    checkpoints). Recording a step is one device copy; sums and the first non-finite step are read at the end."""

    perm: Tensor
    step: int = 0
    names: list[str] | None = None
    values: Tensor | None = None  # (steps in the epoch, terms), rows 0..step-1 filled

    def state_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_state(cls, state: dict[str, Any], device: torch.device) -> EpochProgress:
        state = {k: v.to(device) if isinstance(v, Tensor) else v for k, v in state.items()}
        sums, first_bad = state.pop("sums", None), state.pop("first_bad", None)
        if sums is not None:  # a checkpoint of an earlier version, with running sums: same sums, same first bad step
            values = torch.zeros(max(state["step"], 1), len(sums), device=device)
            values[0] = sums
            for term, at in enumerate(first_bad.tolist()):
                if at >= 0:
                    values[at, term] = float("nan")
            state["values"] = values
        return cls(**state)


def resolve_device(name: str) -> torch.device:
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


def prepare(cfg: RunConfig) -> Protocol:
    """Load the data and build the protocol, raising a clear error for anything that cannot run."""
    method = build_method(cfg.method, cfg.train)  # cross-field checks of the method's config
    BACKBONES.get(cfg.model.backbone)  # an unknown backbone or head is refused before anything is written
    HEADS.get(type(method).head)
    device = resolve_device(cfg.device)
    if cfg.engine.compile != "none":
        check_compiler(device)
    if cfg.task0_cache:
        try:
            check_creatable_dir(cfg.task0_cache, "task0_cache", "set it to a directory or leave it unset")
        except ValueError as err:
            raise ConfigError(str(err)) from None
    d = cfg.data
    dataset = build_dataset(d.name, d.root, download=d.download, num_classes=d.num_classes)
    split = ClassIncrementalSplit.build(
        dataset.num_classes, d.num_tasks, d.base_classes, d.class_order, d.class_order_seed, d.num_classes
    )
    lut, offsets = split.label_map(dataset.num_classes), split.offsets
    train_n, test_n = [], []
    for t in range(split.num_tasks):
        labels = range(offsets[t], offsets[t + 1])
        train_n.append(len(select_classes(dataset.train, lut, labels, d.train_per_class)[1]))
        test_n.append(len(select_classes(dataset.test, lut, labels, d.test_per_class)[1]))
    for t, n in enumerate(train_n):
        if n < cfg.train.batch_size:
            raise SplitError(
                f"task {t} has {n} training images, fewer than train.batch_size={cfg.train.batch_size}; with drop_last "
                f"it would never train. Use fewer tasks, more images per class or a smaller batch"
            )
    if min(test_n) == 0:
        raise SplitError(f"a task has no test images (per task: {test_n}); check data.test_per_class")
    return Protocol(dataset, split, tuple(train_n), tuple(test_n))


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # also seeds every CUDA device


@contextlib.contextmanager
def process_state_kept():
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


def check_same_config(saved: dict[str, Any] | None, cfg: RunConfig) -> None:
    """Refuse to continue a checkpoint under a config that differs from the one it was written with, except in
    runtime keys (``config.RUNTIME_KEYS``): an edited ``config.yaml`` would silently give a mixed run."""
    if saved is None:  # checkpoints of the first layout hold no config
        return
    now = config_to_dict(cfg)
    changed = changed_keys(saved, now)
    if not changed:
        return

    def value(d: dict[str, Any], key: str) -> str:
        for part in key.split("."):
            d = d.get(part) if isinstance(d, dict) else None
        return json.dumps(d)

    shown = [f"{k}: {value(saved, k)} in the checkpoint, {value(now, k)} now" for k in changed[:6]]
    more = f" and {len(changed) - 6} more keys" if len(changed) > 6 else ""
    raise ConfigError(
        f"the run's checkpoint was written with another config ({'; '.join(shown)}{more}): was the run's "
        f"config.yaml edited? Put it back as it was to continue the run, or start a new run for the new config"
    )


class Session:
    """All mutable state of one run, with its checkpoint payload. Built identically for a fresh run and a resume."""

    def __init__(self, cfg: RunConfig, protocol: Protocol, checkpointer: Checkpointer | None, metrics: Path | None):
        self.cfg, self.protocol = cfg, protocol
        self.device = resolve_device(cfg.device)
        self.checkpointer, self.metrics = checkpointer, metrics
        seed_everything(cfg.seed)
        self.method = build_method(cfg.method, cfg.train)
        self.net = build_network(cfg.model.backbone, type(self.method).head, cfg.model.head_init_std).to(self.device)
        engine = cfg.engine
        if engine.channels_last:
            self.net.to(memory_format=torch.channels_last)
        if self.device.type == "cuda":
            torch.backends.cudnn.benchmark = engine.cudnn_benchmark
        if engine.compile != "none":
            self.net.compile_backbone(mode=None if engine.compile == "default" else engine.compile)
        self.rngs = {  # shuffling and augmentation; the method's latent codes
            "data": torch.Generator(device=self.device).manual_seed(cfg.seed),
            "method": torch.Generator(device=self.device).manual_seed(cfg.seed + 1),
        }
        self.acc = AccuracyMatrix(protocol.split.num_tasks)
        self.pos = Position()
        self.timings: list[dict[str, Any]] = []  # finished tasks'
        self.task_timing: dict[str, Any] = {}  # the running task's, so far (kept across processes by checkpoints)
        self.static_ref: dict[str, Any] | None = None
        self.task0_unusable = False  # the shared first-task model exists but could not be read: replace it
        self.last_save = time.monotonic()
        self.started = time.monotonic()
        self.elapsed_before = 0.0  # seconds spent by earlier processes of this run, up to their last checkpoint

    def elapsed_s(self) -> float:
        """Seconds of work this run has kept: earlier processes up to their checkpoints plus this process."""
        return self.elapsed_before + time.monotonic() - self.started

    def merges(self) -> tuple[bool, bool]:
        """(merge_teacher, merge_student) from ``engine.merge_passes``."""
        mode = self.cfg.engine.merge_passes
        if mode == "auto":
            mode = "all" if self.device.type == "cuda" else "teacher"
        return mode != "none", mode == "all"

    def autocast(self) -> contextlib.AbstractContextManager:
        """bf16 autocast around forward passes when ``engine.precision`` is bf16; weights stay fp32."""
        enabled = self.cfg.engine.precision == "bf16"
        cache = self.cfg.engine.cuda_graphs == "off"  # casts cached across a captured step would not be replayed
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=enabled, cache_enabled=cache)

    def payload(self, optimizer: torch.optim.Optimizer | None = None, epoch: EpochProgress | None = None) -> dict:
        static = self.method.static_state_dict()
        if static and (self.static_ref is None or self.static_ref["task"] != self.pos.task):
            self.static_ref = {"task": self.pos.task, "digest": self.checkpointer.save_static(self.pos.task, static)}
        return {
            "position": dataclasses.asdict(self.pos),
            "head_sizes": self.net.head.sizes,
            "net": self.net.state_dict(),
            "optimizer": optimizer.state_dict() if optimizer is not None else None,
            "method": self.method.state_dict(),
            "static": self.static_ref if static else None,
            "epoch_progress": epoch.state_dict() if epoch is not None else None,
            "acc": self.acc.state_dict(),
            "timings": self.timings,
            "task_timing": self.task_timing,
            "elapsed_s": self.elapsed_s(),
            "rng": capture_rng(self.rngs),
            "metrics_bytes": self.metrics.stat().st_size if self.metrics and self.metrics.exists() else 0,
            "config": config_to_dict(self.cfg),
        }

    def save(self, optimizer: torch.optim.Optimizer | None = None, epoch: EpochProgress | None = None) -> None:
        if self.checkpointer is not None:
            self.checkpointer.save(self.payload(optimizer, epoch))
            self.last_save = time.monotonic()

    def restore(self, payload: dict[str, Any]) -> dict[str, Any]:
        """Load a checkpoint payload; returns what the task loop needs to continue (optimizer, epoch state)."""
        self.pos = Position(**payload["position"])
        for n in payload["head_sizes"][len(self.net.head.sizes) :]:
            self.net.expand(n)
        self.net.load_state_dict(payload["net"])
        self.method.load_state_dict(
            payload["method"], self.context(self.pos.task), (payload.get("static_state") or {}) or None
        )
        self.static_ref = payload["static"]
        self.acc.load_state_dict(payload["acc"])
        self.timings = list(payload["timings"])
        self.task_timing = dict(payload.get("task_timing") or {})  # absent from checkpoints before it existed
        self.elapsed_before = float(payload.get("elapsed_s", 0.0))
        restore_rng(payload["rng"], self.rngs)  # last: building the state above consumed random numbers
        epoch = payload["epoch_progress"]
        if epoch:
            epoch = EpochProgress.from_state(epoch, self.device)
        return {"optimizer": payload["optimizer"], "epoch": epoch or None}

    def context(self, task: int, progress: ProgressFactory | None = None, save_point=None) -> TaskContext:
        o = self.protocol.split.offsets
        n_old, n_new = o[min(task, len(o) - 2)], o[min(task, len(o) - 2) + 1] - o[min(task, len(o) - 2)]
        return TaskContext(
            task, n_old, n_new, self.protocol.split.num_tasks, self.net, self.device, self.protocol.dataset.image_size,
            self.cfg.train.batch_size, self.rngs["method"], progress or make_progress(False),
            save_point or (lambda: None), *self.merges(), self.autocast,
            self.cfg.engine.channels_last, self.cfg.engine.fused_optimizer and self.device.type == "cuda",
            self.cfg.engine.cuda_graphs,
        )  # fmt: skip

    # ------------------------------------------------------------------------------ shared first-task models

    def task0_key(self) -> str | None:
        """Digest of everything that shapes the model and random state at the end of task 0, or None when the
        method does not share its first task. Methods with the same task-0 recipe share the file."""
        signature = self.method.task0_signature()
        if signature is None:
            return None
        split, data, cfg = self.protocol.split, self.cfg.data, config_to_dict(self.cfg)
        phases = [dataclasses.asdict(p) | {"name": None} for p in self.method.phases(self.context(0))]
        fields = {
            "dfcil": __import__("dfcil").__version__,
            "dataset": self.protocol.dataset.name,
            "task0_classes": split.tasks[0],
            "train_per_class": data.train_per_class,
            "test_per_class": data.test_per_class,
            "model": cfg["model"],
            "head": type(self.method).head,
            # the phases carry epochs, lr and milestones of task 0; eval batch size never changes results
            "train": {
                k: v for k, v in cfg["train"].items() if k in ("batch_size", "momentum", "weight_decay", "gamma")
            },  # fmt: skip
            "seed": self.cfg.seed,
            # how the engine computes changes the numbers (bf16; within rounding the rest), and so does the kind of
            # device; graphs replay the same kernels
            "engine": {k: v for k, v in cfg["engine"].items() if k != "cuda_graphs"},
            "device": self.device.type,
            "signature": signature,
            "phases": phases,
        }
        return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:32]

    def task0_path(self) -> Path | None:
        key = self.task0_key() if self.cfg.task0_cache else None
        return Path(self.cfg.task0_cache) / f"task0-{key}.pt" if key else None

    def load_task0(self) -> bool:
        """Start from a shared first-task model if one exists; True when it did. One that cannot be read is
        trained again here (and replaced at the end of task 0)."""
        path = self.task0_path()
        if path is None or not path.exists():
            return False
        try:
            payload = loads(path.read_bytes(), str(path))
        except CheckpointError as err:
            log.warning("cannot use the shared first-task model %s (%s): training task 0, then replacing it", path, err)
            self.task0_unusable = True
            return False
        self.restore(payload)
        return True

    def store_task0(self) -> None:
        """Share this run's first-task model (called at the end of task 0) unless one is already stored."""
        path = self.task0_path()
        if path is None or (path.exists() and not self.task0_unusable) or self.method.state_dict():
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        payload = self.payload()
        payload["metrics_bytes"] = 0
        write_atomic(path, dumps({"format": FORMAT, **payload}))
