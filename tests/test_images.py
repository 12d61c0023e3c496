"""Image datasets: decoding, the cache, and the folder, arrays, Tiny-ImageNet and ImageNet-100 datasets, on image
files the tests make (and on the real Tiny-ImageNet subset where it is present)."""

import io
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from conftest import REPO, shared_tiny_subset
from dfcil.config import DataConfig
from dfcil.data import decode as img
from dfcil.data.datasets import build_dataset
from dfcil.data.decode import BaseTransform, decode
from dfcil.errors import DatasetError

TINY_SUBSET = shared_tiny_subset()  # $DFCIL_TINY_SUBSET, else the developers' shared copy


def nothing_cached(folder: Path) -> bool:
    """No cache (nor part of one) in ``folder``; an empty lock file may stay: removing it while another process
    waits on it would break the lock."""
    return not folder.exists() or not [p for p in folder.iterdir() if p.suffix != ".lock"]


def encode(array: np.ndarray, fmt: str = "PNG", mode: str | None = None) -> bytes:
    image = Image.fromarray(array)
    if mode is not None:
        image = image.convert(mode)
    buf = io.BytesIO()
    image.save(buf, format=fmt)
    return buf.getvalue()


def pattern(h: int, w: int, seed: int = 0) -> np.ndarray:
    """A smooth colour pattern (JPEG keeps it close), different per seed."""
    yy, xx = np.mgrid[0:h, 0:w]
    rgb = [(np.sin(xx / (5 + seed) + c) + np.cos(yy / (7 + c)) + 2) * 60 for c in range(3)]
    return np.stack(rgb, axis=-1).astype(np.uint8)


# ------------------------------------------------------------------------------------------------- decoding


def test_decode_resizes_the_shorter_side_then_crops_the_centre_as_torchvision():
    array = pattern(50, 100)
    out = decode(encode(array), BaseTransform(short=32, size=32))
    want = Image.fromarray(array).resize((64, 32), Image.BILINEAR).crop((16, 0, 48, 32))  # Resize(32), CenterCrop(32)
    np.testing.assert_array_equal(out, np.asarray(want))
    assert decode(encode(pattern(64, 64)), BaseTransform(64, 64)).tolist() == pattern(64, 64).tolist()  # untouched
    odd = decode(encode(pattern(37, 37)), BaseTransform(short=37, size=32))  # crop offset round(2.5) = 2, as torch
    np.testing.assert_array_equal(odd, pattern(37, 37)[2:34, 2:34])


@pytest.mark.parametrize("mode", ["L", "CMYK", "RGBA", "P"])
def test_decode_gives_rgb_for_every_colour_mode(mode):
    fmt = "JPEG" if mode in ("L", "CMYK") else "PNG"
    data = encode(pattern(40, 40), fmt, mode)
    out = decode(data, BaseTransform(32, 32))
    assert out.shape == (32, 32, 3) and out.dtype == np.uint8
    want = np.asarray(Image.open(io.BytesIO(data)).convert("RGB").resize((32, 32), Image.BILINEAR))
    np.testing.assert_array_equal(out, want)


def test_16_bit_greyscale_is_scaled_to_8_bits_not_clipped_to_white():
    """A 16-bit greyscale PNG (Pillow mode I;16) filled with 30000 decodes to round(30000 / 257) = 117 in every
    channel; 65535 to 255 and 0 to 0 (Pillow's own RGB conversion would give 255 for anything above 255)."""
    values = np.array([[30000, 65535], [0, 257]], dtype=np.uint16).repeat(16, axis=0).repeat(16, axis=1)
    buf = io.BytesIO()
    Image.fromarray(values).save(buf, format="PNG")
    assert Image.open(io.BytesIO(buf.getvalue())).mode.startswith("I")  # what the test is about
    out = decode(buf.getvalue(), BaseTransform(32, 32))
    assert out[0, 0].tolist() == [117, 117, 117] and out[0, 31].tolist() == [255] * 3
    assert out[31, 0].tolist() == [0] * 3 and out[31, 31].tolist() == [1] * 3


def test_decode_refuses_an_image_below_the_minimum_side():
    with pytest.raises(ValueError, match="20×30 pixels, smaller than the 32"):
        decode(encode(pattern(30, 20)), BaseTransform(32, 32, min_side=32))


# ------------------------------------------------------------------------------------------------- folder


def write_folder(root: Path, classes=("cat", "dog", "eel"), train=4, test=2, size=40, grey=True) -> Path:
    for split, n in (("train", train), ("test", test)):
        for c, name in enumerate(classes):
            folder = root / split / name
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(n):
                array = pattern(size, size + 8, seed=c * 10 + i)
                if grey and i == 0:
                    (folder / f"{i}.jpg").write_bytes(encode(array, "JPEG", "L"))
                elif i == 1:
                    (folder / f"{i}.jpeg").write_bytes(encode(array, "JPEG", "CMYK"))
                else:
                    (folder / f"{i}.png").write_bytes(encode(array))
    (root / "train" / classes[0] / "notes.txt").write_text("not an image: ignored")
    return root


def folder_config(root: Path, tmp_path: Path, **extra) -> DataConfig:
    return DataConfig(name="folder", root=str(root), image_size=32, cache=str(tmp_path / "cache"), workers=1, **extra)


