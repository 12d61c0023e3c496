"""Datasets as uint8 arrays, behind a registry.

Every dataset is a pair of arrays per split: images ``x`` uint8 ``[N, H, W, 3]`` (HWC, RGB; in memory, or
memory-mapped from a decoded cache, :mod:`dfcil.data.cache`) and labels ``y`` int64 ``[N]``, plus the
normalisation constants of the reference code. A builder is registered by name and called with the data root and
the ``data`` section of the config; official formats are read (or downloaded) where a dataset has one.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from filelock import FileLock

from dfcil.config import DataConfig
from dfcil.data.archive import Downloader, fetch, safe_extract
from dfcil.errors import DatasetError
from dfcil.registry import Registry


@dataclasses.dataclass(frozen=True)
class ImageArrays:
    x: np.ndarray  # (N, H, W, 3) uint8
    y: np.ndarray  # (N,) int64 raw labels


@dataclasses.dataclass(frozen=True)
class ImageDataset:
    name: str
    num_classes: int
    image_size: int
    mean: tuple[float, float, float]  # per-channel, of x / 255
    std: tuple[float, float, float]
    train: ImageArrays
    test: ImageArrays
    source: str  # where it was read from, for the log
    classes: tuple[str, ...] = ()  # the classes' names by raw label (wnids, folder names); () where unnamed
    # what each class is, by raw label, for people (Tiny-ImageNet: the first entry of words.txt, "goldfish"); ""
    # or () where not known. Display only: ``classes`` stays the identifier runs record and caches key on
    words: tuple[str, ...] = ()

    def class_label(self, label: int) -> str:
        """Raw class ``label`` as shown to a person: its name and what it is where known (``n01443537
        (goldfish)``), its name alone otherwise; where the dataset names no classes, what the class is (CIFAR-100's
        ``cloud``), else ``class <label>``."""
        word = self.words[label] if label < len(self.words) else ""
        if not self.classes:  # unnamed classes: what they are (CIFAR-100's "cloud"), else their label
            return word or f"class {label}"
        return f"{self.classes[label]} ({word})" if word else self.classes[label]

    def normalised_by(self, cfg: DataConfig) -> ImageDataset:
        """This dataset with the configured normalisation constants, where the config gives them."""
        mean, std = cfg.mean or self.mean, cfg.std or self.std
        return dataclasses.replace(self, mean=tuple(mean), std=tuple(std))


# A builder: (data root, the config's data section, progress factory, downloader) -> ImageDataset
DatasetBuilder = Callable[..., ImageDataset]
# filled by the modules dfcil/data/__init__.py imports, and by plugins (entry points of dfcil.datasets)
DATASETS: Registry[DatasetBuilder] = Registry("dataset", group="dfcil.datasets")


def default_data_root() -> Path:
    """``$DFCIL_DATA`` if set, else the per-user cache directory (e.g. ``~/.cache/dfcil/data``)."""
    env = os.environ.get("DFCIL_DATA")
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("dfcil")) / "data"


def resolve_root(root: str | os.PathLike | None) -> Path:
    """The data root, absolute (``~`` expanded): ``root``, else :func:`default_data_root`."""
    return Path(os.path.abspath(Path(root).expanduser() if root is not None else default_data_root()))


def build_dataset(
    cfg: DataConfig, progress: Callable[..., Any] | None = None, downloader: Downloader | None = None
) -> ImageDataset:
    """Load the dataset ``cfg.name`` from ``cfg.root`` (see :func:`resolve_root`), decoding and caching its images
    the first time where it has image files (``progress``: a tqdm-like factory for that)."""
    dataset = DATASETS.get(cfg.name)(resolve_root(cfg.root), cfg, progress=progress, downloader=downloader)
    return dataset.normalised_by(cfg)


def check_arrays(
    x: np.ndarray, y: np.ndarray, num_classes: int | None, image_size: int | None, source: str
) -> ImageArrays:
    """Validate image/label arrays (``num_classes`` and ``image_size`` where known); raise a :class:`DatasetError`
    naming ``source`` if they are malformed."""
    size = image_size or (x.shape[1] if x.ndim == 4 else 0)
    shape = (size, size, 3)
    if x.dtype != np.uint8 or x.ndim != 4 or tuple(x.shape[1:]) != shape:
        want = ", ".join(map(str, shape)) if image_size else "S, S, 3"
        raise DatasetError(f"{source}: images must be uint8 [N, {want}], got {x.dtype} {x.shape}")
    if y.ndim != 1 or len(y) != len(x) or not np.issubdtype(y.dtype, np.integer):
        raise DatasetError(f"{source}: labels must be an integer vector of length {len(x)}, got {y.dtype} {y.shape}")
    if len(x) == 0:
        raise DatasetError(f"{source} holds no images (x has shape {tuple(x.shape)})")
    top = num_classes - 1 if num_classes else np.iinfo(np.int64).max
    if len(y) and (y.min() < 0 or y.max() > top):
        raise DatasetError(
            f"{source}: labels must lie in 0..{top if num_classes else 'C-1'}, found {y.min()}..{y.max()}"
        )
    return ImageArrays(np.ascontiguousarray(x), y.astype(np.int64))


def read_npz(path: Path, num_classes: int, image_size: int) -> ImageArrays:
    """Read a prepared ``{x, y}`` archive of a dataset of known size (no pickle)."""
    return read_arrays(path, num_classes, image_size)


def read_arrays(
    path: Path, num_classes: int | None = None, image_size: int | None = None, own: bool = False
) -> ImageArrays:
    """Read an ``{x, y}`` archive: uint8 images ``[N, S, S, 3]`` and integer labels (no pickle). ``own``: the
    user's own arrays (the fix is to write them again), not a file dfcil prepares (to delete and prepare again)."""
    size = f"{image_size},{image_size}" if image_size else "S,S"
    layout = f"uint8 x [N,{size},3], channels last, and integer labels y [N]"
    fix = f"Save {path} again with {layout}." if own else f"Delete {path} and prepare it again ({layout})."
    try:
        with np.load(path, allow_pickle=False) as data:
            missing = {"x", "y"} - set(data.files)
            if missing:
                found = ", ".join(repr(k) for k in data.files) or "none"
                raise DatasetError(f"{path}: missing arrays {sorted(missing)} (it holds {found}). {fix}")
            x, y = data["x"], data["y"]
    except DatasetError:
        raise
    except FileNotFoundError:
        others = sorted(p.name for p in path.parent.glob("*.npz"))
        raise DatasetError(
            f"{path} is missing (found {', '.join(others) or 'no .npz'} beside it): prepare it too "
            f"(uint8 x [N,{size},3], int64 y [N]), or remove {path.parent} to use another source"
        ) from None
    except PermissionError:
        raise DatasetError(f"{path} cannot be read (permission denied); check its permissions") from None
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, KeyError) as err:
        reason = str(err).split(". ")[0]  # NumPy's own advice (load with allow_pickle) is not ours to give
        if "pickled" in reason:  # NumPy's guess for any file whose first bytes it does not recognise
            reason = "its first bytes are neither a zip archive's nor a .npy array's"
        raise DatasetError(f"{path} is corrupt or not an .npz archive ({reason}). {fix}") from err
    try:
        return check_arrays(x, y, num_classes, image_size, str(path))
    except DatasetError as err:
        raise DatasetError(f"{err}. {fix}") from None


