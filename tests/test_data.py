import hashlib
import io
import os
import pickle
import shutil
import tarfile

import numpy as np
import pytest
import torch

from dfcil.config import DataConfig
from dfcil.data import datasets as ds
from dfcil.data.archive import safe_extract
from dfcil.data.datasets import ImageArrays, build_dataset, read_npz
from dfcil.data.device import Normalizer, TrainBatches, crop_flip, select_classes
from dfcil.errors import DatasetError

# ------------------------------------------------------------------------------------------- augmentation


def test_crop_flip_is_a_padded_crop_possibly_flipped():
    torch.manual_seed(0)
    x = torch.randn(64, 8, 8, 3)
    out = crop_flip(x, pad=2, generator=torch.Generator().manual_seed(1))
    assert out.shape == (64, 8, 8, 3) and out.is_contiguous()
    out = out.permute(0, 3, 1, 2)
    padded = torch.nn.functional.pad(x.permute(0, 3, 1, 2), (2, 2, 2, 2))
    seen = set()
    for b in range(64):
        matches = [
            (dy, dx, f)
            for dy in range(5)
            for dx in range(5)
            for f in (False, True)
            if torch.equal(out[b], (lambda c: c.flip(-1) if f else c)(padded[b, :, dy : dy + 8, dx : dx + 8]))
        ]
        assert len(matches) == 1, f"sample {b} is not a unique crop/flip"
        seen.add(matches[0])
    assert len(seen) > 30  # offsets and flips vary per sample


def test_padding_is_the_mean_colour_after_normalisation():
    norm = Normalizer((0.5, 0.4, 0.3), (0.2, 0.2, 0.2), torch.device("cpu"))
    img = torch.full((256, 4, 4, 3), 0, dtype=torch.uint8)
    out = norm.to_nchw(crop_flip(norm.nhwc(img), pad=4, generator=torch.Generator().manual_seed(0)))
    assert out.is_contiguous()
    black = ((0 - torch.tensor([0.5, 0.4, 0.3])) / 0.2).view(1, 3, 1, 1)
    is_border = (out == 0).all(dim=1)  # zero in normalised space = the mean colour
    is_image = torch.isclose(out, black.expand_as(out), atol=1e-6).all(dim=1)
    assert torch.all(is_border | is_image) and is_border.any() and is_image.any()


def test_a_black_crop_border_is_torchvisions_padding_of_the_raw_image():
    """data.crop_fill: black pads as torchvision's RandomCrop(padding=4) on the raw image does: the border,
    normalised, is (0 − mean) / std; the same offsets and flips as the mean-colour border, the same pixels inside."""
    mean, std = (0.5, 0.4, 0.3), (0.2, 0.25, 0.5)
    norm = Normalizer(mean, std, torch.device("cpu"), crop_fill="black")
    img = torch.randint(1, 256, (64, 6, 6, 3), dtype=torch.uint8)  # no black pixel inside
    raw = torch.nn.functional.pad(img.permute(0, 3, 1, 2), (4, 4, 4, 4)).permute(0, 2, 3, 1)  # black, raw
    out = crop_flip(norm.nhwc(img), pad=4, generator=torch.Generator().manual_seed(3), border=norm.crop_border)
    # each output is some crop (and flip) of the raw image padded with black, then normalised
    padded_normalised = norm.nhwc(raw)
    for b in range(64):
        crops = [padded_normalised[b, dy : dy + 6, dx : dx + 6] for dy in range(9) for dx in range(9)]
        crops += [c.flip(1) for c in crops]
        assert any(torch.allclose(out[b], c, atol=1e-6) for c in crops), b
    # the mean-colour border: the same crops, zeros at the border
    mean_out = crop_flip(norm.nhwc(img), pad=4, generator=torch.Generator().manual_seed(3))
    inside = (mean_out != 0).any(dim=-1)  # the border is zero in every channel (0.5 · 255 is no pixel value)
    assert torch.equal(out[inside], mean_out[inside]) and not inside.all()
    border = torch.tensor([(0 - m) / s for m, s in zip(mean, std, strict=True)])
    assert torch.allclose(out[~inside], border.expand_as(out[~inside]))
    assert Normalizer(mean, std, torch.device("cpu")).crop_border is None


