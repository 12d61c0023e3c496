"""The paper presets: a setting file (the protocol and the shared schedule), then a method file (the method's
recipe), and for an R-DFCIL ablation a third file after R-DFCIL's. The method files' headers are what
configs/make_presets.py writes; every preset the paper's settings had still resolves, to the values it had; each
header's number is the paper row a report finds for that run; the Tiny-ImageNet-200 and ImageNet-100 presets pass
--dry-run on data in their datasets' layouts."""

import hashlib
import importlib.util
import json
import re
import shlex

import pytest
import yaml

from conftest import CONFIGS
from dfcil import presets
from dfcil.analysis.paper import VARIANTS, protocol_name
from dfcil.analysis.run_dirs import setting_of
from dfcil.cli import main
from dfcil.config import config_to_dict
from dfcil.errors import ConfigError
from dfcil.load import load_config, protocol_without_method
from dfcil.methods import METHODS, build_method
from test_images import TINY_SUBSET, write_imagenet, write_tiny_zip

DATASETS = ("cifar100", "tiny_imagenet200", "imagenet100")
C100 = ("n5", "n10", "n20", "b50_n6", "b50_n11", "b50_n26")
TINY = ("n5", "n10", "n20", "b100_n6", "b100_n11", "b100_n26")
C100_METHODS = ("abd", "abd_faithful", "adagauss", "apr", "deepinversion", "dgr", "dpcr", "efc", "fecam", "finetune")
C100_METHODS += ("joint", "lwf", "lwf_ldc", "lwf_mc", "podnet_df", "rdfcil", "rdfcil_plus", "ucir_df")
PAPER4 = ("rdfcil", "abd", "joint", "finetune")
# every preset of the paper's settings (each was one file, <method>_<setting>.yaml, until they were split):
# (dataset, setting, method file, relative to the dataset's folder, without .yaml)
PRESETS = [
    *(("cifar100", s, m) for m in C100_METHODS for s in C100),
    *(("cifar100", "n20", f"ablations/rdfcil_{k}") for k in VARIANTS["rdfcil"]),
    *(("tiny_imagenet200", s, m) for m in PAPER4 for s in TINY),
    ("tiny_imagenet200", "n10", "efc"),
    ("tiny_imagenet200", "n20", "efc"),
    ("tiny_imagenet200", "n10", "lwf_ldc"),
    *(("imagenet100", s, m) for m in PAPER4 for s in ("n5", "n10", "n20")),
    *((d, "n10", m) for d in ("tiny_imagenet200", "imagenet100") for m in ("dpcr", "adagauss")),  # their papers' /10
]
# method files whose network is part of the method: AdaGauss's 64-d bottleneck on ImageNet-100's ResNet-18, whose
# 512 features are more than the rows of a batch covariance (256 images)
METHOD_NETWORKS = {"imagenet100/adagauss.yaml": {"backbone": "resnet18_b64"}}


def files(dataset: str, setting: str, method: str) -> list[str]:
    """The config files of a preset, in order: the setting, the method, and an ablation after R-DFCIL's."""
    out = [f"configs/{dataset}/{setting}.yaml", f"configs/{dataset}/{method}.yaml"]
    return out[:1] + [f"configs/{dataset}/rdfcil.yaml"] + out[1:] if method.startswith("ablations/") else out


def resolved(paths: list[str]) -> dict:
    """The config a run of these files saves (its config.yaml), as plain data."""
    cfg, _ = load_config([CONFIGS.parent / p for p in paths])
    build_method(cfg.method, cfg.train)  # the method's own checks
    return config_to_dict(cfg)


