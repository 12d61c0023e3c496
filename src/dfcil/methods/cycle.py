"""BiCyc's cycle-consistent distiller (Xu et al., ICLR 2026) as a part a method with a frozen old model composes
(R-DFCIL+'s ``method.cycle``; docs/rdfcil-plus.md, "The cycle switch"): a fresh new → old MLP distiller D per task,
trained with the backbone, and a streaming affine old → new map A that D learns to undo. The maths is in
:mod:`dfcil.losses.cycle`."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from dfcil.compute.precision import full_precision
from dfcil.losses.cycle import PairMoments, affine_map, cycle_losses, update_moments
from dfcil.methods.adapter import mlp


class CycleDistiller:
    """One task's D (Linear(d, multiplier·d), GELU, Linear(multiplier·d, d), AdaGauss's distiller) and the weighted
    moments of the step's feature pairs that give A. :meth:`losses` is called once per training step with the
    student's features z and the old model's z° of the step's real images; it adds them to the moments first, so
    that A is the centred ridge fit of z on z° over the steps so far, weighted toward the recent ones (``momentum``
    per step), and returns MSE(D(z), z°) and MSE(D(A(z°)), z°)."""

    def __init__(
        self,
        d: int,
        multiplier: int,
        ridge: float,
        momentum: float,
        device: torch.device | str,
        rng: torch.Generator | None,
    ) -> None:
        # rng None: the distiller left uninitialised, for a saved state to load into (nothing drawn)
        self.net: nn.Module = mlp(d, multiplier * d, device, rng)
        self.moments = PairMoments.zeros(d, device)
        self.ridge, self.momentum = ridge, momentum

    def losses(self, new: Tensor, old: Tensor) -> tuple[Tensor, Tensor]:
        """(distillation, cycle) for the step's features ``new`` = z (with grad) and ``old`` = z° (N, d)."""
        with torch.no_grad(), full_precision(old.device.type):  # fp32 moments and solve under a bf16 step
            for kept, now in zip(self.moments, update_moments(self.moments, old, new, self.momentum), strict=True):
                kept.copy_(now)  # in place: a CUDA graph reads and writes the same memory at every replay
            p, b = affine_map(self.moments, self.ridge)
            mapped = old.float() @ p + b  # A(z°), detached: the cycle trains D alone
        return cycle_losses(self.net(new), self.net(mapped), old)

    def state_dict(self) -> dict[str, Any]:
        return {"net": self.net.state_dict(), "moments": [t.clone() for t in self.moments]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.net.load_state_dict(state["net"])
        for kept, saved in zip(self.moments, state["moments"], strict=True):
            kept.copy_(saved)
