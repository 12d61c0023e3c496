"""The package's imports run one way: no module imports, even inside a function or under ``TYPE_CHECKING``, a
module that imports it back; every module imports alone; the light modules stay light."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

from conftest import REPO

SRC = REPO / "src"
PACKAGE = SRC / "dfcil"


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports_of(path: Path) -> set[str]:
    """Every dfcil module ``path`` imports anywhere in its text: at the top, inside functions, under TYPE_CHECKING.
    ``from a.b import c`` is module ``a.b.c`` where that is a module, else ``a.b``."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in MODULES else node.module)
    return {name for name in found if name in MODULES}


GRAPH = {name: imports_of(path) for name, path in MODULES.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module, or a module importing itself (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph[v]:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def reaches(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for w in graph[todo.pop()] - seen:
            seen.add(w)
            todo.append(w)
    return seen


def test_the_cycle_finder_finds_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"a"}}) == [["a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_imports_one_that_imports_it_back():
    assert len(GRAPH) > 60 and GRAPH["dfcil.training.engine"] >= {"dfcil.training.loop", "dfcil.training.callbacks"}
    assert cycles(GRAPH) == []


def test_modules_below_do_not_climb_back_up():
    """Each of these sits below the modules named with it, which it may not reach by any chain of imports."""
    above = {
        "dfcil.errors": set(MODULES) - {"dfcil.errors"},  # imports nothing of dfcil
        "dfcil.config": {"dfcil.methods", "dfcil.load", "dfcil.training.engine"},  # the config's types know no method
        "dfcil.analysis.tools": {
            "dfcil.training.engine",
            "dfcil.runs.runner",
            "dfcil.training.callbacks",
        },  # eval/export never train
        "dfcil.model_file": {"dfcil.training.engine", "dfcil.runs.runner", "dfcil.methods"},
        "dfcil.training.state": {"dfcil.checkpoint", "dfcil.training.engine"},
        "dfcil.analysis.report": {
            "dfcil.methods",
            "dfcil.training.engine",
            "dfcil.runs.runner",
        },  # reading run directories only
        "dfcil.synthesis.replay": {"dfcil.methods", "dfcil.training.engine"},
        "dfcil.methods": {
            "dfcil.training.engine",
            "dfcil.training.loop",
            "dfcil.training.callbacks",
            "dfcil.checkpoint",
            "dfcil.load",
        },
        "dfcil.training.loop": {
            "dfcil.training.engine",
            "dfcil.training.callbacks",
            "dfcil.training.task0",
            "dfcil.runs.runner",
        },
        "dfcil.sweep": {"dfcil.cli"},
    }
    climbing = {low: sorted(reaches(GRAPH, low) & high) for low, high in above.items()}
    assert {low: high for low, high in climbing.items() if high} == {}
    for name in ("dfcil.compute.distributed", "dfcil.compute.optim", "dfcil.extras"):  # errors come from dfcil.errors
        assert "dfcil.config" not in GRAPH[name], name


# The package's layers, bottom first: the folders name them (docs/extending.md, Layout). A module may import its own
# layer and the layers below, never one above.
LAYERS = (
    ("dfcil.errors", "dfcil.version", "dfcil.io", "dfcil.extras", "dfcil.stores", "dfcil.children", "dfcil.progress",
     "dfcil.registry", "dfcil.plugins", "dfcil.config", "dfcil.metrics", "dfcil.checkpoint", "dfcil.presets"),
    ("dfcil.data", "dfcil.models", "dfcil.compute", "dfcil.model_file"),
    ("dfcil.losses", "dfcil.context", "dfcil.synthesis"),
    ("dfcil.methods", "dfcil.catalogue"),
    ("dfcil.load",),
    ("dfcil.training",),
    ("dfcil.runs",),
    ("dfcil.analysis",),
    ("dfcil.sweep", "dfcil.cli", "dfcil.__main__", "dfcil.runner"),  # and the package itself
)  # fmt: skip


def layer_of(module: str) -> int:
    for i, prefixes in enumerate(LAYERS):
        if any(module == p or module.startswith(f"{p}.") for p in prefixes):
            return i
    assert module == "dfcil", f"{module} is in no layer: add it to LAYERS"
    return len(LAYERS)


def test_every_module_is_in_a_layer_and_imports_only_its_own_and_those_below():
    assert {p for layer in LAYERS for p in layer if "." in p.removeprefix("dfcil.")} <= {"dfcil.__main__"} | {
        p for layer in LAYERS for p in layer if p in MODULES
    }
    upward = {
        name: sorted(t for t in targets if layer_of(t) > layer_of(name))
        for name, targets in GRAPH.items()
        if any(layer_of(t) > layer_of(name) for t in targets)
    }
    assert upward == {}
    for layer in ("dfcil.training", "dfcil.runs", "dfcil.analysis", "dfcil.compute"):  # the layers are folders
        assert (PACKAGE / layer.removeprefix("dfcil.") / "__init__.py").is_file(), layer
    flat = sorted(p.stem for p in PACKAGE.glob("*.py"))
    assert len(flat) <= 21, flat  # the package's own folder keeps the base modules and the entry points


def test_every_module_imports_alone_and_the_light_ones_stay_light():
    """In a fresh interpreter, each module imports with no other dfcil module loaded before it (an import cycle
    that the order of imports hides would fail here), and what it pulls in is what the layering promises."""
    code = textwrap.dedent(f"""
        import importlib, sys
        failed, loaded, compiler = [], {{}}, None
        for name in {sorted(MODULES)!r}:
            for m in [m for m in sys.modules if m == "dfcil" or m.startswith("dfcil.")]:
                del sys.modules[m]
            try:
                importlib.import_module(name)
            except Exception as err:
                failed.append(f"{{name}}: {{err!r}}")
            loaded[name] = sorted(m for m in sys.modules if m.startswith("dfcil."))
            if "torch._dynamo" in sys.modules and not compiler:
                compiler = name
        print(repr((failed, loaded, compiler)))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    failed, loaded, compiler = eval(done.stdout.strip().splitlines()[-1])  # noqa: S307 - our own subprocess's repr
    assert failed == []
    # the compiler (torch._dynamo) is imported by engine.compile only: seconds of every run's start-up otherwise
    # (R-DFCIL+'s @torch.compiler.disable did, 2.3 s of `import dfcil.methods`' 6)
    assert compiler is None, f"importing {compiler} imports torch._dynamo: use Runtime.eager, not a decorator"
    assert (
        "dfcil.training.engine" not in loaded["dfcil.analysis.tools"]
        and "dfcil.runs.runner" not in loaded["dfcil.analysis.tools"]
    )
    assert "dfcil.methods" not in loaded["dfcil.config"] and "dfcil.methods" not in loaded["dfcil.sweep"]
