"""Write the CIFAR-100 presets: every registered method x paper setting, the R-DFCIL ablations, and the
cifar100-mini overlays.

    python configs/make_presets.py        # rewrites configs/cifar100/*.yaml and configs/cifar100-mini/*.yaml

The presets are generated so that all methods share the backbone, protocol, class order, schedule and synthesizer
unless a preset says otherwise; each file's header names the paper row it reproduces and its number. Methods are
found through the registry: a method with no row below gets presets with its config's defaults (and the shared
synthesizer where it has one). tests/test_presets.py checks every committed preset against what this writes, and
requires the presets of the rows in PAPER_ROWS; a new method's presets are committed when wanted.
"""

from __future__ import annotations

import dataclasses
import textwrap
from collections.abc import Iterable
from pathlib import Path

import yaml

from dfcil.methods import METHODS
from dfcil.paper import PROTOCOLS, UNVERIFIED, VARIANTS, PaperRow, find_row

HERE = Path(__file__).parent

SETTINGS = {  # name: (num_tasks, base_classes, description, paper table)
    "n5": (5, 0, "5 equal tasks of 20 classes", 1),
    "n10": (10, 0, "10 equal tasks of 10 classes", 1),
    "n20": (20, 0, "20 equal tasks of 5 classes", 1),
    "b50_n6": (6, 50, "50 base classes then 5 tasks of 10 (N = 6)", 2),
    "b50_n11": (11, 50, "50 base classes then 10 tasks of 5 (N = 11)", 2),
    "b50_n26": (26, 50, "50 base classes then 25 tasks of 2 (N = 26)", 2),
}

INVERSION = {"steps": 5000, "lr": 0.001, "tau": 1000.0, "w_content": 1.0, "w_diversity": 1.0, "w_bn": 50.0}
INVERSION |= {"w_prior": 0.001, "persistent": False}
# The paper trains "all approaches ... with SGD for 160 epochs", lr 0.1 ÷10 at 80 and 120, wd 5e-4, batch 128;
# R-DFCIL adds 40 epochs of head refinement (its preset: 200).
SCHEDULE = {"epochs": 160, "batch_size": 128, "lr": 0.1, "momentum": 0.9, "weight_decay": 0.0005}
SCHEDULE |= {"milestones": [80, 120], "gamma": 0.1}
SHARED = (
    "Shared with R-DFCIL (docs/reference.md): CIFAR ResNet-32 (cl-lite variant), SGD lr 0.1\n"
    "momentum 0.9 batch 128, pad-4 crop + flip, training seed 1."
)
# the rows that train with their own paper's optimiser and schedule (described in their notes)
SHARED_OWN = (
    "Shared with R-DFCIL (docs/reference.md): CIFAR ResNet-32 (cl-lite variant, d = 64), pad-4 crop + flip,\n"
    "training seed 1; the optimiser and schedule are this method's own recipe (below)."
)
HEADS = {
    "ucir_df": "cosine head (UCIR: σ·cos, one learned σ)",
    "podnet_df": "LSC head (PODNet: 10 proxies per class, learned η)",
    "lwf_ldc": "cosine head in training (as LDC's: σ·cos, one learned σ); LDC's nearest class mean (cosine) classifies",
}
# schedules that the line below cannot say: EFC's two Adam phases, FeCAM's one trained task
SCHEDULES = {
    "fecam": "This preset: the first task trains 200 epochs, lr x0.1 at epochs 60, 120 and 160, wd 0.0005; later\n"
    "tasks do not train. Cosine head in the first task, then FeCAM's Mahalanobis classifier on the class statistics.",
    "efc": "This preset: 100 epochs per task, batch 64; first task Adam lr 1e-3, wd 2e-4, x0.1 at epochs 45 and 90,\n"
    "with self-rotation labels; later tasks Adam lr 1e-4 constant, wd 2e-4, BN frozen. EFC reads these from the\n"
    "method section (first_lr, first_weight_decay, lr, weight_decay): train.lr and train.weight_decay repeat the\n"
    "first task's and are not read, train.momentum is unused. Bias-free linear heads, U(−1/√d, 1/√d) as EFC's.",
}


