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
    assert len(GRAPH) > 60 and GRAPH["dfcil.engine"] >= {"dfcil.loop", "dfcil.callbacks"}
    assert cycles(GRAPH) == []


def test_modules_below_do_not_climb_back_up():
    """Each of these sits below the modules named with it, which it may not reach by any chain of imports."""
    above = {
        "dfcil.errors": set(MODULES) - {"dfcil.errors"},  # imports nothing of dfcil
        "dfcil.config": {"dfcil.methods", "dfcil.load", "dfcil.engine"},  # the config's types know no method
        "dfcil.tools": {"dfcil.engine", "dfcil.runner", "dfcil.callbacks"},  # eval/export never train
        "dfcil.model_file": {"dfcil.engine", "dfcil.runner", "dfcil.methods"},
        "dfcil.state": {"dfcil.checkpoint", "dfcil.engine"},
        "dfcil.report": {"dfcil.methods", "dfcil.engine", "dfcil.runner"},  # reading run directories only
        "dfcil.synthesis.replay": {"dfcil.methods", "dfcil.engine"},
        "dfcil.methods": {"dfcil.engine", "dfcil.loop", "dfcil.callbacks", "dfcil.checkpoint", "dfcil.load"},
        "dfcil.loop": {"dfcil.engine", "dfcil.callbacks", "dfcil.task0", "dfcil.runner"},
        "dfcil.sweep": {"dfcil.cli"},
    }
    climbing = {low: sorted(reaches(GRAPH, low) & high) for low, high in above.items()}
    assert {low: high for low, high in climbing.items() if high} == {}
    for name in ("dfcil.distributed", "dfcil.optim", "dfcil.extras"):  # errors come from dfcil.errors
        assert "dfcil.config" not in GRAPH[name], name


def test_every_module_imports_alone_and_the_light_ones_stay_light():
    """In a fresh interpreter, each module imports with no other dfcil module loaded before it (an import cycle
    that the order of imports hides would fail here), and what it pulls in is what the layering promises."""
    code = textwrap.dedent(f"""
        import importlib, sys
        failed, loaded = [], {{}}
        for name in {sorted(MODULES)!r}:
            for m in [m for m in sys.modules if m == "dfcil" or m.startswith("dfcil.")]:
                del sys.modules[m]
            try:
                importlib.import_module(name)
            except Exception as err:
                failed.append(f"{{name}}: {{err!r}}")
            loaded[name] = sorted(m for m in sys.modules if m.startswith("dfcil."))
        print(repr((failed, loaded)))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    failed, loaded = eval(done.stdout.strip().splitlines()[-1])  # noqa: S307 - our own subprocess's repr
    assert failed == []
    assert "dfcil.engine" not in loaded["dfcil.tools"] and "dfcil.runner" not in loaded["dfcil.tools"]
    assert "dfcil.methods" not in loaded["dfcil.config"] and "dfcil.methods" not in loaded["dfcil.sweep"]
