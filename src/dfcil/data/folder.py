"""Your own data: a folder of images per class (``folder``), or prepared arrays (``arrays``).

``folder``: ``<root>/train/<class>/<image>`` and ``<root>/test/<class>/<image>`` (or ``val/``), the ImageFolder
convention. Classes are the training folder's subfolders in sorted order (their names are saved with the run);
images are the files with an image suffix, in sorted order. They are resized (shorter side) and centre-cropped
to ``data.image_size``, decoded once into the cache (:mod:`dfcil.data.cache`); the normalisation is the
training images' per-channel mean and std unless the config gives it.

The image size: an explicit ``data.image_size`` refuses images smaller than it (they would be enlarged), read
from the images' headers before anything is decoded. Unset (``auto``), it is what the images hold: the shorter
side they all share, else their median shorter side (the smaller ones enlarged, as torchvision's ``Resize``
does); the choice is logged and recorded in the cache's manifest, and a later run on the same files reads it
from there (the cache is refused once the files change, so a resumed run keeps its size).

``arrays``: ``<root>/train.npz`` and ``<root>/test.npz``, each with uint8 ``x`` ``[N, S, S, 3]`` and integer ``y``
(labels 0..C-1, every class in both splits): the CIFAR-100 fast path for any class count and image size.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from dfcil.config import DataConfig
from dfcil.data.cache import Preparation, Split, cache_dir, channel_stats, load_or_prepare
from dfcil.data.datasets import DATASETS, ImageArrays, ImageDataset, read_arrays
from dfcil.data.decode import IMAGE_SUFFIXES, BaseTransform, ImageFile, image_sizes
from dfcil.data.fingerprint import fingerprint_files
from dfcil.errors import DatasetError

log = logging.getLogger("dfcil")


def class_folders(split_dir: Path) -> dict[str, list[Path]]:
    """Each class folder of ``split_dir`` (sorted) and its image files (sorted); a class without images is an
    error naming it."""
    classes = {}
    for folder in sorted(p for p in split_dir.iterdir() if p.is_dir()):
        named = [f for f in folder.iterdir() if f.suffix.lower() in IMAGE_SUFFIXES]
        dangling = sorted(f for f in named if f.is_symlink() and not f.exists())
        if dangling:  # an image the folder names but cannot give: not skipped silently
            raise DatasetError(
                f"{len(dangling)} image(s) of {folder} are links to nothing: {dangling[0]} points to "
                f"{dangling[0].readlink()}, which does not exist; fix or remove the links"
            )
        files = sorted(f for f in named if f.is_file())
        if not files:
            raise DatasetError(
                f"class folder {folder} holds no images ({', '.join(IMAGE_SUFFIXES)}); add its images or remove it"
            )
        classes[folder.name] = files
    if not classes:
        raise DatasetError(f"{split_dir} holds no class folders: expected {split_dir}/<class>/<image> files")
    return classes


def check_same_classes(train: list[str], test: list[str], test_dir: Path) -> None:
    if train != test:
        only_train, only_test = sorted(set(train) - set(test)), sorted(set(test) - set(train))
        raise DatasetError(
            f"the training and test classes differ (only in train: {only_train[:5] or 'none'}; only in "
            f"{test_dir.name}: {only_test[:5] or 'none'}): every class needs images in both"
        )


def auto_size(sizes: np.ndarray) -> tuple[int, str]:
    """The image size ``data.image_size: auto`` chooses from the images' (width, height) ``sizes`` (unreadable
    ones, (0, 0), left out), and why, in words."""
    short = np.sort(sizes.min(axis=1)[sizes.min(axis=1) > 0])
    if not len(short):
        raise DatasetError("none of the images can be read; check that the folder holds image files")
    size = int(short[(len(short) - 1) // 2])  # the lower median: the shorter side of an actual image
    if short[0] == short[-1]:
        return size, f"the shorter side all {len(short)} images share"
    smaller = int(np.searchsorted(short, size))
    return size, (
        f"the median shorter side of {len(short)} images ({short[0]} to {short[-1]} px; the {smaller} smaller ones "
        f"are enlarged); set data.image_size to choose another"
    )


def check_min_side(images: list[ImageFile], sizes: np.ndarray, size: int, root: Path) -> None:
    """Refuse images smaller than an explicit ``size`` (from their headers: before anything is decoded)."""
    short = sizes.min(axis=1)
    small = np.flatnonzero((short > 0) & (short < size))
    if len(small):
        i = small[np.argmin(short[small])]
        w, h = sizes[i]
        raise DatasetError(
            f"{len(small)} of {len(images)} images are smaller than {size} px (the smallest is {w}×{h}, "
            f"{Path(images[i].path).relative_to(root)}): use --data.image_size {short[i]} or leave it unset (auto), "
            f"or remove the smaller images"
        )


@DATASETS.register("folder")
def folder(root: Path, cfg: DataConfig, progress: Any = None, **_: Any) -> ImageDataset:
    """Your own images, a folder per class: <root>/train/<class>/* and <root>/test/<class>/* (or val/).

    Every image is resized (shorter side) and centre-cropped to data.image_size, by default the size the images
    hold (see the module's docstring).
    """
    train_dir = root / "train"
    test_dir = next((root / name for name in ("test", "val") if (root / name).is_dir()), root / "test")
    for d in (train_dir, test_dir):
        if not d.is_dir():
            raise DatasetError(
                f"{d} is missing: the folder dataset reads <root>/train/<class>/<image> and <root>/test/<class>/"
                f"<image> (or val/); point --data.root to such a folder"
            )
    train, test = class_folders(train_dir), class_folders(test_dir)
    classes = list(train)
    check_same_classes(classes, list(test), test_dir)

    def split(files: dict[str, list[Path]]) -> Split:
        images = [ImageFile(str(f)) for c in classes for f in files[c]]
        return Split(images, np.repeat(np.arange(len(classes)), [len(files[c]) for c in classes]))

    every = [f for files in (train, test) for c in classes for f in files[c]]
    identity = {"dataset": "folder", "source": str(root), "fingerprint": fingerprint_files(root, every)}
    identity["classes"] = classes
    size = cfg.image_size
    fixed = BaseTransform(short=size, size=size, min_side=size) if size else None  # smaller images refused
    if fixed:  # else the transform is chosen from the images, and the manifest says which
        identity["transform"] = fixed.as_dict()

    def plan() -> Preparation:
        splits = {"train": split(train), "test": split(test)}
        images = [*splits["train"].images, *splits["test"].images]
        sizes = image_sizes(images, cfg.workers)  # from the headers, before anything is decoded
        if fixed:
            check_min_side(images, sizes, fixed.size, root)
            return Preparation(splits, fixed)
        size, why = auto_size(sizes)
        return Preparation(splits, BaseTransform(short=size, size=size), {"image_size_chosen": why})

    path = cache_dir(cfg.cache, "folder", root, size)
    arrays, manifest = load_or_prepare(path, identity, plan, cfg.workers, progress, cfg.rebuild)
    if fixed is None:
        size = manifest["transform"]["size"]
        log.info("data.image_size auto: %d px, %s", size, manifest["image_size_chosen"])
    stats = manifest["stats"]
    return ImageDataset(
        "folder", len(classes), size, tuple(stats["mean"]), tuple(stats["std"]), ImageArrays(*arrays["train"]),
        ImageArrays(*arrays["test"]), f"{root} (cache {path})", tuple(classes),
    )  # fmt: skip


@DATASETS.register("arrays")
def arrays(root: Path, cfg: DataConfig, **_: Any) -> ImageDataset:
    """Your own arrays: <root>/train.npz and <root>/test.npz, images x and labels y in each.

    ``x``: uint8 ``[N, S, S, 3]`` (RGB); ``y``: integer labels 0..C-1, every class in both splits. The images are
    used as they are: ``data.image_size`` must be unset or ``S``."""
    train, test = (read_arrays(root / f"{split}.npz", own=True) for split in ("train", "test"))
    size = train.x.shape[1]
    if test.x.shape[1:] != train.x.shape[1:]:
        raise DatasetError(
            f"{root}/test.npz holds {test.x.shape[1]}×{test.x.shape[2]} images and train.npz {size}×{size}: both "
            f"splits need images of one size"
        )
    if cfg.image_size is not None and cfg.image_size != size:
        raise DatasetError(
            f"data.image_size {cfg.image_size}: the arrays in {root} hold {size}×{size} images, which the arrays "
            f"dataset does not resize; leave data.image_size unset or prepare the arrays at that size"
        )
    num_classes = int(max(train.y.max(), test.y.max())) + 1
    if num_classes > min(len(train.y), len(test.y)):  # before a set of num_classes labels is built
        name, split = ("train.npz", train) if len(train.y) <= len(test.y) else ("test.npz", test)
        raise DatasetError(
            f"the labels of {root} go up to {num_classes - 1}, but {name} holds {len(split.y)} images: labels must be "
            f"0..C-1 for C classes, every class with images in both splits"
        )
    every = set(range(num_classes))
    absent = {name: sorted(every - set(np.unique(a.y).tolist())) for name, a in (("train", train), ("test", test))}
    missing = [
        f"{name}: {', '.join(map(str, labels[:8]))}{f' and {len(labels) - 8} more' if len(labels) > 8 else ''}"
        for name, labels in absent.items()
        if labels
    ]
    if missing:
        raise DatasetError(
            f"the labels of {root} must be 0..{num_classes - 1} with every class in both splits; classes without "
            f"images in {'; '.join(missing)}"
        )
    stats = channel_stats(train.x)
    return ImageDataset("arrays", num_classes, size, tuple(stats["mean"]), tuple(stats["std"]), train, test, str(root))