def test_normalizer_matches_to_tensor_then_normalize():
    x = torch.randint(0, 256, (2, 5, 5, 3), dtype=torch.uint8)
    mean, std = (0.5071, 0.4867, 0.4408), (0.2675, 0.2565, 0.2761)
    out = Normalizer(mean, std, torch.device("cpu"))(x)
    ref = (x.permute(0, 3, 1, 2).float() / 255 - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(std).view(
        1, 3, 1, 1
    )
    torch.testing.assert_close(out, ref)


def test_train_batches_drop_last_and_cover_a_permutation():
    x = torch.arange(10, dtype=torch.uint8).view(10, 1, 1, 1).expand(10, 2, 2, 3).contiguous()
    y = torch.arange(10)
    norm = Normalizer((0.0, 0.0, 0.0), (1 / 255, 1 / 255, 1 / 255), torch.device("cpu"))  # identity on values
    batches = TrainBatches(x, y, 4, norm, torch.Generator().manual_seed(0), augment=False)
    assert len(batches) == 2
    got = [(bx, by) for bx, by in batches]
    assert [len(by) for _, by in got] == [4, 4]
    labels = torch.cat([by for _, by in got])
    assert len(set(labels.tolist())) == 8
    for bx, by in got:  # images travel with their labels
        assert torch.equal(bx[:, 0, 0, 0].round().long(), by)
    again = torch.cat([by for _, by in batches])
    assert not torch.equal(labels, again)  # a new shuffle every epoch


def test_select_classes_remaps_and_caps_per_class():
    arrays = ImageArrays(np.zeros((12, 2, 2, 3), np.uint8), np.array([0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2]))
    lut = np.array([2, -1, 0])  # raw 0 → position 2, raw 2 → position 0, raw 1 unused
    x, y = select_classes(arrays, lut, [0, 2], per_class=3)
    assert sorted(y.tolist()) == [0, 0, 0, 2, 2, 2]
    x, y = select_classes(arrays, lut, [2])
    assert y.tolist() == [2, 2, 2, 2]


# ------------------------------------------------------------------------------------------- CIFAR-100 files


def _write_npz(folder, n_per_class=2, dtype=np.uint8):
    folder.mkdir(parents=True, exist_ok=True)
    for split in ("train", "test"):
        y = np.repeat(np.arange(100), n_per_class)
        x = np.random.default_rng(0).integers(0, 256, (len(y), 32, 32, 3)).astype(dtype)
        np.savez(folder / f"{split}.npz", x=x, y=y)


def test_prepared_npz_layout(tmp_path):
    _write_npz(tmp_path / "cifar100")
    d = build_dataset(DataConfig(root=str(tmp_path)))
    assert d.train.x.shape == (200, 32, 32, 3) and d.test.y.dtype == np.int64 and d.num_classes == 100
    assert d.mean == (0.5071, 0.4867, 0.4408)


def test_missing_dataset_says_how_to_fix(tmp_path):
    with pytest.raises(DatasetError, match=r"CIFAR-100 not found under data root .*--data.download true"):
        build_dataset(DataConfig(root=str(tmp_path)))
    _write_npz(tmp_path / "cifar100")  # the dataset's own folder given as the data root
    with pytest.raises(DatasetError) as err:
        build_dataset(DataConfig(root=str(tmp_path / "cifar100")))
    inner = tmp_path / "cifar100"
    assert f"{inner} is itself such a folder: give its parent, --data.root {tmp_path}." in str(err.value)


def test_root_from_environment(tmp_path, monkeypatch):
    _write_npz(tmp_path / "cifar100")
    monkeypatch.setenv("DFCIL_DATA", str(tmp_path))
    assert build_dataset(DataConfig()).source == str(tmp_path / "cifar100")


@pytest.mark.parametrize(
    ("corrupt", "match"),
    [
        (lambda p: p.write_bytes(p.read_bytes()[:1000]), "corrupt or not an .npz"),
        (lambda p: p.write_bytes(b"hello"), r"not an .npz archive \(its first bytes are neither a zip"),
        (lambda p: np.savez(p, x=np.zeros((2, 32, 32, 3), np.float32), y=np.zeros(2, np.int64)), "must be uint8"),
        (
            lambda p: np.savez(p, x=np.zeros((2, 32, 32, 3), np.uint8), y=np.array([0, 100])),
            r"labels must lie in 0..99",
        ),
        (lambda p: np.savez(p, x=np.zeros((2, 32, 32, 3), np.uint8), y=np.zeros(3, np.int64)), "length 2"),
        (lambda p: np.savez(p, images=np.zeros(2)), r"missing arrays \['x', 'y'\]"),
    ],
)
def test_corrupt_npz_is_reported_with_the_file(tmp_path, corrupt, match):
    _write_npz(tmp_path / "cifar100")
    path = tmp_path / "cifar100" / "train.npz"
    corrupt(path)
    with pytest.raises(DatasetError, match=match) as err:
        build_dataset(DataConfig(root=str(tmp_path)))
    assert "train.npz" in str(err.value) and "prepare it again" in str(err.value)  # the problem and the fix
    assert "allow_pickle" not in str(err.value)


def test_an_unreadable_npz_is_a_permission_problem_not_a_corrupt_file(tmp_path, monkeypatch):
    _write_npz(tmp_path / "cifar100")

    def denied(path, **kwargs):
        raise PermissionError(13, "Permission denied", str(path))  # what a 0000 file gives a non-root user

    monkeypatch.setattr(np, "load", denied)
    with pytest.raises(DatasetError, match=r"train.npz cannot be read \(permission denied\); check its permissions"):
        build_dataset(DataConfig(root=str(tmp_path)))


def test_a_missing_half_of_the_prepared_arrays_is_called_missing(tmp_path):
    _write_npz(tmp_path / "cifar100")
    (tmp_path / "cifar100" / "test.npz").unlink()
    with pytest.raises(DatasetError, match=r"test.npz is missing \(found train.npz beside it\): prepare it too"):
        build_dataset(DataConfig(root=str(tmp_path)))


def _official_folder(root, n=3):
    folder = root / "cifar-100-python"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    data = {}
    for split, count in (("train", 100 * n), ("test", 100)):
        x = rng.integers(0, 256, (count, 3072)).astype(np.uint8)
        labels = list(np.arange(count) % 100)
        entry = {"data": x, "fine_labels": [int(v) for v in labels], "filenames": [b"a.png"] * count}
        (folder / split).write_bytes(pickle.dumps(entry, protocol=2))
        data[split] = (x, labels)
    return folder, data


def test_official_python_folder(tmp_path):
    _, data = _official_folder(tmp_path)
    d = build_dataset(DataConfig(root=str(tmp_path)))
    x, labels = data["train"]
    assert d.train.x.shape == (300, 32, 32, 3)
    np.testing.assert_array_equal(d.train.x[5], x[5].reshape(3, 32, 32).transpose(1, 2, 0))  # CHW rows → HWC
    assert d.train.y.tolist() == labels


def test_cifar100_says_what_its_classes_are_for_people_and_records_them_as_before(tmp_path):
    """CIFAR-100's names (the prepared archive's fine_names, the official meta's fine_label_names) are shown
    (dry run, eval --classes cloud) but stay out of what runs record and caches key on (ImageDataset.classes), so
    that runs and caches made before still resume and hit (a new-user probe: eval --classes cloud was refused)."""
    names = [f"name{i}" for i in range(100)]
    _write_npz(tmp_path / "npz" / "cifar100")
    path = tmp_path / "npz" / "cifar100" / "train.npz"
    with np.load(path) as data:
        arrays = dict(data)
    np.savez(path, **arrays, fine_names=np.array(names))
    d = build_dataset(DataConfig(root=str(tmp_path / "npz")))
    assert d.words == tuple(names) and d.classes == () and d.class_label(23) == "name23"
    folder, _ = _official_folder(tmp_path / "official")
    (folder / "meta").write_bytes(pickle.dumps({"fine_label_names": names, "coarse_label_names": []}, protocol=2))
    assert build_dataset(DataConfig(root=str(tmp_path / "official"))).words == tuple(names)
    (folder / "meta").write_bytes(b"not a pickle")  # names are for people: a bad meta file loses them, no more
    assert build_dataset(DataConfig(root=str(tmp_path / "official"))).words == ()
    _write_npz(tmp_path / "plain" / "cifar100")  # an archive without names
    plain = build_dataset(DataConfig(root=str(tmp_path / "plain")))
    assert plain.words == () and plain.class_label(23) == "class 23"


class _Evil:
    def __reduce__(self):
        return (os.system, ("touch pwned",))


def test_official_files_are_unpickled_without_running_code(tmp_path, monkeypatch):
    folder, _ = _official_folder(tmp_path)
    (folder / "train").write_bytes(pickle.dumps({"data": _Evil(), "fine_labels": []}))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DatasetError, match="refusing to load"):
        build_dataset(DataConfig(root=str(tmp_path)))
    assert not (tmp_path / "pwned").exists()


