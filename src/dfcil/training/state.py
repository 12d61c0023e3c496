"""The engine's run state: everything about a run that changes as it trains, besides the network and the method.

:class:`RunState` holds the position, the accuracy matrix, the timings, the random streams, the partly done epoch
and the running task's optimiser. Every checkpoint saves its :meth:`RunState.state_dict` and a resume restores it
with :meth:`RunState.load_state_dict`, in one place (:func:`dfcil.training.engine.restore`).
"""

from __future__ import annotations

import dataclasses
import random
import time
from typing import Any

import numpy as np
import torch
from torch import Tensor

from dfcil.data.splits import ClassIncrementalSplit
from dfcil.errors import CheckpointError
from dfcil.metrics import AccuracyMatrix


@dataclasses.dataclass
class Position:
    """Where a run stands. A checkpoint at ``(task, stage, phase, epoch, step)`` resumes right there.

    ``stage``: ``"start"`` (nothing of ``task`` done yet), ``"setup"`` (inside the method's task setup, e.g.
    inversion) or ``"train"`` (phase ``phase``, ``epoch`` epochs of it done, plus ``step`` batches of the next).
    """

    task: int = 0
    stage: str = "start"
    phase: int = 0
    epoch: int = 0
    step: int = 0


@dataclasses.dataclass
class Interrupt:
    """Set by a signal handler; the engine finishes the current step, checkpoints and stops."""

    requested: bool = False


@dataclasses.dataclass
class EpochProgress:
    """A partly done epoch: its batch order, batches done and each step's loss terms so far (for mid-epoch
    checkpoints). Recording a step is one device copy; means and the first non-finite step are read at the end."""

    perm: Tensor
    step: int = 0
    names: list[str] | None = None
    values: Tensor | None = None  # (steps in the epoch, terms), rows 0..step-1 filled

    def record(self, losses: Tensor, names: list[str], steps: int) -> None:
        """Keep one step's loss terms (``losses`` in the order of ``names``) of an epoch of ``steps`` steps."""
        if self.names is None:
            self.names, self.values = names, losses.new_zeros(steps, len(names))
        elif names != self.names:
            raise RuntimeError(
                f"the loss terms changed within an epoch, from {self.names} to {names}: a method's training_step "
                f"must return the same terms at every step of a phase"
            )
        self.values[self.step].copy_(losses)  # the step's only bookkeeping on the device: one copy
        self.step += 1

    def first_non_finite(self) -> tuple[int, str] | None:
        """(step, term name) of the first non-finite loss term, in step order, or None."""
        if self.names is None:
            return None
        bad = (~torch.isfinite(self.values[: self.step])).nonzero().tolist()
        return (bad[0][0], self.names[bad[0][1]]) if bad else None

    def means(self) -> dict[str, float]:
        """Each loss term's mean over the steps done."""
        if self.names is None:
            return {}
        return dict(zip(self.names, (self.values[: self.step].sum(dim=0) / self.step).tolist(), strict=True))

    def state_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_state(cls, state: dict[str, Any], device: torch.device) -> EpochProgress:
        return cls(**{k: v.to(device) if isinstance(v, Tensor) else v for k, v in state.items()})


@dataclasses.dataclass
class RunState:
    """All mutable state of a run besides the network and the method. Every checkpoint saves it, but for the
    process's own start time and a restored optimiser state not yet handed to an optimiser."""

    acc: AccuracyMatrix
    rngs: dict[str, torch.Generator]  # "data": shuffling and augmentation; "method": the method's latent codes
    position: Position = dataclasses.field(default_factory=Position)
    epoch: EpochProgress | None = None  # the running epoch, while one runs
    optimizer: torch.optim.Optimizer | None = None  # the running task's, once its training began
    # hand-off: a checkpoint's optimiser state, loaded into the optimiser fit_task builds next (then None)
    optimizer_handoff: dict[str, Any] | None = None
    elapsed_before: float = 0.0  # seconds spent by earlier processes of this run, up to their last checkpoint
    started: float = dataclasses.field(default_factory=time.monotonic)

    @classmethod
    def new(cls, num_tasks: int, seed: int, device: torch.device) -> RunState:
        rngs = {
            "data": torch.Generator(device=device).manual_seed(seed),
            "method": torch.Generator(device=device).manual_seed(seed + 1),
        }
        return cls(AccuracyMatrix(num_tasks), rngs)

    def elapsed_s(self) -> float:
        """Seconds of work this run has kept: earlier processes up to their checkpoints plus this process."""
        return self.elapsed_before + time.monotonic() - self.started

    def task_record(self, task: int, split: ClassIncrementalSplit) -> dict[str, Any]:
        """What a finished task's line of ``metrics.jsonl`` holds of the run state: its accuracy row (the callbacks
        add theirs: timings, diagnostics)."""
        row = self.acc.summary()
        return {
            "task": task, "n_seen": split.offsets[task + 1], "classes": split.tasks[task],
            "acc": row["acc_per_task"][task], "acc_task_avg": row["acc_per_task_task_avg"][task],
            "acc_row": row["accuracy_matrix"][task][: task + 1], "new_acc": row["new_acc"][task],
            "old_acc": row["old_acc"][task], "correct_row": row["correct_matrix"][task][: task + 1],
            "count_row": row["count_matrix"][task][: task + 1],
        }  # fmt: skip

    def state_dict(self) -> dict[str, Any]:
        return {
            "position": dataclasses.asdict(self.position),
            "optimizer": self.optimizer.state_dict() if self.optimizer is not None else None,
            "epoch_progress": self.epoch.state_dict() if self.epoch is not None else None,
            "acc": self.acc.state_dict(),
            "elapsed_s": self.elapsed_s(),
            "rng": capture_rng(self.rngs),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`; the random streams last, as building the rest of a run consumes them."""
        device = self.rngs["data"].device
        self.position = Position(**state["position"])
        self.acc.load_state_dict(state["acc"])
        self.elapsed_before = float(state["elapsed_s"])
        self.epoch = EpochProgress.from_state(state["epoch_progress"], device) if state["epoch_progress"] else None
        self.optimizer, self.optimizer_handoff = None, state["optimizer"]
        restore_rng(state["rng"], self.rngs)


def capture_rng(generators: dict[str, torch.Generator]) -> dict[str, Any]:
    """Every random stream a run draws from: Python, NumPy (legacy), torch CPU and CUDA, named generators."""
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "python": [version, list(internal), gauss],
        "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)],
        "torch": torch.get_rng_state(),
        "cuda": [torch.cuda.get_rng_state(i) for i in range(torch.cuda.device_count())]
        if torch.cuda.is_initialized()
        else [],
        "generators": {name: g.get_state() for name, g in generators.items()},
    }


def restore_rng(state: dict[str, Any], generators: dict[str, torch.Generator]) -> None:
    """Set every stream of :func:`capture_rng`; checks the named generators before any stream is set."""
    if set(state["generators"]) != set(generators):
        raise CheckpointError(f"checkpoint has RNG streams {sorted(state['generators'])}, run has {sorted(generators)}")
    for name, g in generators.items():
        if state["generators"][name].numel() != g.get_state().numel():  # CPU: 5056 bytes of state, CUDA: 16
            raise CheckpointError(
                f"the checkpoint's random stream {name!r} comes from another kind of device than {g.device}; a run "
                f"resumes on the kind of device it was started on (cuda:0 -> cuda:1 works, cpu <-> cuda does not)"
            )
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    for i, s in enumerate(state["cuda"][: torch.cuda.device_count()]):
        torch.cuda.set_rng_state(s, i)
    for name, g in generators.items():
        g.set_state(state["generators"][name])
