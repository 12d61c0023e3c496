"""A run killed during its final writes (after the last checkpoint: model.pt, then summary.json) and finished by
``dfcil resume`` ends as the uninterrupted run: ``dfcil eval`` of its ``model.pt`` equals its ``summary.json`` for
every kind of state a method classifies with (the network's head, LDC's class means, FeCAM's and AdaGauss's
Gaussians, DPCR's ridge head)."""

import json
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

from conftest import smoke_configs
from dfcil.analysis.tools import evaluate_run
from dfcil.checkpoint import loads
from dfcil.cli import main

# the method families by what they classify with; each trains its smoke preset
FAMILIES = {
    "head": ["--method.name", "finetune"],
    "class_means": ["--method.name", "rdfcil", "--method.ldc", "true"],
    "class_statistics": ["--method.name", "fecam"],
    "gaussians": ["--method.name", "adagauss"],
    "ridge_head": ["--method.name", "dpcr"],
}
VOLATILE = {"timings", "wall_time_s", "total_time_s", "resumed", "run_id"}  # run_id: each run its own


def _argv(family, out):
    method = FAMILIES[family][1]
    configs = [a for c in smoke_configs(method) for a in ("--config", str(c))]
    return ["train", *configs, *FAMILIES[family], "--out", str(out), "--no-progress"]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """One uninterrupted smoke run per family, trained once for the module: copy it before changing it."""
    runs = {}

    def get(family):
        if family not in runs:
            out = tmp_path_factory.mktemp(family) / "run"
            assert main(_argv(family, out)) == 0
            runs[family] = out
        return runs[family]

    return get


def _summary(run):
    return {k: v for k, v in json.loads((run / "summary.json").read_text()).items() if k not in VOLATILE}


def _last_row(run):
    return json.loads((run / "summary.json").read_text())["correct_matrix"][-1]


def _model(run):
    return loads((run / "model.pt").read_bytes())


def assert_same_model(a, b):
    ma, mb = _model(a), _model(b)
    assert ma["net"].keys() == mb["net"].keys()
    assert all(torch.equal(ma["net"][k], mb["net"][k]) for k in ma["net"])
    sa, sb = ma.get("method_state", {}), mb.get("method_state", {})
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]) if isinstance(sa[k], torch.Tensor) else sa[k] == sb[k], k


def assert_finished_as(reference, run):
    """``run``, finished by a resume, is ``reference``: the summary, model.pt's weights and method state, and what
    ``dfcil eval`` computes from model.pt, which equals the summary's last row."""
    assert _summary(run) == _summary(reference)
    assert_same_model(reference, run)
    report = evaluate_run(run)
    assert [t["correct"] for t in report["tasks"]] == _last_row(run)
    assert report["acc"] == pytest.approx(json.loads((run / "summary.json").read_text())["last_acc"])


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("lost", ["summary", pytest.param("model_and_summary", marks=pytest.mark.slow)])
def test_a_run_finished_from_its_last_checkpoint_keeps_the_methods_classifier(finished, tmp_path, family, lost):
    """The process died after the last checkpoint: before summary.json was in place, or before model.pt was too.
    The resume writes both again from the checkpoint; model.pt holds the method's state as the run left it."""
    reference = finished(family)
    run = tmp_path / "run"
    shutil.copytree(reference, run)
    (run / "summary.json").unlink()
    if lost == "model_and_summary":
        (run / "model.pt").unlink()
    assert main(["resume", str(run), "--no-progress"]) == 0
    assert json.loads((run / "summary.json").read_text())["resumed"] is True
    assert_finished_as(reference, run)


# A process killed at one of the final writes: os._exit leaves what a SIGKILL leaves (no cleanup, no finally)
KILLER = textwrap.dedent(
    """
    import os, sys
    from pathlib import Path
    from dfcil.checkpoint import Checkpointer
    where = sys.argv[1]
    if where == "after_last_checkpoint":
        save = Checkpointer.save
        def save_then_die(self, payload, *args):
            save(self, payload, *args)
            if payload["position"]["task"] == 2:  # the checkpoint after the last task (the smoke preset has 2)
                os._exit(137)
        Checkpointer.save = save_then_die
    else:  # model.pt or summary.json: its temporary file written whole, killed before the rename
        replace = os.replace
        def replace_or_die(src, dst, *args, **kwargs):
            if Path(dst).name == where:
                os._exit(137)
            return replace(src, dst, *args, **kwargs)
        os.replace = replace_or_die
    from dfcil.cli import main
    sys.exit(main(sys.argv[2:]))
    """
)


@pytest.mark.parametrize("where", ["after_last_checkpoint", "model.pt", "summary.json"])
def test_a_process_killed_at_each_final_write_resumes_to_the_same_result(finished, tmp_path, where):
    reference = finished("ridge_head")
    run = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-c", KILLER, where, *_argv("ridge_head", run)], capture_output=True)
    assert proc.returncode == 137, proc.stderr.decode()
    assert not (run / "summary.json").exists()
    assert (run / "model.pt").exists() == (where == "summary.json")
    assert main(["resume", str(run), "--no-progress"]) == 0
    assert_finished_as(reference, run)
    assert not list(run.glob(".*.tmp"))  # the killed process's temporary file is removed


def test_a_finished_run_without_its_model_file_says_how_to_write_it_again(finished, tmp_path, capsys):
    """model.pt deleted from a finished run (or not copied with it): `dfcil eval` said "finish the run first (`dfcil
    resume`)", which refuses a finished run; it now gives the command that writes model.pt again from the last
    checkpoint, which works as given."""
    reference = finished("ridge_head")
    run = tmp_path / "run"
    shutil.copytree(reference, run)
    (run / "model.pt").unlink()
    capsys.readouterr()  # the fixture's training log
    assert main(["eval", str(run)]) == 2
    err = capsys.readouterr().err
    command = f"mv {run}/summary.json {run}/summary.old.json && dfcil resume {run}"
    assert "the run finished (summary.json exists)" in err and command in err and err.count("\n") == 1
    (run / "summary.json").rename(run / "summary.old.json")
    assert main(["resume", str(run), "--no-progress"]) == 0
    assert_finished_as(reference, run)
    shutil.rmtree(run / "checkpoints")  # without them, only a copy from elsewhere brings it back
    (run / "model.pt").unlink()
    assert main(["eval", str(run)]) == 2
    assert "copy it from where the run was trained" in capsys.readouterr().err
