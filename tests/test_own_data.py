"""The user's own data (`folder` and `arrays` datasets) through every method, the half-base protocol, --dry-run and
resume."""

import json

import numpy as np
import pytest

from conftest import StopAfterEpochs
from dfcil.cli import main
from dfcil.errors import RunInterrupted
from dfcil.methods import METHODS
from dfcil.training.engine import run
from dfcil.training.loop import RunOptions
from dfcil.training.state import Interrupt
from test_images import encode, pattern
from test_methods import tiny_config


@pytest.fixture(scope="module")
def own_data(tmp_path_factory):
    """Six classes of 32-pixel images, as a class folder tree and as arrays: 16 training and 4 test images each."""
    root = tmp_path_factory.mktemp("own")
    rng = np.random.default_rng(0)
    xs = {"train": [], "test": []}
    for split, n in (("train", 16), ("test", 4)):
        for c in range(6):
            folder = root / "folder" / split / f"class_{c}"
            folder.mkdir(parents=True)
            for i in range(n):
                array = np.clip(pattern(32, 32, seed=c) + rng.integers(-20, 20, (32, 32, 3)), 0, 255).astype(np.uint8)
                (folder / f"{i:02d}.png").write_bytes(encode(array))
                xs[split].append(array)
    (root / "arrays").mkdir()
    for split, arrays in xs.items():
        y = np.repeat(np.arange(6), len(arrays) // 6)
        np.savez(root / "arrays" / f"{split}.npz", x=np.stack(arrays), y=y)
    return root


def data_overrides(own_data, kind):
    extra = [("data.name", kind), ("data.root", str(own_data / kind)), ("data.cache", str(own_data / "cache"))]
    return extra + ([("data.image_size", "32"), ("data.workers", "1")] if kind == "folder" else [])


@pytest.mark.parametrize("kind", ["folder", "arrays"])
@pytest.mark.parametrize("name", METHODS.names())
def test_every_method_runs_on_your_own_data(own_data, kind, name):
    summary = run(tiny_config(name, data_overrides(own_data, kind)), options=RunOptions(progress=False))
    assert len(summary["acc_per_task"]) == 2 and summary["dataset"] == kind
    assert summary.get("class_names") == ([f"class_{c}" for c in range(6)] if kind == "folder" else None)


@pytest.mark.parametrize("kind", ["folder", "arrays"])
def test_your_own_data_in_the_half_base_protocol_and_the_dry_run(own_data, kind, capsys):
    args = ["train", "--config", "configs/smoke.yaml", "--dry-run", "--data.num_tasks", "3", "--data.base_classes", "4"]
    args += ["--train.batch_size", "8"]
    assert main(args + [f"--{k}={v}" for k, v in data_overrides(own_data, kind)]) == 0
    out = capsys.readouterr().out
    assert "classes per task [4, 1, 1]" in out and f"dataset:     {kind} (6 classes, 32x32)" in out
    assert ("(class_" in out) is (kind == "folder")  # a folder's classes are named


def test_a_run_on_a_folder_resumes_exactly(own_data, tmp_path):
    from dfcil.runs.runner import resume, train

    cfg = tiny_config("rdfcil", data_overrides(own_data, "folder"))
    train(cfg, tmp_path / "a", options=RunOptions(progress=False))
    interrupt = Interrupt()
    with pytest.raises(RunInterrupted):
        train(
            cfg,
            tmp_path / "b",
            options=RunOptions(progress=False, interrupt=interrupt, callbacks=[StopAfterEpochs(interrupt, 2)]),
        )
    resume(tmp_path / "b", options=RunOptions(progress=False))
    a, b = (json.loads((tmp_path / d / "summary.json").read_text()) for d in "ab")
    assert a["correct_matrix"] == b["correct_matrix"] and b["class_names"] == a["class_names"]


@pytest.mark.parametrize(
    ("overrides", "generator"),
    [
        ([("data.image_size", "64")], (8, 64)),  # the Tiny-ImageNet generator, ResNet-8 on 64-pixel images
        ([("model.backbone", "resnet18"), ("data.image_size", "32")], (8, 32)),  # the ImageNet ResNet-18 at 32 px
        ([("data.image_size", "48")], (6, 48)),  # another size: a generator from a 6-pixel start
    ],
    ids=["64px", "resnet18", "48px"],
)
def test_rdfcil_runs_at_other_image_sizes_and_backbones(overrides, generator):
    from dfcil.training.callbacks import Callback

    class Seen(Callback):
        def on_run_start(self, loop):
            self.loop = loop

        def on_setup_end(self):
            synth = self.loop.method.replay.synth
            if synth is not None:
                self.generator = (synth.generator.init_size, synth.generator(synth.latent(2)).shape[-1])

    seen = Seen()
    few = [("data.train_per_class", "8"), ("train.batch_size", "16")]  # the shapes are what is checked: quick
    summary = run(tiny_config("rdfcil", [*overrides, *few]), options=RunOptions(callbacks=[seen], progress=False))
    assert len(summary["acc_per_task"]) == 2 and seen.generator == generator


def test_own_data_needs_no_image_size_and_a_stale_cache_is_rebuilt_on_request(own_data, tmp_path, capsys):
    """The README's own-data command without --data.image_size: the size comes from the images (32 px). A changed
    source is refused with the fix; --data.rebuild true prepares the cache again, and the run saves it as false."""
    import shutil

    import yaml

    from dfcil.runs.runner import train

    root = tmp_path / "data"
    shutil.copytree(own_data / "folder", root)
    args = ["train", "--config", "configs/own-data.yaml", "--data.root", str(root), "--dry-run"]
    args += ["--data.cache", str(tmp_path / "cache"), "--data.workers", "1", "--train.batch_size", "8"]
    assert main(args) == 0
    assert "dataset:     folder (6 classes, 32x32)" in capsys.readouterr().out
    (root / "train" / "class_0" / "00.png").write_bytes((root / "train" / "class_1" / "00.png").read_bytes())
    assert main(args) == 2
    assert "run again with --data.rebuild true (or delete" in capsys.readouterr().err
    overrides = [("data.name", "folder"), ("data.root", str(root)), ("data.cache", str(tmp_path / "cache"))]
    overrides += [("data.workers", "1"), ("data.rebuild", "true")]
    train(tiny_config("finetune", overrides), tmp_path / "run", options=RunOptions(progress=False))
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["data"]
    assert saved["rebuild"] is False and saved["image_size"] is None  # auto: the cache records the size chosen
    assert main(args) == 0
