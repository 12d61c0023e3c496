"""One run over several processes (``torchrun --nproc-per-node K -m dfcil train ...``): ranks, and the few
collective operations the engine and the methods need.

How a run is split (docs/distributed.md):

* every rank holds the whole model and draws the same random numbers from the same streams: the epoch's batch
  order, each batch's augmentation and the synthetic batch's latent codes are drawn for the whole global batch on
  every rank, and each rank keeps its share of the rows (:meth:`Dist.shard`). Random streams therefore stay equal
  on every rank, so rank 0's checkpoint resumes every rank;
* each rank computes its loss terms on its share, the gradients are averaged over ranks after ``backward``
  (:meth:`Dist.average_gradients`), so the update is the one-process update of the global batch within rounding;
* terms that are not means over samples are computed over the global batch: relational KD on gathered features
  (:meth:`Dist.gather`), a class-weighted CE with the global weight sum, label counts summed over ranks, and batch
  norm with statistics over the global batch (``engine.sync_bn``);
* model inversion runs on every rank alike (the same streams give the same generator) without communication.

A single process is a :class:`Dist` of one rank: every operation is then the identity.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import Tensor
from torch.nn.modules.batchnorm import _BatchNorm

from dfcil.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Dist:
    """This process's place in the run: ``rank`` of ``world`` processes, ``local_rank`` on its machine."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def active(self) -> bool:
        return self.world > 1

    @property
    def main(self) -> bool:
        """Rank 0: the process that writes the run directory."""
        return self.rank == 0

    def check_batch(self, batch_size: int, key: str = "train.batch_size") -> None:
        if batch_size % self.world:
            raise ConfigError(
                f"{key} {batch_size} does not split over {self.world} processes; the global batch stays "
                f"the configured size, so it must be a multiple of the number of processes"
            )

    def shard(self, x: Tensor) -> Tensor:
        """This rank's rows of a global batch (``len(x)`` divisible by the world size)."""
        if not self.active:
            return x
        n = x.shape[0] // self.world
        return x[self.rank * n : (self.rank + 1) * n]

    def average_gradients(self, params: list[Tensor]) -> None:
        """Replace every gradient by its mean over ranks: one all-reduce of all gradients flattened together."""
        if not self.active:
            return

        def mean_(flat: Tensor) -> None:
            dist.all_reduce(flat)
            flat /= self.world

        _flat([p.grad for p in params if p.grad is not None], mean_)

    def sum_(self, x: Tensor) -> Tensor:
        """``x`` summed over ranks, in place (no gradient)."""
        if self.active:
            dist.all_reduce(x)
        return x

    def mean(self, x: Tensor) -> Tensor:
        """The mean of ``x`` over ranks (a step's loss terms: each rank's are means over its share)."""
        if not self.active:
            return x
        x = x.clone()
        dist.all_reduce(x)
        return x / self.world

    def gather(self, x: Tensor) -> Tensor:
        """Every rank's ``x`` concatenated in rank order (the global batch), differentiable: the gradient of each
        rank's part comes back to that rank, summed over the ranks that used it."""
        if not self.active:
            return x
        from torch.distributed.nn.functional import all_gather

        return torch.cat(all_gather(x))

    def all_sum(self, x: Tensor) -> Tensor:
        """``x`` summed over ranks, differentiable (synchronised batch-norm statistics)."""
        if not self.active:
            return x
        from torch.distributed.nn.functional import all_reduce

        return all_reduce(x)

    def share_buffers(self, net: torch.nn.Module) -> None:
        """Give every process the first one's running statistics of the batch-norm layers that normalise each
        process's share alone (``engine.sync_bn: false``; DistributedDataParallel's ``broadcast_buffers``), so that
        the model, its evaluation and its checkpoints are the same on every process. One broadcast per step."""
        if not self.active:
            return
        buffers = [
            b for m in net.modules() if isinstance(m, _BatchNorm) and getattr(m, "sync", None) is None
            for b in (m.running_mean, m.running_var) if b is not None
        ]  # fmt: skip
        _flat(buffers, lambda flat: dist.broadcast(flat, src=0))

    def barrier(self) -> None:
        if self.active:
            dist.barrier()

    def decide(self, value: bool) -> bool:
        """The first process's ``value``, on every process."""
        if not self.active:
            return value
        t = torch.tensor([float(value)], device=_collective_device())
        dist.broadcast(t, src=0)
        return bool(t.item())

    def flag(self, value: bool) -> bool:
        """True on every rank if ``value`` is true on any (an interrupt requested on one rank)."""
        if not self.active:
            return value
        t = torch.tensor([float(value)], device=_collective_device())
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item())


def _flat(tensors: list[Tensor], collective: Callable[[Tensor], object]) -> None:
    """Run ``collective`` (in place) once on all of ``tensors`` flattened together, and copy the result back."""
    if not tensors:
        return
    flat = torch.cat([t.reshape(-1) for t in tensors])
    collective(flat)
    offset = 0
    for t in tensors:
        t.copy_(flat[offset : offset + t.numel()].view_as(t))
        offset += t.numel()


def device_of(device: torch.device, dist: Dist) -> torch.device:
    """The device of this process: under several processes on CUDA, GPU ``local_rank``."""
    if dist.active and device.type == "cuda":
        return torch.device("cuda", dist.local_rank)
    return device


def _collective_device() -> torch.device:
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def current() -> Dist:
    """The running process group's place, or a single process."""
    if not (dist.is_available() and dist.is_initialized()):
        return Dist()
    return Dist(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", dist.get_rank())))


def start(device_type: str) -> Dist:
    """Join the process group torchrun describes in the environment (``WORLD_SIZE`` > 1): NCCL for CUDA, gloo for
    the CPU; each rank on GPU ``LOCAL_RANK``. Without torchrun: a single process."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1 or (dist.is_available() and dist.is_initialized()):
        return current()
    if not dist.is_available():
        raise ConfigError("this PyTorch has no torch.distributed; run a single process")
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if device_type == "cuda":
        if local >= torch.cuda.device_count():
            raise ConfigError(
                f"rank {local} on this machine has no GPU (only {torch.cuda.device_count()}); start at most as many "
                f"processes per machine as it has GPUs (torchrun --nproc-per-node)"
            )
        torch.cuda.set_device(local)
    dist.init_process_group("nccl" if device_type == "cuda" else "gloo")
    return current()


def stop() -> None:
    """Leave the process group (at the end of a command)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
