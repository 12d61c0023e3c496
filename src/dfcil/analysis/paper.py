"""The paper's numbers (R-DFCIL, Gao et al., ECCV 2022) as one table, keyed the way dfcil names things, with rows
quoted from other papers (ABD's; EFC's and LDC's, on their own protocols).

A row is one approach in one setting: ``(dataset, protocol, method, variant)``.

* ``dataset``: a registered dataset name (``cifar100``, ``tiny_imagenet200``, ``imagenet100``).
* ``protocol``: ``n<N>`` for N equal tasks, ``b<B>_n<N>`` for B base classes then N − 1 equal tasks (N counts the
  base task); a dataset's setting files are named ``<protocol>.yaml`` (``configs/cifar100/n10.yaml``, merged with a
  method file). :func:`protocol_name` builds it.
* ``method``: a registered method name (``joint`` is the paper's Upper Bound), or ``ucir`` / ``podnet`` for the
  exemplar-based rows of Table 2, which dfcil does not implement.
* ``variant``: ``""`` for the approach as the table's row; an R-DFCIL ablation (Table 6 and the supplement, keys
  of :data:`VARIANTS`); ``faithful`` for ABD as ABD's own paper ran it (the paper's "ABD*"); ``abd_oracle`` for
  ABD's upper bound; ``supplement_full`` for the supplement's single run of the full R-DFCIL; ``ldc`` for LwF with
  LDC's drift-compensated class means (``method.ldc: true``, the LDC paper's "LwF + LDC").

Each row holds ``last_acc`` (A_N) and ``avg_inc_acc`` (Ā_N) in percent as :class:`Value` (mean, std, the text as
printed; std None where the paper gives a single run or no std), or None where the paper has no number. Rows marked
``quoted`` are another paper's numbers on that paper's own protocol (backbone, schedule, class order), which
``own_protocol`` describes (:data:`PROTOCOLS`; ``dfcil report`` marks them † and prints it under the table): ABD's
paper's, either quoted by R-DFCIL's tables (the rows with a star) or only in ABD's paper (fine-tuning, LwF.MC, ABD's
upper bound); EFC's (Magistri et al., ICLR 2024) and LDC's (Gomez-Villa et al., ECCV 2024), only the numbers that
were checked. Numbers recalled from those papers but not checked against them are in :data:`UNVERIFIED`, never in
the table (the presets' headers quote them with that mark). docs/reference.md ("Paper numbers") holds the same
numbers as tables.

    paper_value("cifar100", "n10", "rdfcil", "last_acc")   # Value(mean=42.37, std=0.72, text='42.37 ± 0.72')
    find_row("cifar100", "n20", "rdfcil", "no_hkd").source  # 'Table 6'
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

Metric = Literal["last_acc", "avg_inc_acc"]
METRICS: tuple[Metric, ...] = ("last_acc", "avg_inc_acc")

# The paper's datasets: (classes, image side in pixels). A run with fewer classes or images, or other pixels, is
# another protocol and is never compared with the paper.
DATASETS = {"cifar100": (100, 32), "tiny_imagenet200": (200, 64), "imagenet100": (100, 224)}

# The paper's variants of a method, as the method settings that make them (nested like the config's method
# section). A run whose method section holds all of a variant's settings is that variant; the overlays
# configs/cifar100/ablations/rdfcil_<variant>.yaml and the method file abd_faithful.yaml set these.
VARIANTS: dict[str, dict[str, dict[str, Any]]] = {
    "rdfcil": {
        "no_rkd": {"new_kd": "none"},  # Table 6, no RKD on new data
        "no_hkd": {"old_kd": "none"},  # Table 6, no HKD on synthetic data
        "no_chr": {"chr_epochs": 0},  # Table 6, training ends after RRL
        "rkd_to_hkd": {"new_kd": "hkd"},  # supplement, RKD replaced by HKD
        "hkd_to_rkd": {"old_kd": "rkd"},  # supplement, HKD replaced by RKD
        "identity_proj": {"projection": "identity"},  # no learned projections ("about 2%", no table)
        "chr_ce_only": {"chr_hkd": False},  # CHR with the class-balanced CE alone, as the paper's text
        # supplement: RKD replaced by CRD / CRCD on new data; it gives only RKD's average gain (about 10 and 5
        # points), no row
        "rkd_to_crd": {"new_kd": "crd"},
        "rkd_to_crcd": {"new_kd": "crcd"},
    },
    "abd": {"faithful": {"inversion": {"persistent": True}}},  # one generator for the whole run, as ABD's code
    "lwf": {"ldc": {"ldc": True}},  # LwF + LDC (LDC paper): drift-compensated class means, nearest-mean classifier
}

# Settings that make a run another approach than the paper's row of its method, with no paper number of its own:
# a report names the variant and compares the run with nothing (R-DFCIL with LDC's nearest-mean classifier is not
# the paper's R-DFCIL).
SWITCHES: dict[str, dict[str, dict[str, Any]]] = {
    "rdfcil": {"ldc": {"ldc": True}},
    "lwf": {"cosine": {"head": "cosine"}, "local_ce": {"ce": "local"}},  # LDC's LwF; not R-DFCIL's table's LwF
}
# Switches that a variant's paper runs as part of it, so that they name no variant of their own there: LDC's LwF has a
# cosine head and a local CE (an lwf_ldc preset is "ldc", compared with the LDC paper's row).
PART_OF: dict[str, dict[str, tuple[str, ...]]] = {"lwf": {"ldc": ("cosine", "local_ce")}}

# The protocol of each paper that rows are quoted from, as a report's footnote says it (R-DFCIL's own: none).
PROTOCOLS = {
    "ABD paper": "ABD paper (Smith et al., ICCV 2021): ABD's own backbone, schedule and augmentation (on CIFAR-100 "
    "its ResNet-32, SGD 250 epochs per task, x0.1 at 100, 150 and 200, wd 2e-4, colour jitter; class orders 0, 1, 2 "
    "as dfcil's)",
    "EFC paper": "EFC paper (Magistri et al., ICLR 2024, cold start): ResNet-18 (d = 512), 100 epochs per task (Adam; "
    "first task with self-rotation), its own class order",
    "LDC paper": "LDC paper (Gomez-Villa et al., ECCV 2024, LwF + LDC): ResNet-18 (d = 512) with a cosine head, SGD "
    "200 epochs in the first task and 100 in each later one, PyCIL's class order (seed 1993)",
}

_EQUAL = ("n5", "n10", "n20")
_C_BASE = ("b50_n6", "b50_n11", "b50_n26")
_T_BASE = ("b100_n6", "b100_n11", "b100_n26")

# The tables, as printed. One block per table and dataset: (dataset, source, protocols, rows); a row is
# (method, variant, label, A_N per protocol, Ā_N per protocol), a number "mean ± std" or "mean" (one run), None
# where the paper has none. Labels ending in * are quoted by the paper from ABD's paper.
_TABLES: tuple[tuple[str, str, tuple[str, ...], tuple[tuple[Any, ...], ...]], ...] = (
    ("cifar100", "Table 1", _EQUAL, (
        ("joint", "", "Upper Bound", ("70.67 ± 0.16",) * 3, None),
        ("dgr", "", "DGR*", ("14.40 ± 0.40", "8.10 ± 0.10", "4.10 ± 0.30"), None),
        ("lwf", "", "LwF*", ("17.00 ± 0.10", "9.20 ± 0.00", "4.70 ± 0.10"), None),
        ("deepinversion", "", "DeepInversion*", ("18.80 ± 0.30", "10.90 ± 0.60", "5.70 ± 0.30"), None),
        ("abd", "faithful", "ABD*", ("43.90 ± 0.90", "33.70 ± 1.20", "20.00 ± 1.40"), None),
        ("abd", "", "ABD", ("47.36 ± 0.48", "36.19 ± 0.93", "22.29 ± 0.65"),
         ("63.23 ± 1.49", "56.61 ± 1.93", "45.10 ± 2.01")),
        ("rdfcil", "", "R-DFCIL", ("50.47 ± 0.43", "42.37 ± 0.72", "30.75 ± 0.12"),
         ("64.85 ± 1.78", "59.41 ± 1.76", "48.47 ± 1.90")),
    )),
    ("cifar100", "ABD paper", _EQUAL, (  # not in R-DFCIL's tables
        ("finetune", "", "Base (ABD paper)", ("16.4 ± 0.4", "8.8 ± 0.1", "4.4 ± 0.3"), None),
        ("lwf_mc", "", "LwF.MC (ABD paper)", ("32.5 ± 1.0", "17.1 ± 0.1", "7.7 ± 0.5"), None),
        ("joint", "abd_oracle", "Oracle (ABD paper)", ("69.9 ± 0.2",) * 3, None),
    )),
    ("cifar100", "Table 2", _C_BASE, (
        ("ucir", "", "UCIR (CNN)", ("55.73 ± 0.89", "53.22 ± 0.71", "50.08 ± 0.35"),
         ("65.58 ± 1.00", "63.54 ± 1.12", "60.32 ± 1.09")),
        ("podnet", "", "PODNet (CNN)", ("56.19 ± 1.00", "52.53 ± 0.55", "49.14 ± 0.25"),
         ("66.82 ± 1.25", "63.91 ± 1.07", "61.56 ± 1.02")),
        ("ucir_df", "", "UCIR-DF (CNN)", ("39.49 ± 0.81", "25.54 ± 1.51", "9.62 ± 0.73"),
         ("57.82 ± 0.86", "48.69 ± 1.16", "33.33 ± 1.18")),
        ("podnet_df", "", "PODNet-DF (CNN)", ("40.54 ± 1.68", "33.57 ± 2.48", "20.18 ± 0.76"),
         ("56.85 ± 1.40", "52.61 ± 1.72", "43.23 ± 1.70")),
        ("abd", "", "ABD", ("50.55 ± 1.14", "43.65 ± 2.40", "25.27 ± 1.09"),
         ("62.40 ± 1.17", "58.97 ± 1.87", "48.91 ± 1.88")),
        ("rdfcil", "", "R-DFCIL", ("54.76 ± 0.76", "49.70 ± 0.61", "30.01 ± 0.56"),
         ("64.78 ± 1.58", "61.71 ± 1.17", "49.95 ± 0.76")),
    )),
    ("cifar100", "EFC paper", ("n10",), (  # cold start; Ā_N and N = 20: UNVERIFIED
        ("efc", "", "EFC", ("43.6",), None),
    )),
    ("cifar100", "LDC paper", ("n10",), (  # Ā_N: UNVERIFIED
        ("lwf", "ldc", "LwF + LDC", ("45.4",), None),
    )),
    ("cifar100", "Table 6", ("n20",), (  # its full R-DFCIL row is Table 1's (30.75 ± 0.12, 48.47 ± 1.90)
        ("rdfcil", "no_rkd", "R-DFCIL without RKD", ("21.63 ± 5.60",), ("40.86 ± 5.98",)),
        ("rdfcil", "no_hkd", "R-DFCIL without HKD", ("5.37 ± 0.35",), ("20.96 ± 0.69",)),
        ("rdfcil", "no_chr", "R-DFCIL without CHR", ("23.75 ± 0.81",), ("43.09 ± 1.53",)),
    )),
    ("cifar100", "supplement", ("n20",), (
        ("rdfcil", "supplement_full", "R-DFCIL (supplement, one run)", ("30.92",), ("49.47",)),
        ("rdfcil", "rkd_to_hkd", "R-DFCIL, RKD replaced by HKD", ("21.35",), ("40.17",)),
        ("rdfcil", "hkd_to_rkd", "R-DFCIL, HKD replaced by RKD", ("5.81",), ("22.19",)),
    )),
    ("tiny_imagenet200", "Table 3", _EQUAL, (
        ("joint", "", "Upper Bound", ("55.39 ± 0.33",) * 3, None),
        ("abd", "faithful", "ABD*", (None, None, "12.1"), None),
        ("abd", "", "ABD", ("30.56 ± 0.22", "22.87 ± 0.67", "15.20 ± 1.01"),
         ("45.30 ± 0.50", "41.05 ± 0.54", "34.74 ± 0.91")),
        ("rdfcil", "", "R-DFCIL", ("35.89 ± 0.75", "29.58 ± 0.51", "24.43 ± 0.82"),
         ("48.96 ± 0.40", "44.36 ± 0.18", "39.34 ± 0.18")),
    )),
    ("tiny_imagenet200", "Table 4", _T_BASE, (
        ("abd", "", "ABD", ("33.18 ± 0.46", "27.34 ± 0.44", "16.46 ± 0.34"),
         ("44.55 ± 0.13", "41.64 ± 0.46", "34.47 ± 0.29")),
        ("rdfcil", "", "R-DFCIL", ("40.44 ± 0.11", "38.19 ± 0.08", "27.29 ± 0.24"),
         ("48.91 ± 0.29", "47.60 ± 0.50", "40.85 ± 0.28")),
    )),
    ("imagenet100", "Table 5", _EQUAL, (  # one run each, the reference's class order
        ("joint", "", "Upper Bound", ("77.46",) * 3, None),
        ("abd", "", "ABD", ("51.46", "35.96", "22.40"), ("67.42", "57.76", "44.89")),
        ("rdfcil", "", "R-DFCIL", ("53.10", "42.28", "30.28"), ("68.15", "59.10", "47.33")),
    )),
)  # fmt: skip

# Numbers recalled from EFC's and LDC's papers but not checked against them: (dataset, protocol, method, variant)
# → (A_N, Ā_N) as recalled, None where not even recalled. Never compared with a run; the presets' headers and
# docs/reference.md quote them marked as unverified. 43.6 and 45.4 (A_N, N = 10) were checked and are rows above.
UNVERIFIED: dict[tuple[str, str, str, str], tuple[str | None, str | None]] = {
    ("cifar100", "n10", "efc", ""): (None, "58.58"),
    ("cifar100", "n20", "efc", ""): ("32.15", "47.36"),
    ("tiny_imagenet200", "n10", "efc", ""): ("34.10", "47.95"),
    ("tiny_imagenet200", "n20", "efc", ""): ("28.69", "42.07"),
    ("cifar100", "n10", "lwf", "ldc"): (None, "59.5"),
    ("tiny_imagenet200", "n10", "lwf", "ldc"): ("34.2", "46.8"),
}

_NOT_DATA_FREE = {"joint", "dgr", "ucir", "podnet"}  # real old data: all of it, a VAE of it, or exemplars


@dataclasses.dataclass(frozen=True)
class Value:
    """A percentage as the paper prints it."""

    mean: float
    std: float | None  # None: one run
    text: str  # as printed, e.g. "42.37 ± 0.72"

    @classmethod
    def parse(cls, text: str) -> Value:
        mean, _, std = text.partition("±")
        return cls(float(mean), float(std) if std else None, text)


@dataclasses.dataclass(frozen=True)
class PaperRow:
    dataset: str
    protocol: str
    method: str
    variant: str
    label: str  # the paper's row name
    source: str  # "Table 1" ... "Table 6", "supplement", "ABD paper"
    last_acc: Value | None
    avg_inc_acc: Value | None
    data_free: bool
    quoted: bool  # another paper's number, on its own protocol
    own_protocol: str = ""  # that paper's protocol (backbone, schedule, class order), PROTOCOLS; "" for R-DFCIL's

    @property
    def key(self) -> tuple[str, str, str, str]:
        return (self.dataset, self.protocol, self.method, self.variant)


def _build() -> dict[tuple[str, str, str, str], PaperRow]:
    rows: dict[tuple[str, str, str, str], PaperRow] = {}
    for dataset, source, protocols, table in _TABLES:
        for method, variant, label, last, avg in table:
            abd = label.endswith("*") or source == "ABD paper"
            quoted_from = "ABD paper" if abd else source if source in PROTOCOLS else ""
            for i, protocol in enumerate(protocols):
                a_n, a_bar = last[i], avg[i] if avg else None
                if a_n is None and a_bar is None:
                    continue
                row = PaperRow(
                    dataset, protocol, method, variant, label, source,
                    last_acc=Value.parse(a_n) if a_n else None, avg_inc_acc=Value.parse(a_bar) if a_bar else None,
                    data_free=method not in _NOT_DATA_FREE, quoted=bool(quoted_from),
                    own_protocol=PROTOCOLS.get(quoted_from, ""),
                )  # fmt: skip
                assert row.key not in rows, f"paper row {row.key} given twice"
                rows[row.key] = row
    return rows


_ROWS = _build()


def paper_rows() -> tuple[PaperRow, ...]:
    """Every row, in the paper's table order."""
    return tuple(_ROWS.values())


