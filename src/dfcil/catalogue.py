"""What ``dfcil methods`` prints about each method, without importing torch.

A method's entry is its registered name, the first line of its class docstring and what it declares where it is
registered: ``@register_method("name", stores=..., switches={...}, ...)`` (:class:`dfcil.methods.base.MethodInfo`,
the one place each fact is declared). The built-in methods' entries are read from that decorator call in their
source with :mod:`ast`: the modules that ``dfcil/methods/__init__.py`` imports, the classes decorated in them, each
fact the literal the decorator is given (its default where it is given none). Importing the methods would cost the
whole of torch (seconds) for a few lines of text. ``tests/test_cli.py`` checks that these entries equal the ones
:func:`entry_of` makes from the imported registry.

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

from dfcil.plugins import entry_point_outside, entry_points, package_of
from dfcil.stores import SWITCHES, is_data_free

METHODS_PACKAGE = Path(__file__).resolve().parent / "methods"
LISTED = {"stores": "nothing", "switches": {}}  # the facts dfcil methods lists, and their defaults (MethodInfo's)


@dataclasses.dataclass(frozen=True)
class MethodEntry:
    """One line of ``dfcil methods``: the method's name, summary and the facts it declares that the listing shows."""

    name: str
    summary: str  # the first line of the class docstring
    stores: str  # what it keeps between tasks besides the model: one of dfcil.stores.STORES
    switches: tuple[tuple[str, str], ...] = ()  # (config key, what it keeps when the key is true), sorted

    @property
    def data_free(self) -> bool:
        return is_data_free(self.stores)


@dataclasses.dataclass(frozen=True)
class PluginEntry:
    """A method an installed package declares (an entry point of ``dfcil.methods``), not imported."""

    name: str
    package: str  # "mypkg 0.1"
    module: str  # the entry point's value: the module that registers the method
    outside: str | None = None  # why its package is not an installed one (then it loads only with consent), in words


@dataclasses.dataclass(frozen=True)
class SwitchEntry:
    """A config switch that changes what a method keeps: ``method.<key> true`` on ``methods`` keeps ``stores``."""

    key: str
    methods: tuple[str, ...]
    stores: str
    summary: str  # dfcil.stores.SWITCHES


def plugin_of(entry: MethodEntry) -> str | None:
    """The module outside dfcil that registered ``entry``'s method (a plugin), or None for a built-in one."""
    methods = sys.modules.get("dfcil.methods")
    if methods is None or entry.name not in methods.METHODS.names():
        return None
    module = methods.METHODS.get(entry.name).__module__
    return None if module == "dfcil" or module.startswith("dfcil.") else module


def plugin_entries(listed: Iterable[str]) -> list[PluginEntry]:
    """The methods packages on ``sys.path`` declare that are not among ``listed`` (the registered ones), by name,
    read from the packages' metadata: nothing is imported. A package that is not installed (found in the current
    directory or on ``PYTHONPATH``: :func:`~dfcil.plugins.entry_point_outside`) says so: its method loads only with
    the user's consent."""
    listed = set(listed)
    found = {
        ep.name: PluginEntry(ep.name, package_of(ep), ep.module, entry_point_outside(ep))
        for ep in entry_points("dfcil.methods")
    }
    return [entry for name, entry in sorted(found.items()) if name not in listed]


def switch_entries(entries: Iterable[MethodEntry]) -> list[SwitchEntry]:
    """The switches the methods of ``entries`` declare, each with the methods that have it, by key."""
    found: dict[tuple[str, str], list[str]] = {}
    for entry in entries:
        for key, stores in entry.switches:
            found.setdefault((key, stores), []).append(entry.name)
    return [
        SwitchEntry(key, tuple(names), stores, SWITCHES.get(key, "")) for (key, stores), names in sorted(found.items())
    ]


def entry_of(cls: Any) -> MethodEntry:
    """The entry of an imported, registered method class."""
    info = cls.info
    return MethodEntry(cls.name, _summary(cls.__doc__), info.stores, tuple(sorted(info.switches.items())))


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
    ``@register_method(...)`` calls, sorted by name.

    Raises:
        ValueError: a listed fact given something other than a literal.
    """
    entries = []
    for module in _imported_modules(package):
        path = package / f"{module}.py"
        for node in ast.parse(path.read_text(encoding="utf-8"), filename=str(path)).body:
            call = _registration(node)
            if call is None:
                continue
            assert isinstance(node, ast.ClassDef)
            facts = dict(LISTED)
            for keyword in call.keywords:
                if keyword.arg in LISTED:
                    try:
                        facts[keyword.arg] = ast.literal_eval(keyword.value)
                    except ValueError:
                        raise ValueError(
                            f"{path}:{keyword.lineno}: {keyword.arg} of @register_method must be a literal for "
                            f"`dfcil methods` to read it without importing the method (dfcil.catalogue)"
                        ) from None
            name = call.args[0].value  # _registration checked it is a string
            switches = tuple(sorted(facts["switches"].items()))
            entries.append(MethodEntry(name, _summary(ast.get_docstring(node)), facts["stores"], switches))
    return sorted(entries, key=lambda e: e.name)


def _summary(doc: str | None) -> str:
    """The docstring's summary: its first paragraph, on one line (a summary may wrap over several source lines)."""
    paragraph = (doc or "").strip().split("\n\n", 1)[0]
    return " ".join(paragraph.split())


def _registration(node: ast.stmt) -> ast.Call | None:
    """The ``register_method("abd", ...)`` call decorating a class, else None."""
    if not isinstance(node, ast.ClassDef):
        return None
    for deco in node.decorator_list:
        if isinstance(deco, ast.Call) and isinstance(deco.func, ast.Name) and deco.func.id == "register_method":
            arg = deco.args[0] if deco.args else None
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                return deco
    return None


def _imported_modules(package: Path) -> list[str]:
    """The package's modules that its ``__init__.py`` imports (``from dfcil.methods import abd, ...``)."""
    path = package / "__init__.py"
    found = []
    for node in ast.parse(path.read_text(encoding="utf-8"), filename=str(path)).body:
        if isinstance(node, ast.ImportFrom) and node.module == "dfcil.methods":
            found += [alias.name for alias in node.names if (package / f"{alias.name}.py").is_file()]
    return found
