"""The paper's numbers (dfcil.analysis.paper): values as printed, and every number of docs/reference.md covered. That
each preset's header states the number a report finds for its config is tests/test_presets.py's."""

import re

import pytest

from conftest import REPO
from dfcil.analysis.paper import (
    PROTOCOLS,
    UNVERIFIED,
    Value,
    find_row,
    paper_rows,
    paper_value,
    protocol_name,
    variant_of,
)


@pytest.mark.parametrize(
    ("key", "metric", "mean", "std", "source"),
    [
        (("cifar100", "n5", "rdfcil"), "last_acc", 50.47, 0.43, "Table 1"),
        (("cifar100", "n20", "rdfcil"), "avg_inc_acc", 48.47, 1.90, "Table 1"),
        (("cifar100", "n10", "joint"), "last_acc", 70.67, 0.16, "Table 1"),
        (("cifar100", "n10", "lwf"), "last_acc", 9.20, 0.00, "Table 1"),
        (("cifar100", "n20", "abd", "faithful"), "last_acc", 20.00, 1.40, "Table 1"),
        (("cifar100", "b50_n26", "ucir_df"), "avg_inc_acc", 33.33, 1.18, "Table 2"),
        (("cifar100", "b50_n11", "podnet"), "last_acc", 52.53, 0.55, "Table 2"),
        (("tiny_imagenet200", "n20", "abd", "faithful"), "last_acc", 12.1, None, "Table 3"),
        (("tiny_imagenet200", "b100_n11", "rdfcil"), "last_acc", 38.19, 0.08, "Table 4"),
        (("imagenet100", "n20", "abd"), "avg_inc_acc", 44.89, None, "Table 5"),
        (("imagenet100", "n5", "joint"), "last_acc", 77.46, None, "Table 5"),
        (("cifar100", "n20", "rdfcil", "no_rkd"), "last_acc", 21.63, 5.60, "Table 6"),
        (("cifar100", "n20", "rdfcil", "no_chr"), "avg_inc_acc", 43.09, 1.53, "Table 6"),
        (("cifar100", "n20", "rdfcil", "hkd_to_rkd"), "avg_inc_acc", 22.19, None, "supplement"),
        (("cifar100", "n5", "lwf_mc"), "last_acc", 32.5, 1.0, "ABD paper"),
    ],
)
def test_entries_are_the_numbers_of_docs_reference(key, metric, mean, std, source):
    value = paper_value(*key[:3], metric, *key[3:])
    assert (value.mean, value.std) == (pytest.approx(mean), std if std is None else pytest.approx(std))
    assert find_row(*key).source == source


def test_rows_say_what_they_are():
    assert find_row("cifar100", "n5", "dgr").quoted and not find_row("cifar100", "n5", "dgr").data_free
    assert find_row("cifar100", "b50_n6", "ucir").data_free is False
    assert not find_row("cifar100", "n5", "abd").quoted and find_row("cifar100", "n5", "abd", "faithful").quoted
    assert find_row("cifar100", "n5", "joint").avg_inc_acc is None  # the upper bound has A_N only
    assert find_row("tiny_imagenet200", "n5", "abd", "faithful") is None  # "–" in Table 3
    assert find_row("cifar100", "b50_n6", "joint") is None and find_row("imagenet100", "n5", "finetune") is None
    assert Value.parse("9.20 ± 0.00") == Value(9.2, 0.0, "9.20 ± 0.00")
    with pytest.raises(ValueError, match="metric"):
        paper_value("cifar100", "n5", "rdfcil", "forgetting")


def test_other_papers_rows_are_their_own_protocol_and_hold_only_checked_numbers():
    """EFC's and LDC's checked numbers are rows, quoted with their paper's protocol (as ABD's paper's rows); what was
    only recalled stays out of the table."""
    efc, ldc = find_row("cifar100", "n10", "efc"), find_row("cifar100", "n10", "lwf", "ldc")
    assert (efc.last_acc.text, efc.avg_inc_acc, efc.source, efc.label) == ("43.6", None, "EFC paper", "EFC")
    assert (ldc.last_acc.text, ldc.avg_inc_acc, ldc.source, ldc.label) == ("45.4", None, "LDC paper", "LwF + LDC")
    assert efc.quoted and efc.data_free and efc.own_protocol == PROTOCOLS["EFC paper"]
    assert "ResNet-18 (d = 512), 100 epochs per task" in efc.own_protocol and "its own class order" in efc.own_protocol
    assert ldc.quoted and "ResNet-18" in ldc.own_protocol and "200 epochs in the first task" in ldc.own_protocol
    assert find_row("cifar100", "n10", "lwf").own_protocol == PROTOCOLS["ABD paper"]  # LwF*, from ABD's paper
    assert find_row("cifar100", "n5", "lwf_mc").own_protocol == PROTOCOLS["ABD paper"]
    assert find_row("cifar100", "n10", "rdfcil").own_protocol == "" and not find_row("cifar100", "n10", "abd").quoted
    assert not any(r.method == "fecam" for r in paper_rows())  # FeCAM's authors give no cold-start number
    for (dataset, protocol, method, variant), recalled in UNVERIFIED.items():
        row = find_row(dataset, protocol, method, variant)
        held = () if row is None else (row.last_acc, row.avg_inc_acc)
        assert all(v is None or h is None for v, h in zip(recalled, held or (None, None), strict=True))
    assert find_row("cifar100", "n20", "efc") is None and find_row("tiny_imagenet200", "n10", "efc") is None