def find_row(dataset: str, protocol: str, method: str, variant: str = "") -> PaperRow | None:
    """The paper's row for an approach in a setting, or None where the paper has none."""
    return _ROWS.get((dataset, protocol, method, variant))


def paper_value(dataset: str, protocol: str, method: str, metric: Metric, variant: str = "") -> Value | None:
    """One number of the paper (``metric``: ``last_acc`` = A_N or ``avg_inc_acc`` = Ā_N), or None."""
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {', '.join(METRICS)}, got {metric!r}")
    row = find_row(dataset, protocol, method, variant)
    return None if row is None else getattr(row, metric)


def protocol_name(num_tasks: int, base_classes: int = 0) -> str:
    """``n10`` for 10 equal tasks, ``b50_n11`` for 50 base classes then 10 equal tasks."""
    return f"b{base_classes}_n{num_tasks}" if base_classes else f"n{num_tasks}"


def variant_of(method: str, settings: dict[str, Any]) -> str:
    """The paper's variant that a method section (``config.yaml``'s ``method``, plain data) runs: ``""`` for the
    approach as published, a key of :data:`VARIANTS`, or several joined with ``+`` (no paper number)."""

    def holds(want: dict[str, Any], have: Any) -> bool:
        if not isinstance(have, dict):
            return False
        return all(holds(v, have.get(k)) if isinstance(v, dict) else have.get(k) == v for k, v in want.items())

    variants = VARIANTS.get(method, {}) | SWITCHES.get(method, {})
    names = [name for name, want in variants.items() if holds(want, settings)]
    parts = {part for name in names for part in PART_OF.get(method, {}).get(name, ())}
    return "+".join(name for name in names if name not in parts)
