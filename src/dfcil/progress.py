"""Progress bars (tqdm): one per phase on a terminal, silent when output is not a TTY (logs, CI, SLURM)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tqdm.auto import tqdm

ProgressFactory = Callable[..., Any]


def make_progress(enabled: bool | None = None) -> ProgressFactory:
    """A factory ``(total, desc, initial=0, unit="it") -> tqdm``.

    Args:
        enabled: True/False forces bars on/off; None shows them only when stderr is a terminal.
    """
    disable = None if enabled is None else not enabled

    def factory(total: int, desc: str, initial: int = 0, unit: str = "it") -> tqdm:
        return tqdm(
            total=total, desc=desc, initial=initial, unit=unit, disable=disable, leave=False, dynamic_ncols=True
        )

    return factory
