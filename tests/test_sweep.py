"""dfcil sweep: planning, naming, GPU packing, restarts (skip, resume, retry) and the SLURM path (submitit's local
executor)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from conftest import StopAfterEpochs
from dfcil.cli import main
from dfcil.errors import ConfigError, RunInterrupted
from dfcil.load import load_config
from dfcil.runs.runner import train
from dfcil.sweep.gpus import default_jobs
from dfcil.sweep.plan import SweepRun, parse_grid, plan, split_values
from dfcil.training.loop import RunOptions
from dfcil.training.state import Interrupt

TINY = ["--train.epochs", "2", "--train.milestones", "[]", "--method.inversion.steps", "2"]  # a few seconds a run


def test_grid_values_split_at_top_level_commas():
    assert split_values("0,1,2") == ["0", "1", "2"]
    assert split_values("[1, 2],[3]") == ["[1, 2]", "[3]"]
    assert split_values("'a,b',c") == ["'a,b'", "c"]
    assert parse_grid(["data.class_order_seed=0,1", "--seed=3"]) == [
        ("data.class_order_seed", ["0", "1"]),
        ("seed", ["3"]),
    ]
    for bad in (["seed"], ["=1,2"], ["seed=1,,2"], ["seed=1", "seed=2"]):
        with pytest.raises(ConfigError):
            parse_grid(bad)


def test_plan_multiplies_configs_and_grid_and_names_runs_by_what_varies():
    runs = plan(
        [["configs/smoke.yaml"], ["configs/smoke.yaml", "configs/cifar100-mini/lwf.yaml"]],
        [("data.class_order_seed", ["0", "1"]), ("train.epochs", ["3"])],
        [("data.root", "somewhere")],
    )
    assert [r.name for r in runs] == [
        "smoke-order0", "smoke-order1", "lwf-order0", "lwf-order1"
    ]  # fmt: skip
    assert runs[2].config["method"]["name"] == "lwf" and runs[3].config["data"]["class_order_seed"] == 1
    assert all(r.config["train"]["epochs"] == 3 for r in runs)  # a one-value grid key applies but does not name
    assert Path(runs[0].config["data"]["root"]).is_absolute()
    argv = runs[3].argv(Path("out/x"))
    assert argv[:3] == ["train", "--config", str(Path("configs/smoke.yaml").absolute())]
    assert argv[argv.index("--data.root") + 1] == str(Path("somewhere").absolute())
    assert argv[-3:] == ["--out", str(Path("out/x").absolute()), "--no-progress"]


def test_plan_refuses_bad_keys_and_clashing_names():
    with pytest.raises(ConfigError, match="smoke.yaml with train.epochz=1: .*epochz"):
        plan([["configs/smoke.yaml"]], [("train.epochz", ["1", "2"])])
    with pytest.raises(ConfigError, match="both be named"):
        plan([["configs/smoke.yaml"]], [("data.root", ["a b", "a_b"])])  # both root=a_b
    with pytest.raises(ConfigError, match="at least one --config"):
        plan([], [])
    # a method's own refusal, before any run starts: LDC's drift settings with LDC switched off
    ldc = ["configs/cifar100-mini10.yaml", "configs/cifar100-mini10/lwf_ldc.yaml"]  # drift.passes 1
    with pytest.raises(ConfigError, match="lwf_ldc.yaml with method.ldc=false: method.drift sets how LDC"):
        plan([ldc], [("method.ldc", ["true", "false"])])


def test_plan_refuses_two_runs_of_one_config_under_two_names(tmp_path):
    """`--grid train.lr=0.1,1e-1,0.05` trained lr=0.1 and lr=1e-1 alike, and the report grouped them as n = 2,
    ± 0.00: equal values written differently are compared as resolved configs, as `seed=1,1` is by name."""
    with pytest.raises(ConfigError, match="runs 'lr0.1' and 'lr1e-1' of the sweep would train the same config"):
        plan([["configs/smoke.yaml"]], [("train.lr", ["0.1", "1e-1", "0.05"])])
    with pytest.raises(ConfigError, match="'seed1' and 'seed.1' .* same config"):
        plan([["configs/smoke.yaml"]], [("seed", ["1", "+1"])])
    copy = tmp_path / "copy.yaml"
    copy.write_text((Path("configs") / "smoke.yaml").read_text())
    with pytest.raises(ConfigError, match="runs 'smoke' and 'copy' .* same config"):
        plan([["configs/smoke.yaml"], [str(copy)]])
    assert len(plan([["configs/smoke.yaml"]], [("train.lr", ["0.1", "0.05"])])) == 2


def test_runs_of_one_method_over_two_datasets_settings_get_names_of_their_own():
    from dfcil.sweep.plan import _config_labels

    groups = [[f"configs/{dataset}/{setting}.yaml", f"configs/{dataset}/rdfcil.yaml"]
              for dataset in ("cifar100", "tiny_imagenet200") for setting in ("n5", "n10")]  # fmt: skip
    assert _config_labels(groups) == [
        "cifar100-n5+rdfcil", "cifar100-n10+rdfcil", "tiny_imagenet200-n5+rdfcil", "tiny_imagenet200-n10+rdfcil"
    ]  # fmt: skip
    assert _config_labels([groups[0], groups[2]]) == ["cifar100-rdfcil", "tiny_imagenet200-rdfcil"]
    assert _config_labels([groups[0], [groups[0][0], "configs/cifar100/abd.yaml"]]) == ["rdfcil", "abd"]


def test_default_jobs_packs_small_runs_by_free_gpu_memory():
    small = SweepRun("a", (), (), {"device": "auto"}, 32)
    large = SweepRun("b", (), (), {"device": "auto"}, 224)
    assert default_jobs([small] * 10, [])[0] == 1  # the CPU: one at a time
    assert default_jobs([small] * 10, [(0, 139.0)])[0] == 6  # at most six per card
    assert default_jobs([small] * 10, [(0, 10.0)])[0] == 3  # 3 GiB each
    assert default_jobs([small] * 10, [(0, 70.0), (1, 70.0)])[0] == 10  # no more than the runs
    assert default_jobs([small, large], [(0, 70.0)])[0] == 2  # the largest run decides: 24 GiB each
    assert default_jobs([small], [(0, 1.0)])[0] == 1  # at least one
    cpu = SweepRun("c", (), (), {"device": "cpu"}, 32)
    assert default_jobs([cpu] * 4, [(0, 139.0)])[0] == 1
    assert "GPU 0: 139 GiB free" in default_jobs([small] * 10, [(0, 139.0)])[1]


def _records(out: Path) -> dict[str, dict]:
    return {r["name"]: r for r in json.loads((out / "sweep.json").read_text())["runs"]}


def _interrupted_seed2(out: Path) -> None:
    """The sweep's seed-2 run in ``out``, stopped after its second epoch: unfinished, for a sweep to resume."""
    tiny = [(k[2:], v) for k, v in zip(TINY[::2], TINY[1::2], strict=True)]
    cfg, _ = load_config(["configs/smoke.yaml"], [*tiny, ("seed", "2")])
    interrupt = Interrupt()
    with pytest.raises(RunInterrupted):
        train(
            cfg,
            out / "seed2",
            options=RunOptions(progress=False, callbacks=[StopAfterEpochs(interrupt, 2)], interrupt=interrupt),
        )


