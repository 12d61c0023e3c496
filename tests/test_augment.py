"""data.augment: AutoAugment's operations against PIL and hand-computed values, the per-image policy and its random
draws, the batches' determinism, and the augmentation as a protocol setting (the config's choices, the first-task
key, summary.json, the report's groups, an exact resume, every method)."""

import json
import math

import numpy as np
import pytest
import torch
import yaml
from PIL import Image, ImageEnhance, ImageOps

from conftest import CONFIGS, smoke_configs
from dfcil.analysis.run_dirs import find_runs, group_runs
from dfcil.checkpoint import loads
from dfcil.cli import main
from dfcil.data import autoaugment as A
from dfcil.data.device import Normalizer, TrainBatches, crop_flip
from dfcil.errors import ConfigError, RunInterrupted
from dfcil.load import load_config
from dfcil.methods import METHODS
from dfcil.runs.runner import resume, train
from dfcil.training.callbacks import Callback
from dfcil.training.loop import RunOptions
from dfcil.training.state import Interrupt

SMOKE = str(CONFIGS / "smoke.yaml")
CPU = torch.device("cpu")


def levels(*pixels):
    """(1, 3, 1, n) float levels from RGB triples."""
    return torch.tensor(pixels, dtype=torch.float32).T.reshape(1, 3, 1, len(pixels))


def param(value, n=1):
    return torch.full((n,), float(value))


# --- the operations -------------------------------------------------------------------------------------------


def _images():
    """Six 32×32 RGB images: noise, narrow-range noise, 4×4 blocks, a flat one, a gradient, noise again."""
    rng = np.random.default_rng(0)
    arr = rng.integers(0, 256, (6, 32, 32, 3), dtype=np.uint8)
    arr[1] = arr[1] // 4 + 40
    arr[2] = np.repeat(np.repeat(rng.integers(0, 256, (8, 8, 3)), 4, 0), 4, 1)
    arr[3] = 77
    arr[4] = np.linspace(0, 255, 32, dtype=np.uint8)[None, :, None]
    return arr


def _pil_rotate(img, degrees):
    rot = img.convert("RGBA").rotate(degrees)  # the reference's rotate: grey where the image was rotated away
    return Image.composite(rot, Image.new("RGBA", rot.size, (128,) * 4), rot).convert(img.mode)


def _pil_affine(coeffs, resample=Image.NEAREST):
    return lambda img: img.transform(img.size, Image.AFFINE, coeffs, resample, fillcolor=(128, 128, 128))


T = 150 / 331 * 6 / 9  # translate bin 6
S = 0.3 * 8 / 9  # shear bin 8
PIL_OPS = [  # (operation, parameter, what the reference code calls on a PIL image, pixels allowed to differ by 1)
    ("equalize", 0, ImageOps.equalize, 0),
    ("auto_contrast", 0, ImageOps.autocontrast, 0),
    ("invert", 0, ImageOps.invert, 0),
    ("posterize", 5, lambda i: ImageOps.posterize(i, 5), 0),
    ("solarize", 256 - 256 * 5 / 9, lambda i: ImageOps.solarize(i, 256 - 256 * 5 / 9), 0),
    *[(name, f, lambda i, n=name, f=f: getattr(ImageEnhance, n.title())(i).enhance(f), 0)
      for name in ("color", "contrast", "brightness", "sharpness") for f in (0.3, 1.7)],
    ("translate_x", T, _pil_affine((1, 0, T * 32, 0, 1, 0)), 0),
    ("translate_y", -T, _pil_affine((1, 0, 0, 0, 1, -T * 32)), 0),
    ("rotate", 90, lambda i: _pil_rotate(i, 90), 0),
    ("rotate", -10, lambda i: _pil_rotate(i, -10), 0),
    # PIL computes the source position by increments, so a sum on a whole level may land a hair below it
    ("shear_x", S, _pil_affine((1, S, 0, 0, 1, 0), Image.BICUBIC), 0.01),
    ("shear_y", -S, _pil_affine((1, 0, 0, -S, 1, 0), Image.BICUBIC), 0.01),
]  # fmt: skip


