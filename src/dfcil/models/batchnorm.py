"""BatchNorm with two explicit extras, passed through ``forward`` instead of hooks.

* ``splits``: normalise a batch as ``splits`` equal groups, each with its own batch statistics, updating the
  running statistics once per group in order. For ``cat([real, synthetic])`` with ``splits=2`` this equals two
  separate forward passes (real first), which is what the R-DFCIL reference does, in one network pass.
* ``record``: append each layer's input statistics (batch mean and biased variance over N, H, W, next to the
  layer's running statistics) to a list, for the BN-statistics loss of model inversion.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import torch
from torch import Tensor, nn


class BNStats(NamedTuple):
    mean: Tensor  # (C,) batch mean of the layer input
    var: Tensor  # (C,) biased batch variance of the layer input
    running_mean: Tensor  # (C,)
    running_var: Tensor  # (C,)


@dataclasses.dataclass
class BNMode:
    """How the BN layers of one forward pass behave; a fresh object per pass."""

    splits: int = 1  # statistics groups along the batch (train mode only)
    record: list[BNStats] | None = None  # when a list, every BN layer appends its input statistics


class BatchNorm2d(nn.BatchNorm2d):
    """``nn.BatchNorm2d`` that understands :class:`BNMode`; identical to it when ``bn`` is None."""

    def forward(self, x: Tensor, bn: BNMode | None = None) -> Tensor:  # type: ignore[override]
        if bn is None:
            return super().forward(x)
        if bn.record is not None:
            xf = x.float()  # statistics in fp32 even under autocast; mean and var (var_mean is slower on CPUs)
            mean, var = xf.mean(dim=(0, 2, 3)), xf.var(dim=(0, 2, 3), unbiased=False)
            bn.record.append(BNStats(mean, var, self.running_mean, self.running_var))
        if bn.splits == 1 or not self.training:
            return super().forward(x)
        if x.shape[0] % bn.splits:
            raise ValueError(f"batch of {x.shape[0]} does not split into {bn.splits} equal BN groups")
        return torch.cat([super(BatchNorm2d, self).forward(part) for part in x.chunk(bn.splits)])