def test_a_folder_dataset_is_decoded_once_and_read_from_the_cache(tmp_path, monkeypatch):
    root = write_folder(tmp_path / "data")
    d = build_dataset(folder_config(root, tmp_path))
    assert (d.name, d.num_classes, d.image_size, d.classes) == ("folder", 3, 32, ("cat", "dog", "eel"))
    assert d.train.x.shape == (12, 32, 32, 3) and d.test.x.shape == (6, 32, 32, 3)
    assert d.train.y.tolist() == [0] * 4 + [1] * 4 + [2] * 4 and isinstance(d.train.x, np.memmap)
    np.testing.assert_array_equal(d.train.x[3], decode((root / "train/cat/3.png").read_bytes(), BaseTransform(32, 32)))
    x = d.train.x.astype(np.float64) / 255  # the normalisation: the training images' own statistics
    np.testing.assert_allclose(d.mean, x.mean(axis=(0, 1, 2)), atol=1e-6)
    np.testing.assert_allclose(d.std, x.std(axis=(0, 1, 2)), atol=1e-6)
    monkeypatch.setattr(img, "decode_chunk", lambda *a: pytest.fail("decoded again"))
    again = build_dataset(folder_config(root, tmp_path, mean=(0.5, 0.5, 0.5), std=(0.2, 0.2, 0.2)))
    np.testing.assert_array_equal(again.test.x, d.test.x)
    assert again.mean == (0.5, 0.5, 0.5) and again.std == (0.2, 0.2, 0.2)  # the config's normalisation wins


def test_preparing_with_several_processes_gives_the_same_cache(tmp_path):
    root = write_folder(tmp_path / "data", train=70)  # more than one chunk of images per class
    one = build_dataset(folder_config(root, tmp_path / "one"))
    two = build_dataset(DataConfig(**{**folder_config(root, tmp_path / "two").__dict__, "workers": 2}))
    np.testing.assert_array_equal(one.train.x, two.train.x)
    np.testing.assert_array_equal(one.train.y, two.train.y)


def _interrupted_at(n, calls, decode):
    """``decode``, counting each chunk's images in ``calls`` and raising KeyboardInterrupt (Ctrl-C) at call ``n``."""

    def chunk(images, transform):
        calls.append(len(images))
        if len(calls) == n:
            raise KeyboardInterrupt
        return decode(images, transform)

    return chunk


def test_an_interrupted_preparation_continues_where_it_stopped(tmp_path, monkeypatch):
    root = write_folder(tmp_path / "data", train=70)  # 210 training images: 4 chunks, and 1 of test images
    calls, original = [], img.decode_chunk
    monkeypatch.setattr(img, "decode_chunk", _interrupted_at(3, calls, original))
    with pytest.raises(KeyboardInterrupt):
        build_dataset(folder_config(root, tmp_path))
    assert not list((tmp_path / "cache").glob("folder-*px-*"))  # no cache yet, only the hidden partial one
    assert len(list((tmp_path / "cache").glob(".folder-*.partial"))) == 1
    calls.clear()
    monkeypatch.setattr(
        img, "decode_chunk", lambda images, transform: calls.append(len(images)) or original(images, transform)
    )
    resumed = build_dataset(folder_config(root, tmp_path))
    assert sum(calls) == 216 - 2 * 64  # the two chunks decoded before the interrupt are not decoded again
    fresh = build_dataset(folder_config(root, tmp_path / "fresh"))
    np.testing.assert_array_equal(resumed.train.x, fresh.train.x)
    assert not list((tmp_path / "cache").glob(".*.partial"))


def test_corrupt_images_are_named_counted_and_nothing_is_cached(tmp_path):
    root = write_folder(tmp_path / "data")
    (root / "train" / "dog" / "2.png").write_bytes(b"\x89PNG not really")
    (root / "test" / "eel" / "0.jpg").write_bytes(encode(pattern(40, 48), "JPEG")[:200])  # truncated
    with pytest.raises(DatasetError, match=r"2 of 18 images cannot be used: .*dog/2.png.*eel/0.jpg") as err:
        build_dataset(folder_config(root, tmp_path))
    assert "nothing was cached" in str(err.value)
    assert "dog/2.png: UnidentifiedImageError: cannot identify image file;" in str(err.value)
    assert "BytesIO" not in str(err.value)  # Pillow's name for the bytes in memory, not the user's file
    assert nothing_cached(tmp_path / "cache")


def test_a_corrupt_image_found_before_an_interrupt_still_fails_the_preparation(tmp_path, monkeypatch):
    """A truncated image in the first chunk, an interrupt after it (Ctrl-C), the preparation run again: it fails
    naming the image, as it does without the interrupt, and caches nothing (the image is not cached as zeros)."""
    root = write_folder(tmp_path / "data", train=70)  # 210 training images in 4 chunks; the first holds cat/
    (root / "train" / "cat" / "10.png").write_bytes(encode(pattern(40, 48))[:300])  # truncated
    calls, original = [], img.decode_chunk
    monkeypatch.setattr(img, "decode_chunk", _interrupted_at(2, calls, original))
    with pytest.raises(KeyboardInterrupt):
        build_dataset(folder_config(root, tmp_path))
    monkeypatch.setattr(img, "decode_chunk", original)
    with pytest.raises(DatasetError, match=r"1 of 216 images cannot be used: .*cat/10.png"):
        build_dataset(folder_config(root, tmp_path))
    assert not list((tmp_path / "cache").glob("folder-*"))


def test_a_link_to_a_missing_image_is_named_not_skipped(tmp_path):
    root = write_folder(tmp_path / "data")
    (root / "train" / "dog" / "gone.png").symlink_to(tmp_path / "nowhere.png")
    with pytest.raises(DatasetError, match=r"dog/gone.png.* points to .*nowhere.png, which does not exist"):
        build_dataset(folder_config(root, tmp_path))
    assert nothing_cached(tmp_path / "cache")


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda r: (r / "test").rename(r / "elsewhere"), "test is missing"),
        (lambda r: [f.unlink() for f in (r / "train" / "dog").iterdir()], "class folder .*dog holds no images"),
        (
            lambda r: (r / "test" / "eel").rename(r / "test" / "emu"),
            r"only in train: \['eel'\]; only in test: \['emu'\]",
        ),
        (
            lambda r: (r / "train" / "cat" / "big.png").write_bytes(encode(pattern(20, 30))),
            r"1 of 19 images are smaller than 32 px \(the smallest is 30×20, train/cat/big.png\): use "
            r"--data.image_size 20 or leave it unset \(auto\)",
        ),
    ],
    ids=["no-test-split", "empty-class", "other-classes", "small-image"],
)
def test_a_bad_folder_gets_one_clear_error_and_leaves_no_cache(tmp_path, damage, message):
    root = write_folder(tmp_path / "data")
    damage(root)
    with pytest.raises(DatasetError, match=message):
        build_dataset(folder_config(root, tmp_path))
    assert nothing_cached(tmp_path / "cache")


