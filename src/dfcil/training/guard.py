"""The loss guard: what stops a training that diverged, once per epoch, from the loss terms the epoch recorded."""

from __future__ import annotations

import dataclasses

from dfcil.errors import LossLimitError, NonFiniteLossError
from dfcil.training.state import EpochProgress

FIX = "Lower the learning rate or this term's weight; the run directory keeps the checkpoint of the last good epoch"


@dataclasses.dataclass(frozen=True)
class LossGuard:
    """Refuses an epoch whose loss terms diverged: a term that became NaN or infinite at any step, or whose mean
    over the epoch passed ``max_loss`` (``train.max_loss``; None: no limit)."""

    max_loss: float | None = 1e10

    def check(self, epoch: EpochProgress, where: str) -> dict[str, float]:
        """The epoch's mean loss terms, once they pass.

        Args:
            epoch: the epoch's recorded steps.
            where: ``"task 1, phase rrl, epoch 3"``, for the message.

        Raises:
            NonFiniteLossError: naming the first non-finite term and its step.
            LossLimitError: naming a term whose epoch mean passed ``max_loss``.
        """
        bad = epoch.first_non_finite()  # (step, term): later ones usually follow from it
        if bad is not None:
            raise NonFiniteLossError(f"loss term {bad[1]!r} became non-finite in {where}, step {bad[0]}. {FIX}.")
        means, limit = epoch.means(), self.max_loss
        if limit is not None and (big := next(((k, v) for k, v in means.items() if v > limit), None)):
            raise LossLimitError(
                f"loss term {big[0]!r} averaged {big[1]:.4g} in {where}, above train.max_loss ({limit:g}): the "
                f"training diverged. {FIX} (train.max_loss null: no limit)."
            )
        return means
