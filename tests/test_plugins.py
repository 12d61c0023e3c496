"""Plugins: methods (and datasets, backbones, loggers) from outside dfcil, found by name by every command and
every process of a run: installed packages' entry points, and ``plugins`` / ``--plugin`` modules and files
(:mod:`dfcil.plugins`). A fake installed package is a ``.dist-info`` folder (which is all ``importlib.metadata``
reads), and a ``.pth`` file for an editable one, in a folder that Python treats as a site-packages one (the ``site``
fixture); one beside a run, in the current directory or on ``PYTHONPATH`` is not installed."""

from __future__ import annotations

import hashlib
import json
import os
import site as python_site
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from conftest import CONFIGS, REPO, StopAfterEpochs
from dfcil.cli import main
from dfcil.data.datasets import DATASETS
from dfcil.errors import ConfigError, PluginError, RegistryError, RunInterrupted
from dfcil.load import load_config
from dfcil.methods import METHODS
from dfcil.models.backbones import BACKBONES
from dfcil.registry import Registry
from dfcil.training.loggers import LOGGERS

EXAMPLE = REPO / "examples" / "plugin"
SMOKE = str(CONFIGS / "smoke.yaml")
TINY_KEYS = [("train.epochs", "2"), ("train.milestones", "[]"), ("data.num_classes", "6")]  # tests/test_methods.py's
TINY = [arg for key, value in TINY_KEYS for arg in (f"--{key}", value)]

TOY = '''
import torch.nn.functional as F

from dfcil.methods import Method, register_method


@register_method("{name}")
class Toy(Method):
    """A plugin's toy method: CE on the task's data."""

    def training_step(self, net, batch, ctx, phase):
        return {{"ce": F.cross_entropy(net(batch.x).logits, batch.y)}}
'''


