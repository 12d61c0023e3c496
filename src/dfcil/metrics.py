"""Class-incremental metrics from the accuracy matrix. NumPy only; no engine imports, so reports can use it.

Notation: after learning task i (row), ``correct[i, j]`` of ``count[i, j]`` test images of task j's classes
(column, j ≤ i) are classified correctly, with the argmax over all classes seen so far. All accuracies are in
percent. Definitions (docs/metrics.md has them with examples):

* ``a[i, j] = 100 · correct[i, j] / count[i, j]``: the accuracy matrix, lower-triangular.
* ``A_i`` (sample-weighted: the paper's definition under "Evaluation Protocol" in §4, and cl-lite's): accuracy
  over all seen test images, ``100 · Σ_j≤i correct[i, j] / Σ_j≤i count[i, j]``.
* ``A_i`` (task-averaged, ABD's): ``mean_j≤i a[i, j]``. Equal to the sample-weighted one when every task has the
  same number of test images; they differ under the half-base protocol.
* last accuracy ``A_N`` = A of the last row; average incremental accuracy ``mean_i A_i``, first task included.
* new accuracy after task i = ``a[i, i]``; old accuracy = sample-weighted accuracy on tasks j < i.
* forgetting (Chaudhry et al. 2018) = mean over j < N−1 of ``max_{j ≤ l < N−1} a[l, j] − a[N−1, j]``.
* backward transfer (BWT, Lopez-Paz & Ranzato 2017) = mean over j < N−1 of ``a[N−1, j] − a[j, j]``.
"""

from __future__ import annotations

from typing import Any

import numpy as np


class AccuracyMatrix:
    """Correct/total counts per (row = after task i, column = task j) for a protocol of ``num_tasks`` tasks."""

    def __init__(self, num_tasks: int) -> None:
        self.num_tasks = num_tasks
        self.correct = np.zeros((num_tasks, num_tasks), dtype=np.int64)
        self.count = np.zeros((num_tasks, num_tasks), dtype=np.int64)
        self.rows_done = 0

    def record(self, task: int, correct: np.ndarray, count: np.ndarray) -> None:
        """Store the evaluation after ``task``: per-task correct and total counts for tasks 0..task."""
        if task != self.rows_done:
            raise ValueError(f"row {task} recorded out of order (expected {self.rows_done})")
        correct, count = np.asarray(correct), np.asarray(count)
        if correct.shape != (task + 1,) or count.shape != (task + 1,) or (count <= 0).any():
            raise ValueError(f"row {task} needs {task + 1} positive counts, got {count}")
        self.correct[task, : task + 1] = correct
        self.count[task, : task + 1] = count
        self.rows_done += 1

    # ----------------------------------------------------------------------------------- derived quantities

    def matrix(self) -> np.ndarray:
        """(rows_done, num_tasks) accuracies in percent, NaN above the diagonal."""
        n = self.rows_done
        with np.errstate(invalid="ignore", divide="ignore"):
            acc = 100.0 * self.correct[:n] / self.count[:n]
        acc[self.count[:n] == 0] = np.nan
        return acc

    def acc_per_task(self) -> np.ndarray:
        """Sample-weighted A_i for each completed row."""
        n = self.rows_done
        return 100.0 * self.correct[:n].sum(1) / self.count[:n].sum(1)

    def acc_per_task_task_avg(self) -> np.ndarray:
        """Task-averaged A_i for each completed row."""
        return np.nanmean(self.matrix(), axis=1) if self.rows_done else np.zeros(0)

    def new_acc(self) -> np.ndarray:
        return np.diag(self.matrix()[:, : self.rows_done]).copy()

    def old_acc(self) -> np.ndarray:
        """Sample-weighted accuracy on the old tasks' images after each task; NaN after the first."""
        out = np.full(self.rows_done, np.nan)
        for i in range(1, self.rows_done):
            out[i] = 100.0 * self.correct[i, :i].sum() / self.count[i, :i].sum()
        return out

    def forgetting(self) -> float:
        n = self.rows_done
        if n < 2:
            return float("nan")
        a = self.matrix()
        return float(np.mean([a[j : n - 1, j].max() - a[n - 1, j] for j in range(n - 1)]))

    def bwt(self) -> float:
        n = self.rows_done
        if n < 2:
            return float("nan")
        a = self.matrix()
        return float(np.mean([a[n - 1, j] - a[j, j] for j in range(n - 1)]))

    def summary(self) -> dict[str, Any]:
        """JSON-able metrics; NaN becomes None."""
        weighted, averaged = self.acc_per_task(), self.acc_per_task_task_avg()
        last = self.rows_done - 1
        return _jsonable(
            {
                "accuracy_matrix": self.matrix(),
                "correct_matrix": self.correct[: self.rows_done],
                "count_matrix": self.count[: self.rows_done],
                "acc_per_task": weighted,
                "last_acc": weighted[last] if self.rows_done else np.nan,
                "avg_inc_acc": weighted.mean() if self.rows_done else np.nan,
                "acc_per_task_task_avg": averaged,
                "last_acc_task_avg": averaged[last] if self.rows_done else np.nan,
                "avg_inc_acc_task_avg": averaged.mean() if self.rows_done else np.nan,
                "new_acc": self.new_acc(),
                "old_acc": self.old_acc(),
                "forgetting": self.forgetting(),
                "bwt": self.bwt(),
            }
        )

    def state_dict(self) -> dict[str, Any]:
        return {"correct": self.correct.tolist(), "count": self.count.tolist(), "rows_done": self.rows_done}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.correct = np.asarray(state["correct"], dtype=np.int64)
        self.count = np.asarray(state["count"], dtype=np.int64)
        self.rows_done = int(state["rows_done"])
        self.num_tasks = self.correct.shape[0]


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, np.ndarray):
        return _jsonable(value.tolist())
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, float | np.floating):
        return None if np.isnan(value) else round(float(value), 4)
    if isinstance(value, np.integer):
        return int(value)
    return value