def schedule_line(key: str, train: dict) -> str:
    if key in SCHEDULES:
        return SCHEDULES[key]
    t = SCHEDULE | train
    *first, last = map(str, t["milestones"])
    milestones = f"{', '.join(first)} and {last}" if first else last
    head = HEADS.get(key, "bias-free linear head")
    return (
        f"This preset: {t['epochs']} epochs per task, lr x0.1 at epochs {milestones}, wd {t['weight_decay']:g}; {head}."
    )


SYNTH = "the shared synthesizer: a fresh generator per task, 5000 Adam steps at lr 1e-3 (R-DFCIL's)"

PAPER_ROWS = {
    # name: (method section, train overrides, paper row, notes); the numbers come from dfcil.paper
    "finetune": (
        {"name": "finetune"},
        {},
        "fine-tuning (ABD's 'Base', ABD README; 250 epochs, ABD's backbone)",
        "",
    ),
    "joint": (
        {"name": "joint", "from_scratch": True, "last_only": True},
        {},
        "Upper Bound (Table 1)",
        "Trains once, in the last task, on all 100 classes (last_only): only A_N is meaningful.\n"
        "# Not data-free: it uses all real data.",
    ),
    "lwf": (
        {"name": "lwf", "lambda_kd": 1.0, "temperature": 2.0},
        {},
        "LwF* (Table 1, from the ABD paper)",
        "",
    ),
    "lwf_mc": (
        {"name": "lwf_mc"},
        {},
        "LwF.MC (from the ABD paper; not in R-DFCIL's tables)",
        "Sigmoid outputs, binary CE; the old classes' targets are the old model's sigmoids (docs/baselines.md).",
    ),
    "deepinversion": (
        {"name": "deepinversion", "lambda_kd": 1.0, "temperature": 2.0, "inversion": INVERSION},
        {},
        "DeepInversion* (Table 1, from the ABD paper)",
        f"Uses {SYNTH}.",
    ),
    "dgr": (
        {"name": "dgr", "lambda_kd": 1.0, "temperature": 2.0, "zdim": 1024},
        {},
        "DGR* (Table 1, from the ABD paper; not data-free)",
        "Not data-free: a VAE (ABD's CIFAR autoencoder) is trained with the classifier and kept across tasks.",
    ),
    "abd": (
        {"name": "abd", "mu": 0.1, "inversion": INVERSION},
        {},
        "ABD as implemented by the R-DFCIL authors (Tables 1 and 2)",
        f"'Same synthesizer and schedule as R-DFCIL': {SYNTH}; 160 epochs per task, as the paper trains every\n"
        "# approach (R-DFCIL's 40 further epochs are its head refinement, which ABD does not have).\n"
        "# For ABD's own schedule and persistent generator see abd_faithful_*.yaml.",
    ),
    "abd_faithful": (
        {
            "name": "abd",
            "mu": 0.1,
            "inversion": INVERSION | {"steps": 10000} | VARIANTS["abd"]["faithful"]["inversion"],
        },
        {"epochs": 250, "milestones": [100, 150, 200], "weight_decay": 0.0002},
        "ABD* (Table 1, from the ABD paper)",
        "ABD's own schedule (250 epochs, x0.1 at 100/150/200, wd 2e-4) and generator lifetime (one\n"
        "# generator and Adam for the whole run, 10000 steps per task). Still on the shared backbone and\n"
        "# augmentation: ABD's ResNet-32 and ColorJitter are not reproduced, nor its CE over all 100 outputs.",
    ),
    "ucir_df": (
        {"name": "ucir_df", "lambda_base": 5.0, "margin": 0.5, "hard_negatives": 2, "inversion": INVERSION},
        {},
        "UCIR-DF (CNN) (Table 2)",
        f"UCIR's 160-epoch schedule on the shared backbone, with {SYNTH}; cosine head, CNN evaluation.",
    ),
    "podnet_df": (
        {
            "name": "podnet_df",
            "lambda_c": 3.0,
            "lambda_f": 1.0,
            "nca_margin": 0.6,
            "ft_epochs": 20,
            "ft_lr": 0.05,
            "inversion": INVERSION,
        },
        {"epochs": 180},
        "PODNet-DF (CNN) (Table 2)",
        f"160 epochs + 20 epochs of balanced head finetuning at lr 0.05, with {SYNTH}; LSC head, NCA, POD.\n"
        "# The shared step schedule replaces PODNet's cosine annealing (docs/baselines.md).",
    ),
    "rdfcil": (
        {
            "name": "rdfcil",
            "lambda_ce": 0.5,
            "lambda_hkd": 0.15,
            "lambda_rkd": 0.5,
            "chr_epochs": 40,
            "chr_lr": 0.005,
            "chr_hkd": True,
            "inversion": INVERSION,
        },
        {"epochs": 200},
        "R-DFCIL (Tables 1 and 2)",
        "200 epochs per task = 160 RRL + 40 CHR (task 0: 160 epochs of CE), CHR lr 0.005 with HKD kept on.",
    ),
    # Methods of other papers, with their own recipes where dfcil's configs can hold them (the differences said)
    "efc": (
        {"name": "efc", "lambda_efm": 10.0, "eta": 0.1, "sigma": 0.2, "first_lr": 0.001}
        | {"first_weight_decay": 0.0002, "lr": 0.0001, "weight_decay": 0.0002},
        {"epochs": 100, "batch_size": 64, "milestones": [45, 90], "lr": 0.001, "weight_decay": 0.0002},
        "EFC (Magistri et al., ICLR 2024)",
        "EFC's CIFAR-100 cold-start recipe (its code's defaults, which gave the paper's tables): λ_EFM 10, η 0.1,\n"
        "σ 0.2, Gaussian replay of the old classes in the asymmetric CE, drift of the old means at each task's end.\n"
        "# Departures from the EFC paper: R-DFCIL's ResNet-32 (d = 64, pre-ReLU features) for its ResNet-18\n"
        "# (d = 512), dfcil's pad-4 crop + flip for its pad-4 + RandomResizedCrop + flip, dfcil's (ABD's) class\n"
        "# orders for its own (docs/baselines.md, EFC).",
    ),
    "lwf_ldc": (
        {"name": "lwf", "lambda_kd": 10.0, "temperature": 2.0, "head": "cosine", "ce": "local", "ldc": True}
        | {"drift": {"kind": "ldc", "epochs": 20, "lr": 0.001, "batch_size": 128, "passes": 20}},
        {"epochs": 100, "lr": 0.05, "milestones": [45, 90], "weight_decay": 0.0002},
        "LwF + LDC (Gomez-Villa et al., ECCV 2024; method lwf with ldc: true)",
        "LDC's recipe for LwF: CE over the new task's classes only, λ_KD 10, T 2 (no T² factor); after each later\n"
        "task a bias-free d×d projector, fitted by Adam lr 1e-3 for 20 epochs (batch 128, fresh augmentations each\n"
        "epoch) to map the old model's features to the new one's, moves the stored class means; nearest mean on\n"
        "L2-normalised features classifies.\n"
        "# dfcil trains every task with one schedule: this preset gives the first task LDC's incremental schedule\n"
        "# (SGD lr 0.05, 100 epochs, x0.1 at 45 and 90, wd 2e-4), where LDC trains it 200 epochs at lr 0.1, x0.1 at\n"
        "# 60, 120 and 160, wd 5e-4 (lwf has no first-task schedule). Other departures: pad-4 crop + flip only (LDC\n"
        "# adds ColorJitter and AutoAugment), R-DFCIL's ResNet-32 (d = 64) and class orders (docs/baselines.md, LDC).",
    ),
    "fecam": (
        {"name": "fecam", "tukey_beta": 0.5, "nonnegative": "relu", "shrink_diag": 1.0, "shrink_offdiag": 1.0}
        | {"shrink_times": 2},
        {"epochs": 200, "milestones": [60, 120, 160]},
        "FeCAM (Goswami et al., NeurIPS 2023)",
        "FeCAM's recipe: the first task trains a cosine classifier with CE (SGD lr 0.1, momentum 0.9, wd 5e-4,\n"
        "batch 128, 200 epochs); the backbone then stays frozen and no later task trains. Per class: the mean and\n"
        "the covariance of Tukey-transformed features (β 0.5, on ReLU(features): dfcil's are pre-ReLU), shrunk twice\n"
        "(γ1 = γ2 = 1) and normalised to a correlation; the Mahalanobis distance classifies from the second task.\n"
        "# FeCAM anneals its lr by a cosine over the 200 epochs; dfcil's schedule has steps, so this preset lowers it\n"
        "# x0.1 at 60, 120 and 160 (the first-task steps of LDC's code, on the same PyCIL base). Other departures:\n"
        "# R-DFCIL's ResNet-32 (d = 64, pre-ReLU) for its ResNet-18 (d = 512, post-ReLU), pad-4 crop + flip without\n"
        "# ColorJitter and AutoAugment, dfcil's class orders (docs/baselines.md, FeCAM).\n"
        "# No paper number: FeCAM's authors give none for a cold start; their own tables start from a large first\n"
        "# task, and their numbers are not held here.",
    ),
}
# Rows of another paper than R-DFCIL's: key → (its source in dfcil.paper, the row the preset reproduces)
OTHER_PAPERS = {
    "efc": ("EFC paper", "the EFC paper's cold-start row of EFC"),
    "lwf_ldc": ("LDC paper", "the LDC paper's row of LwF + LDC"),
    "fecam": ("FeCAM paper", "FeCAM paper"),
}
# R-DFCIL on N = 20 (paper Table 6 and the supplement): name: (train overrides, description); each one's method
# settings are dfcil.paper.VARIANTS["rdfcil"][name], from which a report recognises the ablation in a run.
ABLATIONS = {
    "no_rkd": ({}, "without RKD (Table 6)"),
    "no_hkd": ({}, "without HKD (Table 6)"),
    "no_chr": ({"epochs": 160}, "without CHR: training ends after 160 epochs of RRL (Table 6)"),
    "rkd_to_hkd": ({}, "RKD replaced by HKD on new data (supplement, one run)"),
    "hkd_to_rkd": ({}, "HKD replaced by RKD on synthetic data (supplement, one run)"),
    "identity_proj": (
        {},
        "RKD on raw features, no learned φ/ψ (the paper says the\nprojections add 'about 2%' to A_N; no table)",
    ),
    "chr_ce_only": (
        {},
        "CHR with the class-balanced CE only, as the paper describes it (the\n"
        "code keeps HKD in CHR; no number in the paper)",
    ),
}