def test_the_folder_dataset_reads_val_as_test(tmp_path):
    root = write_folder(tmp_path / "data")
    (root / "test").rename(root / "val")
    assert build_dataset(folder_config(root, tmp_path)).test.x.shape[0] == 6


def write_sized(root: Path, sizes: list[tuple[int, int]]) -> Path:
    """Two classes, each with a training image of every (width, height) in ``sizes`` and one 40-pixel test image."""
    for c in ("a", "b"):
        for i, (w, h) in enumerate(sizes):
            (root / "train" / c).mkdir(parents=True, exist_ok=True)
            (root / "train" / c / f"{i}.png").write_bytes(encode(pattern(h, w, seed=i)))
        (root / "test" / c).mkdir(parents=True, exist_ok=True)
        (root / "test" / c / "0.png").write_bytes(encode(pattern(40, 40)))
    return root


def auto_config(root: Path, tmp_path: Path, **extra) -> DataConfig:
    return DataConfig(name="folder", root=str(root), cache=str(tmp_path / "cache"), workers=1, **extra)


def test_auto_image_size_is_the_size_uniform_images_share(tmp_path, caplog):
    root = write_folder(tmp_path / "data", size=32)  # 32×40 images, greyscale and CMYK among them
    with caplog.at_level("INFO", logger="dfcil"):
        d = build_dataset(auto_config(root, tmp_path, image_size="auto"))
    assert d.image_size == 32 and d.train.x.shape == (12, 32, 32, 3)
    assert "data.image_size auto: 32 px, the shorter side all 18 images share" in caplog.text
    np.testing.assert_array_equal(d.train.x, build_dataset(folder_config(root, tmp_path / "explicit")).train.x)
    assert [p.name for p in (tmp_path / "cache").iterdir() if not p.name.startswith(".")] == [
        Path(d.source.split("(cache ")[1].rstrip(")")).name
    ] and "folder-auto-" in d.source


def test_auto_image_size_of_mixed_images_is_their_median_shorter_side(tmp_path, caplog, monkeypatch):
    root = write_sized(tmp_path / "data", [(24, 30), (48, 32), (64, 64)])  # shorter sides 24, 32, 64; test 40
    with caplog.at_level("INFO", logger="dfcil"):
        d = build_dataset(auto_config(root, tmp_path))
    assert d.image_size == 32 and d.test.x.shape == (2, 32, 32, 3)
    line = "data.image_size auto: 32 px, the median shorter side of 8 images (24 to 64 px; the 2 smaller ones are "
    assert line + "enlarged)" in caplog.text
    np.testing.assert_array_equal(d.train.x[0], decode((root / "train/a/0.png").read_bytes(), BaseTransform(32, 32)))
    caplog.clear()
    monkeypatch.setattr(img, "header_sizes", lambda *a: pytest.fail("headers read again"))
    monkeypatch.setattr(img, "decode_chunk", lambda *a: pytest.fail("decoded again"))
    with caplog.at_level("INFO", logger="dfcil"):  # a later run reads the choice from the cache, and says it
        assert build_dataset(auto_config(root, tmp_path)).image_size == 32
    assert line in caplog.text


def test_an_explicit_size_larger_than_some_images_is_refused_before_decoding(tmp_path, monkeypatch):
    root = write_sized(tmp_path / "data", [(48, 32), (64, 64)])
    monkeypatch.setattr(img, "decode_chunk", lambda *a: pytest.fail("decoded before the sizes were checked"))
    message = (
        r"^4 of 6 images are smaller than 64 px \(the smallest is 48×32, train/a/0.png\): use --data.image_size 32 "
        r"or leave it unset \(auto\), or remove the smaller images$"
    )
    with pytest.raises(DatasetError, match=message):
        build_dataset(auto_config(root, tmp_path, image_size=64))
    assert nothing_cached(tmp_path / "cache")


def test_image_sizes_are_read_from_headers_by_a_pool_as_by_one_process(tmp_path, monkeypatch):
    root = write_sized(tmp_path / "data", [(24, 30), (48, 32), (64, 64)])
    (root / "train" / "a" / "9.png").write_bytes(b"\x89PNG not really")  # unreadable: (0, 0), named by decoding
    files = [img.ImageFile(str(f)) for f in sorted(root.rglob("*.png"))]
    monkeypatch.setattr(img, "SIZE_CHUNK", 3)
    one, two = img.image_sizes(files, workers=1), img.image_sizes(files, workers=2)
    np.testing.assert_array_equal(one, two)
    assert one.tolist()[:6] == [[40, 40], [40, 40], [24, 30], [48, 32], [64, 64], [0, 0]]  # test/ first


def test_a_changed_source_or_an_older_cache_is_refused_with_the_fix(tmp_path):
    root = write_folder(tmp_path / "data")
    d = build_dataset(folder_config(root, tmp_path))
    cache = Path(d.source.split("(cache ")[1].rstrip(")"))
    (root / "train" / "cat" / "9.png").write_bytes(encode(pattern(40, 40, seed=9)))
    fix = rf"run again with --data.rebuild true \(or delete {cache}\) to prepare it again from the source"
    with pytest.raises(DatasetError, match=r"prepared from another source .*: the source changed since; " + fix):
        build_dataset(folder_config(root, tmp_path))
    (root / "train" / "cat" / "9.png").unlink()
    manifest = json.loads((cache / "manifest.json").read_text())
    (cache / "manifest.json").write_text(json.dumps(manifest | {"cache_format": 0}))
    with pytest.raises(DatasetError, match="prepared by another version of dfcil"):
        build_dataset(folder_config(root, tmp_path))