def _generator():
    spec = importlib.util.spec_from_file_location("make_presets", CONFIGS / "make_presets.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def header_commands() -> list[tuple[str, str, list[str]]]:
    """(setting, claim, config files) of each ``  <setting> (...): <claim>`` entry of the method files' headers
    and its command."""
    out = []
    for path in _generator().method_files():
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            if m := re.fullmatch(r"#   (\w+) \([^()]*\): (.*)", line):
                command = next(c for c in lines[i + 1 :] if c.startswith("#     dfcil train "))
                argv = shlex.split(command[2:])
                names = [argv[j + 1] for j, a in enumerate(argv) if a == "--config"]  # preset names
                out.append((m.group(1), m.group(2), [f"configs/{n}.yaml" for n in names]))
    return out


def test_the_method_files_headers_are_what_the_generator_writes():
    """Each method file's block of commands and numbers is what configs/make_presets.py writes from
    dfcil.analysis.paper, and the commands are exactly the presets of PRESETS: none lost, none unlisted."""
    gen = _generator()
    stale = [str(p.relative_to(CONFIGS)) for p, text in gen.presets().items() if p.read_text() != text]
    assert stale == [], "run python configs/make_presets.py"
    assert sorted(tuple(f) for _, _, f in header_commands()) == sorted(tuple(files(*p)) for p in PRESETS)
    committed = {p for d in DATASETS for p in (CONFIGS / d).rglob("*.yaml")}
    settings = {CONFIGS / d / f"{s}.yaml" for d, s, _ in PRESETS}
    assert committed == set(gen.method_files()) | settings


@pytest.mark.parametrize("dataset", DATASETS)
def test_a_setting_file_holds_the_protocol_and_a_method_file_the_recipe(dataset):
    """A setting file (named as dfcil.analysis.paper names its protocol) gives no method, so that any method file or
    --method.name may follow it; a method file changes no protocol (data, model, seed): only its method section and
    the schedule keys its recipe changes."""
    for path in sorted((CONFIGS / dataset).rglob("*.yaml")):
        body = yaml.safe_load(path.read_text())
        if re.fullmatch(r"(b\d+_)?n\d+", path.stem):
            assert set(body) == {"data", "model", "train", "seed"}, path
            assert protocol_name(body["data"]["num_tasks"], body["data"]["base_classes"]) == path.stem
            assert body["data"]["name"] == dataset and body["seed"] == 1
        else:
            network = METHOD_NETWORKS.get(path.relative_to(CONFIGS).as_posix())
            assert set(body) <= {"method", "train"} | ({"model"} if network else set()), path
            assert "name" in body["method"] and body.get("model") == network, path


def trained_method(method_file: str) -> str:
    """The method a method file's name says it trains: its name, ABD as its own paper ran it (``abd_faithful``),
    LwF with LDC (``lwf_ldc``), or an ablation of R-DFCIL."""
    stem = method_file.rsplit("/", 1)[-1]
    return stem if stem in METHODS else {"abd_faithful": "abd", "lwf_ldc": "lwf"}.get(stem, stem.split("_")[0])


def _flat(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        out |= _flat(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value}
    return out


def _digest(presets: list[tuple[str, str, str]]) -> str:
    """A digest of what these presets resolve to: every key their files set, at its resolved value (so that a new
    config key with a default changes nothing here, and a changed or dropped preset key does)."""
    items = []
    for preset in presets:
        paths = files(*preset)
        given = set().union(*(_flat(yaml.safe_load((CONFIGS.parent / p).read_text())) for p in paths))
        config = _flat(resolved(paths))
        items.append([list(preset), {key: config[key] for key in sorted(given)}])
    return hashlib.sha256(json.dumps(items, sort_keys=True).encode()).hexdigest()[:16]


# what each method file's presets resolved to when the single files were split (the split changed no resolved
# config: checked with --print-config, old file against new pair, for all 136). A preset changed on purpose
# changes its digest: the failure prints the new one.
DIGESTS = {
    "cifar100/abd": "86f019ecc0fedee3",
    "cifar100/abd_faithful": "a63838b0a9db89ba",
    "cifar100/ablations/rdfcil_chr_ce_only": "cb05d8b41627d2b5",
    "cifar100/ablations/rdfcil_hkd_to_rkd": "17881a3cbeea8c0f",
    "cifar100/ablations/rdfcil_identity_proj": "6bd5faae1bb63298",
    "cifar100/ablations/rdfcil_no_chr": "96e6b73b18d3c1f8",
    "cifar100/ablations/rdfcil_no_hkd": "b9501718cf94a4f3",
    "cifar100/ablations/rdfcil_no_rkd": "1f5877fc175e1582",
    "cifar100/ablations/rdfcil_rkd_to_crcd": "61945f5aa226dfd4",
    "cifar100/ablations/rdfcil_rkd_to_crd": "2105ef7a27bb8c2a",
    "cifar100/ablations/rdfcil_rkd_to_hkd": "0df00d2fc8004482",
    "cifar100/adagauss": "8fc8ad3cacf4e8ad",
    "cifar100/apr": "d50ba2896c93e696",
    "cifar100/deepinversion": "98d3e28928b148a9",
    "cifar100/dgr": "4531b5b24edb83a3",
    "cifar100/dpcr": "8aafe40ec8bddee7",
    "cifar100/efc": "f9e9286e0e6c37b3",
    "cifar100/fecam": "8825026e886dd017",
    "cifar100/finetune": "0994bdf262dc99e6",
    "cifar100/joint": "061e23c8347608bc",
    "cifar100/lwf": "15869b7165d7c2b7",
    "cifar100/lwf_ldc": "ab3b9d527b58d22d",
    "cifar100/lwf_mc": "52ad2df401f29487",
    "cifar100/podnet_df": "f611df80f429c99f",
    "cifar100/rdfcil": "8af552effbc4c529",
    "cifar100/rdfcil_plus": "fd4038cf7af3e25b",
    "cifar100/ucir_df": "7e5f7e2ba37e62ab",
    "imagenet100/abd": "cc61b0f950f9f9d1",
    "imagenet100/finetune": "0bd4207818d5b9e4",
    "imagenet100/joint": "4f7b56a4371fecf8",
    "imagenet100/rdfcil": "f5f30ae6c585807d",
    "tiny_imagenet200/abd": "494fcefa309b26b4",
    "tiny_imagenet200/efc": "95ace26a5964db5d",
    "tiny_imagenet200/finetune": "c28906a7b6567546",
    "tiny_imagenet200/joint": "3f3fc5baf5f42dae",
    "tiny_imagenet200/lwf_ldc": "163346b7daa172b0",
    "tiny_imagenet200/rdfcil": "31451fb8bba23f3c",
    "tiny_imagenet200/dpcr": "29ef4af00ceb76ed",
    "tiny_imagenet200/adagauss": "650776f27aaf5087",
    "imagenet100/dpcr": "166e622fdcb9f755",
    "imagenet100/adagauss": "c780b2ecbce635f7",
}


@pytest.mark.parametrize("method_file", sorted({f"{d}/{m}" for d, _, m in PRESETS}))
def test_every_preset_resolves_to_the_config_it_had(method_file):
    dataset, method = method_file.split("/", 1)
    presets = [p for p in PRESETS if p[0] == dataset and p[2] == method]
    for _, setting, _ in presets:
        config = resolved(files(dataset, setting, method))
        assert config["method"]["name"] == trained_method(method)
        assert protocol_name(config["data"]["num_tasks"], config["data"]["base_classes"]) == setting
        assert config["data"]["name"] == dataset
    digest = _digest(presets)
    assert digest == DIGESTS.get(method_file), f"the presets of {method_file} now resolve otherwise: {digest}"


# a few paper cells, key by key (among them keys that the files leave at a method's default)
CELLS = {
    ("cifar100", "n5", "rdfcil"): {
        "method.name": "rdfcil", "method.lambda_ce": 0.5, "method.lambda_hkd": 0.15, "method.lambda_rkd": 0.5,
        "method.chr_epochs": 40, "method.chr_lr": 0.005, "method.chr_hkd": True, "method.new_kd": "rkd",
        "method.old_kd": "hkd", "method.projection": "learned", "method.ldc": False, "method.inversion.steps": 5000,
        "method.inversion.lr": 0.001, "method.inversion.w_bn": 50.0, "method.inversion.persistent": False,
        "data.num_tasks": 5, "data.base_classes": 0, "data.class_order_seed": 0, "data.class_order": None,
        "model.backbone": "resnet32", "train.epochs": 200, "train.batch_size": 128, "train.lr": 0.1,
        "train.weight_decay": 0.0005, "train.milestones": [80, 120], "seed": 1,
    },
    ("cifar100", "b50_n11", "abd"): {
        "method.name": "abd", "method.mu": 0.1, "method.inversion.persistent": False, "method.inversion.steps": 5000,
        "data.num_tasks": 11, "data.base_classes": 50, "train.epochs": 160, "train.milestones": [80, 120],
    },
    ("cifar100", "n10", "abd_faithful"): {
        "method.name": "abd", "method.inversion.persistent": True, "method.inversion.steps": 10000,
        "train.epochs": 250, "train.milestones": [100, 150, 200], "train.weight_decay": 0.0002,
    },
    ("cifar100", "n20", "ablations/rdfcil_no_chr"): {
        "method.name": "rdfcil", "method.chr_epochs": 0, "method.new_kd": "rkd", "method.lambda_hkd": 0.15,
        "data.num_tasks": 20, "train.epochs": 160,
    },
    ("cifar100", "n10", "efc"): {
        "method.name": "efc", "method.lambda_efm": 10.0, "method.first_lr": 0.001, "method.lr": 0.0001,
        "train.epochs": 100, "train.batch_size": 64, "train.milestones": [45, 90], "train.lr": 0.001,
    },
    ("cifar100", "n10", "lwf_ldc"): {
        "method.name": "lwf", "method.ldc": True, "method.head": "cosine", "method.ce": "local",
        "method.lambda_kd": 10.0, "method.drift.kind": "ldc", "train.lr": 0.05, "train.epochs": 100,
    },
    ("tiny_imagenet200", "b100_n26", "rdfcil"): {
        "data.name": "tiny_imagenet200", "data.num_tasks": 26, "data.base_classes": 100, "method.chr_epochs": 40,
        "method.inversion.steps": 5000, "train.epochs": 200, "train.weight_decay": 0.0002,
    },
    ("imagenet100", "n10", "rdfcil"): {
        "data.name": "imagenet100", "data.num_tasks": 10, "model.backbone": "resnet18", "method.chr_epochs": 30,
        "method.inversion.steps": 10000, "train.epochs": 120, "train.batch_size": 64, "train.milestones": [30, 60],
        "train.weight_decay": 0.0001,
    },
}  # fmt: skip


@pytest.mark.parametrize("cell", CELLS, ids=lambda c: "-".join(c))
def test_paper_cells_keep_their_values(cell):
    config = _flat(resolved(files(*cell)))
    assert {key: config[key] for key in CELLS[cell]} == CELLS[cell]
    if cell[0] == "imagenet100":  # the reference's one class order
        assert config["data.class_order"][:5] == [68, 56, 78, 8, 23] and len(config["data.class_order"]) == 100


def _claimed(claim: str) -> tuple[str | None, str | None] | None:
    """(A_N, Ā_N) as a header's entry states them; None for 'no number'."""
    if claim.startswith("no number"):
        return None
    value = r"([\d.]+(?: ± [\d.]+)?)"
    m = re.fullmatch(rf"A_N = {value}(?:, average incremental accuracy = {value})?\.", claim)
    assert m, claim
    return m.group(1), m.group(2)


def test_every_header_number_is_the_paper_row_the_report_finds():
    """Each header entry's number is the row that a report derives from the config that entry's command trains
    (the config a run directory saves): the number stated is the number compared with."""
    for setting, claim, paths in header_commands():
        config = resolved(paths)
        found = setting_of(config)
        assert found.protocol == setting, paths
        row, stated = found.paper_row(), _claimed(claim)
        if stated is None:
            assert row is None or row.last_acc is None, paths
        else:
            assert row is not None, f"{paths} states {stated} but the report finds no paper row"
            assert (row.last_acc.text, row.avg_inc_acc.text if row.avg_inc_acc else None) == stated, paths


def test_every_paper_variant_has_an_ablation_overlay():
    names = {p.stem for p in (CONFIGS / "cifar100" / "ablations").glob("*.yaml")}
    assert {f"rdfcil_{k}" for k in VARIANTS["rdfcil"]} == names


def test_a_run_of_a_setting_and_method_file_is_reported_against_its_paper_row(tmp_path, capsys):
    """dfcil report matches runs by the config saved in each run directory: a run of the two files is matched to
    its paper row (here as if trained: the resolved config as config.yaml, and a summary)."""
    runs = {
        "r": (["cifar100", "n10", "rdfcil"], "| rdfcil · cifar100 · n10 | 1 |", "42.37 ± 0.72", "R-DFCIL (Table 1)"),
        "f": (["cifar100", "n5", "abd_faithful"], "| abd[faithful] · cifar100 · n5 | 1 |", "43.90 ± 0.90", "ABD*"),
        "a": (["cifar100", "n20", "ablations/rdfcil_no_rkd"], "rdfcil[no_rkd] · cifar100 · n20", "21.63 ± 5.60", ""),
        "i": (["imagenet100", "n5", "rdfcil"], "| rdfcil · imagenet100 · n5 | 1 |", "53.10", "R-DFCIL (Table 5)"),
    }
    for name, (preset, *_) in runs.items():
        argv = ["train", *(a for f in files(*preset) for a in ("--config", str(CONFIGS.parent / f))), "--print-config"]
        assert main(argv) == 0
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.yaml").write_text(capsys.readouterr().out)
        summary = {"last_acc": 40.0, "avg_inc_acc": 55.0, "forgetting": 10.0, "acc_per_task": [60.0, 40.0]}
        summary |= {"old_acc": [None, 30.0], "new_acc": [60.0, 50.0], "task_sizes": [50, 50]}
        (tmp_path / name / "summary.json").write_text(json.dumps(summary))
    assert main(["report", str(tmp_path)]) == 0
    table = capsys.readouterr().out
    for _, group, number, row in runs.values():
        line = next(line for line in table.splitlines() if group in line)
        assert number in line and row in line, line


@pytest.fixture(scope="module")
def tiny_root(tmp_path_factory):
    """The real Tiny-ImageNet subset where it is present, else a zip in its layout with 32 images per class (enough
    for a batch of 128 in every task of every preset)."""
    if TINY_SUBSET.exists():
        return TINY_SUBSET
    return write_tiny_zip(tmp_path_factory.mktemp("tiny") / "tiny-imagenet-200.zip", per_class=32)


@pytest.fixture(scope="module")
def imagenet_root(tmp_path_factory):
    """An ImageNet layout with 26 training images per class: a batch of 256 (AdaGauss's) in each task of 10 classes."""
    return write_imagenet(tmp_path_factory.mktemp("imagenet") / "ilsvrc", per_class=26)


def _config_args(preset) -> list[str]:
    """The preset's files by name (``tiny_imagenet200/n10``), as from an installed dfcil without the repository."""
    return [a for f in files(*preset) for a in ("--config", f.removeprefix("configs/").removesuffix(".yaml"))]


@pytest.mark.parametrize("preset", [p for p in PRESETS if p[0] == "tiny_imagenet200"], ids="-".join)
def test_every_tiny_imagenet_preset_passes_the_dry_run(preset, tiny_root, capsys):
    assert main(["train", *_config_args(preset), "--data.root", str(tiny_root), "--dry-run", "--no-estimate"]) == 0
    out = capsys.readouterr().out
    assert "dataset:     tiny_imagenet200 (200 classes, 64x64)" in out and "(n0" in out


@pytest.mark.parametrize("preset", [p for p in PRESETS if p[0] == "imagenet100"], ids="-".join)
def test_every_imagenet100_preset_passes_the_dry_run(preset, imagenet_root, capsys):
    args = ["train", *_config_args(preset), "--data.root", str(imagenet_root), "--dry-run", "--no-estimate"]
    assert main([*args, "--data.image_size", "32"]) == 0  # the layout is the point here, not the pixels
    out = capsys.readouterr().out
    assert "class order: [68, 56, 78, 8, 23," in out and "dataset:     imagenet100 (100 classes, 32x32)" in out


def test_presets_are_listed_with_their_paper_numbers_and_found_by_name(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no configs/ here: names only
    assert main(["presets", "cifar100/rd"]) == 0
    out = capsys.readouterr().out
    assert "cifar100/rdfcil       R-DFCIL (Tables 1 and 2) on CIFAR-100  (paper A_N: n5 50.47 ± 0.43, n10 42.37" in out
    assert "cifar100/rdfcil_plus  R-DFCIL+" in out and "2 presets in " in out
    # a header line ending its sentence after the number: the full stop is not the number's
    abd = presets.paper_numbers(presets.preset_file("cifar100/abd_faithful"))
    assert abd == {"n5": "43.90 ± 0.90", "n10": "33.70 ± 1.20", "n20": "20.00 ± 1.40"}
    cfg, _ = load_config(["cifar100/n10", "cifar100/rdfcil.yaml"])  # with or without the suffix
    assert (cfg.data.num_tasks, cfg.method.name) == (10, "rdfcil")
    (tmp_path / "smoke").mkdir()  # a path that exists wins over the name: here a folder, refused as one
    with pytest.raises(ConfigError, match="'smoke' is a directory"):
        load_config(["smoke"])
    with pytest.raises(ConfigError, match="'nope' does not exist, and no preset is named so; `dfcil presets` lists"):
        load_config(["nope"])
    # a sweep's joined config given to train: said, with the flags that work (it read "no preset is named so")
    with pytest.raises(ConfigError, match="`\\+` joins config files in `dfcil sweep` only; elsewhere give each file "
                       "its own flag: --config cifar100-long --config cifar100-mini/apr"):  # fmt: skip
        load_config(["cifar100-long+cifar100-mini/apr"])
    with pytest.raises(ConfigError, match="no preset is named so"):  # a part that is no file: the plain error
        load_config(["cifar100-long+nope"])
    for bad in ("../pyproject", "/etc/passwd", ".hidden"):  # names stay inside the presets
        assert presets.preset_file(bad) is None


def test_a_preset_or_a_folder_of_them_is_copied_to_start_ones_own(capsys, tmp_path):
    assert main(["presets", "copy", "cifar100/rdfcil", str(tmp_path / "mine")]) == 0
    copied = tmp_path / "mine" / "rdfcil.yaml"
    assert (
        capsys.readouterr().out == f"{copied}\n"
        and copied.read_text() == (CONFIGS / "cifar100/rdfcil.yaml").read_text()
    )
    assert main(["presets", "copy", "cifar100/rdfcil", str(tmp_path / "mine")]) == 2  # never overwritten
    assert f"{copied} exists: nothing copied" in capsys.readouterr().err
    assert main(["presets", "copy", "smoke", str(tmp_path / "s")]) == 0  # the file smoke.yaml, not the folder smoke/
    assert sorted(p.name for p in (tmp_path / "s").iterdir()) == ["smoke.yaml"]
    assert main(["presets", "copy", "cifar100-mini10", str(tmp_path / "m")]) == 0
    assert (tmp_path / "m" / "cifar100-mini10.yaml").exists()
    capsys.readouterr()
    assert main(["presets", "copy", "cifar100/ablations", str(tmp_path / "a")]) == 0
    assert len(list((tmp_path / "a" / "ablations").glob("*.yaml"))) == len(VARIANTS["rdfcil"])
    assert main(["presets", "copy", "nope", str(tmp_path / "x")]) == 2 and not (tmp_path / "x").exists()
    assert main(["presets", "copy", "smoke"]) == 2
    assert "give a preset's name" in capsys.readouterr().err


def test_train_without_a_config_names_a_preset(capsys):
    assert main(["train", "--out", "x"]) == 2
    assert "try --config smoke; `dfcil presets` lists them" in capsys.readouterr().err


def test_a_protocol_file_alone_is_told_to_take_a_method_file(capsys, tmp_path):
    # cifar100/n10 alone trains rdfcil's defaults, whose schedule does not fit it: the refusal comes with the fix
    assert main(["train", "--config", "cifar100/n10", "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "cifar100/n10 is a protocol and names no method: rdfcil's defaults would train it" in err
    assert "(--config cifar100/n10 --config cifar100/rdfcil; the files beside it: abd," in err
    assert "milestones [80, 120]" in err and not (tmp_path / "run").exists()
    assert protocol_without_method(["cifar100/n10", "cifar100/lwf"]) == ""  # a method file names it
    assert protocol_without_method(["cifar100/n10"], [("method.name", "lwf")]) == ""  # so does --method.name
    assert all(protocol_without_method([p]) == "" for p in ("smoke", "cifar100-mini", "cifar100-long", "own-data"))
    assert main(["presets", "copy", "cifar100", str(tmp_path / "mine")]) == 0  # one's own copy, given by path
    note = protocol_without_method([str(tmp_path / "mine" / "cifar100" / "n5.yaml")])
    assert f"--config {tmp_path}/mine/cifar100/rdfcil.yaml;" in note


def test_a_sweep_of_a_protocol_file_alone_is_told_to_take_a_method_file(tmp_path, capsys):
    args = ["sweep", "--config", "cifar100/n10", "--grid", "seed=1,2", "--out", str(tmp_path / "s"), "--dry-run"]
    assert main(args) == 0
    assert capsys.readouterr().err.count("cifar100/n10 is a protocol and names no method") == 1
    assert main([*args[:2], "cifar100/n10+cifar100/lwf", *args[3:]]) == 0
    assert main([*args, "--method.name", "lwf"]) == 0
    assert "is a protocol" not in capsys.readouterr().err
