import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from conftest import CONFIGS
from dfcil.cli import main
from dfcil.load import build_config, load_config
from dfcil.training.loop import RunOptions

SMOKE = str(CONFIGS / "smoke.yaml")


def test_smoke_run_writes_a_consistent_run_directory(smoke_run):
    """The session's shared smoke run (conftest: trained with --log csv --log tensorboard, whose files are the
    loggers')."""
    assert sorted(p.name for p in smoke_run.iterdir()) == [
        ".lock", "checkpoints", "config.yaml", "meta.json", "metrics.csv", "metrics.jsonl", "model.pt", "run.log",
        "summary.json", "synthetic_task1.png", "tasks.csv", "tensorboard",
    ]  # fmt: skip
    assert sorted(p.name for p in (smoke_run / "checkpoints").iterdir()) == [
        "boundary.pt",
        "last.pt",
        "prev.pt",
        "task1-static.pt",
    ]
    s = json.loads((smoke_run / "summary.json").read_text())
    n = len(s["tasks"])
    assert n == 2 and s["task_sizes"] == [5, 5] and len(s["class_order"]) == 10
    m = np.array(s["accuracy_matrix"], dtype=float)  # None (above the diagonal) → nan
    assert m.shape == (n, n) and np.isnan(m[np.triu_indices(n, 1)]).all() and not np.isnan(np.tril(m)).any()
    assert s["last_acc"] == s["acc_per_task"][-1]
    assert s["avg_inc_acc"] == pytest.approx(np.mean(s["acc_per_task"]), abs=1e-3)
    correct, count = np.array(s["correct_matrix"]), np.array(s["count_matrix"])
    assert s["acc_per_task"][1] == pytest.approx(100 * correct[1].sum() / count[1].sum(), abs=1e-3)
    assert count[1].tolist() == [80, 80]  # 16 test images × 5 classes per task
    assert 0 <= s["last_acc"] <= 100 and s["acc_per_task"][0] > 20  # task 0 learns something (chance is 20%)


def test_smoke_run_records_and_config(smoke_run):
    records = [json.loads(line) for line in (smoke_run / "metrics.jsonl").read_text().splitlines()]
    epochs = [r for r in records if r["type"] == "epoch"]
    tasks = [r for r in records if r["type"] == "task"]
    assert [(r["task"], r["phase"]) for r in epochs] == [(0, "base"), (0, "base"), (1, "rrl"), (1, "rrl"), (1, "chr")]
    assert set(epochs[2]["loss"]) == {"lce", "hkd", "rkd"} and set(epochs[4]["loss"]) == {"gce", "hkd"}
    assert [r["lr"] for r in epochs] == pytest.approx([0.1, 0.01, 0.1, 0.01, 0.005])  # x0.1 at each phase's epoch 1
    assert [r["task"] for r in tasks] == [0, 1]
    summary = json.loads((smoke_run / "summary.json").read_text())
    assert summary["format"] == 1 and summary["dfcil"] == __import__("dfcil").__version__
    for r in tasks:  # a report can rebuild the matrices from the task records alone (an unfinished run's too)
        assert r["correct_row"] == summary["correct_matrix"][r["task"]][: r["task"] + 1]
        assert r["count_row"] == summary["count_matrix"][r["task"]][: r["task"] + 1]
    saved = build_config(yaml.safe_load((smoke_run / "config.yaml").read_text()))
    assert saved == load_config([SMOKE], [("log", "[csv, tensorboard]")])[0]  # the session run logs both
    meta = json.loads((smoke_run / "meta.json").read_text())
    assert {"git_sha", "torch", "device", "argv"} <= set(meta)
    assert meta["cpu"] == meta["device_name"] and f"{os.cpu_count()} CPUs" in meta["cpu"]  # the machine, in words
    assert "task 1: accuracy on 10 seen classes" in (smoke_run / "run.log").read_text()


# That a rerun of a config gives the same run is tests/test_tools.py::test_the_grids_and_loggers_leave_the_results_
# unchanged (the bare engine's run against the shared smoke run).


def test_module_entry_point_and_method_list():
    out = subprocess.run([sys.executable, "-m", "dfcil", "methods"], capture_output=True, text=True, check=True)
    names = [line.split()[0] for line in out.stdout.splitlines() if line.strip()]
    assert "rdfcil" in names and "finetune" in names


