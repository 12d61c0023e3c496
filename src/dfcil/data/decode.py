"""Decoding image files with Pillow in a pool of processes, a chunk of images per task: what an image is
(:class:`ImageFile`, a file or a zip member), the base transform every image gets (resize, centre crop, RGB), and
the image sizes read from the headers alone (to choose ``data.image_size: auto``). The decoded-image cache
(:mod:`dfcil.data.cache`) drives it."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import io
import os
import re
import signal
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dfcil.children import die_with_parent

CHUNK = 64  # images per task of the decoding pool
SIZE_CHUNK = 1024  # images per task of the header-reading pool (about 0.15 ms each)
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm")


@dataclasses.dataclass(frozen=True)
class ImageFile:
    """One image to decode: a file, or a member of the zip archive ``archive``."""

    path: str
    archive: str | None = None

    def __str__(self) -> str:
        return f"{self.archive}:{self.path}" if self.archive else self.path


@dataclasses.dataclass(frozen=True)
class BaseTransform:
    """The reference's base transform: ``Resize(short)`` (the shorter side to ``short`` pixels, bilinear, as
    torchvision on a PIL image), then ``CenterCrop(size)``. ``min_side``: refuse images whose shorter side is
    smaller (0: any size, enlarged like torchvision does)."""

    short: int
    size: int
    min_side: int = 0

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


def decode(data: bytes, transform: BaseTransform) -> np.ndarray:
    """Encoded image bytes → uint8 ``[size, size, 3]`` RGB (greyscale, palette, CMYK and alpha images converted)."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as img:
        img.load()  # a truncated or corrupt file fails here, not later
        w, h = img.size
        if min(w, h) < transform.min_side:
            raise ValueError(f"{w}×{h} pixels, smaller than the {transform.min_side} the dataset needs")
        rgb = to_rgb(img)
    short, long = (w, h) if w <= h else (h, w)
    if short != transform.short:  # torchvision's Resize(int): the shorter side to `short`, the longer in proportion
        new_long = int(transform.short * long / short)
        size = (transform.short, new_long) if w <= h else (new_long, transform.short)
        rgb = rgb.resize(size, Image.BILINEAR)
    w, h = rgb.size
    top, left = int(round((h - transform.size) / 2.0)), int(round((w - transform.size) / 2.0))  # CenterCrop
    if top or left or w != transform.size or h != transform.size:
        rgb = rgb.crop((left, top, left + transform.size, top + transform.size))
    return np.asarray(rgb, dtype=np.uint8)


def to_rgb(img: Any) -> Any:
    """A Pillow image as 8-bit RGB. 16-bit greyscale (modes ``I;16*``, and ``I``, as which Pillow may open a 16-bit
    PNG) is scaled to 8 bits, v / 257 rounded (65535 → 255), where Pillow's own conversion would clip every value
    above 255 to white; other modes (greyscale, palette, CMYK, alpha) are Pillow's conversion."""
    from PIL import Image

    if img.mode.startswith("I;16") or img.mode == "I":
        wide = np.asarray(img, dtype=np.float64)
        img = Image.fromarray(np.clip(np.rint(wide / 257.0), 0, 255).astype(np.uint8), "L")
    return img.convert("RGB")


def read_bytes(image: ImageFile, archives: dict[str, zipfile.ZipFile]) -> bytes:
    if image.archive is None:
        return Path(image.path).read_bytes()
    if image.archive not in archives:
        archives[image.archive] = zipfile.ZipFile(image.archive)
    return archives[image.archive].read(image.path)


# In a decoding worker process: the zip archives it has opened, kept open for its later chunks (reading a zip's
# directory of 100,000 entries costs tens of milliseconds). None in any other process.
_WORKER_ARCHIVES: dict[str, zipfile.ZipFile] | None = None


def start_worker(parent: int | None = None) -> None:
    """A decoding worker's start: its archive table, and its end when the preparing process dies (a worker
    left behind would hold its memory until killed by hand)."""
    global _WORKER_ARCHIVES
    _WORKER_ARCHIVES = {}
    die_with_parent(signal.SIGKILL, parent)


def _reason(err: Exception) -> str:
    """Why an image failed, without the in-memory object Pillow names (``<_io.BytesIO object at 0x...>``): the
    image's own path is given beside it."""
    return re.sub(r"\s*<_io\.BytesIO object at 0x[0-9a-fA-F]+>", "", str(err)) or "unreadable"


def decode_chunk(images: Sequence[ImageFile], transform: BaseTransform) -> tuple[np.ndarray, list[str]]:
    """Decode ``images`` (a worker's task): the arrays, and one ``"file: reason"`` per image that failed."""
    out = np.zeros((len(images), transform.size, transform.size, 3), dtype=np.uint8)
    bad: list[str] = []
    archives = _WORKER_ARCHIVES if _WORKER_ARCHIVES is not None else {}
    try:
        for i, image in enumerate(images):
            try:
                out[i] = decode(read_bytes(image, archives), transform)
            except Exception as err:  # noqa: BLE001 - every failure is reported with its file, none is skipped
                bad.append(f"{image}: {type(err).__name__}: {_reason(err)}")
    finally:
        if archives is not _WORKER_ARCHIVES:
            for archive in archives.values():
                archive.close()
    return out, bad


def header_sizes(images: Sequence[ImageFile]) -> np.ndarray:
    """(width, height) of each image from its header, (0, 0) where it cannot be read (decoding names it later)."""
    from PIL import Image

    out = np.zeros((len(images), 2), dtype=np.int64)
    archives = _WORKER_ARCHIVES if _WORKER_ARCHIVES is not None else {}
    try:
        for i, image in enumerate(images):
            try:
                source = image.path if image.archive is None else io.BytesIO(read_bytes(image, archives))
                with Image.open(source) as img:  # lazy: reads the header, decodes no pixel
                    out[i] = img.size
            except Exception:  # noqa: BLE001, S112 - an unreadable image is named by the decoding, with its reason
                continue
    finally:
        if archives is not _WORKER_ARCHIVES:
            for archive in archives.values():
                archive.close()
    return out


def image_sizes(images: Sequence[ImageFile], workers: int | None = None) -> np.ndarray:
    """(N, 2) int64 (width, height) of ``images`` from their headers, without decoding a pixel; (0, 0) for an image
    whose header cannot be read. A pool of ``workers`` processes (None: every core) reads large sets."""
    workers = min(workers or os.cpu_count() or 1, -(-len(images) // SIZE_CHUNK))
    if workers <= 1:
        return header_sizes(images).reshape(-1, 2)
    chunks = [images[i : i + SIZE_CHUNK] for i in range(0, len(images), SIZE_CHUNK)]
    with concurrent.futures.ProcessPoolExecutor(workers, initializer=start_worker, initargs=(os.getpid(),)) as pool:
        return np.concatenate(list(pool.map(header_sizes, chunks)))