def _tar_of(folder_root, name, extra=None):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(folder_root / "cifar-100-python", arcname="cifar-100-python")
        for member, payload in extra or []:
            tar.addfile(member, io.BytesIO(payload) if payload is not None else None)
    path = folder_root / name
    path.write_bytes(buf.getvalue())
    return path


def test_download_is_checksummed_and_extracted(tmp_path, monkeypatch):
    src = tmp_path / "src"
    _official_folder(src)
    archive = _tar_of(src, "cifar.tar.gz")
    md5 = hashlib.md5(archive.read_bytes()).hexdigest()
    monkeypatch.setattr(ds, "CIFAR100_MD5", md5)
    calls = []

    def local_downloader(url, output_file, pooch):
        calls.append(url)
        shutil.copyfile(archive, output_file)

    root = tmp_path / "root"
    d = ds.cifar100(root, DataConfig(download=True), downloader=local_downloader)
    assert calls == [ds.CIFAR100_URL] and d.train.x.shape == (300, 32, 32, 3)
    assert (root / "cifar-100-python" / "train").is_file()
    ds.cifar100(root, DataConfig(download=True), downloader=local_downloader)
    assert len(calls) == 1  # the extracted folder is reused


def test_download_with_a_bad_checksum_fails_and_leaves_nothing(tmp_path):
    src = tmp_path / "src"
    _official_folder(src)
    archive = _tar_of(src, "cifar.tar.gz")
    root = tmp_path / "root"
    with pytest.raises(DatasetError, match="checksum"):
        ds.cifar100(root, DataConfig(download=True), downloader=lambda url, out, p: shutil.copyfile(archive, out))
    assert not (root / "cifar-100-python").exists() and not (root / ds.CIFAR100_ARCHIVE).exists()