def test_every_declared_switch_is_a_config_key_that_changes_what_the_method_keeps():
    from dfcil.catalogue import builtin_entries, switch_entries
    from dfcil.config import TrainConfig
    from dfcil.methods import METHODS, build_method
    from dfcil.stores import STORES, SWITCHES

    switches = switch_entries(builtin_entries())
    assert [(s.key, s.methods) for s in switches] == [("ldc", ("lwf", "rdfcil"))]
    for switch in switches:
        assert switch.stores in STORES and switch.summary == SWITCHES[switch.key]
        for name in switch.methods:
            off = build_method(METHODS.get(name).Config(), TrainConfig())
            on = build_method(METHODS.get(name).Config(**{switch.key: True}), TrainConfig())
            assert (off.stores, on.stores) == (METHODS.get(name).info.stores, switch.stores), (switch.key, name)


def test_the_dataset_listing_aligns_its_summaries_past_the_longest_name(capsys):
    """tiny_imagenet200 is longer than the other names: every summary still starts in one column."""
    assert main(["datasets"]) == 0
    lines = capsys.readouterr().out.splitlines()
    starts = {len(line) - len(line.split(maxsplit=1)[1]) for line in lines}
    assert len(starts) == 1 and min(len(line.split()[0]) for line in lines) < starts.pop() - 2


def test_the_method_listing_says_what_each_method_keeps_and_which_are_data_free(capsys):
    """A column of what each method keeps between tasks, aligned past the longest name and value; the methods that
    keep data or a generator of it are marked."""
    assert main(["methods"]) == 0
    out = capsys.readouterr().out
    table, switches = out.split("\n\nswitches that change what a method keeps:\n")
    rows = {line.split()[0]: line for line in table.splitlines()[1:]}
    assert out.splitlines()[0].split() == ["method", "keeps", "between", "tasks", "summary"]
    assert switches.splitlines()[0].startswith("  method.ldc true (lwf, rdfcil): keeps class statistics. LDC")
    assert "class statistics" in rows["efc"] and "class statistics" in rows["rdfcil_plus"]
    assert len({row.index(row.split()[1]) for row in rows.values()}) == 1  # one column
    assert "all data" in rows["joint"] and rows["joint"].endswith("[not data-free]")
    assert "generator " in rows["dgr"] and rows["dgr"].endswith("[not data-free]")
    assert "synthesizer per task" in rows["rdfcil"] and "nothing" in rows["lwf"] and "not data-free" not in rows["lwf"]


def test_a_method_that_says_it_stores_something_unknown_is_refused():
    from dfcil.errors import RegistryError
    from dfcil.methods import Method, register_method

    class Hoarder(Method):
        pass

    with pytest.raises(RegistryError, match="method 'hoarder': stores = 'exemplars' is not one of 'nothing'"):
        register_method("hoarder", stores="exemplars")(Hoarder)