@pytest.mark.parametrize(("name", "value", "reference", "off_by_one"), PIL_OPS, ids=lambda v: str(v)[:12])
def test_each_operation_is_what_pil_computes_in_the_reference_code(name, value, reference, off_by_one):
    arr = _images()
    x = torch.from_numpy(arr).permute(0, 3, 1, 2).float()
    ours = A.OPS[name][0](x, param(value, len(arr)))
    theirs = torch.from_numpy(np.stack([np.asarray(reference(Image.fromarray(a))) for a in arr]))
    diff = (ours - theirs.permute(0, 3, 1, 2).float()).abs()
    assert diff.max() <= (1 if off_by_one else 0) and (diff > 0).float().mean() <= off_by_one


@pytest.mark.parametrize(
    ("name", "value", "image", "expected"),
    [
        # grey of (200, 100, 50): (19595·200 + 38470·100 + 7471·50 + 2¹⁵) >> 16 = 124; 124 + f·(x − 124), truncated
        ("color", 0.5, levels((200, 100, 50)), levels((162, 112, 87))),
        ("color", 2.0, levels((200, 100, 50)), levels((255, 76, 0))),
        # mean grey of 10 and 250 is 130: 130 ± 0.5·120
        ("contrast", 0.5, levels((10, 10, 10), (250, 250, 250)), levels((70, 70, 70), (190, 190, 190))),
        ("brightness", 1.5, levels((10, 100, 200)), levels((15, 150, 255))),
        ("posterize", 4, levels((17, 255, 15)), levels((16, 240, 0))),  # multiples of 2⁴, rounded down
        ("solarize", 128, levels((100, 128, 200)), levels((100, 127, 55))),  # 128 and up inverted
        ("invert", 0, levels((0, 100, 255)), levels((255, 155, 0))),
        # channel 0 stretched from 50..150: ⌊(x − 50)·2.55⌋; channel 1 is flat and stays; channel 2 from 0..9
        ("auto_contrast", 0, levels((50, 7, 0), (100, 7, 9), (150, 7, 3)),
         levels((0, 7, 0), (127, 7, 255), (255, 7, 85))),
    ],
)  # fmt: skip
def test_operations_on_hand_computed_pixels(name, value, image, expected):
    assert torch.equal(A.OPS[name][0](image, param(value)), expected)


def test_sharpness_blends_with_the_smoothed_interior_and_keeps_the_border():
    x = torch.zeros(1, 3, 3, 3)
    x[..., 1, 1] = 130  # smoothed centre: 5·130 / 13 = 50
    for factor, centre in ((0.0, 50), (1.0, 130), (2.0, 210)):
        out = A.sharpness(x, param(factor))
        assert (out[..., 1, 1] == centre).all() and out.sum() == 3 * centre


def test_equalize_spreads_the_cumulative_histogram_as_pil():
    # 255 pixels at 0, 255 at 1, 2 at 5: step = (512 − 2) // 255 = 2; level v → (1 + pixels below v) // 2
    row = torch.tensor([0.0] * 255 + [1.0] * 255 + [5.0] * 2)
    out = A.equalize(row.expand(1, 3, 1, 512).clone(), param(0))
    assert out[0, 0, 0, :255].eq(0).all() and out[0, 0, 0, 255:510].eq(128).all() and out[0, 0, 0, 510:].eq(255).all()
    flat = torch.full((1, 3, 4, 4), 9.0)
    assert torch.equal(A.equalize(flat, param(0)), flat)  # one level: unchanged


def test_geometric_operations_move_whole_pixels_and_fill_with_grey():
    x = torch.arange(16.0).view(1, 1, 4, 4).expand(1, 3, 4, 4).clone()
    assert torch.equal(A.rotate(x, param(90)), torch.rot90(x, 1, dims=(2, 3)))  # counter-clockwise, as PIL
    shifted = A.translate_x(x, param(0.25))  # x_in = x_out + 1: one column to the left, grey on the right
    assert torch.equal(shifted[..., :3], x[..., 1:]) and shifted[..., 3].eq(128).all()
    wide = torch.arange(16.0).view(1, 1, 2, 8).expand(1, 3, 2, 8).clone()
    sheared = A.shear_x(wide, param(2.0))  # x_in = x_out + 2·(row + ½): rows move 1 and 3 pixels, on the taps
    assert torch.equal(sheared[:, :, 0, :7], wide[:, :, 0, 1:]) and sheared[:, :, 0, 7].eq(128).all()
    assert torch.equal(sheared[:, :, 1, :5], wide[:, :, 1, 3:]) and sheared[:, :, 1, 5:].eq(128).all()
    assert torch.equal(A.shear_y(wide.transpose(2, 3), param(2.0)), sheared.transpose(2, 3))


