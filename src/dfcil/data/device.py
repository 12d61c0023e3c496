"""Device-resident task data and batched augmentation: no DataLoader, no per-image Python in the hot loop.

A task's training images stay on the training device as one uint8 tensor. Each step gathers a batch, normalises
it and applies the training augmentation (``data.augment``) per sample with batched tensor ops. ``cropflip``, the
reference's:

    ToTensor → Normalize(mean, std) → RandomCrop(size, padding=4) → RandomHorizontalFlip

in that order, as cl-lite. Padding happens *after* normalisation, so the border is zero in normalised space, i.e.
the dataset-mean colour, not black. Crop offsets are uniform in 0..2·pad on each axis, independently per image.
``autoaugment``, APR-EFCIL's recipe (LDC's without the policy), on the image's 0..255 levels before normalising:

    RandomCrop(size, padding=4) → RandomHorizontalFlip → ColorJitter(brightness=63/255) → AutoAugment → Normalize

with the same border colour as ``cropflip`` (``data.crop_fill``) and the policy by image size
(:mod:`dfcil.data.autoaugment`). Both draw every random number from the batches' generator, a fixed count per batch.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from dfcil.compute.distributed import Dist
from dfcil.data.autoaugment import AutoAugment, brightness_jitter, policy_for
from dfcil.data.datasets import ImageArrays

AUGMENTS = ("cropflip", "autoaugment")  # data.augment


def class_indices(
    arrays: ImageArrays, label_map: np.ndarray, labels: Sequence[int], per_class: int | None = None
) -> np.ndarray:
    """Indices, in file order, of the images whose remapped label is in ``labels`` (at most ``per_class`` each,
    the first in file order). Reads the labels only, so a memory-mapped dataset stays on disk."""
    mapped = label_map[arrays.y]
    keep = np.isin(mapped, np.asarray(labels))
    if per_class is not None:
        idx = np.flatnonzero(keep)
        ranks = np.zeros(len(idx), dtype=np.int64)
        for label in labels:  # rank of each image within its class, in file order
            members = mapped[idx] == label
            ranks[members] = np.arange(members.sum())
        keep[idx[ranks >= per_class]] = False
    return np.flatnonzero(keep)


def select_classes(
    arrays: ImageArrays, label_map: np.ndarray, labels: Sequence[int], per_class: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Images whose remapped label is in ``labels`` (at most ``per_class`` each, first in file order).

    Returns:
        (x, y) with y the remapped labels (order positions).
    """
    idx = class_indices(arrays, label_map, labels, per_class)
    return arrays.x[idx], label_map[arrays.y[idx]]


def to_device(
    arrays: ImageArrays, label_map: np.ndarray, idx: np.ndarray, device: torch.device, chunk: int = 2048
) -> tuple[Tensor, Tensor]:
    """Images ``idx`` (uint8) and their remapped labels as tensors on ``device``, copied ``chunk`` images at a
    time: a memory-mapped dataset never holds more than a chunk in host memory beyond the result."""
    x = torch.empty((len(idx), *arrays.x.shape[1:]), dtype=torch.uint8, device=device)
    for i in range(0, len(idx), chunk):
        x[i : i + chunk].copy_(torch.from_numpy(np.ascontiguousarray(arrays.x[idx[i : i + chunk]])))
    return x, torch.from_numpy(label_map[arrays.y[idx]]).to(device)


class Normalizer:
    """uint8 (B, H, W, C) → float (B, C, H, W), ``(x / 255 − mean) / std``; NCHW-contiguous, or NHWC strides when
    ``channels_last`` (the permuted view already is channels-last, so no copy)."""

    def __init__(
        self,
        mean: Sequence[float],
        std: Sequence[float],
        device: torch.device,
        channels_last: bool = False,
        crop_fill: str = "mean",
    ) -> None:
        self.mean = torch.tensor(mean, dtype=torch.float32, device=device)
        self.std = torch.tensor(std, dtype=torch.float32, device=device)
        self.channels_last = channels_last
        # the crop's border in normalised values: None pads with zeros (the mean colour); black is (0 − mean) / std
        self.crop_border = None if crop_fill == "mean" else (0.0 - self.mean) / self.std
        # the same border in levels 0..255, for augmentations before normalising
        self.level_border = self.mean * 255 if crop_fill == "mean" else torch.zeros_like(self.mean)

    def nhwc(self, x: Tensor) -> Tensor:
        return (x.float().div_(255.0) - self.mean) / self.std

    def to_nchw(self, x: Tensor) -> Tensor:
        """(B, H, W, C) → (B, C, H, W) in the configured memory format."""
        x = x.permute(0, 3, 1, 2)
        return x if self.channels_last else x.contiguous()

    def __call__(self, x: Tensor) -> Tensor:
        return self.to_nchw(self.nhwc(x))

    def levels(self, x: Tensor) -> Tensor:
        """Float (B, C, H, W) levels 0..255 → normalised, in the configured memory format."""
        x = (x / 255.0 - self.mean[:, None, None]) / self.std[:, None, None]
        return x.contiguous(memory_format=torch.channels_last) if self.channels_last else x.contiguous()