# ------------------------------------------------------------------------------------------------- CIFAR-100

CIFAR100_URL = "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz"
CIFAR100_MD5 = "eb9058c3a382ffc7106e4002c42a8d85"  # the checksum torchvision verifies
CIFAR100_ARCHIVE = "cifar-100-python.tar.gz"
# Normalisation of the R-DFCIL reference code (cl-lite CIFAR100 base transform), applied to x / 255.
CIFAR100_MEAN = (0.5071, 0.4867, 0.4408)
CIFAR100_STD = (0.2675, 0.2565, 0.2761)


class _ArrayUnpickler(pickle.Unpickler):
    """Unpickler for the official CIFAR files that only rebuilds NumPy arrays (no arbitrary code)."""

    ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("numpy.core.multiarray", "scalar"),
        ("numpy._core.multiarray", "scalar"),
        ("_codecs", "encode"),
    }

    def find_class(self, module: str, name: str):
        if (module, name) in self.ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}")


def read_cifar100_python(folder: Path, split: str) -> ImageArrays:
    """Read ``cifar-100-python/{train,test}`` (the official pickled format)."""
    path = folder / split
    fix = f"Delete {folder} and extract the official archive again, or delete it and use --data.download true."
    try:
        with open(path, "rb") as f:
            entry = _ArrayUnpickler(f, encoding="latin1").load()
        data, labels = entry["data"], entry["fine_labels"]
        x = np.asarray(data, dtype=np.uint8).reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
        y = np.asarray(labels, dtype=np.int64)
    except FileNotFoundError:
        raise DatasetError(f"{path} is missing. {fix}") from None
    except (pickle.UnpicklingError, EOFError, KeyError, ValueError, TypeError, AttributeError) as err:
        raise DatasetError(f"{path} is corrupt ({err}). {fix}") from err
    try:
        return check_arrays(x, y, 100, 32, str(path))
    except DatasetError as err:
        raise DatasetError(f"{err}. {fix}") from None


def cifar100_words(prepared: Path, official: Path) -> tuple[str, ...]:
    """CIFAR-100's class names by raw label (``apple``, ``aquarium_fish``, ...): ``fine_names`` of the prepared
    ``train.npz`` where it holds them, else ``fine_label_names`` of the official ``meta``; () where neither does.
    For people only (``ImageDataset.words``): what runs record and caches key on stays as it was."""
    try:
        if (prepared / "train.npz").exists():
            with np.load(prepared / "train.npz", allow_pickle=False) as data:
                names = [str(n) for n in data["fine_names"]] if "fine_names" in data.files else []
        else:
            with open(official / "meta", "rb") as f:
                names = [str(n) for n in _ArrayUnpickler(f, encoding="latin1").load()["fine_label_names"]]
    except (OSError, ValueError, KeyError, TypeError, EOFError, pickle.UnpicklingError, zipfile.BadZipFile):
        return ()
    return tuple(names) if len(names) == 100 else ()