def test_magnitude_bins_are_the_reference_codes():
    def magnitudes(name):
        return [A.OPS[name][1](m) for m in range(10)]

    assert magnitudes("posterize") == [8, 8, 7, 7, 6, 6, 5, 5, 4, 4]  # round(linspace(8, 4, 10))
    assert magnitudes("solarize") == pytest.approx(np.linspace(256, 0, 10))
    assert magnitudes("rotate") == pytest.approx(np.linspace(0, 30, 10))
    assert magnitudes("translate_x") == pytest.approx(np.linspace(0, 150 / 331, 10))
    assert magnitudes("shear_y") == pytest.approx(np.linspace(0, 0.3, 10))
    assert magnitudes("contrast") == pytest.approx(np.linspace(0, 0.9, 10))
    signed = {n for n, (_, _, s, _) in A.OPS.items() if s}
    assert signed == {"shear_x", "shear_y", "translate_x", "translate_y", "rotate"} | A.ENHANCE
    for policy in (A.CIFAR10, A.IMAGENET):
        assert len(policy) == 25 and all(n in A.OPS and 0 <= p <= 1 for sub in policy for n, p, _ in sub)
    assert A.policy_for(32) is A.CIFAR10 and A.policy_for(16) is A.CIFAR10 and A.policy_for(64) is A.IMAGENET


# --- the policy ---------------------------------------------------------------------------------------------------


def _noise(n, size=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, 3, size, size), generator=g).float()


def test_each_image_draws_its_own_sub_policy_and_sign():
    x = _noise(1).expand(64, -1, -1, -1).clone()  # one image, 64 times
    out = A.AutoAugment(A.CIFAR10, CPU)(x, torch.Generator().manual_seed(0))
    assert len({o.numpy().tobytes() for o in out}) > 10  # one sub-policy per batch would give at most 4
    rotate = A.AutoAugment(((("rotate", 1.0, 9), ("invert", 0.0, 0)),), CPU)
    out = rotate(x, torch.Generator().manual_seed(0))
    turned = {o.numpy().tobytes() for o in out}
    both = {A.rotate(x[:1], param(d))[0].numpy().tobytes() for d in (30, -30)}
    assert turned == both  # ±30°, each drawn per image


def test_probabilities_gate_each_operation():
    x = _noise(8)
    always = A.AutoAugment(((("invert", 1.0, 0), ("posterize", 1.0, 8)),), CPU)  # invert, then keep 4 bits
    assert torch.equal(always(x, torch.Generator()), A.posterize(255 - x, param(4, 8)))
    never = A.AutoAugment(((("invert", 0.0, 0), ("equalize", 0.0, 0)),), CPU)
    assert torch.equal(never(x, torch.Generator()), x)


def test_the_policy_draws_five_numbers_per_image_whatever_the_images():
    def state_after(x):
        g = torch.Generator().manual_seed(3)
        A.AutoAugment(A.IMAGENET, CPU)(x, g)
        return g.get_state()

    g = torch.Generator().manual_seed(3)
    torch.randint(0, 25, (8,), generator=g), torch.rand((8, 2), generator=g), torch.rand((8, 2), generator=g)
    assert torch.equal(state_after(_noise(8)), state_after(torch.zeros(8, 3, 16, 16))) and torch.equal(
        state_after(_noise(8)), g.get_state()
    )


# --- the batches --------------------------------------------------------------------------------------------------


def _batches(recipe, seed=0, size=16, channels_last=False, crop_fill="mean"):
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 256, (32, size, size, 3), dtype=torch.uint8, generator=g)
    norm = Normalizer((0.5, 0.4, 0.3), (0.25, 0.2, 0.3), CPU, channels_last, crop_fill)
    return TrainBatches(x, torch.arange(32) % 4, 8, norm, torch.Generator().manual_seed(seed), recipe=recipe)