def test_a_stale_cache_is_rebuilt_on_request_while_a_reader_keeps_the_old_arrays(tmp_path):
    root = write_folder(tmp_path / "data")
    old = build_dataset(folder_config(root, tmp_path))
    before = np.array(old.train.x)
    (root / "train" / "cat" / "3.png").write_bytes(encode(pattern(40, 48, seed=99)))  # an edited image
    with pytest.raises(DatasetError, match=r"run again with --data.rebuild true \(or delete .*folder-32px-"):
        build_dataset(folder_config(root, tmp_path))
    new = build_dataset(folder_config(root, tmp_path, rebuild=True))
    np.testing.assert_array_equal(
        new.train.x[3], decode((root / "train/cat/3.png").read_bytes(), BaseTransform(32, 32))
    )
    np.testing.assert_array_equal(old.train.x, before)  # the old memory map still reads the old cache's arrays
    assert sorted(p.name for p in (tmp_path / "cache").iterdir() if p.suffix != ".lock") == [
        Path(new.source[:-1].split("cache ")[1]).name
    ]
    np.testing.assert_array_equal(build_dataset(folder_config(root, tmp_path)).train.x, new.train.x)


KILLED_REBUILD = """
import sys, time
from pathlib import Path
from dfcil.config import DataConfig
from dfcil.data import decode as img
from dfcil.data.datasets import build_dataset

root, cache, marker = sys.argv[1:]
original, calls = img.decode_chunk, []


def slow(images, transform):  # the second chunk never finishes: the parent kills the process there
    calls.append(1)
    if len(calls) == 2:
        Path(marker).touch()
        time.sleep(600)
    return original(images, transform)


img.decode_chunk = slow
build_dataset(DataConfig(name="folder", root=root, image_size=32, cache=cache, workers=1, rebuild=True))
"""


