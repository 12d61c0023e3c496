"""Tiny-ImageNet-200 (the cs231n release): 200 classes of 64×64 images, 500 training and 50 validation images
each; the validation split is the test set, as in the reference (docs/reference.md, Data and protocols).

The data root holds the official ``tiny-imagenet-200.zip`` (or is that zip, or holds one ``tiny-imagenet-200*.zip``,
such as a subset in the same layout) or its extracted ``tiny-imagenet-200/`` folder; ``data.download`` fetches
and checks the zip. Inside: ``wnids.txt`` (the class ids), ``train/<wnid>/images/<wnid>_<i>.JPEG`` and
``val/images/val_<i>.JPEG`` with ``val/val_annotations.txt`` (``file<TAB>wnid<TAB>box``), and ``words.txt``
(``wnid<TAB>words``), whose first word names each class where one is shown (``n01443537 (goldfish)``); ``test/``
has no labels and is not read. Labels are the wnids in sorted order (ImageFolder's convention); images are
decoded once into the cache (:mod:`dfcil.data.cache`), resized to 64 as the reference does (``Resize(64)`` leaves
64-pixel images as they are).
"""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from dfcil.config import DataConfig
from dfcil.data.archive import Downloader, fetch
from dfcil.data.cache import Preparation, Split, cache_dir, load_or_prepare
from dfcil.data.datasets import DATASETS, ImageArrays, ImageDataset
from dfcil.data.decode import BaseTransform, ImageFile
from dfcil.data.fingerprint import fingerprint_file, fingerprint_files
from dfcil.errors import DatasetError

TINY_URL = "http://cs231n.stanford.edu/tiny-imagenet-200.zip"
TINY_MD5 = "90528d7ca1a48142e341f4ef8d21d0de"  # 248,100,043 bytes
TINY_ARCHIVE = "tiny-imagenet-200.zip"
TOP = "tiny-imagenet-200"
# Normalisation of the R-DFCIL reference code (its Tiny-ImageNet base transform), applied to x / 255.
TINY_MEAN = (0.4803, 0.4481, 0.3976)
TINY_STD = (0.2764, 0.2688, 0.2816)


class _Source:
    """The release as a zip archive or an extracted folder: its member names and how to read one."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.zip = path.suffix == ".zip"
        if self.zip:
            try:
                with zipfile.ZipFile(path) as z:
                    self.names = {n for n in z.namelist() if not n.endswith("/")}
            except (zipfile.BadZipFile, OSError) as err:
                raise DatasetError(
                    f"{path} is not a readable zip archive ({err}): the download is incomplete or damaged; delete "
                    f"it and download it again (--data.download true)"
                ) from None
        else:
            self.names = {str(f.relative_to(path.parent)) for f in path.rglob("*") if f.is_file()}

    def read_text(self, name: str) -> str:
        if name not in self.names:
            raise DatasetError(
                f"{self.path} has no {name}: it is not a whole tiny-imagenet-200 release (a partial archive); "
                f"download it again"
                if self.zip
                else f"{self.path.parent / name} is missing: {self.path} is not a whole extracted tiny-imagenet-200 "
                f"release (a partial folder); extract the official zip there again, or point --data.root to the zip"
            )
        if self.zip:
            with zipfile.ZipFile(self.path) as z:
                return z.read(name).decode()
        return (self.path.parent / name).read_text(encoding="utf-8")  # as the zip's members are decoded

    def image(self, name: str) -> ImageFile:
        return ImageFile(name, str(self.path)) if self.zip else ImageFile(str(self.path.parent / name))

    def fingerprint(self) -> str:
        if self.zip:
            return fingerprint_file(self.path)
        return fingerprint_files(self.path.parent, [self.path.parent / n for n in self.names])


def _one_archive(folder: Path) -> Path | None:
    """The one ``tiny-imagenet-200*.zip`` in ``folder``, None for none; several are refused (which one?)."""
    zips = sorted(folder.glob(f"{TOP}*.zip")) if folder.is_dir() else []
    if len(zips) > 1:
        raise DatasetError(
            f"{folder} holds several Tiny-ImageNet archives ({[z.name for z in zips]}): point --data.root to one"
        )
    return zips[0] if zips else None


def find_source(root: Path, cfg: DataConfig, downloader: Downloader | None) -> Path:
    """The zip or the extracted folder under ``root``, downloading the zip where asked."""
    if root.suffix == ".zip" and root.is_file():
        return root
    folder = root / TOP
    extracted = (folder / "wnids.txt").exists()
    if not extracted and (inside := _one_archive(folder)):  # not extracted: the zip kept in such a folder
        return inside
    for candidate in (folder, root / TINY_ARCHIVE):
        if candidate.exists():
            return candidate
    if found := _one_archive(root):
        return found
    if not cfg.download:
        raise DatasetError(
            f"Tiny-ImageNet-200 not found under data root {root}: expected {root / TINY_ARCHIVE} or {root / TOP}/ "
            f"(or --data.root pointing to the zip). Pass --data.download true to fetch the official archive "
            f"(248 MB, md5-checked)."
        )
    return fetch(TINY_URL, f"md5:{TINY_MD5}", root, TINY_ARCHIVE, downloader=downloader)


def class_words(source: _Source, wnids: list[str]) -> tuple[str, ...]:
    """The first entry of each class's ``words.txt`` line (``n01443537<TAB>goldfish, Carassius auratus`` gives
    ``goldfish``), "" for a class it does not list, by label; () without the file, or for one that is not text: the
    classes then show as their wnids. Display only: neither the cache nor a run's records depend on it."""
    name = f"{TOP}/words.txt"
    if name not in source.names:
        return ()
    try:
        text = source.read_text(name)
    except UnicodeDecodeError:
        return ()
    first: dict[str, str] = {}
    for line in text.splitlines():
        wnid, _, words = line.partition("\t")
        first[wnid.strip()] = words.split(",")[0].strip()
    return tuple(first.get(w, "") for w in wnids)