def _reference_section() -> str:
    text = (REPO / "docs" / "reference.md").read_text()
    return text[text.index("## Paper numbers") :].split("\n## ")[0]


def test_every_number_of_the_reference_page_is_in_the_table():
    section = _reference_section()
    texts = {v.text for r in paper_rows() for v in (r.last_acc, r.avg_inc_acc) if v is not None}
    means = {v.mean for r in paper_rows() for v in (r.last_acc, r.avg_inc_acc) if v is not None}
    with_std = re.findall(r"\d+\.\d+ ± \d+\.\d+", section)
    assert len(with_std) > 100 and set(with_std) <= texts
    # single runs: Tables 3-5's numbers without a std, and the supplement's paragraph
    tables = re.sub(r"\d+\.\d+ ± \d+\.\d+", "", section[section.index("**Tables 3–5") : section.index("**Table 6")])
    supplement = section[section.index("Supplement, single runs") :].split("\n\n")[0]
    single = {float(x) for x in re.findall(r"\d+\.\d+", tables + supplement)}
    assert {12.1, 77.46, 53.10, 44.89, 30.92, 49.47, 21.35, 5.81} <= single <= means
    assert len(single) == 20
    # other papers: the checked numbers (✓) are rows, the unverified ones UNVERIFIED's, and nothing else is said
    others = section[section.index("**Other papers' numbers") :]
    checked = {float(x) for x in re.findall(r"(\d+\.\d+) ✓", others)}
    unverified = {float(x) for x in re.findall(r"(\d+\.\d+) unverified", others)}
    assert checked == {r.last_acc.mean for r in paper_rows() if r.source in ("EFC paper", "LDC paper")}
    assert unverified == {float(v) for pair in UNVERIFIED.values() for v in pair if v is not None}


def test_protocol_names_and_variants():
    assert protocol_name(10) == "n10" and protocol_name(11, 50) == "b50_n11"
    assert variant_of("rdfcil", {"new_kd": "none", "old_kd": "hkd", "chr_epochs": 40}) == "no_rkd"
    assert variant_of("rdfcil", {"new_kd": "none", "old_kd": "none"}) == "no_rkd+no_hkd"  # no paper row
    assert variant_of("rdfcil", {"new_kd": "crcd"}) == "rkd_to_crcd"  # the supplement gives no row of it
    assert find_row("cifar100", "n20", "rdfcil", "rkd_to_crd") is None
    assert variant_of("abd", {"inversion": {"persistent": True, "steps": 10000}}) == "faithful"
    assert variant_of("rdfcil", {"new_kd": "rkd", "chr_epochs": 3}) == "" and variant_of("lwf", {}) == ""
    assert variant_of("lwf", {"lambda_kd": 10.0, "ldc": True}) == "ldc" and variant_of("lwf", {"ldc": False}) == ""
    # LDC's own LwF is the LDC paper's "ldc"; its switches alone are another LwF than R-DFCIL's table's
    assert variant_of("lwf", {"ldc": True, "head": "cosine", "ce": "local"}) == "ldc"
    assert variant_of("lwf", {"head": "cosine", "ce": "seen"}) == "cosine"
    assert variant_of("lwf", {"head": "cosine", "ce": "local"}) == "cosine+local_ce"


def test_rdfcil_with_ldc_is_its_own_variant_with_no_paper_number():
    from dfcil.analysis.paper import paper_value, variant_of

    assert variant_of("rdfcil", {"ldc": True, "chr_epochs": 40}) == "ldc"
    assert variant_of("rdfcil", {"ldc": False}) == ""
    assert paper_value("cifar100", "n10", "rdfcil", "last_acc", "ldc") is None
    assert variant_of("lwf", {"ldc": True}) == "ldc" and paper_value("cifar100", "n10", "lwf", "last_acc", "ldc")