def test_sweep_runs_skips_resumes_and_retries(tmp_path, capsys):
    out = tmp_path / "sweep"
    # seed 2's run is left unfinished by an interrupt: the sweep must resume it, not start it over
    _interrupted_seed2(out)
    assert not (out / "seed2" / "summary.json").exists()

    args = ["sweep", "--config", "configs/smoke.yaml", "--grid", "seed=1,2", "--out", str(out), *TINY]
    assert main([*args, "--dry-run"]) == 0
    shown = capsys.readouterr().out
    assert "seed1 [new]" in shown and "seed2 [unfinished]" in shown
    assert main([*args, "--jobs", "2"]) == 0
    records = _records(out)
    assert records["seed1"]["state"] == "done" and records["seed2"]["state"] == "resumed"
    assert records["seed2"]["result"]["last_acc"] is not None and records["seed1"]["attempts"] == 1
    assert records["seed1"]["config"]["seed"] == 1 and records["seed2"]["config"]["seed"] == 2
    summary = json.loads((out / "seed2" / "summary.json").read_text())
    assert summary["resumed"] is True
    text = capsys.readouterr().out
    assert "seed2: resuming" in text and "| seed1 | done | 1 |" in text

    # again: nothing to do
    assert main(args) == 0
    assert {r["state"] for r in _records(out).values()} == {"skipped"}
    text = capsys.readouterr().out
    assert "2 finished before, skipped" in text
    # runs this invocation did not time show their own time, marked as such (not "—")
    own = json.loads((out / "seed1" / "summary.json").read_text())["total_time_s"]
    assert f"| seed1 | skipped | 0 | {own:.0f}* |" in text and "*: the run's own time" in text

    # a finished run's summary cut short: that run is reported failed with its file and the fix, the other skipped
    summary_file = out / "seed1" / "summary.json"
    whole = summary_file.read_bytes()
    summary_file.write_bytes(whole[: len(whole) // 2])
    assert main(args) == 1
    records = _records(out)
    assert records["seed1"]["state"] == "failed" and records["seed2"]["state"] == "skipped"
    assert f"{summary_file} cannot be read" in records["seed1"]["error"] and "delete" in records["seed1"]["error"]
    text = capsys.readouterr().out
    assert f"seed1: {summary_file} cannot be read" in text and "1 runs failed" in text
    summary_file.write_bytes(whole)

    # another config under the same names is refused before anything runs
    assert main([*args, "--train.batch_size", "16"]) == 2
    assert "holds a run with another config (" in capsys.readouterr().err


@pytest.mark.parametrize("content", [b"", b"[1, 2]", b'{"last_acc": null}', b"\xff\xfe"])
def test_a_run_that_ends_without_a_readable_summary_is_failed_not_a_traceback(tmp_path, content):
    """A run's process that exits 0 but leaves a summary.json that cannot be read (cut, not a summary, not UTF-8):
    the sweep records it failed, naming the file, and does not try it again."""
    from dfcil.sweep.plan import SweepRun
    from dfcil.sweep.state import Sweep

    run = SweepRun("r", ("configs/smoke.yaml",), (), {}, 16, attempts=1)
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "summary.json").write_bytes(content)
    sweep = Sweep(tmp_path, [run], ["dfcil", "sweep"], "local")
    sweep.finished(run, ok=True, seconds=1.0, error=None, resumed=False)
    assert run.state == "failed" and run.result is None
    assert str(tmp_path / "r" / "summary.json") in run.error


def test_a_config_file_edited_while_the_sweep_runs_changes_none_of_its_runs(tmp_path, monkeypatch, capsys):
    """A run's process trains the config the sweep planned, not what its config file says when the run starts
    (a later run of a long sweep, or a queued SLURM job): here the file is edited after planning, just before the
    run's process starts; the run trains the planned batch size."""
    import shutil

    from dfcil.sweep.local import LocalRuns

    config = tmp_path / "mine.yaml"
    shutil.copy("configs/smoke.yaml", config)
    original_start = LocalRuns.start

    def start(self, run):
        config.write_text(config.read_text().replace("batch_size: 32", "batch_size: 16"))
        original_start(self, run)

    monkeypatch.setattr(LocalRuns, "start", start)
    out = tmp_path / "sweep"
    args = ["sweep", "--config", str(config), "--grid", "seed=2", "--out", str(out), *TINY]
    assert main(args) == 0 and "batch_size: 16" in config.read_text()
    saved = load_config([out / "mine" / "config.yaml"])[0]
    assert saved.train.batch_size == 32 and saved.train.epochs == 2 and saved.seed == 2
    planned = out / "logs" / "mine.config.yaml"
    assert f"dfcil train --config {planned} --out" in (out / "logs" / "mine.log").read_text()
    capsys.readouterr()
    # the sweep again: its run holds the config planned before the edit, which the file no longer gives
    assert main(args) == 2
    assert "holds a run with another config (train.batch_size" in capsys.readouterr().err


def test_a_crashing_run_is_retried_once_a_refused_one_is_not(tmp_path, capsys):
    """A run that crashes (here a method raising in its step: exit 1) may not crash again, so the sweep tries it a
    second time; bad input (exit 2: no dataset) fails the same way again, so it is reported at once."""
    out = tmp_path / "sweep"
    crashing = tmp_path / "crashing.py"
    crashing.write_text(
        "from dfcil.config import MethodConfig, configclass\n"
        "from dfcil.methods import register_method\n"
        "from dfcil.methods.lifecycle import TeacherMethod\n\n\n"
        "@configclass\nclass CrashingConfig(MethodConfig):\n    name: str = 'crashing'\n\n\n"
        "@register_method('crashing')\nclass Crashing(TeacherMethod):\n    Config = CrashingConfig\n\n"
        "    def training_step(self, net, batch, ctx, phase):\n        raise RuntimeError('boom')\n"
    )
    args = ["sweep", "--config", "configs/smoke.yaml", "--method.name", "crashing", "--plugin", str(crashing)]
    assert main([*args, "--out", str(out)]) == 1  # it fails at its first step
    record = _records(out)["smoke"]
    assert record["state"] == "failed" and record["attempts"] == 2 and "exit 1" in record["error"]
    text = capsys.readouterr().out
    assert "failed (exit 1" in text and "retrying" in text and "1 runs failed" in text

    out = tmp_path / "refused"
    code = main(
        ["sweep", "--config", "configs/cifar100-mini.yaml", "--data.root", str(tmp_path / "nowhere"), "--out", str(out)]
    )
    assert code == 1
    record = _records(out)["cifar100-mini"]
    assert record["state"] == "failed" and record["attempts"] == 1
    assert "cifar100" in record["error"] and "exit 2" in record["error"]
    assert not (out / "cifar100-mini").exists()  # a run that failed before its first checkpoint leaves nothing
    text = capsys.readouterr().out
    assert "failed (exit 2" in text and "retrying" not in text and "1 runs failed" in text

    out = tmp_path / "diverged"  # a diverged training (exit 3) diverges again from its last checkpoint
    args = ["sweep", "--config", "configs/smoke.yaml", "--train.max_loss", "1e-6", "--out", str(out), *TINY]
    assert main(args) == 1
    record = _records(out)["smoke"]
    assert record["state"] == "failed" and record["attempts"] == 1 and "exit 3" in record["error"]
    assert "above train.max_loss" in record["error"]


def test_slurm_launcher_through_submitits_local_executor(tmp_path, capsys):
    pytest.importorskip("submitit")
    out = tmp_path / "sweep"
    args = ["sweep", "--config", "configs/smoke.yaml", "--grid", "seed=3", "--out", str(out), *TINY]
    assert main([*args, "--launcher", "slurm", "--slurm.cluster", "local", "--slurm.timeout_min", "10"]) == 0
    record = _records(out)["smoke"]
    assert record["state"] == "done" and record["job_id"] and record["result"]["last_acc"] is not None
    assert (out / "smoke" / "summary.json").exists() and list((out / "slurm").iterdir())
    assert f"submitted as job {record['job_id']}" in capsys.readouterr().out


def test_runs_go_to_cards_with_room_and_to_the_devices_this_process_sees(monkeypatch):
    from dfcil.sweep.gpus import placement, visible_device

    assert placement([(0, 80.0), (1, 0.5)], 3.0, 7) == [0] * 6 + [0]  # six fit on card 0, none on the full one
    assert placement([(0, 9.0), (1, 9.0)], 3.0, 4) == [0, 1, 0, 1]
    assert placement([(0, 3.0), (1, 3.0)], 3.0, 4) == [0, 1, 0, 1]  # an explicit --jobs beyond capacity
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert [visible_device(i) for i in (0, 1)] == ["2", "3"]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert visible_device(1) == "1"


def test_sweep_refuses_bad_out_dirs_reserved_names_and_unknown_loggers(tmp_path, capsys):
    base = ["sweep", "--config", "configs/smoke.yaml"]
    (tmp_path / "file").write_text("x")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("x")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.yaml").write_text("x")
    for out, why in (("file", "is a file"), ("other", "other things than this sweep"), ("run", "is a run directory")):
        for dry in ([], ["--dry-run"]):  # a dry run refuses what the sweep would refuse
            assert main([*base, "--out", str(tmp_path / out), *dry]) == 2
            assert why in capsys.readouterr().err
    assert main([*base, "--out", str(tmp_path / "new"), "--jobs", "0", "--dry-run"]) == 2
    assert "--jobs 0: give at least 1" in capsys.readouterr().err
    assert main([*base, "--log", "cvs", "--out", str(tmp_path / "new")]) == 2
    assert "unknown logger 'cvs'" in capsys.readouterr().err
    (tmp_path / "logs.yaml").write_text(Path("configs/smoke.yaml").read_text())
    assert main(["sweep", "--config", str(tmp_path / "logs.yaml"), "--out", str(tmp_path / "new")]) == 2
    assert "the sweep's own folder" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()


def test_log_names_reach_each_run_as_dfcil_train_takes_them():
    runs = plan([["configs/smoke.yaml"]], [], [("log", '["csv", "tensorboard"]')])
    argv = runs[0].argv(Path("x"))
    assert argv[argv.index("--log") + 1] == "csv,tensorboard"
    assert "--log" not in plan([["configs/smoke.yaml"]])[0].argv(Path("x"))


@pytest.mark.slow
def test_slurm_launcher_starts_a_run_of_two_processes_under_torchrun(tmp_path):
    """--slurm.procs 2: the job starts torchrun with two processes (gloo on this CPU); one run, written once."""
    pytest.importorskip("submitit")
    out = tmp_path / "sweep"
    args = ["sweep", "--config", "configs/smoke.yaml", "--grid", "seed=3", "--out", str(out), *TINY, "--device", "cpu"]
    slurm = ["--launcher", "slurm", "--slurm.cluster", "local", "--slurm.procs", "2", "--slurm.gpus_per_node", "0"]
    assert main([*args, *slurm, "--slurm.timeout_min", "10"]) == 0
    record = _records(out)["smoke"]
    assert record["state"] == "done" and record["result"]["last_acc"] is not None
    lines = (out / "smoke" / "metrics.jsonl").read_text().splitlines()
    assert len([x for x in lines if '"type": "task"' in x]) == 2  # two tasks, each recorded once
    assert json.loads((out / "smoke" / "meta.json").read_text())["processes"] == 2


def _saved_run(out: Path, name: str, files: list[str], overrides: list[tuple[str, str]]) -> None:
    """A run directory as `dfcil train` leaves it before its first checkpoint: its config.yaml."""
    from dfcil.config import dump_config, with_absolute_paths

    (out / name).mkdir(parents=True)
    (out / name / "config.yaml").write_text(dump_config(with_absolute_paths(load_config(files, overrides)[0])))


def test_a_sweep_that_would_train_existing_runs_again_under_new_names_is_refused(tmp_path, capsys):
    """Run names come from what varies: adding a config renames 'seed=1' to 'smoke-seed=1'. Without the check
    the finished runs trained again beside the old ones, and a report counted both."""
    out = tmp_path / "sweep"
    for seed in (1, 2):
        _saved_run(out, f"seed={seed}", ["configs/smoke.yaml"], [("seed", str(seed))])
    (out / "sweep.json").write_text(json.dumps({"format": 1, "runs": []}))
    other = tmp_path / "other.yaml"
    other.write_text("train:\n  batch_size: 16\n")
    args = ["sweep", "--config", "configs/smoke.yaml", "--config", f"configs/smoke.yaml+{other}", "--grid", "seed=1,2"]
    assert main([*args, "--out", str(out), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert f"{out / 'seed=1'} already holds the run this sweep names 'smoke-seed1'" in err and "--out" in err
    # the same configs under the names they had are fine, and so is a sweep of other configs sharing the directory
    assert main(["sweep", "--config", "configs/smoke.yaml", "--grid", "seed=1,2", "--out", str(out), "--dry-run"]) == 0
    own = tmp_path / "own"
    folder = [("data.name", "folder"), ("data.root", str(tmp_path / "flowers")), ("seed", "1")]
    _saved_run(own, "flowers", ["configs/smoke.yaml"], folder)
    (own / "sweep.json").write_text(json.dumps({"format": 1, "runs": []}))
    birds = ["--data.name", "folder", "--data.root", str(tmp_path / "birds"), "--grid", "seed=1,2"]
    assert main(["sweep", "--config", "configs/smoke.yaml", *birds, "--out", str(own), "--dry-run"]) == 0
    same = ["--data.name", "folder", "--data.root", str(tmp_path / "flowers"), "--grid", "seed=1,2"]
    assert main(["sweep", "--config", "configs/smoke.yaml", *same, "--out", str(own), "--dry-run"]) == 2
    assert main(["sweep", "--config", str(other), "--out", str(out), "--dry-run"]) == 0


def test_run_names_say_what_varies_without_equals_signs():
    from dfcil.sweep.plan import name_part

    assert [name_part(k, v) for k, v in [("class_order_seed", "0"), ("seed", "2"), ("name", "finetune")]] == [
        "order0", "seed2", "finetune"
    ]  # fmt: skip
    assert name_part("lambda_hkd", "0.5") == "lambda_hkd0.5" and name_part("ldc", "true") == "ldc_true"
    assert name_part("method.drift.init", "identity") == "method.drift.init_identity"
    runs = plan([["configs/smoke.yaml"]], [("method.name", ["finetune", "lwf"]), ("data.class_order_seed", ["0", "1"])])
    assert [r.name for r in runs] == ["finetune-order0", "finetune-order1", "lwf-order0", "lwf-order1"]
    assert runs[0].earlier_name == "name=finetune-class_order_seed=0"


def test_a_sweep_made_with_the_earlier_names_keeps_resuming_under_them(tmp_path, capsys):
    """Sweeps made before run names lost their '=' keep their directories: a run found under its earlier name
    is that run (resumed or skipped there, not trained again beside it); runs added since get the new names."""
    out = tmp_path / "sweep"
    _saved_run(out, "seed=1", ["configs/smoke.yaml"], [("seed", "1")])
    (out / "sweep.json").write_text(json.dumps({"format": 1, "runs": [{"name": "seed=1", "state": "interrupted"}]}))
    args = ["sweep", "--config", "configs/smoke.yaml", "--grid", "seed=1,2,3", "--out", str(out), "--dry-run"]
    assert main(args) == 0
    shown = capsys.readouterr().out
    assert "1 runs keep the names an earlier dfcil gave them (key=value)" in shown
    assert "seed=1 [unfinished]" in shown and "seed2 [new]" in shown and "seed3 [new]" in shown
    assert f"--out {out / 'seed=1'}" in shown and "seed1 [" not in shown


def test_sweep_json_keeps_the_records_of_runs_another_sweep_planned(tmp_path):
    """Two sweeps of other configs into one directory (names that do not clash): the second one's sweep.json still
    lists the first one's runs, with their results."""
    from dfcil.sweep.state import Sweep

    out = tmp_path / "sweep"
    out.mkdir()
    earlier = {"name": "finetune", "state": "done", "result": {"last_acc": 5.5}, "config": {"seed": 1}}
    (out / "sweep.json").write_text(json.dumps({"format": 1, "runs": [earlier]}))
    runs = plan([["configs/smoke.yaml"]])
    sweep = Sweep(out, runs, ["dfcil", "sweep"], "local")
    sweep.save()
    records = _records(out)
    assert records["finetune"] == earlier and set(records) == {"finetune", runs[0].name}


def test_an_unreadable_sweep_json_is_said_not_silently_replaced(tmp_path, capsys):
    from dfcil.sweep.state import Sweep

    (tmp_path / "sweep.json").write_text("{not json")
    Sweep(tmp_path, plan([["configs/smoke.yaml"]]), ["dfcil", "sweep"], "local")
    assert "sweep.json cannot be read (JSONDecodeError" in capsys.readouterr().err


def test_the_renamed_run_check_skips_what_it_cannot_read_and_tells_own_data_folders_apart(tmp_path):
    """Another sweep's run this dfcil cannot read is not a duplicate; on own data the same config over another
    folder is another run, not a renamed one."""
    out = tmp_path / "sweep"
    _saved_run(out, "seed=1", ["configs/smoke.yaml"], [("seed", "1")])
    (out / "foreign").mkdir()
    (out / "foreign" / "config.yaml").write_text("method: {name: no_such_method}\n")
    (out / "sweep.json").write_text(json.dumps({"format": 1, "runs": []}))
    assert main(["sweep", "--config", "configs/smoke.yaml", "--grid", "seed=1,2", "--out", str(out), "--dry-run"]) == 0


@pytest.mark.parametrize("value", ["..", "."])
def test_a_grid_value_that_would_name_a_run_dot_or_dot_dot_is_refused_before_any_run(tmp_path, capsys, value):
    """A ``name`` key's value is a run's whole name when it alone varies: ``..`` would be the sweep directory's
    parent, ``.`` the sweep directory itself."""
    with pytest.raises(ConfigError, match=rf"--grid wandb.name={value} would name a run {value!r}"):
        plan([["configs/smoke.yaml"]], [("wandb.name", [value, "b"])])
    out = tmp_path / "sweep" / "x"
    argv = ["sweep", "--config", "configs/smoke.yaml", "--grid", f"wandb.name=b,{value}", "--out", str(out)]
    for dry in (["--dry-run"], []):
        assert main([*argv, *dry]) == 2
        assert "give another value" in capsys.readouterr().err
    assert not (tmp_path / "sweep").exists()
    assert [r.name for r in plan([["configs/smoke.yaml"]], [("wandb.name", [f"{value}a", "b"])])] == [f"{value}a", "b"]


@pytest.mark.parametrize(("cores", "jobs", "said"), [(2, 2, "CPU, 1 thread"), (4, 2, "CPU, 2 threads"), (2, 1, "CPU")])
def test_a_cpu_run_is_told_its_share_of_the_cores_in_words(monkeypatch, tmp_path, cores, jobs, said):
    import dfcil.sweep.local as local

    monkeypatch.setattr(local, "usable_cores", lambda: cores)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    runs = local.LocalRuns(type("Sweep", (), {"out": tmp_path})(), jobs, [])
    env, where = runs._environment(None, 0)
    assert where == said and env.get("OMP_NUM_THREADS") == (str(cores // jobs) if jobs > 1 else None)


def test_a_hard_linked_copy_of_a_sweep_resumes_without_writing_into_the_original(tmp_path, capsys):
    """`cp -al SWEEP COPY` shares every file: before, the copy's sweep appended to the original's run logs."""
    from test_run_dir_writes import _snapshot

    out, copy = tmp_path / "sweep", tmp_path / "copy"
    _interrupted_seed2(out)
    (out / "logs").mkdir()
    (out / "logs" / "seed2.log").write_text("the original sweep's lines\n")
    shutil.copytree(out, copy, copy_function=os.link)
    before = _snapshot(out)
    assert main(["sweep", "--config", "configs/smoke.yaml", "--grid", "seed=1,2", "--out", str(copy), *TINY]) == 0
    assert _records(copy)["seed2"]["state"] == "resumed" and _snapshot(out) == before
    assert (copy / "logs" / "seed2.log").read_text().startswith("the original sweep's lines\n--- attempt 1")