def paper_key(key: str) -> tuple[str, str]:
    """(method, variant) of a preset row in dfcil.paper's table: abd_faithful is ABD as ABD's paper ran it, lwf_ldc
    LwF with LDC."""
    return {"abd_faithful": ("abd", "faithful"), "lwf_ldc": ("lwf", "ldc")}.get(key, (key, ""))


def _wrap(line: str) -> list[str]:
    """A header line cut at 116 characters; commands (indented) stay whole so that they can be copied."""
    return textwrap.wrap(line, 116) if line and not line.startswith("  ") else [line]


def header(lines: list[str]) -> str:
    lines = [part for line in lines for part in line.split("\n") for part in _wrap(part)]
    return "\n".join(f"# {line}" if line else "#" for line in lines) + "\n"


def numbers(row: PaperRow | None, none: str = "no number in the paper for this setting") -> str:
    if row is None or row.last_acc is None:
        return none
    avg = f", average incremental accuracy = {row.avg_inc_acc.text}" if row.avg_inc_acc else ""
    return f"A_N = {row.last_acc.text}{avg}"


def claim(key: str, dataset: str, setting: str, orders: str) -> list[str]:
    """The header's paper lines: the number a report compares with (``Paper (...): ...``), and for another paper's
    row the numbers recalled but not checked (never compared) and that paper's protocol."""
    method, variant = paper_key(key)
    row = find_row(dataset, setting, method, variant)
    if key not in OTHER_PAPERS:
        return [f"Paper ({orders}): {numbers(row)}."]
    source, what = OTHER_PAPERS[key]
    recalled = UNVERIFIED.get((dataset, setting, method, variant))
    none = (
        "no number checked against the paper for this setting"
        if recalled
        else "no number from its authors for this setting"
    )
    lines = [f"Paper ({what}, on its own protocol): {numbers(row, none)}."]
    if recalled:
        said = [f"{m} = {v}" for m, v in zip(("A_N", "Ā_N"), recalled, strict=True) if v is not None]
        lines.append(f"Recalled from the {source} but not checked against it, so never compared: {', '.join(said)}.")
    if source in PROTOCOLS:
        lines.append(f"That protocol is not this preset's: {PROTOCOLS[source]}.")
    return lines


