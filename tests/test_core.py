"""The shape of the core: small, readable pieces; no import cycle; a method is found through the registry alone."""

import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from conftest import CONFIGS, REPO, StopInSetup
from dfcil.errors import RunInterrupted
from dfcil.load import load_config
from dfcil.methods import METHODS, unregister_method
from dfcil.training.callbacks import Callback
from dfcil.training.loop import RunOptions
from dfcil.training.state import Interrupt

SRC = REPO / "src" / "dfcil"


def _python(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, check=True)
    return done.stdout


def test_the_config_types_know_no_method_and_no_torch():
    """dfcil.config declares the config's types; dfcil.load looks the methods up, visibly, above them."""
    out = _python("""
        import sys
        import dfcil.config
        print("dfcil.methods" in sys.modules, "torch" in sys.modules)
        import dfcil.load
        cfg, _ = dfcil.load.load_config([], [("method.name", "lwf")])
        print(cfg.method.name, "dfcil.methods" in sys.modules)
    """)
    assert out.split() == ["False", "False", "lwf", "True"]


def test_nothing_below_the_engine_imports_the_checkpoints_or_the_engine():
    below = ["dfcil.methods", "dfcil.synthesis.replay", "dfcil.synthesis.inversion", "dfcil.models.network"]
    below += ["dfcil.data.datasets", "dfcil.data.device", "dfcil.losses.distillation", "dfcil.metrics"]
    out = _python(f"""
        import sys
        for name in {below!r}:
            __import__(name)
        print(sorted(m for m in sys.modules if m in ("dfcil.checkpoint", "dfcil.training.engine",
        "dfcil.training.callbacks")))
    """)
    assert out.strip() == "[]"


