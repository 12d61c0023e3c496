"""BatchNorm with two explicit extras, passed through ``forward`` instead of hooks.

* ``splits``: normalise a batch as ``splits`` equal groups, each with its own batch statistics, updating the
  running statistics once per group in order. For ``cat([real, synthetic])`` with ``splits=2`` this equals two
  separate forward passes (real first), which is what the R-DFCIL reference does, in one network pass.
* ``record``: append each layer's input statistics (batch mean and biased variance over N, H, W, next to the
  layer's running statistics) to a list, for the BN-statistics loss of model inversion.

In train mode a layer given a :class:`BNMode` leaves its ``num_batches_tracked`` to :meth:`BNMode.count`, which
the network calls once after its forward: one multi-tensor add instead of one kernel per layer and pass (the
counter only matters to ``momentum=None``, whose layers count as ``nn.BatchNorm2d`` does).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class BNStats(NamedTuple):
    mean: Tensor  # (C,) batch mean of the layer input
    var: Tensor  # (C,) biased batch variance of the layer input
    running_mean: Tensor  # (C,)
    running_var: Tensor  # (C,)


def batch_moments(x: Tensor) -> tuple[Tensor, Tensor]:
    """Per-channel mean and biased variance of ``x`` (N, C, H, W) over N, H and W, in fp32 whatever ``x``'s dtype.

    Equal to ``x.float().mean((0, 2, 3))`` and ``x.float().var((0, 2, 3), unbiased=False)`` within rounding, in fewer
    kernels: one ``var_mean`` forward (two cheap passes on CPUs, where ``var`` is a scalar loop some 40× slower than
    ``mean``), and a backward that is one fused multiply-add over ``x`` instead of autograd's chain for each of
    ``mean`` and ``var``: d mean / dx = 1 / n and d var / dx = 2 (x - mean) / n. Inside ``torch.compile`` the plain
    ops (the compiler fuses them itself; a custom Function would keep the graph out of AOTAutograd's disk cache).
    """
    if torch.compiler.is_compiling():
        xf = x.float()
        var, mean = torch.var_mean(xf, dim=(0, 2, 3), unbiased=False)
        return mean, var
    return _BatchMoments.apply(x)


def global_moments(x: Tensor, dist, count: bool = False) -> tuple[Tensor, ...]:  # noqa: ANN001
    """:func:`batch_moments` over every process's ``x`` together (``dist`` a :class:`dfcil.compute.distributed.Dist`):
    per-channel sums, sums of squares and counts summed over processes, differentiably; with ``count`` also the
    number of values per channel."""
    c, xf = x.shape[1], x.float()
    n = torch.full((1,), xf.numel() // c, dtype=torch.float32, device=x.device)
    stats = dist.all_sum(torch.cat([xf.sum(dim=(0, 2, 3)), xf.square().sum(dim=(0, 2, 3)), n]))
    total = stats[2 * c]
    mean = stats[:c] / total
    var = (stats[c : 2 * c] / total - mean.square()).clamp(min=0)
    return (mean, var, total) if count else (mean, var)


def synchronise(module: nn.Module, dist) -> None:  # noqa: ANN001
    """Make every batch-norm layer of ``module`` normalise training batches with the global batch's statistics over
    ``dist``'s processes; plain ``nn.BatchNorm2d`` layers (a generator's) are replaced by :class:`BatchNorm2d`."""
    for name, child in list(module.named_children()):
        if type(child) is nn.BatchNorm2d:
            twin = BatchNorm2d(child.num_features, child.eps, child.momentum, child.affine, child.track_running_stats)
            twin.load_state_dict(child.state_dict())
            child = twin.to(next(iter(child.buffers())).device)
            setattr(module, name, child)
        if isinstance(child, BatchNorm2d):
            child.sync = dist
        else:
            synchronise(child, dist)


_TWO_PASS_DEVICES = frozenset({"cpu"})  # where var_mean is slow; benchmarks/archive/op_count.py counts CUDA's path


class _BatchMoments(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor) -> tuple[Tensor, Tensor]:  # noqa: ANN001
        xf = x.float()
        if xf.device.type in _TWO_PASS_DEVICES:
            mean = xf.mean(dim=(0, 2, 3))
            var = (xf - mean[:, None, None]).square().mean(dim=(0, 2, 3))
        else:
            var, mean = torch.var_mean(xf, dim=(0, 2, 3), unbiased=False)
        ctx.save_for_backward(x, mean)
        return mean, var

    @staticmethod
    def backward(ctx, grad_mean: Tensor, grad_var: Tensor) -> Tensor:  # noqa: ANN001
        x, mean = ctx.saved_tensors
        n = x.numel() // x.shape[1]  # the gradient is x * grad_var * 2/n + shift: three kernels in all
        shift = torch.addcmul(grad_mean / n, grad_var, mean, value=-2.0 / n)  # (C,)
        return torch.addcmul(shift[:, None, None], x, grad_var[:, None, None], value=2.0 / n).to(x.dtype)


@dataclasses.dataclass
class BNMode:
    """How the BN layers of one forward pass behave; a fresh object per pass."""

    splits: int = 1  # statistics groups along the batch (train mode only)
    record: list[BNStats] | None = None  # when a list, every BN layer appends its input statistics
    record_sync: object = None  # a Dist of several processes: record the global batch's statistics
    tracked: list[Tensor] = dataclasses.field(default_factory=list)  # counters that :meth:`count` advances

    def count(self) -> None:
        """Advance the ``num_batches_tracked`` of every layer that normalised with batch statistics in this pass by
        ``splits`` (what as many separate passes would count), in one operation; call once, after the forward."""
        if self.tracked:
            torch._foreach_add_(self.tracked, self.splits)
            self.tracked.clear()


class BatchNorm2d(nn.BatchNorm2d):
    """``nn.BatchNorm2d`` that understands :class:`BNMode`; identical to it when ``bn`` is None. With :attr:`sync`
    (a :class:`dfcil.compute.distributed.Dist` of several processes, set by the engine under ``engine.sync_bn``) a
    training batch is normalised with the statistics of the global batch, every process's part of each BN group
    together."""

    sync = None  # a Dist of several processes: synchronise batch statistics

    def _synchronised(self, x: Tensor) -> Tensor:
        """Batch norm of ``x`` with mean and variance over the global batch: per-channel sums, sums of squares and
        counts summed over processes (differentiably), the running statistics updated as one process would."""
        if self.momentum is None:
            raise ValueError("synchronised batch norm needs a momentum (the cumulative average is not supported)")
        xf = x.float()
        mean, var, total = global_moments(x, self.sync, count=True)
        with torch.no_grad():
            self.running_mean.lerp_(mean.detach().to(self.running_mean.dtype), self.momentum)
            unbiased = var.detach() * total / (total - 1).clamp(min=1)
            self.running_var.lerp_(unbiased.to(self.running_var.dtype), self.momentum)
        scale = torch.rsqrt(var + self.eps)
        if self.weight is not None:
            scale = scale * self.weight
        out = (xf - mean[None, :, None, None]) * scale[None, :, None, None]
        if self.bias is not None:
            out = out + self.bias[None, :, None, None]
        return out.to(x.dtype)

    def forward(self, x: Tensor, bn: BNMode | None = None) -> Tensor:  # type: ignore[override]
        if bn is None and self.training and self.sync is not None and self.sync.active:
            out = self._synchronised(x)  # a layer called without a BNMode (a generator's)
            if self.num_batches_tracked is not None:
                self.num_batches_tracked.add_(1)
            return out
        if bn is None:
            return super().forward(x)
        if bn.record is not None:
            mean, var = batch_moments(x) if bn.record_sync is None else global_moments(x, bn.record_sync)
            bn.record.append(BNStats(mean, var, self.running_mean, self.running_var))
        if not self.training:
            return super().forward(x)
        if x.shape[0] % bn.splits:
            raise ValueError(f"batch of {x.shape[0]} does not split into {bn.splits} equal BN groups")
        parts = x.chunk(bn.splits) if bn.splits > 1 else (x,)
        if self.sync is not None and self.sync.active:  # statistics over every process's part (engine.sync_bn)
            out = [self._synchronised(part) for part in parts]
            if self.num_batches_tracked is not None:
                bn.tracked.append(self.num_batches_tracked)
        elif self.momentum is None:  # a cumulative average depends on the count between the groups: count as nn does
            out = [super(BatchNorm2d, self).forward(part) for part in parts]
        else:
            out = [
                F.batch_norm(
                    part, self.running_mean, self.running_var, self.weight, self.bias, True, self.momentum, self.eps
                )
                for part in parts
            ]
            if self.num_batches_tracked is not None:
                bn.tracked.append(self.num_batches_tracked)
        return torch.cat(out) if len(out) > 1 else out[0]
