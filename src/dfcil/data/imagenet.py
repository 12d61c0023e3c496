"""ImageNet-100: the 100 classes of the UCIR/PODNet split files, which are the first 100 ILSVRC-2012 wnids in
sorted order (``n01440764`` … ``n01855672``, labels 0–99 in that order), about 1300 training and the 50 official
validation images each; the validation images are the test set (docs/reference.md, Data and protocols).

The data root is a standard ILSVRC-2012 folder, ``train/<wnid>/*.JPEG`` and ``val/<wnid>/*.JPEG`` (all 1000
classes, or only these 100), or holds the split files ``train_100.txt`` and ``val_100.txt`` (lines
``<path relative to the root> <label>``), which are then read instead. Images are decoded once, as the reference
transforms them (shorter side to 256, centre crop 224), into a memory-mapped cache of about 19 GB
(:mod:`dfcil.data.cache`); a task reads only its own classes from it. ``data.image_size`` scales both sizes
(e.g. 32: shorter side 36, crop 32) for quick runs.

The reference's class order is ``np.random.seed(1993); np.random.shuffle``: :func:`reference_class_order`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from dfcil.config import DataConfig
from dfcil.data.cache import Preparation, Split, cache_dir, load_or_prepare
from dfcil.data.datasets import DATASETS, ImageArrays, ImageDataset
from dfcil.data.decode import IMAGE_SUFFIXES, BaseTransform, ImageFile
from dfcil.data.fingerprint import fingerprint_files
from dfcil.errors import DatasetError

FIRST, LAST, COUNT = "n01440764", "n01855672", 100  # the subset: the first 100 wnids in sorted order
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
SPLIT_FILES = {"train": "train_100.txt", "test": "val_100.txt"}


def reference_class_order() -> list[int]:
    """The iCaRL/PODNet order of the 100 labels the reference uses: starts 68, 56, 78, 8, 23."""
    order = list(range(COUNT))
    rng = np.random.RandomState(1993)  # np.random.seed(1993); np.random.shuffle(order), without the global stream
    rng.shuffle(order)
    return order


def _has_split_files(folder: Path) -> bool:
    return all((folder / name).is_file() for name in SPLIT_FILES.values())


def _holds_imagenet(folder: Path) -> bool:
    """Whether ``folder`` has one of the layouts read: the split files, or a ``train/`` folder."""
    return _has_split_files(folder) or (folder / "train").is_dir()


def _wnids_from_folder(train_dir: Path) -> list[str]:
    folders = sorted(p.name for p in train_dir.iterdir() if p.is_dir() and p.name.startswith("n"))
    wnids = folders[:COUNT]
    if len(wnids) < COUNT or wnids[0] != FIRST or wnids[-1] != LAST:
        raise DatasetError(
            f"{train_dir} does not hold the ImageNet-100 classes ({FIRST} … {LAST}, the first {COUNT} ILSVRC-2012 "
            f"wnids in sorted order): found {len(folders)} class folders"
            + (f" from {folders[0]} to {folders[-1]}" if folders else "")
            + ". Point --data.root to an ILSVRC-2012 folder with train/ and val/ (or to one with train_100.txt and "
            "val_100.txt)"
        )
    return wnids


def _from_folders(root: Path, wnids: list[str]) -> dict[str, list[tuple[Path, int]]]:
    out = {}
    for split, name in (("train", "train"), ("test", "val")):
        items = []
        for label, wnid in enumerate(wnids):
            folder = root / name / wnid
            if not folder.is_dir():
                raise DatasetError(
                    f"{folder} is missing: ImageNet-100 needs every one of its classes in {root / name}/ (the "
                    f"validation images sorted into class folders, as train/ is)"
                )
            files = sorted(f for f in folder.iterdir() if f.is_file() and f.suffix.lower() in IMAGE_SUFFIXES)
            if not files:
                raise DatasetError(f"class folder {folder} holds no images; restore them from the ILSVRC-2012 release")
            items += [(f, label) for f in files]
        out[split] = items
    return out


def _from_split_files(root: Path) -> dict[str, list[tuple[Path, int]]]:
    out = {}
    for split, name in SPLIT_FILES.items():
        items = []
        for number, line in enumerate((root / name).read_text().splitlines(), start=1):
            if not line.strip():
                continue
            try:
                path, label = line.rsplit(maxsplit=1)
                label = int(label)
            except ValueError:
                raise DatasetError(f"{root / name} line {number} is not '<path> <label>': {line[:80]!r}") from None
            if not 0 <= label < COUNT:
                raise DatasetError(f"{root / name} line {number}: label {label} is not in 0..{COUNT - 1}")
            items.append((root / path, label))
        out[split] = items
    for split, items in out.items():
        labels = {label for _, label in items}
        if labels != set(range(COUNT)):
            missing = sorted(set(range(COUNT)) - labels)
            raise DatasetError(f"{root / SPLIT_FILES[split]} has no images of the labels {missing[:8]}")
    return out


@DATASETS.register("imagenet100")
def imagenet100(root: Path, cfg: DataConfig, progress: Any = None, **_: Any) -> ImageDataset:
    """ImageNet-100 (UCIR/PODNet split): 100 ILSVRC-2012 classes at 224×224, from your ILSVRC-2012 copy.

    The validation images are the test set; see the module's docstring for the layouts read. ``root`` is that
    folder, or a data root holding it as ``imagenet100/`` (one root for every dataset, as CIFAR-100's)."""
    given = root
    root = next((here for here in (root, root / "imagenet100") if _holds_imagenet(here)), root)
    if _has_split_files(root):
        items = _from_split_files(root)
        folder_of = {label: p.parent.name for p, label in reversed(items["train"])}  # train/<wnid>/<file>
        wnids = [folder_of[label] for label in range(COUNT)]
    elif (root / "train").is_dir():
        wnids = _wnids_from_folder(root / "train")
        items = _from_folders(root, wnids)
    else:
        raise DatasetError(
            f"ImageNet-100 not found under data root {given}: expected an ILSVRC-2012 folder with train/<wnid>/ and "
            f"val/<wnid>/, or the split files {' and '.join(SPLIT_FILES.values())}, there or in "
            f"{given / 'imagenet100'}/; ImageNet cannot be downloaded here: point --data.root to your copy"
        )
    missing = [str(p) for pairs in items.values() for p, _ in pairs if not p.is_file()]
    if missing:
        raise DatasetError(f"{len(missing)} images of the split are missing, e.g. {missing[:3]}: check the data root")
    size = cfg.image_size or 224
    transform = BaseTransform(short=round(size * 256 / 224), size=size)
    every = [p for pairs in items.values() for p, _ in pairs]
    identity = {"dataset": "imagenet100", "source": str(root), "fingerprint": fingerprint_files(root, every)}
    identity |= {"classes": wnids, "transform": transform.as_dict()}

    def plan() -> Preparation:
        return Preparation(
            {
                s: Split([ImageFile(str(p)) for p, _ in pairs], np.array([y for _, y in pairs], dtype=np.int64))
                for s, pairs in items.items()
            },
            transform,
        )

    path = cache_dir(cfg.cache, "imagenet100", root, size)
    arrays, _ = load_or_prepare(path, identity, plan, cfg.workers, progress, cfg.rebuild)
    train, test = ImageArrays(*arrays["train"]), ImageArrays(*arrays["test"])
    return ImageDataset(
        "imagenet100", COUNT, size, IMAGENET_MEAN, IMAGENET_STD, train, test, f"{root} (cache {path})", tuple(wnids)
    )
