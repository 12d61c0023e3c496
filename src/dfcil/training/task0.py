"""Shared first-task models: runs whose task 0 is trained identically (the same classes, schedule, model, seed and
engine, and a method whose first task is the same loss) share one trained task-0 model through ``task0_cache``.

A run that finds its model there starts at task 1; one that does not stores its own at the end of task 0. The key
is a digest of everything that shapes the model and the random streams at the end of task 0: the data (its
first-task classes, images and how they are fed), the model, schedule, seed and engine, and the code's revision.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from pathlib import Path
from typing import Any

from dfcil.checkpoint import FORMAT, dumps, loads
from dfcil.compute.distributed import Dist, current
from dfcil.compute.runtime import resolve_device
from dfcil.config import RunConfig, config_to_dict
from dfcil.errors import CheckpointError
from dfcil.io import write_atomic
from dfcil.methods import Method, Task, build_method
from dfcil.training.loop import Callback, Loop
from dfcil.training.protocol import Protocol
from dfcil.version import source_revision

log = logging.getLogger("dfcil")


def task0_key(cfg: RunConfig, protocol: Protocol, method: Method | None = None) -> str | None:
    """Digest of everything that shapes the model and random state at the end of task 0, or None when the method
    (the run's, or one built from ``cfg``) does not share its first task. Methods with the same task-0 recipe share
    the file."""
    method = method or build_method(cfg.method, cfg.train)
    signature = method.task0_signature()
    if signature is None:
        return None
    split, data, raw = protocol.split, cfg.data, config_to_dict(cfg)
    first = Task(task_id=0, n_old=0, n_new=split.offsets[1], num_tasks=split.num_tasks)
    fields = {
        "code": source_revision(),  # a model trained by other code is another model
        "dataset": protocol.dataset.name,
        "task0_classes": split.tasks[0],
        "task0_data": protocol.data_identity(data.train_per_class, tasks=1, sample=64),  # not where it lies
        "train_per_class": data.train_per_class,
        "test_per_class": data.test_per_class,
        "crop_fill": data.crop_fill,
        "augment": data.augment,
        "model": raw["model"],
        "head": method.head,
        # the phases carry epochs, lr and milestones of task 0; eval batch size never changes results
        "train": {k: v for k, v in raw["train"].items() if k in ("batch_size", "momentum", "weight_decay", "gamma")},
        "seed": cfg.seed,
        # how the engine computes changes the numbers (bf16; within rounding the rest), and so does the kind of
        # device; graphs replay the same kernels
        "engine": {k: v for k, v in raw["engine"].items() if k != "cuda_graphs"},
        "device": resolve_device(cfg.device).type,
        "signature": signature,
        "phases": [dataclasses.asdict(p) | {"name": None} for p in method.phases(first)],
    }
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:32]


class Task0Cache(Callback):
    """Loads a shared first-task model instead of training task 0 (:meth:`load`), or stores this run's."""

    def __init__(self, cfg: RunConfig, protocol: Protocol, method: Method) -> None:
        key = task0_key(cfg, protocol, method) if cfg.task0_cache else None
        if cfg.task0_cache and key is None and current().main:  # a sweep's one cache, over methods of both kinds
            log.warning("task0_cache %s is not used: %s does not share its first task (Method.task0_signature), so "
                        "task 0 is trained and not stored", cfg.task0_cache, cfg.method.name)  # fmt: skip
        self.config = config_to_dict(cfg)  # kept with the model, as a checkpoint keeps it
        self.path = Path(cfg.task0_cache) / f"task0-{key}.pt" if key else None
        self.loaded = False  # this run starts from the shared model
        self.unusable = False  # the shared model exists but could not be read: replace it

    def load(self, dist: Dist = Dist()) -> dict[str, Any] | None:  # noqa: B008 - frozen
        """The shared first-task model's payload, or None. One that cannot be read is trained again here (and
        replaced at the end of task 0). Over several processes the first decides for all (another run may write the
        file while they look), and the others read what it read."""
        there = self.path is not None and self.path.exists()
        if not dist.active:
            return self._read() if there else None
        payload = self._read() if dist.main and there else None
        if not dist.decide(payload is not None):
            return None
        return payload if dist.main else self._read()

    def _read(self) -> dict[str, Any] | None:
        try:
            payload = loads(self.path.read_bytes(), str(self.path))
        except CheckpointError as err:
            log.warning("cannot use the shared first-task model %s (%s): training task 0, then replacing it",
                        self.path, err)  # fmt: skip
            self.unusable = True
            return None
        self.loaded = True
        return payload

    def on_run_start(self, loop: Loop) -> None:
        self.loop = loop

    def on_task_end(self, record: dict[str, Any]) -> None:
        """Share this run's first-task model unless one is stored or the method keeps state beyond the network."""
        path = self.path
        if record["task"] != 0 or self.loaded or path is None or (path.exists() and not self.unusable):
            return
        if self.loop.method.state_dict():
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        payload = self.loop.snapshot() | {"config": self.config, "static": None, "metrics_bytes": 0}
        write_atomic(path, dumps({"format": FORMAT, **payload}))