def test_the_code_is_lint_clean_and_its_functions_small():
    """ruff's rules of pyproject.toml, the size budget included (complexity, arguments and statements per function
    in src/), and its formatting."""
    if importlib.util.find_spec("ruff") is None:
        pytest.skip("ruff is not installed (pip install -e '.[test]' installs it)")
    paths = [str(REPO / p) for p in ("src", "tests", "benchmarks", "examples")]
    for args in (["check", "--no-cache", *paths], ["format", "--check", "--no-cache", *paths]):
        done = subprocess.run([sys.executable, "-m", "ruff", *args], cwd=REPO, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr
    assert not (SRC / "session.py").exists()


def test_no_file_sends_readers_to_files_the_repository_does_not_hold():
    """spec/ is the project's private notes: the repository states what it relies on in docs/ instead."""
    files = [REPO / "README.md", *REPO.glob("docs/**/*.md"), *REPO.glob("results/*.md"), *SRC.rglob("*.py")]
    files += [*REPO.glob("configs/**/*.yaml")]
    files += [*REPO.glob("benchmarks/*"), *(f for f in REPO.glob("tests/*.py") if f.name != "test_core.py")]
    assert [str(f.relative_to(REPO)) for f in files if f.is_file() and "spec/" in f.read_text()] == []


def _anchors(doc: Path) -> set[str]:
    """The anchors GitHub gives a Markdown file's headings: lower case, punctuation dropped, spaces as hyphens."""
    import re

    text = re.sub(r"```.*?```", "", doc.read_text(), flags=re.S)  # a '#' comment in a code block is no heading
    headings = re.findall(r"^#+ (.+)$", text, flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def test_relative_links_in_the_readme_and_docs_resolve():
    """Every relative link of the README, docs/ and results/ names a file that exists, and a heading of it where it
    names one."""
    import re

    broken = []
    for doc in [REPO / "README.md", *REPO.glob("docs/**/*.md"), *REPO.glob("results/*.md")]:
        for target, anchor in re.findall(r"\]\(([^)#\s]*)(?:#([^)]*))?\)", doc.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            path = (doc.parent / target) if target else doc
            if not path.exists():
                broken.append(f"{doc.relative_to(REPO)} -> {target}")
            elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
                broken.append(f"{doc.relative_to(REPO)} -> {target}#{anchor}")
    assert broken == []


def test_loss_terms_that_change_within_an_epoch_are_an_error():
    import torch

    from dfcil.training.state import EpochProgress

    ep = EpochProgress(torch.arange(4))
    ep.record(torch.ones(2), ["a", "b"], 4)
    with pytest.raises(RuntimeError, match=r"changed within an epoch, from \['a', 'b'\] to \['a'\]"):
        ep.record(torch.ones(1), ["a"], 4)


def test_a_method_starts_each_task_once_even_when_resumed_inside_its_setup(tmp_path):
    """on_task_start runs once per task; a run resumed inside the inversion restores the method's state and goes
    on with synthesize, and ends exactly as an uninterrupted run."""
    from dfcil.methods.rdfcil import RDFCIL
    from dfcil.runs.runner import resume, train

    starts = []

    class Counting(RDFCIL):
        def on_task_start(self, ctx):
            starts.append(ctx.task_id)
            super().on_task_start(ctx)

    cfg = load_config([CONFIGS / "smoke.yaml"], [("method.inversion.steps", "6"), ("checkpoint_interval_s", "0")])[0]
    with METHODS.replaced("rdfcil", Counting):
        reference = train(cfg, tmp_path / "a", options=RunOptions(progress=False))
        assert starts == [0, 1]
        starts.clear()
        interrupt = Interrupt()
        with pytest.raises(RunInterrupted, match="setup"):
            train(
                cfg,
                tmp_path / "b",
                options=RunOptions(progress=False, interrupt=interrupt, callbacks=[StopInSetup(interrupt, 3)]),
            )
        assert starts == [0, 1]
        resumed = resume(tmp_path / "b", options=RunOptions(progress=False))
    assert starts == [0, 1]  # not again in the resumed process
    assert resumed["correct_matrix"] == reference["correct_matrix"]


TOY = '''
import torch.nn.functional as F

from dfcil.config import MethodConfig, PositiveFloat, configclass
from dfcil.methods import Method, register_method


@configclass
class ToyConfig(MethodConfig):
    scale: PositiveFloat = 1.0  # no name of its own: registering names it


@register_method("toy", graph_safe=True)
class Toy(Method):
    """A toy method: scaled CE on the task's data."""

    Config = ToyConfig

    def training_step(self, net, batch, ctx, phase):
        return {"ce": self.cfg.scale * F.cross_entropy(net(batch.x).logits, batch.y)}


@register_method("toy_plain")
class ToyPlain(Method):
    """A toy method without a config of its own, not marked graph-safe: plain CE."""

    def training_step(self, net, batch, ctx, phase):
        return {"ce": F.cross_entropy(net(batch.x).logits, batch.y)}
'''


@pytest.fixture
def toy_methods(tmp_path, monkeypatch):
    """Methods defined in a module of their own, outside the package, registered by importing it."""
    (tmp_path / "toy_method.py").write_text(TOY)
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = importlib.util.spec_from_file_location("toy_method", tmp_path / "toy_method.py")
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
    yield "toy", "toy_plain"
    unregister_method("toy")
    unregister_method("toy_plain")


@pytest.mark.parametrize("index", [0, 1], ids=["own-config-graph-safe", "no-config-not-graph-safe"])
def test_registering_a_method_is_enough_for_the_smoke_graph_and_preset_machinery(
    toy_methods, index, tmp_path, capsys, caplog
):
    from dfcil.cli import main
    from test_graphs import test_every_method_keeps_its_graph_promise as graph_check
    from test_methods import test_every_method_resumes_exactly_inside_an_incremental_task as resume_check
    from test_methods import test_two_task_run_of_every_method as smoke

    name = toy_methods[index]
    assert main(["methods"]) == 0 and "A toy method" in capsys.readouterr().out
    assert METHODS.get(name).Config().name == name  # a config made from the defaults selects this method
    smoke(name, tmp_path / "smoke")
    graph_check(name, caplog)  # graph-safe: replays exactly; not: eager, with one warning
    resume_check(name, tmp_path / "resume")
    # a paper setting file (and the mini protocol) runs it at its config's defaults: it needs no preset of its own
    for setting, tasks in (("n5", 5), ("b50_n26", 26)):
        cfg = load_config([CONFIGS / "cifar100" / f"{setting}.yaml"], [("method.name", name)])[0]
        assert cfg.method.name == name and cfg.data.num_tasks == tasks and cfg.train.epochs == 160
    assert load_config([CONFIGS / "cifar100-mini.yaml"], [("method.name", name)])[0].method.name == name
    n5 = str(CONFIGS / "cifar100" / "n5.yaml")
    assert main(["train", "--config", n5, "--method.name", name, "--print-config"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["method"]["name"] == name


def test_a_config_that_names_another_method_is_refused_at_registration():
    from dfcil.config import MethodConfig, configclass
    from dfcil.errors import RegistryError
    from dfcil.methods import Method, register_method

    @configclass
    class Named(MethodConfig):
        name: str = "lwf"

    class Mislabelled(Method):
        Config = Named

    with pytest.raises(RegistryError, match="registered as 'mislabelled'.*default 'mislabelled'"):
        register_method("mislabelled")(Mislabelled)
    assert "mislabelled" not in METHODS


def test_the_public_api_trains_and_resumes_a_run_directory(tmp_path):
    import dfcil
    from dfcil.errors import ConfigError

    assert dfcil.__all__ == ["__version__", "list_methods", "load_config", "load_model", "resume", "train"]
    cfg, _ = dfcil.load_config([CONFIGS / "smoke.yaml"], [("train.epochs", "2"), ("train.milestones", "[]")])
    summary = dfcil.train(cfg, tmp_path / "run")
    assert len(summary["acc_per_task"]) == 2 and (tmp_path / "run" / "summary.json").exists()
    assert dfcil.resume(tmp_path / "run") == summary  # finished: nothing to resume, its summary as it is
    with pytest.raises(ConfigError, match="not a dfcil run directory"):
        dfcil.resume(tmp_path)
    assert "rdfcil" in dfcil.list_methods()
    net = dfcil.load_model(tmp_path / "run" / "model.pt")
    assert not net.training and net.head.out_features == 10  # the smoke preset's 10 classes


class _FailsOnInterrupt(Callback):
    def on_interrupt(self):
        raise OSError("a logger's disk is full")


def test_a_failing_callback_never_costs_the_checkpoint(tmp_path):
    """Every callback sees every hook: one that raises on an interrupt still lets the checkpoint be written, and
    its error is raised afterwards."""
    from conftest import StopAfterEpochs
    from dfcil.checkpoint import Checkpointer, loads
    from dfcil.runs.runner import train

    cfg = load_config([CONFIGS / "smoke.yaml"])[0]
    interrupt = Interrupt()
    stop = StopAfterEpochs(interrupt, 3)  # task 0 has 2 epochs: after the first RRL epoch of task 1
    with pytest.raises(OSError, match="disk is full"):
        train(
            cfg,
            tmp_path / "run",
            options=RunOptions(progress=False, interrupt=interrupt, callbacks=[stop, _FailsOnInterrupt()]),
        )
    position = loads(Checkpointer(tmp_path / "run").last.read_bytes())["position"]
    assert position == {"task": 1, "stage": "train", "phase": 0, "epoch": 1, "step": 0}


class _BackboneAtEvaluation(Callback):
    def __init__(self):
        self.seen = []

    def on_run_start(self, loop):
        self.loop = loop

    def on_eval_start(self):
        backbone = self.loop.net.backbone
        self.seen.append((backbone.training, any(p.requires_grad for p in backbone.parameters())))


def test_a_run_resumed_at_a_phase_end_finishes_the_task_as_an_uninterrupted_one(tmp_path):
    """Stopped right after CHR (a head-only phase), resumed: the method's task end and the evaluation see the
    backbone frozen in eval mode, as they do without the stop."""
    from conftest import StopAfterEpochs
    from dfcil.runs.runner import resume, train

    cfg = load_config([CONFIGS / "smoke.yaml"])[0]
    plain = _BackboneAtEvaluation()
    reference = train(cfg, tmp_path / "a", options=RunOptions(progress=False, callbacks=[plain]))
    interrupt = Interrupt()
    with pytest.raises(RunInterrupted, match="end of phase chr"):  # task 0: 2 epochs; task 1: 2 RRL, 1 CHR
        train(
            cfg,
            tmp_path / "b",
            options=RunOptions(progress=False, interrupt=interrupt, callbacks=[StopAfterEpochs(interrupt, 5)]),
        )
    resumed = _BackboneAtEvaluation()
    summary = resume(tmp_path / "b", options=RunOptions(progress=False, callbacks=[resumed]))
    assert plain.seen == [(True, True), (False, False)] and resumed.seen == [(False, False)]
    assert summary["correct_matrix"] == reference["correct_matrix"]


def test_every_replaying_method_answers_with_its_synthesizer_and_the_others_with_none():
    """One method-level answer (Method.synthesizer) for the grids, the diagnostics, inspect and the protocol."""
    from dfcil.config import TrainConfig
    from dfcil.methods import build_method
    from dfcil.synthesis.replay import Replay

    for name in METHODS.names():
        method = build_method(METHODS.get(name).Config(), TrainConfig())
        synthesizer = method.synthesizer()
        inverts = hasattr(method.cfg, "inversion")
        assert (synthesizer is not None) == inverts, name
        if inverts:
            assert isinstance(synthesizer, Replay) and synthesizer.cfg is method.cfg.inversion
            assert synthesizer in method.components().values()


def test_below_the_engines_build_nothing_holds_the_run_config():
    """The config is resolved at the top (engine.build, the runner): the loop, its callbacks and the analysis of a
    live run take values, never the RunConfig."""
    import ast
    import dataclasses

    from conftest import REPO
    from dfcil.training.loop import Loop

    assert "cfg" not in {f.name for f in dataclasses.fields(Loop)}
    for module in ("loop", "callbacks", "grid", "diagnostics", "loggers", "guard"):
        tree = ast.parse((REPO / "src" / "dfcil" / "training" / f"{module}.py").read_text())
        names = {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
        assert "RunConfig" not in names, module