def test_cropflip_batches_are_the_normalised_crop_and_flip_as_before():
    data = _batches("cropflip")
    g = torch.Generator().manual_seed(0)
    perm = torch.randperm(32, generator=g)
    for (x, _), idx in zip(data, perm.view(4, 8), strict=True):
        norm = data.normalizer
        assert torch.equal(x, norm.to_nchw(crop_flip(norm.nhwc(data.x[idx]), 4, g, None)))


@pytest.mark.parametrize("size", [16, 64])  # the CIFAR-10 and the ImageNet policy
def test_autoaugment_batches_repeat_under_a_seed_and_differ_from_cropflip(size):
    before = torch.get_rng_state()
    first = [x for x, _ in _batches("autoaugment", size=size)]
    assert torch.equal(torch.get_rng_state(), before)  # every draw from the batches' own generator
    again = [x for x, _ in _batches("autoaugment", size=size)]
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    assert not torch.equal(first[0], next(iter(_batches("autoaugment", seed=1, size=size)))[0])
    assert not torch.equal(first[0], next(iter(_batches("cropflip", size=size)))[0])
    assert first[0].shape == (8, 3, size, size) and torch.isfinite(first[0]).all()
    views = _batches("autoaugment", size=size).views(8, torch.Generator().manual_seed(0))
    assert views.recipe == "autoaugment" and torch.equal(next(iter(views))[0], first[0])  # a method's own pass


def test_autoaugment_batches_keep_the_memory_format_and_the_crop_border():
    x, _ = next(iter(_batches("autoaugment", channels_last=True)))
    assert x.is_contiguous(memory_format=torch.channels_last)
    norm = Normalizer((0.5, 0.4, 0.3), (0.25, 0.2, 0.3), CPU)
    assert torch.allclose(norm.level_border, torch.tensor([127.5, 102.0, 76.5]))  # the mean colour in levels
    assert Normalizer((0.5,) * 3, (0.25,) * 3, CPU, crop_fill="black").level_border.eq(0).all()


# --- a protocol setting -------------------------------------------------------------------------------------------


