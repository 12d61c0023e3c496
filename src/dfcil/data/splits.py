"""Class-incremental protocols: class order, task sizes and the label remap. Pure, no I/O."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence

import numpy as np

from dfcil.errors import SplitError


def class_order_from_seed(num_classes: int, seed: int) -> list[int]:
    """The class order of ABD and R-DFCIL: ``random.seed(seed); random.shuffle(list(range(C)))``.

    A private ``random.Random`` gives the same sequence as the module-level functions without touching global
    state. CIFAR-100, seed 0: 23, 8, 11, 7, 48, 13, 1, 91, ...
    """
    order = list(range(num_classes))
    random.Random(seed).shuffle(order)
    return order


def task_sizes(num_classes: int, num_tasks: int, base_classes: int = 0) -> list[int]:
    """Classes per task, as cl-lite's ``split_task``.

    ``base_classes == 0``: N tasks of ``C // N`` classes, the first one enlarged by what makes the rest divide evenly:
    ``C // N + (C - C // N) % (N - 1)``, then N - 1 tasks of what is left over N - 1. That gives the remainder
    ``C % N`` to the first task except when it is N - 1, where the later tasks get one class more (200 classes in 3
    tasks: 66, 67, 67).
    ``base_classes > 0``: a first task of that many classes, then N - 1 equal tasks (the "half-base" protocol of
    Hou et al.: 50 base classes then 5/10/25 tasks for N = 6/11/26).
    """
    if num_tasks < 1:
        raise SplitError(f"num_tasks must be at least 1, got {num_tasks}")
    if num_tasks > num_classes:
        raise SplitError(
            f"cannot split {num_classes} classes into {num_tasks} tasks: a task needs at least one class; set "
            f"data.num_tasks to {num_classes} or fewer"
        )
    if base_classes == 0:
        if num_tasks == 1:
            return [num_classes]
        first = num_classes // num_tasks
        first += (num_classes - first) % (num_tasks - 1)
        return [first] + [(num_classes - first) // (num_tasks - 1)] * (num_tasks - 1)
    if base_classes < 0 or base_classes > num_classes:
        raise SplitError(f"base_classes must be in [1, {num_classes}] (or 0 for equal tasks), got {base_classes}")
    rest = num_classes - base_classes
    if num_tasks == 1:
        if rest:
            raise SplitError(
                f"a single task must hold all {num_classes} classes, but base_classes is {base_classes}; "
                f"set base_classes to 0 or {num_classes}, or num_tasks > 1"
            )
        return [base_classes]
    if rest == 0:
        raise SplitError(
            f"base_classes={base_classes} takes all {num_classes} classes, leaving none for the other "
            f"{num_tasks - 1} tasks; set base_classes below {num_classes}, or num_tasks to 1"
        )
    if rest < num_tasks - 1 or rest % (num_tasks - 1):
        valid = [n + 1 for n in range(1, rest + 1) if rest % n == 0]
        raise SplitError(
            f"cannot split {num_classes} classes into a first task of {base_classes} and {num_tasks - 1} equal tasks: "
            f"{rest} remaining classes are not divisible by {num_tasks - 1}. "
            f"With base_classes={base_classes}, num_tasks can be one of {valid}"
        )
    return [base_classes] + [rest // (num_tasks - 1)] * (num_tasks - 1)


@dataclasses.dataclass(frozen=True)
class ClassIncrementalSplit:
    """A class order cut into tasks. Label k of the remapped problem is ``class_order[k]``.

    Remapping raw labels to their position in the order makes each task's logits one contiguous block:
    task t owns labels ``[offsets[t], offsets[t + 1])``.
    """

    class_order: tuple[int, ...]
    task_sizes: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(set(self.class_order)) != len(self.class_order):
            raise SplitError("class_order lists a class more than once")
        if sum(self.task_sizes) != len(self.class_order) or min(self.task_sizes, default=0) < 1:
            raise SplitError(f"task sizes {list(self.task_sizes)} do not partition {len(self.class_order)} classes")

    @classmethod
    def build(
        cls,
        dataset_classes: int,
        num_tasks: int,
        base_classes: int = 0,
        class_order: Sequence[int] | None = None,
        class_order_seed: int = 0,
        num_classes: int | None = None,
    ) -> ClassIncrementalSplit:
        """Build a split for a dataset with ``dataset_classes`` classes.

        Args:
            dataset_classes: classes the dataset has (raw labels are ``0 .. dataset_classes - 1``).
            num_tasks: N, tasks in the protocol.
            base_classes: classes of the first task; 0 for N equal tasks.
            class_order: explicit order (a permutation of a subset of the raw labels), or None to generate it.
            class_order_seed: seed of the generated order.
            num_classes: use only the first ``num_classes`` classes of the order.
        """
        if class_order is None:
            order = class_order_from_seed(dataset_classes, class_order_seed)
        else:
            order = [int(c) for c in class_order]
            bad = [c for c in order if not 0 <= c < dataset_classes]
            if bad:
                raise SplitError(f"class_order holds labels outside 0..{dataset_classes - 1}: {bad[:5]}")
            if len(set(order)) != len(order):
                dup = sorted({c for c in order if order.count(c) > 1})
                raise SplitError(f"class_order lists classes more than once: {dup[:5]}")
        if num_classes is not None:
            if num_classes > len(order):
                raise SplitError(f"num_classes={num_classes} but the class order has only {len(order)} classes")
            order = order[:num_classes]
        return cls(tuple(order), tuple(task_sizes(len(order), num_tasks, base_classes)))

    @property
    def num_tasks(self) -> int:
        return len(self.task_sizes)

    @property
    def num_classes(self) -> int:
        return len(self.class_order)

    @property
    def offsets(self) -> tuple[int, ...]:
        """``offsets[t]`` = classes seen before task t; ``offsets[-1]`` = all classes."""
        return tuple(int(v) for v in np.concatenate([[0], np.cumsum(self.task_sizes)]))

    @property
    def tasks(self) -> list[list[int]]:
        """Raw class ids of each task, in order."""
        o = self.offsets
        return [list(self.class_order[o[t] : o[t + 1]]) for t in range(self.num_tasks)]

    def label_map(self, dataset_classes: int) -> np.ndarray:
        """Array mapping raw label → position in the order, -1 for classes outside the protocol."""
        lut = np.full(dataset_classes, -1, dtype=np.int64)
        lut[list(self.class_order)] = np.arange(self.num_classes)
        return lut

    def task_of_label(self) -> np.ndarray:
        """Array mapping remapped label → task index."""
        return np.repeat(np.arange(self.num_tasks), self.task_sizes)