def test_a_rebuild_killed_midway_leaves_the_old_cache_and_continues_next_time(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    root = write_folder(tmp_path / "data", train=70)  # 216 images: 5 chunks
    build_dataset(folder_config(root, tmp_path))
    (cache,) = (tmp_path / "cache").glob("folder-*")
    (root / "train" / "dog" / "3.png").write_bytes(encode(pattern(40, 48, seed=99)))
    marker = tmp_path / "decoding"
    child = subprocess.Popen([sys.executable, "-c", KILLED_REBUILD, str(root), str(tmp_path / "cache"), str(marker)])
    deadline = time.monotonic() + 120
    while not marker.exists() and child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marker.exists(), "the rebuild did not reach its second chunk"
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    # under the cache's name: the old cache, whole (refused as stale, not as damaged), and the rebuild's partial
    with pytest.raises(DatasetError, match="prepared from another source"):
        build_dataset(folder_config(root, tmp_path))
    assert (cache / "manifest.json").exists() and (tmp_path / "cache" / f".{cache.name}.partial").is_dir()
    # the rebuild asked again continues the partial (a kill loses at most the last half minute of decoding)
    rebuilt = build_dataset(folder_config(root, tmp_path, rebuild=True))
    fresh = build_dataset(folder_config(root, tmp_path / "fresh"))
    np.testing.assert_array_equal(rebuilt.train.x, fresh.train.x)
    assert sorted(p.name for p in (tmp_path / "cache").iterdir() if p.suffix != ".lock") == [cache.name]


def test_a_rebuild_killed_between_its_renames_is_finished_by_the_next_run(tmp_path, monkeypatch):
    """The new cache whole in its hidden directory, the old one renamed aside, nothing under the cache's name:
    the next run renames the new one into place without decoding, and removes the old one."""
    root = write_folder(tmp_path / "data")
    want = np.array(build_dataset(folder_config(root, tmp_path)).train.x)
    (cache,) = (tmp_path / "cache").glob("folder-*")
    cache.rename(cache.parent / f".{cache.name}.partial")
    (cache.parent / f".{cache.name}.old").mkdir()
    monkeypatch.setattr(img, "decode_chunk", lambda *a: pytest.fail("decoded again"))
    np.testing.assert_array_equal(build_dataset(folder_config(root, tmp_path)).train.x, want)
    assert sorted(p.name for p in (tmp_path / "cache").iterdir() if p.suffix != ".lock") == [cache.name]


def test_a_cache_with_a_label_beyond_its_classes_is_refused_when_opened(tmp_path):
    """A damaged cache (a label past the manifest's classes) is refused by every command that opens it, the same
    way: --dry-run used to fail with an IndexError while training went on."""
    from dfcil.cli import main

    root = write_folder(tmp_path / "data")
    build_dataset(folder_config(root, tmp_path))
    (cache,) = (tmp_path / "cache").glob("folder-*")
    y = np.load(cache / "test_y.npy")
    y[2] = 7
    np.save(cache / "test_y.npy", y)
    with pytest.raises(DatasetError, match=r"test labels are not the manifest's 3 classes \(found 0..7"):
        build_dataset(folder_config(root, tmp_path))
    args = ["--config", str(REPO / "configs" / "smoke.yaml"), "--data.name", "folder", "--data.root", str(root)]
    args += ["--data.image_size", "32", "--data.cache", str(tmp_path / "cache"), "--data.num_tasks", "3"]
    assert main(["train", *args, "--dry-run"]) == 2
    assert main(["train", *args, "--out", str(tmp_path / "run")]) == 2 and not (tmp_path / "run").exists()


def test_an_unwritable_cache_is_a_clear_error(tmp_path):
    root = write_folder(tmp_path / "data")
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the cache directory should be")
    with pytest.raises(DatasetError, match="set data.cache .* to a writable directory"):
        build_dataset(DataConfig(name="folder", root=str(root), image_size=32, cache=str(blocked / "c"), workers=1))


# ------------------------------------------------------------------------------------------------- arrays


def write_arrays(root: Path, sizes=(16, 16), classes=(4, 4), n=5) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for split, size, c in zip(("train", "test"), sizes, classes, strict=True):
        y = np.repeat(np.arange(c), n)
        np.savez(root / f"{split}.npz", x=rng.integers(0, 256, (len(y), size, size, 3), dtype=np.uint8), y=y)
    return root


def test_an_arrays_dataset_takes_any_class_count_and_size(tmp_path):
    d = build_dataset(DataConfig(name="arrays", root=str(write_arrays(tmp_path / "a"))))
    assert (d.num_classes, d.image_size, d.train.x.shape) == (4, 16, (20, 16, 16, 3))
    np.testing.assert_allclose(d.mean, (d.train.x / 255).mean(axis=(0, 1, 2)), atol=1e-6)


@pytest.mark.parametrize(
    ("layout", "config", "message"),
    [
        ({"sizes": (16, 24)}, {}, "both splits need images of one size"),
        ({"classes": (4, 3)}, {}, r"classes without images in test: 3$"),
        ({}, {"image_size": 32}, "does not resize"),
    ],
)
def test_bad_arrays_are_refused(tmp_path, layout, config, message):
    root = write_arrays(tmp_path / "a", **layout)
    with pytest.raises(DatasetError, match=message):
        build_dataset(DataConfig(name="arrays", root=str(root), **config))


def test_own_arrays_of_the_wrong_layout_say_how_to_save_them_not_to_delete_them(tmp_path):
    """The user's own arrays: the fix is to save them in the layout read (the file is theirs, not a cache); wrong
    array names are listed; classes missing from a split are listed with how many more there are."""
    root = write_arrays(tmp_path / "a")
    with np.load(root / "train.npz") as data:
        x, y = data["x"], data["y"]
    np.savez(root / "train.npz", x=x.transpose(0, 3, 1, 2).astype(np.float32), y=y)  # CHW floats
    with pytest.raises(DatasetError) as err:
        build_dataset(DataConfig(name="arrays", root=str(root)))
    assert "must be uint8" in str(err.value) and "Delete" not in str(err.value)
    assert str(err.value).endswith(f"Save {root / 'train.npz'} again with uint8 x [N,S,S,3], channels last, and "
                                   f"integer labels y [N].")  # fmt: skip
    np.savez(root / "train.npz", images=x, labels=y)
    with pytest.raises(DatasetError, match=r"missing arrays \['x', 'y'\] \(it holds 'images', 'labels'\)\. Save"):
        build_dataset(DataConfig(name="arrays", root=str(root)))
    np.savez(root / "train.npz", x=np.concatenate([x] * 3), y=np.arange(60) % 15)  # labels 0..14, test has 0..3
    with pytest.raises(DatasetError, match=r"classes without images in test: 4, 5, 6, 7, 8, 9, 10, 11 and 3 more$"):
        build_dataset(DataConfig(name="arrays", root=str(root)))


def test_arrays_with_a_huge_label_or_no_images_get_one_line_at_once(tmp_path):
    """A label of 3·10⁸ among 20 images: refused before anything the size of the label is allocated. Empty arrays:
    refused by name, not with NumPy's zero-size error."""
    import resource
    import time

    root = write_arrays(tmp_path / "a")
    with np.load(root / "train.npz") as data:
        x, y = data["x"], data["y"].copy()
    y[3] = 300_000_000
    np.savez(root / "train.npz", x=x, y=y)
    before, t0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, time.perf_counter()
    with pytest.raises(DatasetError, match=r"go up to 300000000, but train.npz holds 20 images"):
        build_dataset(DataConfig(name="arrays", root=str(root)))
    assert time.perf_counter() - t0 < 5 and resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200_000
    np.savez(root / "train.npz", x=np.zeros((0, 16, 16, 3), dtype=np.uint8), y=np.zeros(0, dtype=np.int64))
    with pytest.raises(DatasetError, match=r"train.npz holds no images"):
        build_dataset(DataConfig(name="arrays", root=str(root)))


# ------------------------------------------------------------------------------------------------- Tiny-ImageNet


def tiny_wnids() -> list[str]:
    return [f"n{9000000 - 37 * i:08d}" for i in range(200)]  # unsorted, as the release's wnids.txt


def write_tiny_zip(path: Path, per_class=2, damage=None) -> Path:
    """A Tiny-ImageNet-shaped zip: 200 classes, ``per_class`` 64-pixel training images each, one validation image
    per class (greyscale for every tenth), ``damage`` applied to the member names and contents first."""
    wnids = tiny_wnids()
    members = {"tiny-imagenet-200/wnids.txt": "\n".join(wnids) + "\n"}
    lines = []
    for c, w in enumerate(wnids):
        for i in range(per_class):
            members[f"tiny-imagenet-200/train/{w}/images/{w}_{i}.JPEG"] = encode(pattern(64, 64, c % 7 + i), "JPEG")
        members[f"tiny-imagenet-200/val/images/val_{c}.JPEG"] = encode(
            pattern(64, 64, c % 5), "JPEG", "L" if c % 10 == 0 else None
        )
        lines.append(f"val_{c}.JPEG\t{w}\t0\t0\t63\t63")
    members["tiny-imagenet-200/val/val_annotations.txt"] = "\n".join(lines) + "\n"
    if damage:
        damage(members)
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    return path


def tiny_config(root: Path, tmp_path: Path, **extra) -> DataConfig:
    return DataConfig(name="tiny_imagenet200", root=str(root), cache=str(tmp_path / "cache"), workers=1, **extra)


def test_tiny_imagenet_from_its_zip_or_its_folder(tmp_path):
    archive = write_tiny_zip(tmp_path / "data" / "tiny-imagenet-200.zip")
    d = build_dataset(tiny_config(tmp_path / "data", tmp_path))
    assert (d.num_classes, d.image_size, d.train.x.shape, d.test.x.shape) == (
        200,
        64,
        (400, 64, 64, 3),
        (200, 64, 64, 3),
    )
    wnids = sorted(tiny_wnids())
    assert d.classes == tuple(wnids) and d.mean == (0.4803, 0.4481, 0.3976)
    first = wnids[0]  # label 0: the first wnid in sorted order, its images in name order
    with zipfile.ZipFile(archive) as z:
        want = decode(z.read(f"tiny-imagenet-200/train/{first}/images/{first}_0.JPEG"), BaseTransform(64, 64))
    np.testing.assert_array_equal(d.train.x[0], want)
    assert d.train.y.tolist()[:4] == [0, 0, 1, 1]
    assert d.test.y[0] == wnids.index(tiny_wnids()[0])  # val_0 belongs to the first wnid of wnids.txt
    with zipfile.ZipFile(archive) as z:
        z.extractall(tmp_path / "extracted")
    folder = build_dataset(tiny_config(tmp_path / "extracted", tmp_path))
    np.testing.assert_array_equal(folder.train.x, d.train.x)
    np.testing.assert_array_equal(folder.test.y, d.test.y)
    direct = build_dataset(tiny_config(archive, tmp_path))  # --data.root may be the zip itself
    assert direct.source == d.source


def test_tiny_imagenet_classes_show_with_their_first_word_from_words_txt(tmp_path):
    """Classes showed as wnids (n01443537) though the release's words.txt names them: shown as ``wnid (first
    word)`` now. The wnids stay the classes' names (what runs record, what caches and shared task-0 models key
    on); without words.txt, or for a class it does not list, a class shows as its wnid."""
    wnids = sorted(tiny_wnids())
    lines = ["n00001740\tentity", f"{wnids[0]}\tgoldfish, Carassius auratus", f"{wnids[1]}\t great white shark, shark"]
    add = lambda m: m.update({"tiny-imagenet-200/words.txt": "\n".join(lines) + "\n"})  # noqa: E731 - words.txt too
    archive = write_tiny_zip(tmp_path / "data" / "tiny-imagenet-200.zip", per_class=1, damage=add)
    d = build_dataset(tiny_config(tmp_path / "data", tmp_path))
    assert d.classes == tuple(wnids) and len(d.words) == 200
    shown = [d.class_label(c) for c in range(3)]  # wnids[2] is not in words.txt
    assert shown == [f"{wnids[0]} (goldfish)", f"{wnids[1]} (great white shark)", wnids[2]]
    with zipfile.ZipFile(archive) as z:
        z.extractall(tmp_path / "extracted")
    folder = build_dataset(tiny_config(tmp_path / "extracted", tmp_path))
    assert folder.words == d.words and folder.classes == d.classes
    plain_zip = write_tiny_zip(tmp_path / "plain" / "tiny-imagenet-200.zip", per_class=1)  # no words.txt
    plain = build_dataset(tiny_config(plain_zip, tmp_path))
    assert plain.words == () and plain.classes == d.classes and plain.class_label(0) == wnids[0]
    unnamed = build_dataset(DataConfig(name="fake"))
    assert unnamed.classes == () and unnamed.class_label(3) == "class 3"


def test_tiny_imagenet_zip_kept_in_a_folder_of_its_name_is_found_and_a_partial_folder_is_named(tmp_path):
    """DATA/tiny-imagenet-200/ holding the archive (under any tiny-imagenet-200*.zip name), not its extracted files,
    is read from the archive; a folder with neither names the missing file by its full path, and the fix."""
    archive = write_tiny_zip(tmp_path / "data" / "tiny-imagenet-200" / "tiny-imagenet-200-sub.zip", per_class=1)
    d = build_dataset(tiny_config(tmp_path / "data", tmp_path))
    assert d.train.x.shape[0] == 200 and d.source.startswith(f"{archive} (cache ")
    archive.unlink()
    (tmp_path / "data" / "tiny-imagenet-200" / "train").mkdir()
    wanted = tmp_path / "data" / "tiny-imagenet-200" / "tiny-imagenet-200" / "wnids.txt"
    with pytest.raises(DatasetError) as err:
        build_dataset(tiny_config(tmp_path / "data", tmp_path))
    assert str(err.value).startswith(f"{tmp_path / 'data' / 'tiny-imagenet-200' / 'wnids.txt'} is missing: ")
    assert str(wanted) not in str(err.value) and "point --data.root to the zip" in str(err.value)


def _drop_annotation_wnid(members):
    text = members["tiny-imagenet-200/val/val_annotations.txt"].splitlines()
    text[3] = text[3].replace(text[3].split("\t")[1], "n00000001")
    members["tiny-imagenet-200/val/val_annotations.txt"] = "\n".join(text)


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda m: m.pop("tiny-imagenet-200/wnids.txt"), "has no tiny-imagenet-200/wnids.txt: it is not a whole"),
        (_drop_annotation_wnid, r"line 4 of tiny-imagenet-200/val/val_annotations.txt names an unknown class"),
        (
            lambda m: [m.pop(k) for k in [k for k in m if "/train/n08999963/" in k]],
            "no training images for 1 classes",
        ),
        (lambda m: m.pop("tiny-imagenet-200/val/images/val_7.JPEG"), "names val_7.JPEG, which is missing"),
    ],
    ids=["no-wnids", "unknown-wnid", "class-without-images", "missing-val-image"],
)
def test_a_damaged_tiny_imagenet_release_is_named_and_nothing_is_cached(tmp_path, damage, message):
    write_tiny_zip(tmp_path / "data" / "tiny-imagenet-200.zip", per_class=1, damage=damage)
    with pytest.raises(DatasetError, match=message):
        build_dataset(tiny_config(tmp_path / "data", tmp_path))
    assert nothing_cached(tmp_path / "cache")