# what site-packages is to Python, for the processes a test starts (imported at start from PYTHONPATH)
SITECUSTOMIZE = """
import site

_listed = site.getsitepackages
site.getsitepackages = lambda prefixes=None: [*_listed(prefixes), {folder!r}]
site.addsitedir({folder!r})
"""


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A site-packages folder for fake installed packages (:func:`install`): listed by ``site.getsitepackages()``
    and on ``sys.path`` with its ``.pth`` files read (``site.addsitedir``), as Python does for its own at start; in
    this process, and in the processes the test starts (a ``sitecustomize`` module on ``PYTHONPATH`` that does the
    same: the folder itself is not on ``PYTHONPATH``). Nothing is installed in the test's own environment, and
    what the test registers and imports from it (or from the example) is gone afterwards. No ``--trust-plugins`` of
    an earlier test in this process holds."""
    from dfcil import plugins

    folder, customize = tmp_path / "site-packages", tmp_path / "sitecustomize"
    folder.mkdir()
    customize.mkdir()
    (customize / "sitecustomize.py").write_text(SITECUSTOMIZE.format(folder=str(folder)))
    monkeypatch.syspath_prepend(str(folder))  # and sys.path as it was afterwards, the .pth files' folders gone too
    listed = python_site.getsitepackages
    monkeypatch.setattr(python_site, "getsitepackages", lambda prefixes=None: [*listed(prefixes), str(folder)])
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(customize), os.environ.get("PYTHONPATH")) if p))
    monkeypatch.setattr(plugins, "_trusting_every_plugin", False)
    registries = (METHODS, DATASETS, BACKBONES, LOGGERS)
    names, modules = [set(r.names()) for r in registries], set(sys.modules)
    yield folder
    for registry, before in zip(registries, names, strict=True):
        for name in set(registry.names()) - before:
            registry.unregister(name)
    for name in set(sys.modules) - modules:
        file = getattr(sys.modules[name], "__file__", None) or ""
        if file.startswith((str(tmp_path), str(EXAMPLE))):
            del sys.modules[name]


def install(
    site: Path,
    dist: str,
    version: str,
    entry_points: dict[str, dict[str, str]],
    editable: Path | None = None,
    **modules: str,
) -> None:
    """A fake distribution ``dist`` in the folder ``site`` declaring ``entry_points`` ({group: {name: module}}), with
    ``modules`` (name → source) beside it, or, ``editable``, the folder of its modules that a ``.pth`` file adds to
    ``sys.path`` (as ``pip install -e`` does), at once (``site.addsitedir``) when ``site`` is on ``sys.path``."""
    for name, source in modules.items():
        (site / f"{name}.py").write_text(textwrap.dedent(source))
    info = site / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    groups = [f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()) for group, eps in entry_points.items()]
    (info / "entry_points.txt").write_text("\n".join(groups))
    if editable is not None:
        (site / f"__editable__.{dist.replace('-', '_')}-{version}.pth").write_text(f"{editable}\n")
        if str(site) in sys.path:
            python_site.addsitedir(str(site))


def test_an_installed_method_is_imported_when_a_config_names_it_and_only_then(site, capsys):
    install(site, "toy-pkg", "1.0", {"dfcil.methods": {"plug_toy": "plug_toy"}}, plug_toy=TOY.format(name="plug_toy"))
    load_config([SMOKE], [("method.name", "lwf")])
    assert "plug_toy" not in sys.modules and METHODS.plugin_names() == ["plug_toy"]
    # switching from the smoke preset's rdfcil drops rdfcil's keys: the switch finds the plugin's method by name
    cfg, dropped = load_config([SMOKE], [("method.name", "plug_toy")])
    assert (
        cfg.method.name == "plug_toy"
        and "method.chr_epochs dropped (not a key of plug_toy)" in dropped
        and "plug_toy" in sys.modules
    )
    assert main(["methods"]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("plug_toy "))
    assert "A plugin's toy method" in line and "[plugin: plug_toy]" in line


def test_dfcil_methods_lists_installed_plugins_from_their_metadata_without_importing_them_or_torch(site, tmp_path):
    install(site, "toy-pkg", "1.0", {"dfcil.methods": {"plug_toy": "plug_toy"}}, plug_toy=TOY.format(name="plug_toy"))
    # a package in the current directory is not installed: listed, with why a config naming it is refused
    here = tmp_path / "here"
    here.mkdir()
    install(here, "stray", "1.0", {"dfcil.methods": {"stray_toy": "stray_toy"}}, stray_toy=TOY.format(name="stray_toy"))
    code = "\n".join(
        [
            "import sys",
            "from dfcil.cli import main",
            "main(['methods'])",
            "print(sorted({'torch', 'plug_toy'} & {*sys.modules}))",
        ]
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=here).stdout
    (line,) = [line for line in out.splitlines() if line.startswith("plug_toy ")]
    assert "[plugin: toy-pkg 1.0]" in line and "--plugin plug_toy" in line and "not imported" not in line
    (line,) = [line for line in out.splitlines() if line.startswith("stray_toy ")]
    assert "[plugin: stray 1.0]" in line and "not imported by its name alone" in line, line
    assert "not installed" in line and "found in the current directory" in line and "--plugin stray_toy" in line
    assert out.splitlines()[-1] == "[]"  # neither torch nor the plugin was imported


BROKEN = """
raise RuntimeError("no licence server\\nfound")
"""


def test_a_broken_plugin_is_one_line_naming_it_and_breaks_no_run_that_does_not_use_it(site, capsys):
    install(
        site, "broken-pkg", "1.2", {"dfcil.methods": {"broken": "broken_plugin", "silent": "silent_plugin"}},
        broken_plugin=BROKEN, silent_plugin="x = 1\n",
    )  # fmt: skip
    assert load_config([SMOKE], [("method.name", "lwf")])[0].method.name == "lwf"
    assert main(["train", "--config", SMOKE, "--method.name", "broken", "--print-config"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("dfcil: error: method plugin 'broken'")
    assert "broken-pkg 1.2" in err and "RuntimeError: no licence server found" in err and "broken_plugin.py:2" in err
    with pytest.raises(PluginError, match="'silent'.*registered no method 'silent'"):
        METHODS.get("silent")
    with pytest.raises(RegistryError, match=r"Did you mean 'broken'\?.*plugins: broken, silent"):
        METHODS.get("brokn")


def test_two_registrations_of_one_name_are_an_error_naming_both_modules(site, tmp_path, capsys):
    (tmp_path / "shadow.py").write_text(TOY.format(name="lwf"))
    assert main(["train", "--config", SMOKE, "--plugin", str(tmp_path / "shadow.py"), "--print-config"]) == 2
    err = capsys.readouterr().err
    assert "method 'lwf' is registered twice: by module dfcil.methods.lwf and by module shadow" in err
    assert err.count("\n") == 1 and "shadow.py failed to import" in err

    registry = Registry("thing")
    registry.register("a")(Path)
    with pytest.raises(RegistryError, match="'a' is registered twice: by module pathlib and by module json"):
        registry.register("a")(json.JSONDecoder)

    install(site, "one", "1.0", {"dfcil.backbones": {"twin": "one_net"}})
    install(site, "two", "2.0", {"dfcil.backbones": {"twin": "two_net"}})
    with pytest.raises(
        PluginError, match=r"'twin' is declared by several plugins: one_net \(package one 1\.0\) and two_net"
    ):
        BACKBONES.get("twin")


def test_a_plugin_that_cannot_be_imported_is_one_error_naming_it_and_the_fix(tmp_path, capsys):
    (tmp_path / "bad_syntax.py").write_text("def f(:\n")
    (tmp_path / "needs_more.py").write_text("import no_such_dependency_xyz\n")
    cases = {
        "no_such_plugin_xyz": "plugin 'no_such_plugin_xyz': no module of that name can be imported. Install its",
        str(tmp_path / "missing.py"): "missing.py does not exist: give the path of a .py file, or a module name",
        str(tmp_path / "bad_syntax.py"): "bad_syntax.py failed to import: SyntaxError",
        str(tmp_path / "needs_more.py"): "No module named 'no_such_dependency_xyz'",
    }
    for plugin, message in cases.items():
        assert main(["train", "--config", SMOKE, "--plugin", plugin, "--print-config"]) == 2, plugin
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
    with pytest.raises(ConfigError, match="plugins must be a list of module names or .py files"):
        load_config([SMOKE], [("plugins", "3")])


def test_a_sweep_passes_its_plugins_to_every_run(site, tmp_path, monkeypatch):
    from dfcil.sweep.plan import plan

    monkeypatch.chdir(tmp_path)
    (tmp_path / "file_toy.py").write_text(TOY.format(name="file_toy"))
    runs = plan([[SMOKE]], [("seed", ["1", "2"])], [("method.name", "file_toy")], plugins=["file_toy.py"])
    path = str(tmp_path / "file_toy.py")
    for run in runs:
        assert run.config["plugins"] == [path] and run.config["method"]["name"] == "file_toy"
        argv = run.argv(tmp_path / run.name)
        assert argv[argv.index("--plugin") + 1] == path


def _eval_in_a_new_process(run_dir: Path, cwd: Path, *extra: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "dfcil", "eval", str(run_dir), "--json", *extra], cwd=cwd, capture_output=True,
        text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_plugin_file_is_saved_with_the_run_and_imported_again_by_resume_and_eval(site, tmp_path, monkeypatch, capsys):
    from dfcil.runs.runner import RunOptions, train
    from dfcil.training.state import Interrupt

    work = tmp_path / "work"
    work.mkdir()
    (work / "my_method.py").write_text(TOY.format(name="file_toy"))
    monkeypatch.chdir(work)
    cfg = load_config([SMOKE], [("method.name", "file_toy"), *TINY_KEYS], plugins=["my_method.py"])[0]
    interrupt = Interrupt()
    options = RunOptions(progress=False, interrupt=interrupt, callbacks=[StopAfterEpochs(interrupt, 3)])
    with pytest.raises(RunInterrupted):
        train(cfg, tmp_path / "run", options)
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert saved["plugins"] == [str(work / "my_method.py")]
    (plugin,) = json.loads((tmp_path / "run" / "meta.json").read_text())["plugins"]
    started = hashlib.sha256((work / "my_method.py").read_bytes()).hexdigest()
    assert plugin == {"module": "my_method", "file": str(work / "my_method.py"), "sha256": started, "package": None,
                      "version": None, "git_sha": None}  # fmt: skip

    METHODS.unregister("file_toy")  # as in a new process: only config.yaml says where the method is
    del sys.modules["my_method"]
    monkeypatch.chdir(tmp_path)
    # the run's word alone imports no file: the user names it again (any path to the same file)
    assert main(["resume", str(tmp_path / "run"), "--no-progress"]) == 2
    assert "file_toy" not in METHODS and "my_method" not in sys.modules
    (work / "my_method.py").write_text(TOY.format(name="file_toy") + "# edited after the run started\n")
    edited = hashlib.sha256((work / "my_method.py").read_bytes()).hexdigest()
    capsys.readouterr()
    assert main(["resume", str(tmp_path / "run"), "--no-progress", "--plugin", "work/my_method.py"]) == 0
    assert "file_toy" in METHODS and (tmp_path / "run" / "summary.json").exists()
    assert f"plugin file my_method ({work / 'my_method.py'}) changed since the run started" in capsys.readouterr().err
    (resumed,) = json.loads((tmp_path / "run" / "meta.json").read_text())["resumes"]
    assert [p["sha256"] for p in resumed["plugins"]] == [edited]
    monkeypatch.delenv("PYTHONPATH")
    # from elsewhere, nothing on PYTHONPATH: --trust-plugins allows what the run names
    report = _eval_in_a_new_process(tmp_path / "run", tmp_path, "--trust-plugins")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert report["acc"] == summary["last_acc"] and len(report["classes"]) == 6


def test_the_example_plugin_trains_resumes_sweeps_and_evaluates_by_name(site, tmp_path, monkeypatch, capsys):
    """examples/plugin, installed (its pyproject's entry points, its src folder added by a .pth file of
    site-packages, as `pip install -e` does): every command finds its method by name, in this process and in new
    ones, with dfcil untouched."""
    from dfcil.runs.runner import RunOptions, train
    from dfcil.training.state import Interrupt

    pyproject = (EXAMPLE / "pyproject.toml").read_text()  # what pip would install from it (no tomllib on 3.10)
    assert 'name = "dfcil-cosine-lwf"\nversion = "0.1.0"' in pyproject
    assert '[project.entry-points."dfcil.methods"]\ncosine_lwf = "dfcil_cosine_lwf"' in pyproject
    eps = {"dfcil.methods": {"cosine_lwf": "dfcil_cosine_lwf"}}
    install(site, "dfcil-cosine-lwf", "0.1.0", eps, editable=EXAMPLE / "src")  # as pip install -e examples/plugin
    assert "cosine_lwf" not in METHODS.names()

    cfg = load_config([SMOKE], [("method.name", "cosine_lwf"), *TINY_KEYS])[0]
    interrupt = Interrupt()
    options = RunOptions(progress=False, interrupt=interrupt, callbacks=[StopAfterEpochs(interrupt, 3)])
    with pytest.raises(RunInterrupted):  # stopped inside task 1, as Ctrl-C would
        train(cfg, tmp_path / "run", options)
    assert main(["resume", str(tmp_path / "run"), "--no-progress"]) == 0
    meta = json.loads((tmp_path / "run" / "meta.json").read_text())
    (plugin,) = meta["plugins"]
    assert plugin["module"] == "dfcil_cosine_lwf"
    assert plugin["file"] == str(EXAMPLE / "src" / "dfcil_cosine_lwf" / "__init__.py")
    assert plugin["package"] == "dfcil-cosine-lwf" and plugin["version"] == "0.1.0"
    assert plugin["git_sha"] is None or len(plugin["git_sha"]) == 40  # the repository the example lies in

    sweep = ["sweep", "--config", SMOKE, "--method.name", "cosine_lwf", *TINY, "--grid", "seed=1,2", "--jobs", "2"]
    assert main([*sweep, "--out", str(tmp_path / "sweep")]) == 0, capsys.readouterr().out
    records = json.loads((tmp_path / "sweep" / "sweep.json").read_text())["runs"]
    assert [r["state"] for r in records] == ["done", "done"]
    report = _eval_in_a_new_process(tmp_path / "sweep" / "seed2", cwd=tmp_path)
    summary = json.loads((tmp_path / "sweep" / "seed2" / "summary.json").read_text())
    assert report["acc"] == summary["last_acc"] and len(report["classes"]) == 6


# --------------------------------------------------------------------------- a run directory from elsewhere

EVIL = "from pathlib import Path\nPath({marker!r}).write_text('ran')\n"


def _received(smoke_run: Path, tmp_path: Path, plugins: list[str], finished: bool = True) -> tuple[Path, Path]:
    """A copy of a finished run as a user may receive it, with ``evilplug.py`` inside, whose import writes a
    marker file, and ``plugins`` written into its config.yaml by hand. Returns the run and the marker."""
    import shutil

    received, marker = tmp_path / "G", tmp_path / "marker"
    shutil.copytree(smoke_run, received, ignore=shutil.ignore_patterns("tensorboard", "inspect"))
    (received / "evilplug.py").write_text(EVIL.format(marker=str(marker)))
    config = yaml.safe_load((received / "config.yaml").read_text())
    config["plugins"] = plugins
    (received / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    if not finished:
        (received / "summary.json").unlink()
    return received, marker


@pytest.fixture
def forget_evilplug():
    yield
    sys.modules.pop("evilplug", None)


@pytest.mark.parametrize("command", [["eval", "."], ["export", ".", "--out", "../m.safetensors"], ["inspect", "."],
                                     ["resume", "."]])  # fmt: skip
def test_a_received_run_directory_imports_no_file_it_names_without_consent(
    smoke_run, tmp_path, monkeypatch, capsys, command, forget_evilplug
):
    """The probe of issue 46: `cd G && dfcil eval .` with `plugins: [evilplug.py]` in G/config.yaml ran the file.
    Now each command stops, in one line that lists the file and how to allow it, and the file has not run; a
    relative path in a saved config means the run directory, never the current one."""
    received, marker = _received(smoke_run, tmp_path, ["evilplug.py"], finished=command[0] != "resume")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "evilplug.py").write_text(EVIL.format(marker=str(marker)))  # the cwd's is not it
    for cwd in (received, tmp_path / "elsewhere"):
        monkeypatch.chdir(cwd)
        target = "." if cwd == received else str(received)
        assert main([*[target if a == "." else a for a in command]]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "imports only with your consent" in err, err
        assert f"the file {received / 'evilplug.py'}" in err and f"--plugin {received / 'evilplug.py'}" in err
        assert "--trust-plugins" in err and not marker.exists()
        assert "evilplug" not in sys.modules


def test_a_named_plugin_file_runs_only_with_plugin_or_trust_plugins(smoke_run, tmp_path, monkeypatch, capsys,
                                                                       forget_evilplug):  # fmt: skip
    received, marker = _received(smoke_run, tmp_path, [str(tmp_path / "G" / "evilplug.py")])  # absolute, inside
    monkeypatch.chdir(tmp_path)
    assert main(["eval", "G"]) == 2 and not marker.exists()
    assert "the file" in capsys.readouterr().err
    assert main(["eval", "G", "--plugin", "G/evilplug.py"]) == 0 and marker.exists()  # named again: allowed
    marker.unlink()
    del sys.modules["evilplug"]
    assert main(["eval", "G", "--trust-plugins"]) == 0 and marker.exists()
    assert "accuracy" in capsys.readouterr().out


def test_a_run_record_given_as_config_or_an_existing_out_names_no_code_without_consent(
    smoke_run, tmp_path, monkeypatch, capsys, forget_evilplug
):
    """`dfcil train --config G/config.yaml` repeats a received run, and `--out G` continues it: neither imports
    G's plugin file on G's word; `dfcil sweep --config G/config.yaml` neither."""
    received, marker = _received(smoke_run, tmp_path, ["evilplug.py"])
    monkeypatch.chdir(tmp_path)
    for argv in (
        ["train", "--config", "G/config.yaml", "--out", "new", "--print-config"],
        ["train", "--config", SMOKE, "--out", "G"],
        ["sweep", "--config", "G/config.yaml", "--out", "sweep", "--dry-run"],
    ):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert "imports only with your consent" in err and str(received / "evilplug.py") in err, err
        assert not marker.exists() and not (tmp_path / "new").exists() and not (tmp_path / "sweep").exists()
    out = capsys.readouterr()
    assert main(["train", "--config", "G/config.yaml", "--trust-plugins", "--print-config"]) == 0 and marker.exists()
    assert f"- {received / 'evilplug.py'}" in capsys.readouterr().out, out  # the run's file, not the cwd's


def test_a_module_the_run_directory_holds_is_code_of_the_run(smoke_run, tmp_path):
    """`cd G && python -m dfcil eval .` puts G on sys.path: a module name in G's plugins then finds G's file, so it
    needs consent as a file does; the standard library's and an installed package's modules do not."""
    received, marker = _received(smoke_run, tmp_path, ["evilplug"])
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-m", "dfcil", "eval", "."], cwd=received, capture_output=True, text=True,
                          env=env)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert f"the module evilplug ({received / 'evilplug.py'}, found in the run directory)" in done.stderr
    assert not marker.exists()
    from dfcil.plugins import needs_consent

    assert not needs_consent("json", received) and not needs_consent("dfcil.methods", received)
    assert needs_consent("anything.py", received) and needs_consent("/abs/elsewhere.py", received)


def _dfcil(cwd: Path, *argv: str, pythonpath: Path | None = None) -> subprocess.CompletedProcess:
    """``python -m dfcil ARGV`` in ``cwd`` (which it puts on ``sys.path``), ``PYTHONPATH`` only ``pythonpath``."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    return subprocess.run([sys.executable, "-m", "dfcil", *argv], cwd=cwd, capture_output=True, text=True, env=env)


