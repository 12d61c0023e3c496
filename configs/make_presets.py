"""Write the paper presets' commands and numbers: in the header of each method file (and R-DFCIL ablation), the
command of every setting it runs and the paper's number for it, from dfcil.analysis.paper.

    python configs/make_presets.py        # rewrites those lines in configs/{cifar100,tiny_imagenet200,imagenet100}/

A paper preset is two files given in order: a setting file, ``<dataset>/<setting>.yaml`` (named as
dfcil.analysis.paper.protocol_name names its protocol: the data, the backbone, the schedule every approach shares), then
a method file, ``<dataset>/<method>.yaml`` (the method section and the schedule keys its recipe changes). An R-DFCIL
ablation (``cifar100/ablations/``) is a third file, after R-DFCIL's. The files are written by hand, all but one block of
each method file's header, from its line ``# Paper (`` to the next ``#`` line, which this script writes.
tests/test_presets.py checks that the committed files are what it writes, and that each number is the paper row a report
finds for the run that command trains."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import yaml

from dfcil.analysis.paper import DATASETS, PROTOCOLS, UNVERIFIED, PaperRow, find_row, protocol_name, variant_of

HERE = Path(__file__).parent
# dataset: (how the paper's numbers are taken, the class order the command trains, --out of a run)
ORDERS = {
    "cifar100": (
        "mean ± std over class orders 0, 1, 2",
        "seed-0 class order; --data.class_order_seed 1 and 2 for the other two orders",
        "runs/cifar100-{key}_{setting}-s0",
    ),
    "tiny_imagenet200": (
        "mean ± std over class orders 0, 1, 2",
        "seed-0 class order; --data.class_order_seed 1 and 2 for the other two orders",
        "runs/tiny_imagenet200-{key}_{setting}",
    ),
    "imagenet100": (
        "one run, the reference's class order",
        "in the reference's class order, np.random.seed(1993), which data.class_order gives",
        "runs/imagenet100-{key}_{setting}",
    ),
}
# the settings a file runs where not all of its dataset's: other papers' methods where their paper has a number,
# and the R-DFCIL ablations (the paper's Table 6 and supplement: 20 tasks)
ONLY = {
    "tiny_imagenet200/efc.yaml": ("n10", "n20"),
    "tiny_imagenet200/lwf_ldc.yaml": ("n10",),
    "tiny_imagenet200/dpcr.yaml": ("n10",),
    "tiny_imagenet200/adagauss.yaml": ("n10",),
    "imagenet100/dpcr.yaml": ("n10",),
    "imagenet100/adagauss.yaml": ("n10",),
    "cifar100/ablations": ("n20",),
}
# rows of another paper than R-DFCIL's: (method, variant) → (its source in dfcil.analysis.paper, the row the preset
# runs)
OTHER_PAPERS = {
    ("efc", ""): ("EFC paper", "the EFC paper's cold-start row of EFC"),
    ("lwf", "ldc"): ("LDC paper", "the LDC paper's row of LwF + LDC"),
    ("fecam", ""): ("FeCAM paper", "FeCAM paper"),
    ("dpcr", ""): ("DPCR paper", "the DPCR paper's row of DPCR"),
    ("adagauss", ""): ("AdaGauss paper", "the AdaGauss paper's row of AdaGauss"),
    ("apr", ""): ("APR paper", "the APR paper's row of APR"),
}
# numbers on another protocol than dfcil's that a header states under a setting but that are never compared with a
# run (its authors' own, not checked against their paper, or second-hand): (dataset, setting, method, variant) → lines
NOT_COMPARED = {
    ("cifar100", "n10", "apr", ""): (
        "Its authors' README (ResNet-18, their class order; their paper not read here): average incremental",
        "accuracy 69.96 with the Mahalanobis head (69.00 NCM, 67.20 linear); A_N 57.94 is second-hand (another",
        "paper's table). Neither is compared with a run.",
    ),
}
SETTING = re.compile(r"(b\d+_)?n\d+")


def settings(dataset: str) -> dict[str, str]:
    """The setting files of a dataset, in the paper's order (equal tasks, then a large first task): name → what
    the protocol is."""
    classes = DATASETS[dataset][0]
    found = {}
    for path in (HERE / dataset).glob("*.yaml"):
        if SETTING.fullmatch(path.stem):
            data = yaml.safe_load(path.read_text())["data"]
            n, base = data["num_tasks"], data["base_classes"]
            assert protocol_name(n, base) == path.stem, f"{path} holds the protocol {protocol_name(n, base)}"
            found[(base > 0, n, path.stem)] = (
                f"{base} base classes then {n - 1} tasks of {(classes - base) // (n - 1)} classes"
                if base
                else f"{n} equal tasks of {classes // n} classes"
            )
    return {stem: text for (_, _, stem), text in sorted(found.items())}


def numbers(row: PaperRow | None, none: str = "no number in the paper for this setting") -> str:
    if row is None or row.last_acc is None:
        return none
    avg = f", average incremental accuracy = {row.avg_inc_acc.text}" if row.avg_inc_acc else ""
    return f"A_N = {row.last_acc.text}{avg}"


def block(path: Path) -> list[str]:
    """The generated lines of a method file's (or ablation's) header: per setting, the paper's number and the
    command."""
    rel = path.relative_to(HERE)
    dataset, ablation = rel.parts[0], rel.parts[1] == "ablations"
    method = yaml.safe_load(path.read_text())["method"]
    files = [f"{dataset}/{{setting}}", rel.with_suffix("").as_posix()]  # preset names: they work from any install
    if ablation:  # after the method file it changes
        files.insert(1, f"{dataset}/{method['name']}")
        method = yaml.safe_load((HERE / dataset / f"{method['name']}.yaml").read_text())["method"] | method
    name, variant = method["name"], variant_of(method["name"], method)
    orders, order, out = ORDERS[dataset]
    source, what = OTHER_PAPERS.get((name, variant), ("", orders))
    if ablation:
        what = f"R-DFCIL full: {numbers(find_row(dataset, 'n20', name))}"
    lines = [f"Paper ({what}{', on its own protocol' if source else ''}) and command, per setting ({order}):"]
    only = ONLY.get(rel.as_posix(), ONLY.get(rel.parent.as_posix()))
    for setting, text in settings(dataset).items():
        if only and setting not in only:
            continue
        row = find_row(dataset, setting, name, variant)
        recalled = UNVERIFIED.get((dataset, setting, name, variant))
        none = "no number in the paper for this setting"
        if source:
            none = f"no number {'checked against the paper' if recalled else 'from its authors'} for this setting"
        told = NOT_COMPARED.get((dataset, setting, name, variant), ())
        if told:
            none = "no number compared for this setting"
        lines.append(f"  {setting} ({text}): {numbers(row, none)}.")
        lines += [f"    {line}" for line in told]
        if recalled:
            said = ", ".join(f"{m} = {v}" for m, v in zip(("A_N", "Ā_N"), recalled, strict=True) if v is not None)
            lines.append(f"    Recalled from the {source} but not checked against it, so never compared: {said}.")
        configs = " ".join(f"--config {f.format(setting=setting)}" for f in files)
        lines.append(f"    dfcil train {configs} --data.root DATA --out {out.format(key=path.stem, setting=setting)}")
    if source in PROTOCOLS:
        lines.append(f"That protocol is not this preset's: {PROTOCOLS[source]}.")
    wrapped = [part for line in lines for part in (textwrap.wrap(line, 116) if line[0] != " " else [line])]
    return [f"# {line}" for line in wrapped]


def written(path: Path) -> str:
    """A method file as this script writes it: its text with the header's block from ``# Paper (`` to the next
    ``#`` line replaced."""
    lines = path.read_text().split("\n")
    start = next(i for i, line in enumerate(lines) if line.startswith("# Paper ("))
    end = lines.index("#", start)
    return "\n".join(lines[:start] + block(path) + lines[end:])


def method_files() -> list[Path]:
    """The method files and ablations of the paper's datasets (every file there but the settings)."""
    return sorted(
        p for d in ORDERS for p in (HERE / d).rglob("*.yaml") if not (p.parent.name == d and SETTING.fullmatch(p.stem))
    )


def presets() -> dict[Path, str]:
    return {path: written(path) for path in method_files()}


def main() -> None:
    for path, text in presets().items():
        path.write_text(text)


if __name__ == "__main__":
    main()