@pytest.mark.parametrize(
    "member",
    [
        ("../escape.txt", tarfile.REGTYPE, ""),
        ("/abs.txt", tarfile.REGTYPE, ""),
        ("cifar-100-python/link", tarfile.SYMTYPE, "../../outside"),
        ("cifar-100-python/hard", tarfile.LNKTYPE, "../x"),
        ("cifar-100-python/dev", tarfile.CHRTYPE, ""),
        ("cifar-100-python/up", tarfile.SYMTYPE, ".."),  # the first link of a chain that walks out step by step
    ],
)
def test_safe_extract_rejects_escaping_members(tmp_path, member):
    name, kind, link = member
    src = tmp_path / "src"
    _official_folder(src)
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    info.size = 0
    archive = _tar_of(src, "evil.tar.gz", [(info, b"" if kind == tarfile.REGTYPE else None)])
    dest = tmp_path / "dest"
    with pytest.raises(DatasetError, match="unsafe archive member"):
        safe_extract(archive, dest)
    assert not (tmp_path / "escape.txt").exists() and list(dest.iterdir()) == []  # nothing half-extracted


def test_safe_extract_refuses_writing_through_a_link_of_the_archive(tmp_path):
    src = tmp_path / "src"
    _official_folder(src)
    link = tarfile.TarInfo("cifar-100-python/sub")
    link.type, link.linkname = tarfile.SYMTYPE, "meta"
    below = tarfile.TarInfo("cifar-100-python/sub/x")
    below.size = 1
    archive = _tar_of(src, "evil.tar.gz", [(link, None), (below, b"x")])
    with pytest.raises(DatasetError, match="below a symbolic link"):
        safe_extract(archive, tmp_path / "dest")
    assert list((tmp_path / "dest").iterdir()) == []