def _claim_plugins(run: Path, plugins: list[str]) -> None:
    """Make the checkpoints of ``run`` name ``plugins`` as its edited config.yaml does (a resume refuses others)."""
    from dfcil.checkpoint import dumps, loads

    for path in (run / "checkpoints").glob("*.pt"):
        payload = loads(path.read_bytes())
        if "config" in payload:  # not a task's static part
            payload["config"]["plugins"] = plugins
            path.write_bytes(dumps(payload))


@pytest.mark.parametrize(
    ("command", "found"),
    [
        ("eval", "beside the run, in the current directory"),
        ("resume", "on PYTHONPATH"),
        pytest.param("eval", "on PYTHONPATH", marks=pytest.mark.slow),
        pytest.param("resume", "beside the run, in the current directory", marks=pytest.mark.slow),
    ],
)
def test_a_module_a_received_run_names_is_imported_only_with_consent_wherever_it_is_found(
    smoke_run, tmp_path, found, command
):
    """Issue 4 of the reliability review: a run's `plugins: [besideplug]` found through the current directory
    (`python -m dfcil eval G`, besideplug.py beside G) or through PYTHONPATH was imported on the run's word. It is no
    installed package's: one line names it and the fix, nothing runs; `--plugin besideplug` or `--trust-plugins`
    allow it."""
    received, marker = _received(smoke_run, tmp_path, ["besideplug"], finished=command == "eval")
    if command == "resume":
        _claim_plugins(received, ["besideplug"])
    if found == "on PYTHONPATH":
        folder, cwd, pythonpath = tmp_path / "lib", tmp_path / "elsewhere", tmp_path / "lib"
        cwd.mkdir()
    else:
        folder, cwd, pythonpath = tmp_path, tmp_path, None
    folder.mkdir(exist_ok=True)
    (folder / "besideplug.py").write_text(EVIL.format(marker=str(marker)))
    run = os.path.relpath(received, cwd)
    argv = [command, run, *(["--no-progress"] if command == "resume" else [])]

    done = _dfcil(cwd, *argv, pythonpath=pythonpath)
    assert done.returncode == 2, done.stderr
    assert not marker.exists()
    error = done.stderr.splitlines()[-1]
    where = "on PYTHONPATH" if found == "on PYTHONPATH" else "beside the run directory"
    assert error.startswith("dfcil: error: ") and "imports only with your consent: the module besideplug" in error
    assert f"({folder / 'besideplug.py'}, found {where})" in error
    assert "--plugin besideplug" in error and "--trust-plugins" in error

    # each command and each place once with each way of consent (a resume finishes the run: one try)
    allow = ["--plugin", "besideplug"] if (command == "eval") == (found == "on PYTHONPATH") else ["--trust-plugins"]
    done = _dfcil(cwd, *argv, *allow, pythonpath=pythonpath)
    assert done.returncode == 0, done.stderr
    assert marker.read_text() == "ran"


