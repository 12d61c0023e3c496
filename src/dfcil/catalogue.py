"""What ``dfcil methods`` prints about each method, without importing torch.

A method's entry is its registered name, the first line of its class docstring and the class attributes listed as
facts in :class:`MethodEntry`. The built-in methods' entries are read from their source with :mod:`ast`: the
modules that ``dfcil/methods/__init__.py`` imports, the classes decorated ``@register_method("name")`` in them, and
each fact as the literal the class (or the nearest base class in the methods package) assigns. Importing the
methods would cost the whole of torch (seconds) for a few lines of text. ``tests/test_cli.py`` checks that these
entries equal the ones :func:`entry_of` makes from the imported registry, so the two cannot drift apart.

Methods registered outside the package (a plugin, a test's toy method) are listed from their classes: once
``dfcil.methods`` is imported, :func:`method_entries` reads the registry itself. The methods that installed packages
declare as entry points (:mod:`dfcil.plugins`) and that are not imported are listed from the packages' metadata
(:func:`plugin_entries`): their names and packages, without importing them.
"""

from __future__ import annotations

import ast
import dataclasses
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from dfcil.plugins import entry_points, package_of
from dfcil.stores import is_data_free

METHODS_PACKAGE = Path(__file__).resolve().parent / "methods"
BASE = ("base", "Method")  # (module, class) where every fact has its default


@dataclasses.dataclass(frozen=True)
class MethodEntry:
    """One line of ``dfcil methods``. The fields after ``summary`` are the facts: class attributes of the method,
    each assigned a literal in its source."""

    name: str
    summary: str  # the first line of the class docstring
    stores: str  # what it keeps between tasks besides the model: one of dfcil.stores.STORES

    @property
    def data_free(self) -> bool:
        return is_data_free(self.stores)


@dataclasses.dataclass(frozen=True)
class PluginEntry:
    """A method an installed package declares (an entry point of ``dfcil.methods``), not imported."""

    name: str
    package: str  # "mypkg 0.1"
    module: str  # the entry point's value: the module that registers the method


def plugin_of(entry: MethodEntry) -> str | None:
    """The module outside dfcil that registered ``entry``'s method (a plugin), or None for a built-in one."""
    methods = sys.modules.get("dfcil.methods")
    if methods is None or entry.name not in methods.METHODS.names():
        return None
    module = methods.METHODS.get(entry.name).__module__
    return None if module == "dfcil" or module.startswith("dfcil.") else module


def plugin_entries(listed: Iterable[str]) -> list[PluginEntry]:
    """The methods installed packages declare that are not among ``listed`` (the registered ones), by name, read
    from the packages' metadata: nothing is imported."""
    listed = set(listed)
    found = {ep.name: PluginEntry(ep.name, package_of(ep), ep.module) for ep in entry_points("dfcil.methods")}
    return [entry for name, entry in sorted(found.items()) if name not in listed]


# Config switches that change what a method keeps between tasks: (key, methods, stores, summary). dfcil methods
# lists them under the methods; tests/test_cli.py checks that each method's config has the key.
SWITCHES = (
    (
        "ldc",
        ("lwf", "rdfcil"),
        "class statistics",
        "LDC (Gomez-Villa et al., 2024): class means moved by a learned projector after each task; nearest-mean "
        "classifier",
    ),
)

FACTS = tuple(f.name for f in dataclasses.fields(MethodEntry))[2:]


def entry_of(cls: Any) -> MethodEntry:
    """The entry of an imported, registered method class."""
    return MethodEntry(cls.name, _first_line(cls.__doc__), **{fact: getattr(cls, fact) for fact in FACTS})


def method_entries() -> list[MethodEntry]:
    """Every registered method's entry, sorted by name: from the registry when ``dfcil.methods`` is already
    imported (it then also holds methods registered from outside the package), else from the built-in methods'
    source."""
    methods = sys.modules.get("dfcil.methods")
    if methods is not None:
        return [entry_of(methods.METHODS.get(name)) for name in methods.METHODS.names()]
    return builtin_entries()