def test_an_empty_out_is_refused_not_taken_for_the_current_directory(tmp_path, capsys, monkeypatch):
    """``--out ""`` (a shell variable left unset) would write into the current directory, or under a default
    name: each command refuses it before doing anything."""
    monkeypatch.chdir(tmp_path)
    for args in (
        ["train", "--config", SMOKE, "--out", ""],
        ["sweep", "--config", SMOKE, "--out", " "],
        ["export", "somerun", "--out", ""],
        ["inspect", "somerun", "--out", ""],
        ["report", "runs", "--plots", ""],
    ):
        assert main(args) == 2, args
        option = "--plots" if "--plots" in args else "--out"
        assert f"dfcil: error: {option} is empty; give a path" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_dry_run_prints_the_protocol_and_writes_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = ["train", "--config", SMOKE, "--dry-run", "--data.num_tasks", "3", "--data.base_classes", "4"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "classes per task [4, 3, 3]" in out and "class order: [7, 8, 1, 5, 3, 4, 2, 0, 9, 6]" in out
    rrl = "rrl 2 ep, lr 0.1 ×0.1 at epochs 1, sgd momentum 0.9, wd 0.0005"
    assert f"task 1: 3 classes, 144 train / 48 test images; {rrl}; chr 1 ep, lr 0.005 constant, head only" in out
    assert list(tmp_path.iterdir()) == []
    assert main([*args[:-4], "--data.num_tasks", "10"]) == 0  # a class per task
    assert "task 9: 1 class, " in capsys.readouterr().out


def test_print_config(capsys):
    assert main(["train", "--config", SMOKE, "--print-config", "--train.epochs=4", "--device", "cpu"]) == 0
    cfg = yaml.safe_load(capsys.readouterr().out)
    assert cfg["train"]["epochs"] == 4 and cfg["device"] == "cpu" and cfg["method"]["name"] == "rdfcil"
    # a config that cannot run is refused as --dry-run refuses it, not printed as if it could (a new-user probe)
    assert main(["train", "--config", SMOKE, "--print-config", "--device", "cdua"]) == 2
    assert "device: 'cdua' is not a device" in capsys.readouterr().err


def test_an_image_size_a_method_cannot_train_is_refused_before_task_0(tmp_path, capsys):
    """DGR's VAE takes 32×32 images only: a 16-pixel dataset is one error line before anything trains."""
    out = tmp_path / "run"
    dgr = str(CONFIGS / "smoke" / "dgr.yaml")
    assert main(["train", "--config", SMOKE, "--config", dgr, "--data.image_size", "16", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    (line,) = [line for line in err.splitlines() if "error" in line]  # (after the overlay's "method switched" note)
    assert line.startswith("dfcil: error: dgr's VAE is defined for 32×32 images, not 16×16")
    assert "--data.image_size 32" in err and not out.exists()
    # and a size no generator is built for, for a method that inverts one
    assert main(["train", "--config", SMOKE, "--data.image_size", "12", "--out", str(out)]) == 2
    assert capsys.readouterr().err.startswith("dfcil: error: no generator for 12-pixel images") and not out.exists()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--data.name", "cifar100", "--data.root", "{tmp}/empty"], "CIFAR-100 not found under data root"),
        (["--data.name", "cifar100", "--data.root", "{tmp}/corrupt"], "corrupt or not an .npz"),
        (["--train.epoks", "2"], "unknown config key 'train.epoks'. Did you mean 'train.epochs'?"),
        (["--data.num_tasks", "3", "--data.base_classes", "5"], "5 remaining classes are not divisible by 2"),
        (["--method.name", "rdfcl"], "unknown method 'rdfcl'. Did you mean 'rdfcil'?"),
        (["--method.name", "RDFCIL"], "unknown method 'RDFCIL'. Did you mean 'rdfcil'?"),
        (["--train.batch_size", "500"], "fewer than train.batch_size=500"),
        (["--method.chr_epochs", "3"], "chr_epochs (3) must be smaller than train.epochs (3)"),
        (["--device", "cuda:7"] if not __import__("torch").cuda.is_available() else ["--device", "tpu"], "device"),
        (["--bogus"], "unrecognised argument '--bogus'"),
        (["--model.backbone", "resnet99"], "unknown backbone 'resnet99'"),
        (["--method.name", "[1]"], "method.name must be a method's name"),
        (["--task0_cache", "{tmp}/afile"], "task0_cache {tmp}/afile exists and is not a directory"),
        (["--out", "{tmp}/afile/run"], "run directory {tmp}/afile/run cannot be created"),
        (["--out", "{tmp}/readonly"], "run directory {tmp}/readonly is not writable"),
        (["--task0_cache", "{tmp}/readonly"], "task0_cache {tmp}/readonly is not writable"),
        (["--device", "meta"], "device: 'meta' is not supported (dfcil trains on cpu and cuda)"),
        (["--train.milestones", "[50]"], "reach 50: a milestone there never lowers the lr"),
    ],
)
def test_bad_input_fails_clearly_and_leaves_no_run_directory(tmp_path, capsys, monkeypatch, extra, message):
    import dfcil.io

    readonly = tmp_path / "readonly"
    readonly.mkdir()
    real_access = dfcil.io.os.access  # the tests may run as root, whom os.access lets write anywhere
    monkeypatch.setattr(
        dfcil.io.os, "access", lambda p, mode: not (Path(p) == readonly and mode & os.W_OK) and real_access(p, mode)
    )
    corrupt = tmp_path / "corrupt" / "cifar100"
    corrupt.mkdir(parents=True)
    (corrupt / "train.npz").write_bytes(b"not a zip")
    (corrupt / "test.npz").write_bytes(b"not a zip")
    (tmp_path / "afile").write_text("a file, not a directory")
    out = tmp_path / "run"
    args = ["train", "--config", SMOKE, "--out", str(out)] + [a.replace("{tmp}", str(tmp_path)) for a in extra]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message.replace("{tmp}", str(tmp_path)) in err and err.startswith("dfcil: error:")
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["afile", "corrupt", "readonly"]
    assert not any(readonly.iterdir())


def test_compile_without_a_compiler_for_the_device_is_refused_before_the_run_starts(tmp_path, capsys, monkeypatch):
    import torch._inductor.cpp_builder as cpp_builder
    from torch._inductor.exc import InvalidCxxCompiler

    def no_compiler():
        raise InvalidCxxCompiler  # what inductor raises at the first compiled step without g++ or $CXX

    monkeypatch.setattr(cpp_builder, "get_cpp_compiler", no_compiler)
    out = tmp_path / "run"
    assert main(["train", "--config", SMOKE, "--out", str(out), "--device", "cpu", "--engine.compile", "default"]) == 2
    err = capsys.readouterr().err
    assert "engine.compile needs a C++ compiler on the CPU" in err and "engine.compile: none" in err
    assert not out.exists()


def test_a_run_that_fails_before_its_first_checkpoint_leaves_nothing(tmp_path):
    from dfcil.load import load_config
    from dfcil.runs.runner import train
    from dfcil.training.callbacks import Callback

    class Fails(Callback):
        def on_task_start(self, info):
            raise RuntimeError("boom")

    cfg, _ = load_config([SMOKE])
    for out in (tmp_path / "new", tmp_path / "empty"):
        (tmp_path / "empty").mkdir(exist_ok=True)
        with pytest.raises(RuntimeError, match="boom"):
            train(cfg, out, options=RunOptions(progress=False, callbacks=[Fails()]))
        # an empty --out given: emptied again, but for its lock file (removing a lock another process may hold
        # open would let two processes lock the directory); a later run may use the directory all the same
        assert not out.exists() if out.name == "new" else [p.name for p in out.iterdir()] == [".lock"]
    train(cfg, tmp_path / "empty", options=RunOptions(progress=False))
    assert (tmp_path / "empty" / "summary.json").exists()


def test_existing_run_directory_is_not_overwritten(smoke_run, capsys):
    """The same command again on its finished run (a quick start run twice): nothing trained, nothing changed, and
    no error (it exited 2); another config on it is refused."""
    before = {p.name: p.read_bytes() for p in smoke_run.iterdir() if p.is_file()}
    capsys.readouterr()
    argv = ["train", "--config", SMOKE, "--out", str(smoke_run), "--log", "csv", "--log", "tensorboard"]
    assert main(argv) == 0
    said = capsys.readouterr().err
    assert "holds this run, finished (summary.json exists, A_N " in said and f"`dfcil eval {smoke_run}`" in said
    assert {p.name: p.read_bytes() for p in smoke_run.iterdir() if p.is_file()} == before
    assert main([*argv, "--train.epochs", "4"]) == 2
    assert (
        "holds a finished run with a different config (train.epochs); choose another --out" in capsys.readouterr().err
    )


def test_tiny_run_on_real_cifar(cifar_root, tmp_path):
    out = tmp_path / "cifar"
    args = ["train", "--config", SMOKE, "--out", str(out), "--data.name", "cifar100", "--data.root", str(cifar_root)]
    args += ["--data.num_classes", "4", "--data.train_per_class", "40", "--data.test_per_class", "20"]
    assert main(args) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["tasks"] == [[23, 8], [11, 7]] and s["count_matrix"][1] == [40, 40]


def test_the_saved_model_reproduces_the_last_accuracy_row(smoke_run):
    """model.pt rebuilds the final network (load_model); evaluating it apart from the engine (all test images of
    the seen classes, normalised by hand) gives the summary's last row of correct counts."""
    from dfcil.load import load_config
    from dfcil.model_file import load_model
    from dfcil.training.protocol import prepare

    cfg = load_config([smoke_run / "config.yaml"])[0]
    protocol = prepare(cfg)
    net = load_model(smoke_run / "model.pt")
    split, test = protocol.split, protocol.dataset.test
    lut = torch.as_tensor(split.label_map(protocol.dataset.num_classes))
    x = torch.as_tensor(test.x).permute(0, 3, 1, 2).float() / 255
    mean, std = (torch.tensor(v)[:, None, None] for v in (protocol.dataset.mean, protocol.dataset.std))
    labels = lut[torch.as_tensor(test.y)]
    seen = labels >= 0
    with torch.no_grad():
        pred = net((x[seen] - mean) / std).logits.argmax(dim=1)
    correct = [
        int(((pred == labels[seen]) & (torch.as_tensor(split.task_of_label())[labels[seen]] == t)).sum())
        for t in range(split.num_tasks)
    ]
    summary = json.loads((smoke_run / "summary.json").read_text())
    assert correct == summary["correct_matrix"][-1]


def test_a_yaml_bomb_and_a_huge_value_get_one_short_line(tmp_path, capsys):
    """A 1 KB config whose aliases expand to 10^9 values is refused at once, before anything walks it; an error
    about a value does not echo a long value in full."""
    import time

    from test_report import BOMB

    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(BOMB)
    t0 = time.perf_counter()
    assert main(["train", "--config", str(bomb), "--print-config"]) == 2
    assert time.perf_counter() - t0 < 5
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "aliases" in err and str(bomb) in err
    long = tmp_path / "long.yaml"
    long.write_text("train:\n  epochs: " + "9" * 50 + "x" * 100_000 + "\n")
    assert main(["train", "--config", str(long), "--print-config"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "train.epochs" in err and "(100052 characters)" in err and len(err) < 400
    assert main(["train", "--config", str(CONFIGS / "smoke.yaml"), "--data.class_order", BOMB.split(": ", 3)[-1]]) == 2
    assert "command-line value" in capsys.readouterr().err


def test_a_milestone_past_its_phase_is_refused_and_the_dry_run_prints_every_schedule(capsys):
    """R-DFCIL's RRL phase is train.epochs - method.chr_epochs long: a milestone at 8 of a 10-epoch schedule with 2
    CHR epochs would never fire. The dry run shows every phase's lr schedule."""
    args = ["train", "--config", SMOKE, "--train.epochs", "10", "--method.chr_epochs", "2", "--dry-run"]
    assert main([*args, "--train.milestones", "[6, 8]"]) == 2
    err = capsys.readouterr().err
    assert "the base phase of task 0 lasts 8 epochs, but its lr milestones [6, 8]" in err and "below 8" in err
    assert main([*args, "--train.milestones", "[6, 7]"]) == 0
    out = capsys.readouterr().out
    assert "base 8 ep, lr 0.1 ×0.1 at epochs 6, 7, sgd momentum 0.9, wd 0.0005;" in out
    rrl = "rrl 8 ep, lr 0.1 ×0.1 at epochs 6, 7, sgd momentum 0.9, wd 0.0005"
    assert f"{rrl}; chr 2 ep, lr 0.005 constant, head only, sgd momentum 0.9, wd 0.0005;" in out


def test_a_key_of_the_method_switched_away_from_is_named_as_such(capsys):
    preset = ["--config", str(CONFIGS / "cifar100" / "n5.yaml"), "--config", str(CONFIGS / "cifar100" / "rdfcil.yaml")]
    args = ["train", *preset, "--method.name", "finetune", "--method.chr_epochs", "3", "--print-config"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--method.chr_epochs: a setting of rdfcil, the method of the config files" in err
    assert "drop --method.chr_epochs" in err
    assert main(["train", *preset, "--method.name", "lwf", "--method.lambda_kd", "2", "--print-config"]) == 0


# ------------------------------------------------------------------------------------ listing, pipes, --help


def test_the_method_listing_read_from_source_equals_the_registry():
    """``dfcil methods`` reads the built-in methods from their source (no torch): every entry must be the one the
    imported class gives, so a docstring, a name or a fact changed in a method file shows in the listing."""
    from dfcil.catalogue import builtin_entries, entry_of
    from dfcil.methods import METHODS

    builtin = [METHODS.get(n) for n in METHODS.names() if METHODS.get(n).__module__.startswith("dfcil.methods.")]
    assert builtin_entries() == [entry_of(cls) for cls in builtin]
    assert len(builtin) >= 10


TOY_PACKAGE = {
    "__init__.py": "from dfcil.methods import kept, plain  # noqa: F401\nfrom dfcil.methods.base import Method\n",
    "kept.py": (
        "from dfcil.methods.base import Method\n\n\n"
        '@register_method("kept", stores="all data", graph_safe=True)\nclass Kept(Method):\n    """Keeps real data.\n\n'
        '    More text."""\n'
    ),
    "plain.py": (
        "from dfcil.methods.base import Method\n\n\n"
        '@register_method("plain", switches={"ldc": "class statistics"})\nclass Plain(Method):\n    """Plain."""\n\n\n'
        "class NotRegistered(Method):\n    pass\n"
    ),
    "unlisted.py": '@register_method("unlisted")\nclass Unlisted:\n    """Not imported by __init__."""\n',
}


def test_the_source_reader_reads_the_registration_and_refuses_a_computed_fact(tmp_path):
    from dfcil.catalogue import MethodEntry, builtin_entries

    for name, text in TOY_PACKAGE.items():
        (tmp_path / name).write_text(text)
    assert builtin_entries(tmp_path) == [
        MethodEntry("kept", "Keeps real data.", stores="all data"),
        MethodEntry("plain", "Plain.", stores="nothing", switches=(("ldc", "class statistics"),)),  # the default
    ]
    (tmp_path / "plain.py").write_text(TOY_PACKAGE["plain.py"].replace('switches={"ldc": "class statistics"}',
                                                                       "stores=str(0)"))  # fmt: skip
    with pytest.raises(ValueError, match=r"plain.py:4: stores of @register_method must be a literal"):
        builtin_entries(tmp_path)


def test_a_summary_that_wraps_over_source_lines_is_listed_whole():
    """A docstring's summary is its first paragraph: one that wraps is listed on one line, not cut at the wrap."""
    from dfcil.catalogue import _summary

    doc = "Alpha: beta,\n    gamma and delta.\n\n    Details that are not the summary."
    assert _summary(doc) == "Alpha: beta, gamma and delta."
    assert _summary("One line.") == "One line." and _summary(None) == ""


def test_a_fact_set_as_a_class_attribute_is_refused_with_where_to_declare_it():
    """A method's facts are declared once, in its registration; a class attribute (a plugin written for an earlier
    dfcil) would be a second source that the listing cannot read."""
    from dfcil.errors import RegistryError
    from dfcil.methods import METHODS, Method, register_method

    class Old(Method):
        stores = "all data"

    said = r"Old sets stores as class attributes; declare them once, .*: @register_method\('old_style', stores='all dat"
    with pytest.raises(RegistryError, match=said):
        register_method("old_style")(Old)
    with pytest.raises(RegistryError, match="unknown facts \\['graph_sfe'\\]"):
        register_method("typo", graph_sfe=True)
    assert "old_style" not in METHODS.names()


def test_the_listing_commands_and_help_do_not_import_torch():
    """The guard behind `dfcil --help`, `dfcil methods` and `dfcil datasets` starting in well under a second and
    a half: none of them imports torch, matplotlib or the methods (benchmarks/archive/startup.py times them)."""
    code = (
        "import contextlib, io, sys\n"
        "from dfcil.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
        "    assert main(['methods']) == 0 and main(['datasets']) == 0\n"
        "    with contextlib.suppress(SystemExit):\n"
        "        main(['--help'])\n"
        "heavy = sorted(m for m in ('torch', 'matplotlib', 'dfcil.methods') if m in sys.modules)\n"
        "print(heavy, out.getvalue().count('[not data-free]'))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split("\n")[0] == "[] 2"  # joint and dgr


@pytest.mark.parametrize(
    "command", [["methods"], ["train", "--config", SMOKE, "--dry-run"]], ids=["methods", "train-dry-run"]
)
def test_a_reader_that_goes_away_ends_the_command_quietly(command):
    """`dfcil ... | head -1`: the reader closes the pipe. The test closes it before the command writes (a reader
    that waits for the first line would get the whole output, which fits in the pipe's buffer, and close too
    late to matter); the command must exit 141 (128 + SIGPIPE) with nothing on stderr about the pipe."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "dfcil", *command], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 141, err
    assert "Traceback" not in err and "BrokenPipeError" not in err and "Exception ignored" not in err


def test_inspect_without_a_mode_plots_the_features(monkeypatch, capsys):
    import dfcil.analysis.features

    calls = []
    monkeypatch.setattr(
        dfcil.analysis.features, "inspect_features", lambda *args, **_: calls.append(args) or ("table", ["plot.png"])
    )
    assert main(["inspect", "RUN", "--per-class", "3"]) == 0
    assert calls and calls[0][:2] == ("RUN", None) and calls[0][4].per_class == 3 and calls[0][-1] is None
    assert calls[0][4].embedding == "joint"
    assert capsys.readouterr().out == "table\nplot.png\n"


def test_export_lists_its_formats_from_the_export_registry(capsys):
    from dfcil.analysis.tools import EXPORT_FORMATS

    with pytest.raises(SystemExit, match="0"):
        main(["export", "--help"])
    assert f"one of: {', '.join(EXPORT_FORMATS.names())}" in " ".join(capsys.readouterr().out.split())


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    from dfcil.cli import _build_parser

    parser = _build_parser()
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices


@pytest.mark.parametrize("command", sorted(_subcommands()))
def test_every_argument_of_every_command_has_help(command, capsys):
    parser = _subcommands()[command]
    missing = [a.option_strings or a.metavar or a.dest for a in parser._actions if not a.help]
    assert missing == []
    with pytest.raises(SystemExit, match="0"):
        main([command, "--help"])
    helped = " ".join(capsys.readouterr().out.split())
    shown = [a for a in parser._actions if a.help != argparse.SUPPRESS and "%(" not in a.help]
    assert [a.dest for a in shown if " ".join(a.help.split()) not in helped] == []


def test_an_out_that_is_not_a_run_directory_is_refused_and_left_as_it_was(tmp_path, capsys):
    """--out at a folder of the user's: one holding other files, or another tool's config.yaml (a Hydra config),
    is refused in one line naming --out; nothing in it changes."""
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.txt").write_text("keep")
    assert main(["train", "--config", SMOKE, "--out", str(folder), "--no-progress"]) == 2
    assert "exists and is not a dfcil run directory (no config.yaml); choose another --out" in capsys.readouterr().err
    (folder / "config.yaml").write_text("defaults:\n  - model: resnet\n")
    assert main(["train", "--config", SMOKE, "--out", str(folder), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"--out {folder} holds a config.yaml that dfcil cannot use (" in err and err.count("\n") == 1
    assert sorted(p.name for p in folder.iterdir()) == ["config.yaml", "notes.txt"]
    assert (folder / "config.yaml").read_text() == "defaults:\n  - model: resnet\n"


def test_a_full_disk_is_one_clear_error_that_says_how_to_go_on(monkeypatch, capsys):
    import errno

    import dfcil.cli

    def full(args):
        raise OSError(errno.ENOSPC, "No space left on device", "/data/cache/cifar100/train.x")

    monkeypatch.setitem(dfcil.cli.COMMANDS, "methods", full)
    assert main(["methods"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dfcil: error: no space left on the disk writing /data/cache/cifar100/train.x") and (
        "run the same command again" in err and err.count("\n") == 1
    )

    def other(args):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setitem(dfcil.cli.COMMANDS, "methods", other)
    with pytest.raises(PermissionError):  # other OS errors are not dressed up as this one
        main(["methods"])


def test_a_dry_run_names_every_problem_of_the_protocol_and_the_schedule_at_once(tmp_path, capsys):
    from test_images import write_folder

    root = write_folder(tmp_path / "data", classes=("a", "b", "c", "d"), train=15, test=2)
    base = ["train", "--config", str(CONFIGS / "own-data.yaml"), "--data.root", str(root),
            "--data.cache", str(tmp_path / "cache"), "--data.image_size", "32", "--dry-run"]  # fmt: skip
    # the shrinking of issue 49: 5 tasks for 4 classes, a batch of 128 for 60 images, milestones [80, 120] for 3
    # epochs, and R-DFCIL's 40 CHR epochs: one refusal that lists them all, each with its fix (the schedule's too,
    # against the train section's 3 epochs while the method refuses its CHR epochs; issue 67)
    assert main([*base, "--train.epochs", "3"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dfcil: error: 4 problems") and err.count("\n  ") == 4
    for text in ("chr_epochs (40) must be smaller", "set data.num_tasks to 4 or fewer", "all 60 training images",
                 "train.epochs is 3", "milestones [80, 120]"):  # fmt: skip
        assert text in err
    assert main([*base, "--train.epochs", "3", "--method.chr_epochs", "1"]) == 2  # the method's phases now
    err = capsys.readouterr().err
    assert "3 problems" in err and "milestones [80, 120]" in err and "--dry-run" not in err  # the user runs one
    assert "a phase of 2 epochs cannot have two milestones" in err.lower() and "train.milestones: [0.5]" in err
    fixed = ["--train.epochs", "3", "--method.chr_epochs", "1", "--data.num_tasks", "2", "--train.batch_size", "10"]
    assert main([*base, *fixed, "--train.milestones", "[0.5]"]) == 0  # the fractions follow the shortened phases
    out = capsys.readouterr().out
    assert "milestones:  [0.5] of each phase" in out and "rrl 2 ep, lr 0.1 ×0.1 at epochs 1" in out


def test_switching_to_a_method_with_its_own_optimiser_says_which_train_keys_it_does_not_read(capsys):
    assert main(["train", "--config", SMOKE, "--method.name", "efc", "--dry-run"]) == 0
    err = capsys.readouterr().err
    assert "method switched to 'efc'" in err and "efc does not read train.lr, train.momentum, train.weight_decay" in err
    assert main(["train", "--config", SMOKE, "--method.name", "finetune", "--dry-run"]) == 0
    assert "does not read" not in capsys.readouterr().err  # fine-tuning's phases read the whole train section


SLOW_COMMAND = """
import sys, time
from pathlib import Path
from dfcil import cli

def slow(args):
    Path(sys.argv[1]).write_text("ready")
    time.sleep(60)
    return 0

cli.COMMANDS["datasets"] = slow
sys.exit(cli.main(["datasets"]))
"""


@pytest.mark.skipif(os.name != "posix", reason="a POSIX shell's background job")
def test_a_command_started_in_the_background_of_a_script_stops_on_sigint(tmp_path):
    """A non-interactive shell starts `cmd &` with SIGINT ignored; dfcil puts the default back, so kill -INT (or
    Ctrl-C) stops it as in the foreground: exit 130, "interrupted", long before the command's minute is up."""
    ready = tmp_path / "ready"
    (tmp_path / "slow.py").write_text(SLOW_COMMAND)
    script = (
        f'"{sys.executable}" slow.py ready 2> err.txt & pid=$!\n'
        "for i in $(seq 300); do [ -e ready ] && break; sleep 0.1; done\n"
        'kill -INT "$pid"; wait "$pid"; echo "status $?"\n'
    )
    started = time.monotonic()
    done = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert ready.exists(), done.stderr
    assert done.stdout.strip() == "status 130" and time.monotonic() - started < 50
    assert "dfcil: interrupted" in (tmp_path / "err.txt").read_text()


@pytest.mark.parametrize(
    ("option", "values"),
    [("--classes", [""]), ("--classes", [","]), ("--tasks", [","]), ("--tasks", [" "]), ("--tasks", ["1,,2"]),
     ("--classes", ["3,", "7"])],
)  # fmt: skip
def test_an_empty_class_or_task_list_of_eval_is_one_usage_error(smoke_run, capsys, option, values):
    """``--classes ""`` (a shell variable left unset) or an empty item between commas selects nothing: one error
    that names the option and what it takes, not a traceback from the empty selection."""
    assert main(["eval", str(smoke_run), option, *values]) == 2
    err = capsys.readouterr().err
    takes = "raw class ids or names" if option == "--classes" else "task numbers"
    assert err.startswith(f"dfcil: error: {option} ") and "an empty" in err and f"give {takes}" in err, err
    assert len(err.splitlines()) == 1


def test_a_dry_run_refuses_an_unknown_logger_as_the_run_does(tmp_path, capsys, monkeypatch):
    """``--log bogus`` fails a real run before it starts: the dry run, which promises the same validation, says so
    too (and writes nothing)."""
    monkeypatch.chdir(tmp_path)
    for command in (["train", "--config", SMOKE], ["sweep", "--config", SMOKE, "--out", "sweep"]):
        assert main([*command, "--dry-run", "--log", "bogus"]) == 2, command
        assert "dfcil: error: unknown logger 'bogus'. Registered loggers: csv" in capsys.readouterr().err
    assert main(["train", "--config", SMOKE, "--dry-run", "--log", "csv"]) == 0
    assert list(tmp_path.iterdir()) == []


def test_the_cpu_is_named_from_cpuinfo_and_without_it(tmp_path):
    """meta.json's ``cpu``: /proc/cpuinfo's model name (platform.processor() is empty on Linux), the logical CPUs and
    PyTorch's vector instructions; a machine without /proc/cpuinfo still gets a name."""
    from dfcil.runs.runner import cpu_name

    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9B14\nflags\t\t: fpu\n")
    capability = torch.backends.cpu.get_cpu_capability()
    assert cpu_name(info) == f"AMD EPYC 9B14, {os.cpu_count()} CPUs, {capability}"
    assert cpu_name(tmp_path / "absent").endswith(f", {os.cpu_count()} CPUs, {capability}")
    assert not cpu_name(tmp_path / "absent").startswith(",")