def text(head: list[str], body: dict) -> str:
    return header(head) + yaml.safe_dump(body, sort_keys=False)


def full_config(method: dict, train: dict, tasks: int, base: int) -> dict:
    return {
        "method": method,
        "data": {"name": "cifar100", "num_tasks": tasks, "base_classes": base, "class_order_seed": 0},
        "model": {"backbone": "resnet32"},
        "train": SCHEDULE | train,
        "seed": 1,
    }


def defaults(name: str) -> dict:
    """The method section of a registered method without a paper row: its config's defaults, with the shared
    synthesizer where it has one."""
    section = yaml.safe_load(yaml.safe_dump(dataclasses.asdict(METHODS.get(name).Config())))  # tuples → lists
    return section | ({"inversion": INVERSION} if "inversion" in section else {})


# R-DFCIL+ (dfcil's own, no paper): R-DFCIL's preset and schedule with R-DFCIL+'s switches at their defaults
PLUS_KEYS = ("replay", "replay_ratio", "lambda_replay", "drift", "classifier")
PAPER_ROWS["rdfcil_plus"] = (
    PAPER_ROWS["rdfcil"][0]
    | {"name": "rdfcil_plus"}
    | {k: dataclasses.asdict(METHODS.get("rdfcil_plus").Config())[k] for k in PLUS_KEYS},
    PAPER_ROWS["rdfcil"][1],
    "R-DFCIL+ (dfcil's own: R-DFCIL with class Gaussians, drift compensation and replay in CHR; no paper)",
    "R-DFCIL's preset (rdfcil_<setting>.yaml) and its schedule, with R-DFCIL+'s defaults: a mean and covariance\n"
    "# per class (about 16.6 KB each at d = 64, kept besides R-DFCIL's state), moved at the end of each RRL by a\n"
    "# linear map fitted by least squares (one augmented pass), and replayed as sampled features in CHR\n"
    "# (docs/rdfcil-plus.md).",
)