def test_where_a_module_name_is_found_decides_whether_a_run_needs_consent_for_it(tmp_path, monkeypatch):
    """A module name of a run's plugins loads without consent only from this machine's Python: the standard
    library, an installed package (site-packages, a folder a .pth file adds: dfcil's editable install). Found in
    the run directory, beside it, in the current directory, on PYTHONPATH or in any other folder of sys.path, it
    needs consent; finding it imports nothing."""
    from dfcil.plugins import found_outside

    run, here, lib, other = (tmp_path / name for name in ("G", "here", "lib", "other"))
    places = {"inside_mod.py": run, "beside_mod.py": tmp_path, "here_mod.py": here, "lib_mod.py": lib,
              "other_mod.py": other, "pkg_mod/__init__.py": other, "ns_mod/part.py": lib}  # fmt: skip
    for file, folder in places.items():
        (folder / file).parent.mkdir(parents=True, exist_ok=True)
        (folder / file).write_text("raise SystemExit('imported')\n")
    for folder in (other, lib, tmp_path, run):
        monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setenv("PYTHONPATH", str(lib))
    monkeypatch.chdir(here)
    monkeypatch.syspath_prepend("")  # python -c, a notebook: the current directory
    said = {
        "inside_mod": f"{run / 'inside_mod.py'}, found in the run directory",
        "beside_mod": f"{tmp_path / 'beside_mod.py'}, found beside the run directory",
        "here_mod": f"{here / 'here_mod.py'}, found in the current directory",
        "lib_mod": f"{lib / 'lib_mod.py'}, found on PYTHONPATH",
        "ns_mod.part": f"{lib / 'ns_mod'}, found on PYTHONPATH",
        "other_mod": f"{other / 'other_mod.py'}, found outside the installed packages",
        "pkg_mod.sub": f"{other / 'pkg_mod' / '__init__.py'}, found outside the installed packages",
    }
    for name, words in said.items():
        assert found_outside(name, run) == words
        assert name.split(".")[0] not in sys.modules
    for name in ("json", "sys", "dfcil.methods", "yaml", "no_such_module_xyz"):  # stdlib, built in, installed
        assert found_outside(name, run) is None, name