def test_a_truncated_tiny_imagenet_zip_says_to_download_it_again(tmp_path):
    archive = write_tiny_zip(tmp_path / "data" / "tiny-imagenet-200.zip", per_class=1)
    archive.write_bytes(archive.read_bytes()[: archive.stat().st_size // 2])
    with pytest.raises(DatasetError, match="not a readable zip archive .* download it again"):
        build_dataset(tiny_config(tmp_path / "data", tmp_path))
    with pytest.raises(DatasetError, match="Tiny-ImageNet-200 not found .* --data.download true"):
        build_dataset(tiny_config(tmp_path / "nothing", tmp_path))


def test_tiny_imagenet_download_is_checksummed(tmp_path, monkeypatch):
    import hashlib
    import shutil

    from dfcil.data import tiny_imagenet

    archive = write_tiny_zip(tmp_path / "made" / "t.zip", per_class=1)
    root = tmp_path / "root"
    cfg = tiny_config(root, tmp_path, download=True)
    copy = lambda url, out, pooch: shutil.copyfile(archive, out)  # noqa: E731 - the "network"
    monkeypatch.setattr(tiny_imagenet, "TINY_MD5", "0" * 32)
    with pytest.raises(DatasetError, match="failed its checksum"):
        tiny_imagenet.tiny_imagenet200(root, cfg, downloader=copy)
    assert not (root / "tiny-imagenet-200.zip").exists()
    monkeypatch.setattr(tiny_imagenet, "TINY_MD5", hashlib.md5(archive.read_bytes()).hexdigest())
    d = tiny_imagenet.tiny_imagenet200(root, cfg, downloader=copy)
    assert d.train.x.shape[0] == 200 and (root / "tiny-imagenet-200.zip").exists()


@pytest.mark.skipif(
    not TINY_SUBSET.exists(),
    reason="the real Tiny-ImageNet subset not found: set DFCIL_TINY_SUBSET to its zip (tiny-imagenet-200-sub100.zip, "
    "the release's layout with 100 training images per class)",
)
def test_the_real_tiny_imagenet_subset_parses(tmp_path):
    """The shared subset in the release's layout: 200 classes, the first 100 training images of each, the whole
    validation set; every listed image decodes (a sample is decoded here; a run decodes them all)."""
    from dfcil.data.tiny_imagenet import _Source, list_splits

    source = _Source(TINY_SUBSET)
    wnids = sorted(source.read_text("tiny-imagenet-200/wnids.txt").split())
    splits = list_splits(source, wnids)
    assert len(splits["train"].images) == 20000 and len(splits["test"].images) == 10000
    assert np.bincount(splits["train"].labels).tolist() == [100] * 200
    assert np.bincount(splits["test"].labels).tolist() == [50] * 200
    sample = list(splits["test"].images[:64]) + list(splits["train"].images[:64])
    out, bad = img.decode_chunk(sample, BaseTransform(64, 64))
    assert bad == [] and out.shape == (128, 64, 64, 3)
    assert source.fingerprint() == "sha256:d5234617047421d5ffa92607ccf556ed73a4c90637c619ed42fe0e30f6c67f15"


# ------------------------------------------------------------------------------------------------- ImageNet-100


def imagenet_wnids() -> list[str]:
    """n01440764 … n01855672, in sorted order, as ImageNet-100's."""
    return [f"n01{440764 + 4191 * i:06d}" for i in range(99)] + ["n01855672"]


def write_imagenet(root: Path, extra_classes: int = 2, per_class: int = 2) -> Path:
    """An ILSVRC-2012-shaped folder: the 100 classes (and ``extra_classes`` later ones, as the full release has),
    ``per_class`` training images and one validation image each, of assorted sizes and colour modes."""
    wnids = imagenet_wnids() + [f"n02{i:06d}" for i in range(extra_classes)]
    for c, w in enumerate(wnids):
        for split, n in (("train", per_class), ("val", 1)):
            folder = root / split / w
            folder.mkdir(parents=True)
            for i in range(n):
                array = pattern(30 + c % 3, 44, seed=c % 9 + i)
                mode = {0: "L", 1: "CMYK"}.get(c % 11) if split == "train" and i == 0 else None
                (folder / f"{w}_{i}.JPEG").write_bytes(encode(array, "JPEG", mode))
    return root


def imagenet_config(root: Path, tmp_path: Path, **extra) -> DataConfig:
    return DataConfig(
        name="imagenet100", root=str(root), image_size=32, cache=str(tmp_path / "cache"), workers=1, **extra
    )


def test_imagenet100_takes_the_first_100_wnids_and_scales_the_reference_transform(tmp_path):
    from dfcil.data.imagenet import reference_class_order

    root = write_imagenet(tmp_path / "ilsvrc")
    d = build_dataset(imagenet_config(root, tmp_path))
    assert (d.num_classes, d.image_size, d.train.x.shape, d.test.x.shape) == (
        100,
        32,
        (200, 32, 32, 3),
        (100, 32, 32, 3),
    )
    assert d.classes == tuple(imagenet_wnids()) and d.mean == (0.485, 0.456, 0.406)
    w = imagenet_wnids()[5]
    want = decode((root / "train" / w / f"{w}_0.JPEG").read_bytes(), BaseTransform(short=37, size=32))  # 256/224
    np.testing.assert_array_equal(d.train.x[10], want)
    assert reference_class_order()[:5] == [68, 56, 78, 8, 23]
    # a data root holding every dataset: the copy is found in its imagenet100/ folder, and read as the same data
    (tmp_path / "data").mkdir()
    root.rename(tmp_path / "data" / "imagenet100")
    inside = build_dataset(imagenet_config(tmp_path / "data", tmp_path / "again"))
    np.testing.assert_array_equal(inside.train.x, d.train.x)
    with pytest.raises(DatasetError, match=f"there or in {tmp_path / 'elsewhere' / 'imagenet100'}/"):
        build_dataset(imagenet_config(tmp_path / "elsewhere", tmp_path))


def test_imagenet100_from_the_split_files(tmp_path):
    root = write_imagenet(tmp_path / "ilsvrc", extra_classes=0)
    for split, name in (("train", "train_100.txt"), ("val", "val_100.txt")):
        lines = [f"{split}/{w}/{f.name} {label}" for label, w in enumerate(imagenet_wnids())
                 for f in sorted((root / split / w).iterdir())]  # fmt: skip
        (root / name).write_text("\n".join(lines) + "\n")
    from_files = build_dataset(imagenet_config(root, tmp_path / "a"))
    (root / "train_100.txt").rename(root / "unused.txt")
    from_folders = build_dataset(imagenet_config(root, tmp_path / "b"))
    np.testing.assert_array_equal(from_files.train.x, from_folders.train.x)
    assert from_files.classes == from_folders.classes


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda r: __import__("shutil").rmtree(r / "val" / imagenet_wnids()[40]), r"val/n01608\d+ is missing"),
        (lambda r: __import__("shutil").rmtree(r / "train" / imagenet_wnids()[0]), "does not hold the ImageNet-100"),
        (
            lambda r: (r / "train" / imagenet_wnids()[3] / "bad.JPEG").write_bytes(b"\xff\xd8 not a jpeg"),
            "cannot be used",
        ),
    ],
    ids=["missing-class-folder", "other-classes", "corrupt-image"],
)
def test_a_damaged_imagenet_folder_is_named_and_nothing_is_cached(tmp_path, damage, message):
    root = write_imagenet(tmp_path / "ilsvrc", extra_classes=0)
    damage(root)
    with pytest.raises(DatasetError, match=message):
        build_dataset(imagenet_config(root, tmp_path))
    assert nothing_cached(tmp_path / "cache")