def test_an_unknown_augmentation_is_refused_with_the_choices(tmp_path, capsys):
    with pytest.raises(ConfigError, match="cropflip.*autoaugment"):
        load_config([SMOKE], [("data.augment", "bogus")])
    assert main(["train", "--config", SMOKE, "--data.augment", "bogus", "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "data.augment" in err[0] and "'cropflip' or 'autoaugment'" in err[0]
    assert not (tmp_path / "run").exists()


def test_the_first_task_key_follows_the_augmentation():
    from dfcil.training.protocol import prepare
    from dfcil.training.task0 import task0_key

    def key(augment):
        cfg = load_config([SMOKE], [("data.augment", augment)])[0]
        return task0_key(cfg, prepare(cfg))

    assert key("cropflip") != key("autoaugment") and key("autoaugment") == key("autoaugment")


class StopAfterSteps(Callback):
    """Ask a run to stop (as Ctrl-C would) after ``n`` training steps: inside an epoch."""

    def __init__(self, interrupt, n):
        self.interrupt, self.n = interrupt, n

    def on_step_end(self):
        self.n -= 1
        if self.n == 0:
            self.interrupt.requested = True


@pytest.fixture(scope="module")
def autoaugment_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("aa") / "run"
    train(load_config([SMOKE], [("data.augment", "autoaugment")])[0], out, options=RunOptions(progress=False))
    return out


def test_summary_json_says_the_augmentation(autoaugment_run):
    assert json.loads((autoaugment_run / "summary.json").read_text())["augment"] == "autoaugment"


def test_a_run_stopped_inside_an_epoch_resumes_to_the_same_run(autoaugment_run, tmp_path):
    cfg = load_config([SMOKE], [("data.augment", "autoaugment")])[0]
    out, interrupt = tmp_path / "run", Interrupt()
    options = RunOptions(progress=False, interrupt=interrupt, callbacks=[StopAfterSteps(interrupt, 10)])
    with pytest.raises(RunInterrupted):  # task 0 has 7 steps an epoch: step 3 of its second epoch
        train(cfg, out, options=options)
    position = loads((out / "checkpoints" / "last.pt").read_bytes())["position"]
    assert position["task"] == 0 and position["epoch"] == 1 and position["step"] == 3
    resume(out, options=RunOptions(progress=False))
    a, b = (json.loads((d / "summary.json").read_text()) for d in (autoaugment_run, out))
    assert a["correct_matrix"] == b["correct_matrix"] and b["augment"] == "autoaugment"
    wa, wb = (loads((d / "model.pt").read_bytes())["net"] for d in (autoaugment_run, out))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    losses = [
        [(r["task"], r["phase"], r["epoch"], r["loss"]) for r in map(json.loads, (d / "metrics.jsonl").open())
         if r["type"] == "epoch"]
        for d in (autoaugment_run, out)
    ]  # fmt: skip
    assert losses[0] == losses[1]


def _write_run(root, name, data, seed, augment_in_summary):
    path = root / name
    path.mkdir(parents=True)
    config = {"method": {"name": "rdfcil"}, "data": {"name": "cifar100", "num_tasks": 10} | data, "seed": seed}
    (path / "config.yaml").write_text(yaml.safe_dump(config))
    summary = {"last_acc": 40.0 + seed, "avg_inc_acc": 55.0, "acc_per_task": [70.0, 40.0 + seed], "forgetting": 5.0,
               "old_acc": [None, 30.0], "new_acc": [70.0, 80.0], "task_sizes": [10, 10]}  # fmt: skip
    if augment_in_summary is not None:
        summary["augment"] = augment_in_summary
    (path / "summary.json").write_text(json.dumps(summary))


def test_the_report_keeps_runs_of_another_augmentation_in_their_own_row(tmp_path, capsys):
    _write_run(tmp_path, "old/s1", {}, 1, None)  # saved before data.augment existed: cropflip
    _write_run(tmp_path, "cf/s2", {"augment": "cropflip"}, 2, "cropflip")
    for seed in (1, 2):
        _write_run(tmp_path, f"aa/s{seed}", {"augment": "autoaugment"}, seed, "autoaugment")
    _write_run(tmp_path, "mixed/s3", {"augment": "autoaugment"}, 3, "cropflip")  # two runs' files: skipped
    groups = {g.label: sorted(r.name for r in g.runs) for g in group_runs(find_runs([tmp_path]))}
    assert groups == {
        'rdfcil · cifar100 · n10 · data.augment="autoaugment"': [f"{tmp_path.name}/aa/s1", f"{tmp_path.name}/aa/s2"],
        'rdfcil · cifar100 · n10 · data.augment="cropflip"': [f"{tmp_path.name}/cf/s2", f"{tmp_path.name}/old/s1"],
    }
    err = capsys.readouterr().err
    assert "config.yaml's data.augment is 'autoaugment', summary.json's augment is 'cropflip'" in err


def test_autoaugment_keeps_the_rules_of_a_cuda_graph():
    """engine.cuda_graphs=check records every step, the augmentation included, and fails on a host sync, a tensor
    made from Python data or an undeclared random stream; on the CPU it trains as the eager run."""
    from dfcil.training.engine import run

    base = [("train.epochs", "3"), ("train.milestones", "[1]"), ("data.num_classes", "6")]
    base += [("data.augment", "autoaugment")]
    eager = run(load_config([SMOKE], base)[0], options=RunOptions(progress=False))
    checked = run(load_config([SMOKE], [*base, ("engine.cuda_graphs", "check")])[0], options=RunOptions(progress=False))
    assert checked["accuracy_matrix"] == eager["accuracy_matrix"]
    phases = [p for t in checked["timings"] for p in t["phases"].values()]
    assert phases and all(p["cuda_graphs"] == "check" and p["captures"] >= 1 for p in phases)


@pytest.mark.parametrize("name", METHODS.names())
def test_every_method_trains_a_short_smoke_run_with_autoaugment(name, tmp_path):
    """Every method, its own augmented views and synthetic images included, on AutoAugment's batches."""
    overrides = [("method.name", name), ("train.epochs", "2"), ("train.milestones", "[]"), ("data.num_classes", "6")]
    cfg = load_config(smoke_configs(name), [*overrides, ("data.augment", "autoaugment")])[0]
    summary = train(cfg, tmp_path / "run", options=RunOptions(progress=False))
    assert summary["augment"] == "autoaugment" and len(summary["acc_per_task"]) == 2
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all(math.isfinite(v) for r in records if r["type"] == "epoch" for v in r["loss"].values())