def method_rows() -> dict[str, tuple]:
    """Every registered method's row: the paper's where it has one, else its defaults and no number."""
    rows = dict(PAPER_ROWS)
    for name in METHODS.names():
        if name not in rows:
            rows[name] = (defaults(name), {}, f"{name} (no number in the paper)", "")
    return rows


def presets(keys: Iterable[str] | None = None) -> dict[Path, str]:
    """The generated CIFAR-100 presets: path and text (header and YAML body). ``keys``: only those of these rows
    (method names, or a row such as ``abd_faithful``) and R-DFCIL's ablations; None: every registered method's."""
    files: dict[Path, str] = {}
    out = HERE / "cifar100"
    rows = {k: row for k, row in method_rows().items() if keys is None or k in keys}
    for key, (method, train, row, notes) in rows.items():
        for setting, (tasks, base, desc, tab) in SETTINGS.items():
            name = f"{key}_{setting}.yaml"
            head = [
                f"{row} on CIFAR-100, {desc} (the protocol of R-DFCIL's Table {tab}).",
                *claim(key, "cifar100", setting, "mean ± std over class orders 0, 1, 2"),
                "",
                "Command (seed-0 class order; --data.class_order_seed 1 and 2 for the other two orders):",
                f"  dfcil train --config configs/cifar100/{name} --data.root DATA "
                f"--out runs/cifar100-{key}_{setting}-s0",
                "",
                SHARED_OWN if key in OTHER_PAPERS else SHARED,
                schedule_line(key, train),
            ] + ([notes.replace("# ", "")] if notes else [])
            lines = [line for block in head for line in block.split("\n")]
            files[out / name] = text(lines, full_config(method, train, tasks, base))
    rd_method, rd_train = PAPER_ROWS["rdfcil"][0], PAPER_ROWS["rdfcil"][1]
    full = find_row("cifar100", "n20", "rdfcil")
    for key, (train, row) in ABLATIONS.items():
        name = f"rdfcil_n20_{key}.yaml"
        method = VARIANTS["rdfcil"][key]
        head = [
            f"R-DFCIL ablation, {row}, on CIFAR-100 with 20 equal tasks.",
            f"Paper (R-DFCIL full: {numbers(full)}): {numbers(find_row('cifar100', 'n20', 'rdfcil', key))}.",
            "",
            f"Command: dfcil train --config configs/cifar100/ablations/{name} --data.root DATA --out runs/{key}-s0",
            "Everything else is rdfcil_n20.yaml.",
        ]
        lines = [ln for block in head for ln in block.split("\n")]
        files[out / "ablations" / name] = text(lines, full_config(rd_method | method, rd_train | train, 20, 0))
    for key, body in mini_overlays().items():
        if keys is not None and key not in keys and not key.startswith("rdfcil_"):
            continue
        head = [
            f"cifar100-mini overlay: {ablation_name(key)}, on the",
            "cifar100-mini protocol, schedule and synthesizer budget (80 inversion steps). Use it after the base",
            "(DATA: the data root, README section Data):",
            f"  dfcil train --config configs/cifar100-mini.yaml --config configs/cifar100-mini/{key}.yaml \\",
            f"      --data.root DATA --out runs/mini-{key}-s1",
        ]
        files[HERE / "cifar100-mini" / f"{key}.yaml"] = text(head, body)
    return files