def builtin_entries(package: Path = METHODS_PACKAGE) -> list[MethodEntry]:
    """The entries of the methods registered by the modules that ``package/__init__.py`` imports, read from their
    source, sorted by name.

    Raises:
        ValueError: a fact assigned something other than a literal, or assigned nowhere up to the base class.
    """
    source = _PackageSource(package)
    entries = []
    for module in source.imported_modules():
        for node in source.tree(module).body:
            name = _registered_name(node)
            if name is not None:
                assert isinstance(node, ast.ClassDef)
                facts = {fact: source.fact(module, node.name, fact) for fact in FACTS}
                entries.append(MethodEntry(name, _first_line(ast.get_docstring(node)), **facts))
    return sorted(entries, key=lambda e: e.name)


def _first_line(doc: str | None) -> str:
    lines = (doc or "").strip().splitlines()
    return lines[0].strip() if lines else ""


def _registered_name(node: ast.stmt) -> str | None:
    """``"abd"`` for a class decorated ``@register_method("abd")``, else None."""
    if not isinstance(node, ast.ClassDef):
        return None
    for deco in node.decorator_list:
        if isinstance(deco, ast.Call) and isinstance(deco.func, ast.Name) and deco.func.id == "register_method":
            arg = deco.args[0] if deco.args else None
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                return arg.value
    return None


class _PackageSource:
    """The parsed modules of the methods package, and class attributes looked up through their base classes."""

    def __init__(self, package: Path) -> None:
        self.package = package
        self._trees: dict[str, ast.Module] = {}

    def tree(self, module: str) -> ast.Module:
        if module not in self._trees:
            path = self.package / f"{module}.py"
            self._trees[module] = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        return self._trees[module]

    def imported_modules(self) -> list[str]:
        """The package's modules that its ``__init__.py`` imports (``from dfcil.methods import abd, ...``)."""
        found = []
        for node in self.tree("__init__").body:
            if isinstance(node, ast.ImportFrom) and node.module == "dfcil.methods":
                found += [alias.name for alias in node.names if (self.package / f"{alias.name}.py").is_file()]
        return found

    def fact(self, module: str, cls: str, fact: str) -> Any:
        """The literal that class ``cls`` of ``module``, or its nearest base in the package, assigns to ``fact``."""
        for where, node in self._lineage(module, cls):
            for stmt in node.body:
                target, value = _assignment(stmt)
                if target != fact:
                    continue
                try:
                    return ast.literal_eval(value)
                except ValueError:
                    raise ValueError(
                        f"{self.package / where}.py:{stmt.lineno}: {cls}.{fact} must be a literal for `dfcil "
                        f"methods` to read it without importing the method (dfcil.catalogue)"
                    ) from None
        raise ValueError(f"{cls} in {self.package / module}.py: no class up to Method assigns {fact!r}")

    def _lineage(self, module: str, cls: str) -> Iterable[tuple[str, ast.ClassDef]]:
        """``cls`` and its bases that the package defines, depth first in the order they are named (single
        inheritance, which is all the methods use, makes this the MRO)."""
        node = next((n for n in self.tree(module).body if isinstance(n, ast.ClassDef) and n.name == cls), None)
        if node is None:
            return
        yield module, node
        if (module, cls) == BASE:
            return
        for base in node.bases:
            if isinstance(base, ast.Name):
                yield from self._lineage(*self._resolve(module, base.id))

    def _resolve(self, module: str, name: str) -> tuple[str, str]:
        """Where the name ``name`` used in ``module`` is defined: ``from dfcil.methods.base import Method`` in
        ``module`` gives ``("base", "Method")``; a name defined in ``module`` itself stays there."""
        for node in self.tree(module).body:
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("dfcil.methods."):
                for alias in node.names:
                    if (alias.asname or alias.name) == name:
                        return node.module.removeprefix("dfcil.methods."), alias.name
        return module, name


def _assignment(stmt: ast.stmt) -> tuple[str | None, ast.expr | None]:
    """``("stores", <"all data">)`` for ``stores = "all data"`` or ``stores: ClassVar[str] = "all data"``."""
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
        return stmt.targets[0].id, stmt.value
    if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value is not None:
        return stmt.target.id, stmt.value
    return None, None
