"""A new user's rough edges (issue 67, part 3): a dry run that lists every problem at once and never tells its user
to run a dry run, milestone suggestions that fit the phases at hand and fractions that collapse onto one epoch,
``dfcil inspect`` without the plot extra, skip reasons that say how to provide the data, a device as --config."""

from __future__ import annotations

import ast
import re
import stat
import sys
from pathlib import Path

import pytest

from conftest import CONFIGS, REPO
from dfcil import context
from dfcil.cli import main

SMOKE = str(CONFIGS / "smoke.yaml")


@pytest.fixture(scope="module")
def cifar_layout(tmp_path_factory) -> Path:
    from test_readme import _fake_cifar_root

    return _fake_cifar_root(tmp_path_factory.mktemp("cifar") / "DATA")


def suggested(err: str) -> str:
    """The ``train.milestones: [...]`` a refusal suggests."""
    found = re.findall(r"train\.milestones: (\[[^\]]*\])", err)
    assert len(set(found)) == 1, err
    return found[0]


# ------------------------------------------------------------------------------------ a dry run lists them all


def test_a_dry_run_lists_the_methods_problem_and_the_schedules_at_once(cifar_layout, capsys):
    """2 epochs of cifar100-mini: its 3 CHR epochs do not fit (the method refuses), and neither do its milestones
    [8, 11]; one dry run names both, and does not tell its user to run a dry run."""
    args = ["train", "--config", "cifar100-mini", "--data.root", str(cifar_layout), "--train.epochs", "2"]
    assert main([*args, "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dfcil: error: 2 problems") and err.count("\n  ") == 2, err
    assert "method.chr_epochs (3) must be smaller than train.epochs (2)" in err
    assert "milestones [8, 11]" in err and "reach 8" in err
    assert "--dry-run" not in err
    assert main(args) == 2  # a real run refuses the same, before it starts
    assert "2 problems" in capsys.readouterr().err


def test_every_phase_with_a_late_milestone_is_named_once_with_the_others_of_its_length(capsys):
    args = ["train", "--config", SMOKE, "--train.epochs", "10", "--method.chr_epochs", "2", "--data.num_tasks", "3"]
    assert main([*args, "--train.milestones", "[6, 8]", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.count("dfcil: error:") == 1 and "problems" not in err  # one cause, one problem
    assert "the base phase of task 0 lasts 8 epochs, but its lr milestones [6, 8]" in err
    assert "The rrl phase of tasks 1, 2 is the same." in err and "--dry-run" not in err


def test_a_method_switch_in_a_dry_run_does_not_suggest_a_dry_run(capsys):
    assert main(["train", "--config", SMOKE, "--method.name", "efc", "--dry-run"]) == 0
    err = capsys.readouterr().err
    assert "efc does not read train.lr" in err and "--dry-run" not in err


# ------------------------------------------------------------------------------ milestones that fit the phases


@pytest.mark.parametrize(
    ("epochs", "chr_epochs", "milestones", "count"),
    [
        ("6", "3", "[8, 11]", 2),  # 3-epoch phases: [0.5, 0.75] would give epochs 2, 2
        ("4", "2", "[8, 11]", 1),  # 2-epoch phases: room for one milestone only
        ("3", "2", "[8, 11]", 0),  # 1-epoch phases: none
        ("5", "2", "[0.5, 0.75]", 2),  # fractions collapsing onto one epoch (3-epoch phases: 2, 2)
    ],
)
def test_the_suggested_milestones_fit_the_phases_at_hand(capsys, epochs, chr_epochs, milestones, count):
    args = ["train", "--config", SMOKE, "--train.epochs", epochs, "--method.chr_epochs", chr_epochs, "--dry-run"]
    assert main([*args, "--train.milestones", milestones]) == 2
    err = capsys.readouterr().err
    fix = suggested(err)
    fractions = tuple(eval(fix))  # noqa: S307 - a list of numbers the test just read
    phase = int(epochs) - int(chr_epochs)
    assert len(fractions) == count, err
    assert all(0 < m < phase for m in context.milestone_epochs(fractions, phase))
    assert len(set(context.milestone_epochs(fractions, phase))) == count, fix  # [0.5, 0.75] of 3 epochs: 2, 2
    if count < 2:
        assert f"a phase of {phase} epoch" in err.lower() and "cannot have" in err, err
    if milestones.startswith("[0."):
        assert "fall on one epoch" in err and "epochs [2, 2]" in err, err
    assert main([*args, "--train.milestones", fix]) == 0, capsys.readouterr().err  # the fix runs


def test_the_dry_run_refuses_fractions_that_collapse_rather_than_print_them(capsys):
    """[0.5, 0.75] of a 3-epoch phase are epochs 2 and 2: the lr would drop twice at once (Phase.lr_at counts each
    milestone), which the dry run printed as "at epochs 2, 2" without a word."""
    phase = context.Phase("rrl", 3, 0.1, (0.5, 0.75))
    assert phase.milestones == (2, 2) and phase.lr_at(2) == pytest.approx(0.001)  # what a run would do
    args = ["train", "--config", SMOKE, "--train.epochs", "4", "--method.chr_epochs", "1", "--dry-run"]
    assert main([*args, "--train.milestones", "[0.5, 0.75]"]) == 2
    captured = capsys.readouterr()
    assert "at epochs 2, 2" not in captured.out and "lower the lr twice at once" in captured.err


@pytest.mark.parametrize("lengths", [{3}, {4}, {5}, {2, 3}, {3, 160}, set(range(3, 300))])
def test_fitting_fractions_give_distinct_milestones_inside_every_phase(lengths):
    fitting_fractions, milestone_epochs = context.fitting_fractions, context.milestone_epochs
    fractions = fitting_fractions(lengths, 2)
    assert fractions is not None and len(fractions) == 2 or min(lengths) < 3
    if fractions is not None:
        for epochs in lengths:
            m = milestone_epochs(fractions, epochs)
            assert 1 <= m[0] < m[1] < epochs, (fractions, epochs, m)
    assert fitting_fractions({3, 160}, 2) != (0.5, 0.75) and fitting_fractions({160}, 2) == (0.5, 0.75)
    assert fitting_fractions({2}, 2) is None and fitting_fractions({2}, 1) == (0.5,)
    assert fitting_fractions({1}, 1) is None


# ------------------------------------------------------------------------------ inspect without the plot extra


def test_inspect_without_threadpoolctl_says_how_to_install_it_before_any_work(smoke_run, tmp_path, capsys, monkeypatch):
    pytest.importorskip("sklearn.manifold")  # scikit-learn installed, its dependency threadpoolctl not
    from dfcil.analysis.tools import FinishedRun

    opened = []
    monkeypatch.setattr(FinishedRun, "open", lambda *a, **k: opened.append(a) or pytest.fail("work started"))
    monkeypatch.setitem(sys.modules, "threadpoolctl", None)  # import fails as if absent
    assert main(["inspect", str(smoke_run), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "needs threadpoolctl" in err and "pip install 'dfcil[plot]'" in err
    assert not opened and not (tmp_path / "out").exists()


# ------------------------------------------------------------------------------------------- skip reasons


def skip_reasons() -> list[tuple[str, str]]:
    """(test file, text) of every skip reason the tests give: ``reason=`` arguments and ``pytest.skip`` messages."""
    found = []
    for path in sorted((REPO / "tests").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            texts = [k.value for k in node.keywords if k.arg == "reason"]
            if isinstance(node.func, ast.Attribute) and node.func.attr == "skip" and node.args:
                texts.append(node.args[0])
            found += [(path.name, ast.unparse(t)) for t in texts]
    return found


def test_no_skip_reason_names_a_path_outside_the_project():
    reasons = skip_reasons()
    assert len(reasons) > 5
    outside = [(f, r) for f, r in reasons if "../" in r or "shared/data" in r]
    assert not outside, outside


def test_the_tiny_imagenet_subset_is_found_by_its_variable_and_the_skip_says_so(tmp_path, monkeypatch):
    from conftest import shared_tiny_subset

    monkeypatch.setenv("DFCIL_TINY_SUBSET", str(tmp_path / "sub.zip"))
    assert shared_tiny_subset() == tmp_path / "sub.zip"
    monkeypatch.delenv("DFCIL_TINY_SUBSET")
    beside = REPO.parent / "shared" / "data" / "tiny-imagenet-200" / "tiny-imagenet-200-sub100.zip"
    assert shared_tiny_subset() == beside  # where the developers keep it, as before
    from test_images import test_the_real_tiny_imagenet_subset_parses as needs_it

    reason = next(m.kwargs["reason"] for m in needs_it.pytestmark if m.name == "skipif")
    assert "DFCIL_TINY_SUBSET" in reason and "../" not in reason, reason


# --------------------------------------------------------------------------------------- a device as --config


@pytest.mark.skipif(not Path("/dev/null").exists(), reason="no /dev/null on this platform")
def test_a_character_device_as_config_is_said_to_be_no_regular_file(capsys):
    assert stat.S_ISCHR(Path("/dev/null").stat().st_mode)
    assert main(["train", "--config", "/dev/null", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "config file '/dev/null' is a character device, not a regular file; give a .yaml file" in err
    assert "does not exist" not in err