def ablation_name(key: str) -> str:
    """A mini overlay's name in its header: ``rdfcil, ablation no_rkd`` for R-DFCIL's ablations."""
    return f"rdfcil, ablation {key.removeprefix('rdfcil_')}" if key.removeprefix("rdfcil_") in ABLATIONS else key


def mini_overlays() -> dict[str, dict]:
    """cifar100-mini overlays: every registered method but R-DFCIL (the base preset), and R-DFCIL's ablations."""
    budget = {"inversion": {"steps": 80}}
    overlays = {
        "joint": {"name": "joint", "from_scratch": True, "last_only": False},
        "abd": {"name": "abd", "inversion": {"steps": 80, "persistent": False}},
        "podnet_df": {"name": "podnet_df", "ft_epochs": 3} | budget,
        "lwf_ldc": {"name": "lwf", "lambda_kd": 10.0, "temperature": 2.0, "head": "cosine", "ce": "local", "ldc": True},
    }
    for name in METHODS.names():
        if name not in overlays and name != "rdfcil":
            has_inversion = "inversion" in {f.name for f in dataclasses.fields(METHODS.get(name).Config)}
            overlays[name] = {"name": name} | (budget if has_inversion else {})
    overlays = dict(sorted(overlays.items()))
    for k in ABLATIONS:
        overlays[f"rdfcil_{k}"] = {"name": "rdfcil", "chr_epochs": 3} | budget | VARIANTS["rdfcil"][k]
    return {k: {"method": m} | ({"train": {"epochs": 12}} if k == "rdfcil_no_chr" else {}) for k, m in overlays.items()}


