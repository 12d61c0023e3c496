"""Callbacks: what happens around the loop (logging, metric records, progress) without living in it."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

log = logging.getLogger("dfcil")


class Callback:
    """Hook points of the engine. Records are plain JSON-able dicts."""

    def on_task_start(self, info: dict[str, Any]) -> None: ...

    def on_epoch_end(self, record: dict[str, Any]) -> None: ...

    def on_task_end(self, record: dict[str, Any]) -> None: ...

    def on_run_end(self, summary: dict[str, Any]) -> None: ...


class ConsoleLogger(Callback):
    """One log line per epoch and per task (to the console and, when configured, ``run.log``)."""

    def on_task_start(self, info: dict[str, Any]) -> None:
        log.info(
            "task %d (of 0..%d): %d new classes (%d seen), %d training images, phases %s",
            info["task"],
            info["num_tasks"] - 1,
            info["n_new"],
            info["n_seen"],
            info["train_images"],
            ", ".join(f"{p['name']}×{p['epochs']}" for p in info["phases"]),
        )

    def on_epoch_end(self, record: dict[str, Any]) -> None:
        losses = " ".join(f"{k}={v:.4f}" for k, v in record["loss"].items())
        log.info(
            "task %d %s epoch %d/%d lr=%.4g %s (%.1fs, %.0f img/s)",
            record["task"],
            record["phase"],
            record["epoch"] + 1,
            record["epochs"],
            record["lr"],
            losses,
            record["time_s"],
            record["images_per_s"],
        )

    def on_task_end(self, record: dict[str, Any]) -> None:
        old = "" if record["old_acc"] is None else f", old {record['old_acc']:.2f}"
        log.info(
            "task %d: accuracy on %d seen classes %.2f%% (new %.2f%s); row %s",
            record["task"],
            record["n_seen"],
            record["acc"],
            record["new_acc"],
            old,
            [round(a, 2) for a in record["acc_row"]],
        )
        t = record["timing"]
        phases = ", ".join(f"{k} {v['time_s']:.1f}s ({v['images_per_s']:.0f} img/s)" for k, v in t["phases"].items())
        log.info(
            "task %d time: setup %.1fs, %s, eval %.1fs; peak memory %.0f MB",
            record["task"],
            t.get("setup_s", 0.0),
            phases or "no training",
            t["eval_s"],
            t["peak_memory_mb"],
        )

    def on_run_end(self, summary: dict[str, Any]) -> None:
        log.info(
            "done: last accuracy A_N %.2f%%, average incremental accuracy %.2f%% (%.0fs)",
            summary["last_acc"],
            summary["avg_inc_acc"],
            summary["wall_time_s"],
        )


class JsonlLogger(Callback):
    """Appends every epoch and task record to ``metrics.jsonl`` (one JSON object per line, crash-safe)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _write(self, record: dict[str, Any]) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")

    def on_epoch_end(self, record: dict[str, Any]) -> None:
        self._write({"type": "epoch", **record})

    def on_task_end(self, record: dict[str, Any]) -> None:
        self._write({"type": "task", **record})