def list_splits(source: _Source, wnids: list[str]) -> dict[str, Split]:
    """Training images per class (sorted) and the validation images of val_annotations.txt, with labels."""
    label = {w: i for i, w in enumerate(wnids)}
    by_class: dict[str, list[str]] = {w: [] for w in wnids}
    for name in source.names:
        parts = name.split("/")
        if len(parts) == 5 and parts[1] == "train" and parts[3] == "images" and parts[2] in by_class:
            by_class[parts[2]].append(name)
    empty = [w for w, files in by_class.items() if not files]
    if empty:
        raise DatasetError(
            f"{source.path}: no training images for {len(empty)} classes ({', '.join(empty[:5])}): a partial release; "
            f"download or extract it again"
        )
    train = [n for w in wnids for n in sorted(by_class[w])]
    train_y = np.repeat(np.arange(len(wnids)), [len(by_class[w]) for w in wnids])
    annotations = f"{TOP}/val/val_annotations.txt"
    val, val_y = [], []
    for number, line in enumerate(source.read_text(annotations).splitlines(), start=1):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) < 2 or fields[1] not in label:
            raise DatasetError(
                f"{source.path}: line {number} of {annotations} names an unknown class ({line.strip()[:60]!r}; "
                f"the classes are those of wnids.txt): the release is damaged; download or extract it again"
            )
        name = f"{TOP}/val/images/{fields[0]}"
        if name not in source.names:
            raise DatasetError(
                f"{source.path}: {annotations} line {number} names {fields[0]}, which is missing: a partial "
                f"release; download or extract it again"
            )
        val.append(name)
        val_y.append(label[fields[1]])
    return {
        "train": Split([source.image(n) for n in train], train_y),
        "test": Split([source.image(n) for n in val], np.asarray(val_y, dtype=np.int64)),
    }


@DATASETS.register("tiny_imagenet200")
def tiny_imagenet200(
    root: Path, cfg: DataConfig, progress: Any = None, downloader: Downloader | None = None, **_: Any
) -> ImageDataset:
    """Tiny-ImageNet-200 (cs231n): 200 classes of 64×64 images, from its zip or folder, or downloaded.

    The validation split is the test set; see the module's docstring for the layout read."""
    source = _Source(find_source(root, cfg, downloader))
    wnids = sorted(source.read_text(f"{TOP}/wnids.txt").split())
    if len(wnids) != 200:
        raise DatasetError(f"{source.path}: wnids.txt lists {len(wnids)} classes, not 200; download it again")
    size = cfg.image_size or 64
    transform = BaseTransform(short=size, size=size)
    identity = {"dataset": "tiny_imagenet200", "source": str(source.path), "fingerprint": source.fingerprint()}
    identity |= {"classes": wnids, "transform": transform.as_dict()}
    path = cache_dir(cfg.cache, "tiny_imagenet200", source.path, size)
    arrays, _ = load_or_prepare(
        path, identity, lambda: Preparation(list_splits(source, wnids), transform), cfg.workers, progress, cfg.rebuild
    )
    train, test = ImageArrays(*arrays["train"]), ImageArrays(*arrays["test"])
    where, words = f"{source.path} (cache {path})", class_words(source, wnids)
    return ImageDataset("tiny_imagenet200", 200, size, TINY_MEAN, TINY_STD, train, test, where, tuple(wnids), words)