# ------------------------------------------------------------------------------------------------ other datasets
# The paper's Tiny-ImageNet-200 (Tables 3 and 4) and ImageNet-100 (Table 5) protocols, for the methods it reports
# there (R-DFCIL, ABD as the R-DFCIL authors ran it, the upper bound) and fine-tuning as the floor. Schedules are
# the reference's per dataset (docs/reference.md, R-DFCIL training); every method but R-DFCIL trains its RRL epochs.
OTHER = {
    "tiny_imagenet200": {
        "label": "Tiny-ImageNet-200",
        "settings": {
            "n5": (5, 0, "5 equal tasks of 40 classes", 3),
            "n10": (10, 0, "10 equal tasks of 20 classes", 3),
            "n20": (20, 0, "20 equal tasks of 10 classes", 3),
            "b100_n6": (6, 100, "100 base classes then 5 tasks of 20 (N = 6)", 4),
            "b100_n11": (11, 100, "100 base classes then 10 tasks of 10 (N = 11)", 4),
            "b100_n26": (26, 100, "100 base classes then 25 tasks of 4 (N = 26)", 4),
        },
        "data": {"name": "tiny_imagenet200", "class_order_seed": 0},
        "backbone": "resnet32",
        "schedule": {"epochs": 160, "batch_size": 128, "lr": 0.1, "momentum": 0.9, "weight_decay": 0.0002}
        | {"milestones": [80, 120], "gamma": 0.1},
        "chr_epochs": 40,
        "inversion_steps": 5000,
        # other papers' methods, in the settings where their paper has a number
        "own": {"efc": ("n10", "n20"), "lwf_ldc": ("n10",)},
        "own_shared": "Shared with R-DFCIL (docs/reference.md): 64×64 images, CIFAR ResNet-32 (cl-lite variant, 16×16\n"
        "final map, d = 64), pad-4 crop + flip, training seed 1; the optimiser and schedule are this method's own\n"
        "recipe (below).",
        "orders": "mean ± std over class orders 0, 1, 2",
        "command": "seed-0 class order; --data.class_order_seed 1 and 2 for the other two orders",
        "shared": "Shared with R-DFCIL (docs/reference.md): 64×64 images, CIFAR ResNet-32 (cl-lite variant, 16×16\n"
        "final map), SGD lr 0.1 momentum 0.9 batch 128, pad-4 crop + flip, training seed 1; the Tiny-ImageNet\n"
        "generator.",
    },
    "imagenet100": {
        "label": "ImageNet-100",
        "settings": {
            "n5": (5, 0, "5 equal tasks of 20 classes", 5),
            "n10": (10, 0, "10 equal tasks of 10 classes", 5),
            "n20": (20, 0, "20 equal tasks of 5 classes", 5),
        },
        # the reference's one order: np.random.seed(1993); np.random.shuffle(range(100))
        "data": {"name": "imagenet100", "class_order": None},
        "backbone": "resnet18",
        "schedule": {"epochs": 90, "batch_size": 64, "lr": 0.1, "momentum": 0.9, "weight_decay": 0.0001}
        | {"milestones": [30, 60], "gamma": 0.1},
        "chr_epochs": 30,
        "inversion_steps": 10000,
        "orders": "one run, the reference's class order",
        "command": "in the reference's class order, np.random.seed(1993), which data.class_order gives",
        "shared": "Shared with R-DFCIL (docs/reference.md): Resize 256 + CenterCrop 224, the reference's ResNet-18\n"
        "(3×3 stride-1 stem, 14×14 final map), SGD lr 0.1 momentum 0.9 batch 64, pad-4 crop + flip, training\n"
        "seed 1; the ImageNet generator.",
    },
}


def other_rows(d: dict) -> dict[str, tuple]:
    """(method section, train overrides, paper row, notes) of each method the other datasets' presets run."""
    inversion = INVERSION | {"steps": d["inversion_steps"]}
    rd = PAPER_ROWS["rdfcil"][0] | {"chr_epochs": d["chr_epochs"], "inversion": inversion}
    rrl_and_chr = d["schedule"]["epochs"] + d["chr_epochs"]
    synth = f"the shared synthesizer, a fresh generator per task, {d['inversion_steps']} Adam steps at lr 1e-3"
    return {
        "rdfcil": (rd, {"epochs": rrl_and_chr}, "R-DFCIL",
                   f"{rrl_and_chr} epochs per task = {d['schedule']['epochs']} RRL + {d['chr_epochs']} CHR (task 0: "
                   f"{d['schedule']['epochs']} epochs of CE), CHR lr 0.005 with HKD kept on."),
        "abd": ({"name": "abd", "mu": 0.1, "inversion": inversion}, {}, "ABD as implemented by the R-DFCIL authors",
                f"'Same synthesizer and schedule as R-DFCIL': {synth}."),
        "joint": ({"name": "joint", "from_scratch": True, "last_only": True}, {}, "Upper Bound",
                  "Trains once, in the last task, on all classes (last_only): only A_N is meaningful.\nNot "
                  "data-free: it uses all real data."),
        "finetune": ({"name": "finetune"}, {}, "fine-tuning (the lower bound; no row in the paper)", ""),
    } | {key: PAPER_ROWS[key][:3] + (OWN_NOTES.get(key, PAPER_ROWS[key][3]),) for key in d.get("own", {})}  # fmt: skip