def test_a_module_of_the_users_own_path_needs_naming_again_only_for_a_command_on_the_run(
    site, tmp_path, monkeypatch, capsys
):
    """A plugin module on the user's PYTHONPATH: `dfcil train --plugin pathplug` imports it (the user's own
    command), `dfcil train` again with the same --out continues the run (its config names it: the user's word), a
    sweep's runs and a sweep run again over them too; `dfcil resume RUN` alone is a command on a run directory,
    which may come from elsewhere: it asks for `--plugin pathplug`, as for a plugin file."""
    from dfcil.plugins import needs_consent
    from dfcil.runs.runner import RunOptions, train
    from dfcil.training.state import Interrupt

    lib = tmp_path / "lib"
    lib.mkdir()
    monkeypatch.syspath_prepend(str(lib))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(lib), os.environ["PYTHONPATH"]]))
    (lib / "pathplug.py").write_text(TOY.format(name="path_toy"))
    cfg = load_config([SMOKE], [("method.name", "path_toy"), *TINY_KEYS], plugins=["pathplug"])[0]
    interrupt = Interrupt()
    options = RunOptions(progress=False, interrupt=interrupt, callbacks=[StopAfterEpochs(interrupt, 3)])
    with pytest.raises(RunInterrupted):
        train(cfg, tmp_path / "run", options)
    assert yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["plugins"] == ["pathplug"]
    assert needs_consent("pathplug", tmp_path / "run")
    assert main(["resume", str(tmp_path / "run"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"the module pathplug ({lib / 'pathplug.py'}, found on PYTHONPATH)" in err and "--plugin pathplug" in err
    start = ["train", "--config", SMOKE, "--method.name", "path_toy", *TINY, "--plugin", "pathplug", "--no-progress"]
    assert main([*start, "--out", str(tmp_path / "run")]) == 0  # the same command again: continues, no question
    assert (tmp_path / "run" / "summary.json").exists()

    sweep = ["sweep", "--config", SMOKE, "--method.name", "path_toy", *TINY, "--plugin", "pathplug", "--grid",
             "seed=1", "--out", str(tmp_path / "sweep")]  # fmt: skip
    for state in ("done", "skipped"):  # run again, it finds its run directories, which name the sweep's plugins
        assert main(sweep) == 0, capsys.readouterr()
        (record,) = json.loads((tmp_path / "sweep" / "sweep.json").read_text())["runs"]
        assert record["state"] == state


def test_a_checkpoint_that_names_other_plugins_than_the_config_is_refused_before_importing(
    smoke_run, tmp_path, capsys, forget_evilplug
):
    """The checkpoint holds a copy of the config, which resume builds (importing its plugins): one that names
    other plugins than config.yaml is not the run's, and nothing it names is imported."""
    from dfcil.checkpoint import dumps, loads

    received, marker = _received(smoke_run, tmp_path, [], finished=False)
    last = received / "checkpoints" / "last.pt"
    payload = loads(last.read_bytes())
    payload["config"]["plugins"] = [str(received / "evilplug.py")]
    last.write_bytes(dumps(payload))
    assert main(["resume", str(received), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "names other plugins" in err and "not this run's" in err, err
    assert not marker.exists() and not (received / "summary.json").exists()


@pytest.mark.parametrize(
    ("source", "said"),
    [("import sys\nsys.exit(5)\n", "exited while importing (sys.exit(5) at "),
     ("raise SystemExit('bye')\n", "exited while importing (SystemExit('bye') at "),
     ("import sys\nsys.exit()\n", "exited while importing (sys.exit(None) at ")],
)  # fmt: skip
def test_a_plugin_that_exits_while_importing_is_one_error_naming_it(tmp_path, capsys, source, said):
    """`sys.exit(5)` at import used to exit 5 with no output, `raise SystemExit("bye")` 1 with only its text: now one
    `dfcil: error:` line naming the plugin, exit status 2, as for any failing plugin."""
    plugin = tmp_path / "exits_at_import.py"
    plugin.write_text(source)
    assert main(["train", "--config", SMOKE, "--plugin", str(plugin), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"dfcil: error: plugin file {plugin} {said}{plugin}:") and err.count("\n") == 1, err
    assert "exits_at_import" not in sys.modules


def test_ctrl_c_while_a_plugin_imports_stops_the_command_as_ctrl_c_does(tmp_path, capsys):
    plugin = tmp_path / "interrupted_at_import.py"
    plugin.write_text("raise KeyboardInterrupt\n")
    assert main(["train", "--config", SMOKE, "--plugin", str(plugin), "--dry-run"]) == 130
    assert capsys.readouterr().err == "dfcil: interrupted\n"
    assert "interrupted_at_import" not in sys.modules


# ------------------------------------------------------------------------ entry points of packages not installed

EVIL_METHOD = '''
from pathlib import Path

Path({marker!r}).write_text("ran")

from dfcil.methods import register_method
from dfcil.methods.rdfcil import RDFCIL


@register_method("evilmeth")
class Evil(RDFCIL):
    """R-DFCIL under another name, with a side effect at import."""
'''


def _received_method(smoke_run: Path, tmp_path: Path, folder: Path) -> tuple[Path, Path]:
    """A copy of a finished run whose config.yaml names the method ``evilmeth`` (and no ``plugins``), and, in
    ``folder``, a package that is not installed (``evil-1.0.dist-info``) declaring it as an entry point of the
    module ``evilep`` (``evilep.py``, beside it), whose import writes a marker. Returns the run and the marker."""
    from dfcil.checkpoint import dumps, loads

    received, marker = _received(smoke_run, tmp_path, [])
    config = yaml.safe_load((received / "config.yaml").read_text())
    del config["plugins"]
    config["method"]["name"] = "evilmeth"
    (received / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    model = loads((received / "model.pt").read_bytes())
    model["run"]["method"] = "evilmeth"  # the run's own model, as one of evilmeth would say
    (received / "model.pt").write_bytes(dumps(model))
    folder.mkdir(exist_ok=True)
    install(
        folder, "evil", "1.0", {"dfcil.methods": {"evilmeth": "evilep"}}, evilep=EVIL_METHOD.format(marker=str(marker))
    )
    return received, marker


@pytest.mark.parametrize("found", ["in the current directory", pytest.param("on PYTHONPATH", marks=pytest.mark.slow)])
def test_an_entry_point_of_a_package_that_is_not_installed_is_imported_only_with_consent(smoke_run, tmp_path, found):
    """A received run naming `method: {name: evilmeth}` (no plugins), with `evil-1.0.dist-info` declaring evilmeth
    beside it in the current directory (which `python -m dfcil` puts on sys.path) or on PYTHONPATH: importlib.metadata
    reads every sys.path folder, and `dfcil eval G` imported evilep.py on the run's word. Now it stops, one line
    naming the entry point, its package and where it was found, and the fix; `--plugin evilep` or `--trust-plugins`
    allow it."""
    if found == "on PYTHONPATH":
        folder, cwd = tmp_path / "lib", tmp_path / "elsewhere"
        cwd.mkdir()
    else:
        folder = cwd = tmp_path
    received, marker = _received_method(smoke_run, tmp_path, folder)
    pythonpath = folder if found == "on PYTHONPATH" else None
    run = os.path.relpath(received, cwd)

    done = _dfcil(cwd, "eval", run, pythonpath=pythonpath)
    assert done.returncode == 2, done.stderr
    assert not marker.exists()
    (error,) = done.stderr.splitlines()
    assert error.startswith("dfcil: error: method plugin 'evilmeth' (dfcil.methods entry point 'evilep' of package "
                            "evil 1.0)"), error  # fmt: skip
    assert f"not installed (its metadata in {folder}, found {found})" in error, error
    assert "--plugin evilep" in error and "--trust-plugins" in error and "pip install" in error, error

    for allow in (["--plugin", "evilep"], ["--trust-plugins"]):
        done = _dfcil(cwd, "eval", run, *allow, pythonpath=pythonpath)
        assert done.returncode == 0, done.stderr
        assert marker.read_text() == "ran"
        marker.unlink()


def test_an_entry_point_loads_on_a_name_alone_only_from_an_installed_package(site, tmp_path, monkeypatch):
    """An entry point whose package's metadata lies in site-packages loads by name; one whose metadata lies in
    another folder of sys.path, or an installed one whose module a file of the same name in the current directory
    shadows, is refused before anything is imported, saying where it was found; a command that trusts every
    plugin of its run (`--trust-plugins`: check_consent) allows them."""
    from dfcil.plugins import Consent, check_consent

    other, here = tmp_path / "other", tmp_path / "here"
    other.mkdir()
    here.mkdir()
    registers = "from dfcil.models.backbones import BACKBONES\n\nBACKBONES.register({name!r})(dict)\n"
    install(
        site, "real", "2.0", {"dfcil.backbones": {"real_net": "real_net"}}, real_net=registers.format(name="real_net")
    )
    install(site, "shadowed", "3.0", {"dfcil.backbones": {"shadowed_net": "shadowed_net"}},
            shadowed_net=registers.format(name="shadowed_net"))  # fmt: skip
    (here / "shadowed_net.py").write_text("raise SystemExit('imported')\n")
    install(other, "stray", "1.0", {"dfcil.backbones": {"stray_net": "stray_net"}},
            stray_net=registers.format(name="stray_net"))  # fmt: skip
    monkeypatch.syspath_prepend(str(other))
    monkeypatch.chdir(here)
    monkeypatch.syspath_prepend("")  # python -m, python -c: the current directory, first

    assert BACKBONES.get("real_net") is dict
    with pytest.raises(PluginError) as refused:
        BACKBONES.get("stray_net")
    assert str(refused.value) == (
        f"backbone plugin 'stray_net' (dfcil.backbones entry point 'stray_net' of package stray 1.0) comes from a "
        f"package that is not installed (its metadata in {other}, found outside the installed packages): dfcil "
        f"imports it only with your consent. Read it first; then allow it with --plugin stray_net (its module), "
        f"install its package (pip install), or pass --trust-plugins (for a run directory you trust)"
    )
    with pytest.raises(PluginError) as refused:
        BACKBONES.get("shadowed_net")
    said = f"3.0) comes from an installed package, but its module is {here / 'shadowed_net.py'}, found in the current"
    assert said in str(refused.value)
    assert "stray_net" not in sys.modules and "shadowed_net" not in sys.modules

    check_consent([], tmp_path, Consent(everything=True))  # the run's command says --trust-plugins
    assert BACKBONES.get("stray_net") is dict