@DATASETS.register("cifar100")
def cifar100(root: Path, cfg: DataConfig, downloader: Downloader | None = None, **_: Any) -> ImageDataset:
    """CIFAR-100: 100 classes of 32×32 images, from the data root or its official download.

    Read from ``root``: ``cifar100/{train,test}.npz`` (fast path), else ``cifar-100-python/``, else a checksummed
    download of the official archive when ``download`` is set."""
    prepared, official = root / "cifar100", root / "cifar-100-python"
    if (prepared / "train.npz").exists() or (prepared / "test.npz").exists():
        train, test = (read_npz(prepared / f"{s}.npz", 100, 32) for s in ("train", "test"))
        source = str(prepared)
    else:
        if not official.is_dir():
            if not cfg.download:
                # the dataset's own folder given as the root: one level too deep
                itself = (root / "train.npz").exists() or ((root / "train").is_file() and (root / "meta").is_file())
                hint = f" {root} is itself such a folder: give its parent, --data.root {root.parent}." if itself else ""
                raise DatasetError(
                    f"CIFAR-100 not found under data root {root}: expected {prepared}/{{train,test}}.npz or "
                    f"{official}/.{hint} Point --data.root (or $DFCIL_DATA) to a folder holding one of them, or pass "
                    f"--data.download true to fetch the official archive (161 MB, md5-checked)."
                )
            # runs of a sweep may start together: one downloads and extracts, the others wait and read its folder
            # (a second extraction would replace the tree the first run reads)
            root.mkdir(parents=True, exist_ok=True)
            with FileLock(root / ".cifar100-download.lock"):
                if not official.is_dir():
                    archive = fetch(CIFAR100_URL, f"md5:{CIFAR100_MD5}", root, CIFAR100_ARCHIVE, downloader=downloader)
                    safe_extract(archive, root)
                    if not official.is_dir():
                        raise DatasetError(
                            f"{archive} did not contain cifar-100-python/. Delete it and download again."
                        )
        train, test = (read_cifar100_python(official, s) for s in ("train", "test"))
        source = str(official)
    check_image_size(cfg, 32, "cifar100")
    words = cifar100_words(prepared, official)
    return ImageDataset("cifar100", 100, 32, CIFAR100_MEAN, CIFAR100_STD, train, test, source, words=words)


def check_image_size(cfg: DataConfig, size: int, name: str) -> None:
    """Refuse a configured image size that a dataset of fixed size cannot give."""
    if cfg.image_size is not None and cfg.image_size != size:
        raise DatasetError(
            f"data.image_size {cfg.image_size}: {name} images are {size}×{size}; leave data.image_size unset (or "
            f"set it to {size})"
        )


# ------------------------------------------------------------------------------------------------- generated


def make_fake_arrays(num_classes: int, per_class: int, image_size: int, seed: int) -> ImageArrays:
    """Learnable generated images: a fixed low-resolution colour template per class plus pixel noise."""
    rng = np.random.default_rng(1234)  # templates are shared by train and test
    cells = 4
    templates = rng.integers(0, 256, size=(num_classes, cells, cells, 3)).astype(np.float32)
    scale = image_size // cells
    templates = templates.repeat(scale, axis=1).repeat(scale, axis=2)
    noise_rng = np.random.default_rng(seed)
    y = np.repeat(np.arange(num_classes), per_class)
    x = templates[y] + noise_rng.normal(0.0, 48.0, size=(len(y), image_size, image_size, 3))
    return ImageArrays(np.clip(x, 0, 255).astype(np.uint8), y.astype(np.int64))


@DATASETS.register("fake")
def fake(root: Path, cfg: DataConfig, **_: Any) -> ImageDataset:
    """Generated images for tests and smoke runs: 10 classes of 16×16 by default, no files needed.

    10 classes unless ``data.num_classes``; 48 train / 16 test per class, more train images where
    ``data.train_per_class`` asks for them; 16×16 unless ``data.image_size``, a multiple of 4. Also for timing a
    protocol's schedule at its real size (``--data.image_size 32`` for CIFAR's shapes)."""
    n, size = cfg.num_classes or 10, cfg.image_size or 16
    if size % 4:
        raise DatasetError(f"data.image_size {size}: the fake dataset needs a multiple of 4")
    train = make_fake_arrays(n, max(48, cfg.train_per_class or 0), size, seed=0)
    test = make_fake_arrays(n, 16, size, seed=1)
    return ImageDataset("fake", n, size, (0.5, 0.5, 0.5), (0.25, 0.25, 0.25), train, test, "generated")
