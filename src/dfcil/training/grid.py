"""Pictures of the synthetic images: a grid of a task's inverted generator's samples, ``synthetic_task<t>.png``.

The latent codes come from a generator of their own, seeded from the run's seed and the task
(:func:`grid_seed`), never from the run's random streams, and the generator is left in the mode it was in: a
picture never changes what the run computes (``tests/test_tools.py`` compares runs with and without it).
"""

from __future__ import annotations

import io
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dfcil.io import write_atomic
from dfcil.methods import Method
from dfcil.training.loop import Callback, Loop

log = logging.getLogger("dfcil")

GRID_IMAGES = 64  # images per grid, 8 × 8
GRID_ROW = 8  # images per row
MAX_TILE = 112  # pixels per tile side at most: 224-pixel samples are shown at half size


def synthetic_images_path(run_dir: Path, task: int) -> Path:
    """Where a run directory keeps task ``task``'s grid."""
    return Path(run_dir) / f"synthetic_task{task}.png"


def grid_seed(seed: int, task: int) -> int:
    """The seed of task ``task``'s grid latents in a run seeded ``seed``: a stream of its own (< 2**63)."""
    state = np.random.SeedSequence([seed, task, 0x67726964]).generate_state(2, np.uint32)  # 0x67726964: "grid"
    return (int(state[0]) << 31) ^ int(state[1])


def denormalize(x: Tensor, mean: Sequence[float], std: Sequence[float]) -> np.ndarray:
    """Normalised images (B, 3, H, W) → uint8 (B, H, W, 3): ``x · std + mean``, clipped to [0, 1], times 255."""
    m = torch.tensor(mean, dtype=torch.float32, device=x.device)[:, None, None]
    s = torch.tensor(std, dtype=torch.float32, device=x.device)[:, None, None]
    pixels = ((x.float() * s + m).clamp(0, 1) * 255).round().to(torch.uint8)
    return pixels.permute(0, 2, 3, 1).cpu().numpy()


def tile_images(images: np.ndarray, per_row: int = GRID_ROW, pad: int = 2, fill: int = 255) -> np.ndarray:
    """uint8 images (B, H, W, C) as one (rows·H + (rows+1)·pad, per_row·W + (per_row+1)·pad, C) picture, row
    by row, with ``pad`` pixels of ``fill`` around and between them."""
    b, h, w, c = images.shape
    rows = math.ceil(b / per_row)
    out = np.full((rows * h + (rows + 1) * pad, per_row * w + (per_row + 1) * pad, c), fill, dtype=np.uint8)
    for i, image in enumerate(images):
        top, left = pad + (i // per_row) * (h + pad), pad + (i % per_row) * (w + pad)
        out[top : top + h, left : left + w] = image
    return out


def png_bytes(picture: np.ndarray) -> bytes:
    """A uint8 (H, W, 3) picture as PNG bytes (Pillow)."""
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(picture).save(buf, format="PNG")
    return buf.getvalue()


def trained_generator(method: Method) -> nn.Module | None:
    """The generator the method inverted for the running task, once trained; None for a method without one (or
    before its inversion ends)."""
    synthesizer = method.synthesizer()
    return synthesizer.trained_generator if synthesizer is not None else None


@torch.no_grad()
def sample_images(generator: nn.Module, n: int, seed: int) -> Tensor:
    """``n`` images (B, 3, H, W) from ``generator`` in eval mode, latents from a fresh stream seeded ``seed``;
    the generator's mode is put back and no other random stream is touched."""
    device = next(generator.parameters()).device
    z = torch.randn(n, generator.zdim, generator=torch.Generator(device=device).manual_seed(seed), device=device)
    was_training = generator.training
    generator.eval()  # BN with its running statistics, which stay as they are
    try:
        return generator(z).float()
    finally:
        generator.train(was_training)


def synthetic_grid(loop: Loop, task: int, seed: int, n: int = GRID_IMAGES) -> np.ndarray | None:
    """Task ``task``'s grid of ``n`` synthetic images of a run seeded ``seed``, de-normalised with the dataset's
    mean and std, or None when the method holds no trained generator or it gives non-finite images."""
    generator = trained_generator(loop.method)
    if generator is None:
        return None
    x = sample_images(generator, n, grid_seed(seed, task))
    if not bool(torch.isfinite(x).all()):  # a generator gone non-finite: no grid of noise is written
        log.warning(f"task {task}: the generator gives non-finite images; no synthetic_task{task}.png written")
        return None
    if x.shape[-1] > MAX_TILE:
        x = F.interpolate(x, size=(MAX_TILE, MAX_TILE), mode="bilinear", antialias=True)
    dataset = loop.protocol.dataset
    return tile_images(denormalize(x, dataset.mean, dataset.std))


class SyntheticGrid(Callback):
    """Writes ``synthetic_task<t>.png`` into the run directory when task t's inversion ends (``on_setup_end``),
    atomically. A run resumed past a task's inversion writes the grid again if it is missing: the checkpoint
    restored the trained generator."""

    def __init__(self, run_dir: Path, seed: int) -> None:
        """``seed``: the run's, from which each grid's latent codes are drawn (a stream of their own)."""
        self.dir, self.seed = Path(run_dir), seed

    def path(self, task: int) -> Path:
        return synthetic_images_path(self.dir, task)

    def on_run_start(self, loop: Loop) -> None:
        self.loop = loop

    def _write(self) -> None:
        task = self.loop.state.position.task
        grid = synthetic_grid(self.loop, task, self.seed)
        if grid is not None:
            write_atomic(self.path(task), png_bytes(grid))

    def on_setup_end(self) -> None:
        self._write()

    def on_task_start(self, info: dict[str, Any]) -> None:
        resumed_in_training = info.get("resumed_at", {}).get("stage") == "train"
        if resumed_in_training and not self.path(info["task"]).exists():
            self._write()