OWN_NOTES = {  # the notes of another paper's method on Tiny-ImageNet-200, where they differ from CIFAR-100's
    "efc": "EFC's recipe as on CIFAR-100 (its code uses the same optimiser, schedule, λ_EFM, η and σ on\n"
    "Tiny-ImageNet): λ_EFM 10, η 0.1, σ 0.2. Departures from the EFC paper: R-DFCIL's ResNet-32 (d = 64, pre-ReLU\n"
    "features) for its ResNet-18 (d = 512, AvgPool 8), dfcil's pad-4 crop + flip for its pad-8 crop + flip,\n"
    "dfcil's (ABD's) class orders for its own (docs/baselines.md, EFC).",
    "lwf_ldc": "LDC's recipe for LwF as on CIFAR-100: CE over the new task's classes only, λ_KD 10, T 2; the\n"
    "projector fitted by Adam lr 1e-3 for 20 epochs moves the stored class means; nearest mean classifies.\n"
    "# LDC's code notes an incremental lr of 1e-3 for Tiny-ImageNet; dfcil's lwf trains every task with one\n"
    "# schedule, so this preset keeps CIFAR-100's 0.05 (a first task at 1e-3 would barely train). Other departures\n"
    "# as on CIFAR-100: R-DFCIL's ResNet-32 (d = 64) for ResNet-18, pad-4 crop + flip only, one schedule for every\n"
    "# task, dfcil's class orders (docs/baselines.md, LDC).",
}


def other_presets() -> dict[Path, str]:
    from dfcil.data.imagenet import reference_class_order

    files = {}
    for dataset, d in OTHER.items():
        for key, (method, train, row, notes) in other_rows(d).items():
            for setting, (tasks, base, desc, tab) in d["settings"].items():
                if key in d.get("own", {}) and setting not in d["own"][key]:
                    continue
                name = f"{key}_{setting}.yaml"
                schedule = d["schedule"] | train
                milestones = " and ".join(map(str, schedule["milestones"]))
                head = [
                    f"{row} on {d['label']}, {desc} (the protocol of R-DFCIL's Table {tab}).",
                    *claim(key, dataset, setting, d["orders"]),
                    "",
                    f"Command ({d['command']}):",
                    f"  dfcil train --config configs/{dataset}/{name} --data.root DATA "
                    f"--out runs/{dataset}-{key}_{setting}",
                    "",
                    d["own_shared"] if key in OTHER_PAPERS else d["shared"],
                    SCHEDULES.get(key)
                    or f"This preset: {schedule['epochs']} epochs per task, lr x0.1 at epochs "
                    f"{milestones}, wd {schedule['weight_decay']:g}; {HEADS.get(key, 'bias-free linear head')}.",
                ] + ([notes.replace("# ", "")] if notes else [])
                data = d["data"] | {"num_tasks": tasks, "base_classes": base}
                if "class_order" in data:
                    data["class_order"] = reference_class_order()
                body = {"method": method, "data": data, "model": {"backbone": d["backbone"]}, "train": schedule}
                files[HERE / dataset / name] = text([ln for b in head for ln in b.split("\n")], body | {"seed": 1})
    return files


def main() -> None:
    for path, content in (presets() | other_presets()).items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)


if __name__ == "__main__":
    main()