def crop_flip(x: Tensor, pad: int, generator: torch.Generator | None = None, border: Tensor | None = None) -> Tensor:
    """Per-sample padded random crop and horizontal flip of a float (B, H, W, C) batch: padded with zeros (the
    mean colour of normalised images), or with the per-channel value ``border`` (black: :class:`Normalizer`).

    Args:
        x: normalised images, channels last.
        pad: padding on each side; offsets are uniform in ``0..2·pad``.
        generator: random stream for offsets and flips (on ``x``'s device).

    Returns:
        (B, H, W, C) float tensor (channels last, contiguous).
    """
    b, h, w, _ = x.shape
    dev = x.device
    if border is None:
        padded = F.pad(x, (0, 0, pad, pad, pad, pad))  # (B, H+2p, W+2p, C), zeros = the mean colour
    else:  # the border's own colour; x itself untouched (padded inside, not shifted and back)
        padded = border.to(x.dtype).expand(b, h + 2 * pad, w + 2 * pad, x.shape[3]).clone()
        padded[:, pad : pad + h, pad : pad + w] = x
    dy = torch.randint(0, 2 * pad + 1, (b, 1), generator=generator, device=dev)
    dx = torch.randint(0, 2 * pad + 1, (b, 1), generator=generator, device=dev)
    flip = torch.rand(b, 1, generator=generator, device=dev) < 0.5
    rows = dy + torch.arange(h, device=dev)  # (B, H)
    cols = dx + torch.arange(w, device=dev)  # (B, W)
    cols = torch.where(flip, cols.flip(1), cols)  # flipping the crop = reading its columns backwards
    return padded[torch.arange(b, device=dev)[:, None, None], rows[:, :, None], cols[:, None, :]]


class TrainBatches:
    """Shuffled, augmented, fixed-size batches of one task's images (``drop_last``, as the reference).

    Args:
        x: (N, H, W, C) uint8 images on the training device.
        y: (N,) int64 labels (order positions) on the same device.
        batch_size: images per batch.
        normalizer: maps uint8 images to normalised floats.
        generator: random stream for shuffling and augmentation.
        dist: several processes: each batch is drawn and augmented whole on every process, which keeps its rows
            (the random streams stay equal on every process, and the global batch is a single process's).
        pad: crop padding (0 disables crop; flip stays).
        augment: apply the augmentation (False: normalised images only).
        recipe: which augmentation (:data:`AUGMENTS`, the config's ``data.augment``).
    """

    def __init__(
        self,
        x: Tensor,
        y: Tensor,
        batch_size: int,
        normalizer: Normalizer,
        generator: torch.Generator,
        dist: Dist = Dist(),  # noqa: B008 - frozen
        pad: int = 4,
        augment: bool = True,
        recipe: str = "cropflip",
    ) -> None:
        if recipe not in AUGMENTS:
            raise ValueError(f"unknown augmentation {recipe!r}; choose one of {', '.join(AUGMENTS)}")
        self.x, self.y = x, y
        self.dist = dist
        self.batch_size = batch_size
        self.normalizer = normalizer
        self.generator = generator
        self.pad = pad
        self.augment = augment
        self.recipe = recipe
        self.policy = AutoAugment(policy_for(self.image_size), x.device) if recipe == "autoaugment" else None

    def views(self, batch_size: int, generator: torch.Generator | None) -> TrainBatches:
        """The same images and augmentation in batches of ``batch_size`` drawn from ``generator`` (a method's own
        augmented pass), whole on every process."""
        return TrainBatches(
            self.x, self.y, batch_size, self.normalizer, generator, pad=self.pad, augment=self.augment,
            recipe=self.recipe,
        )  # fmt: skip

    def __len__(self) -> int:
        return len(self.x) // self.batch_size

    @property
    def image_size(self) -> int:
        return self.x.shape[1]

    def permutation(self) -> Tensor:
        """A fresh batch order for one epoch (drawn from the generator)."""
        return torch.randperm(len(self.x), generator=self.generator, device=self.x.device)

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        return self.iterate(self.permutation())

    def plain(self, batch_size: int = 500) -> Iterator[tuple[Tensor, Tensor]]:
        """Every image once, in order, normalised but not augmented (for imprinting and statistics)."""
        for i in range(0, len(self.x), batch_size):
            yield self.normalizer(self.x[i : i + batch_size]), self.y[i : i + batch_size]

    def indices(self, perm: Tensor, start: int = 0) -> Iterator[Tensor]:
        """The image indices of each batch of the epoch with order ``perm``, from batch ``start`` on."""
        for i in range(start, len(self)):
            yield perm[i * self.batch_size : (i + 1) * self.batch_size]

    def load(self, idx: Tensor) -> tuple[Tensor, Tensor]:
        """The augmented, normalised images and the labels of one batch (all on the device, no host sync); under
        several processes this process's rows of it."""
        x, norm = self.x[idx], self.normalizer
        if not self.augment:
            x = norm(x)
        elif self.policy is None:  # cropflip
            x = norm.to_nchw(crop_flip(norm.nhwc(x), self.pad, self.generator, norm.crop_border))
        else:  # autoaugment, on levels 0..255
            x = crop_flip(x.float(), self.pad, self.generator, norm.level_border).permute(0, 3, 1, 2)
            x = norm.levels(self.policy(brightness_jitter(x, self.generator), self.generator))
        return self.dist.shard(x), self.dist.shard(self.y[idx])

    def iterate(self, perm: Tensor, start: int = 0) -> Iterator[tuple[Tensor, Tensor]]:
        """The batches of the epoch with order ``perm``, from batch ``start`` on (to continue a partial epoch)."""
        for idx in self.indices(perm, start):
            yield self.load(idx)