LOCK_HOLDER = """
import signal, sys, time
from pathlib import Path
from dfcil.data.cache import load_or_prepare
signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C raises, even where the parent ignores SIGINT
log = Path(sys.argv[2])

def plan():  # inside the cache's lock: say so, hold it, then fail (nothing is prepared)
    with log.open("a") as f:
        f.write(f"{sys.argv[3]} in {time.time()}\\n")
    time.sleep(float(sys.argv[4]))
    with log.open("a") as f:
        f.write(f"{sys.argv[3]} out {time.time()}\\n")
    raise SystemExit(0)

with log.open("a") as f:
    f.write(f"{sys.argv[3]} waits {time.time()}\\n")
load_or_prepare(Path(sys.argv[1]), {}, plan)
"""


def test_a_process_stopped_while_waiting_for_the_cache_lock_leaves_it_to_its_holder(tmp_path):
    """A holds the preparation lock; B waits for it and is stopped (Ctrl-C); C then waits too. C must enter only
    after A left: B removing the lock file on its way out let C lock a new file and prepare beside A."""
    import signal
    import subprocess
    import sys
    import time

    cache, log = tmp_path / "cache" / "c", tmp_path / "log"

    def start(name, hold):
        return subprocess.Popen([sys.executable, "-c", LOCK_HOLDER, str(cache), str(log), name, str(hold)])

    a = start("A", 4)
    deadline = time.time() + 60
    while not (log.exists() and "A in" in log.read_text()):
        assert time.time() < deadline and a.poll() is None, "A never took the lock"
        time.sleep(0.05)
    b = start("B", 0)
    while "B waits" not in log.read_text():
        assert time.time() < deadline and b.poll() is None, "B never started waiting"
        time.sleep(0.05)
    time.sleep(0.5)  # B is waiting on the lock
    b.send_signal(signal.SIGINT)
    assert b.wait(30) != 0
    c = start("C", 0)
    assert a.wait(60) == 0 and c.wait(60) == 0
    events = {line.split()[0] + " " + line.split()[1]: float(line.split()[2]) for line in log.read_text().splitlines()}
    assert "A in" in events and "B in" not in events and events["C in"] >= events["A out"], events