def test_fake_dataset_is_deterministic_and_learnable_shaped():
    a, b = build_dataset(DataConfig(name="fake")), build_dataset(DataConfig(name="fake", num_classes=4))
    assert a.train.x.shape == (480, 16, 16, 3) and b.num_classes == 4 and b.test.y.max() == 3
    np.testing.assert_array_equal(a.train.x, build_dataset(DataConfig(name="fake")).train.x)


def test_read_npz_of_real_cifar(cifar_root):
    train = read_npz(cifar_root / "cifar100" / "train.npz", 100, 32)
    assert train.x.shape == (50000, 32, 32, 3) and train.y[:5].tolist() == [19, 29, 0, 11, 1]
    assert np.bincount(train.y).tolist() == [500] * 100
    d = build_dataset(DataConfig(root=str(cifar_root)))
    assert d.test.x.shape == (10000, 32, 32, 3)


@pytest.mark.parametrize("name", ds.DATASETS.names())
def test_each_dataset_says_in_one_plain_sentence_what_it_is(name):
    """`dfcil datasets` prints each docstring's first line: a whole sentence, plain text, short."""
    summary = (ds.DATASETS.get(name).__doc__ or "").strip().splitlines()[0]
    assert summary.endswith(".") and "``" not in summary and len(summary) <= 100, summary


TOGETHER = """
import shutil, sys, time
from pathlib import Path
import dfcil.data.datasets as ds
from dfcil.config import DataConfig
archive, root, calls, md5 = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4]
ds.CIFAR100_MD5 = md5

def slow_copy(url, output_file, pooch):  # a download that takes a while
    with calls.open("a") as f:
        f.write("download\\n")
    time.sleep(1.5)
    shutil.copyfile(archive, output_file)

d = ds.cifar100(root, DataConfig(download=True), downloader=slow_copy)
assert d.train.x.shape == (300, 32, 32, 3)
"""


def test_runs_starting_together_download_and_extract_once(tmp_path):
    """Two processes (runs of a sweep) fetch CIFAR-100 at once: one downloads and extracts, the other waits and
    reads the extracted folder (extracting twice replaced the tree the first one was reading)."""
    import subprocess
    import sys

    src = tmp_path / "src"
    _official_folder(src)
    archive = _tar_of(src, "cifar.tar.gz")
    md5 = hashlib.md5(archive.read_bytes()).hexdigest()
    calls = tmp_path / "calls"
    args = [sys.executable, "-c", TOGETHER, str(archive), str(tmp_path / "root"), str(calls), md5]
    procs = [subprocess.Popen(args, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    errors = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errors
    assert calls.read_text().split() == ["download"]