PROBER = """
import sys
from pathlib import Path
from dfcil.data.cache import check_writable
for _ in range(int(sys.argv[2])):
    check_writable(Path(sys.argv[1]))
"""


def test_runs_starting_together_probe_the_cache_folder_without_failing_each_other(tmp_path):
    """Two processes checking that one cache folder is writable at once: a probe file of a fixed name, created
    and removed by both, made one of them report the folder as not writable."""
    import subprocess
    import sys

    args = [sys.executable, "-c", PROBER, str(tmp_path / "cache" / "c"), "1500"]
    procs = [subprocess.Popen(args, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    errors = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errors
    assert [p.name for p in (tmp_path / "cache").iterdir()] == []  # no probe left behind


def test_the_cache_writer_finishes_short_writes_and_never_hides_a_failed_sync(tmp_path, monkeypatch):
    """pwrite may write part of a chunk (a nearly full disk): the rest is written, and a write of nothing is an
    error. A writeback error met by the syncing thread (reported once by the kernel) fails the cache."""
    import errno
    import os
    import time

    from dfcil.data import cache as mod

    path = tmp_path / "x.npy"
    np.save(path, np.zeros((4, 2, 2, 3), dtype=np.uint8))
    real = os.pwrite
    monkeypatch.setattr(mod.os, "pwrite", lambda fd, data, at: real(fd, bytes(data)[:5], at))  # 5 bytes a call
    images = np.arange(2 * 12, dtype=np.uint8).reshape(2, 2, 2, 3)
    with mod._Writer(path) as writer:
        writer.write(1, images)
    assert np.array_equal(np.load(path)[1:3], images) and not np.load(path)[[0, 3]].any()
    monkeypatch.setattr(mod.os, "pwrite", lambda fd, data, at: 0)
    with pytest.raises(OSError, match="no bytes written"), mod._Writer(path) as writer:
        writer.write(0, images)
    monkeypatch.setattr(mod.os, "pwrite", real)

    def failing(fd):
        raise OSError(errno.EIO, "Input/output error")

    with pytest.raises(OSError, match="Input/output error"), mod._Writer(path) as writer:
        monkeypatch.setattr(mod.os, "fsync", failing)
        time.sleep(1.5)  # the syncing thread meets the error
        monkeypatch.undo()
    assert writer.error is not None and writer.error.errno == errno.EIO
