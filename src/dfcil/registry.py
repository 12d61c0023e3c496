"""Named registries: a method, dataset or backbone is found by the name a config gives.

A registry is a table filled by decorators when the module that defines an item is imported. Each family's package
imports its built-in members by name (``dfcil/methods/__init__.py``, ``dfcil/data/__init__.py``,
``dfcil/models/__init__.py``), and Python runs a package's ``__init__`` before any module inside it, so a registry
is complete as soon as anything of its family is imported. Lookups of unknown names raise an error that lists the
valid names.

A registry with an entry-point ``group`` (``dfcil.methods``, ...) also finds plugins: asked for a name it does not
hold, it imports the module of the installed entry point of that name (:mod:`dfcil.plugins`), which registers it.
An entry point of a package that is not installed (its ``.dist-info`` in the current directory or on
``PYTHONPATH``) is refused instead, unless the command trusts its run's plugins
(:func:`dfcil.plugins.load_entry_point`): a name, which a received run's config may give, imports no code found
beside it.
"""

from __future__ import annotations

import contextlib
import difflib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from dfcil.errors import PluginError, RegistryError
from dfcil.plugins import entry_points, load_entry_point

T = TypeVar("T")


class Registry(Generic[T]):
    """A name → item table with decorator registration, plugins found by name, and helpful lookup errors.

    Args:
        kind: what an item is, in words (``"method"``).
        group: the entry-point group where installed packages declare more items (``"dfcil.methods"``), or None.
    """

    def __init__(self, kind: str, group: str | None = None) -> None:
        self.kind = kind
        self.group = group
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator that registers its target under ``name``."""

        def decorator(item: T) -> T:
            if name in self._items:
                first, second = _origin(self._items[name]), _origin(item)
                raise RegistryError(f"{self.kind} {name!r} is registered twice: by {first} and by {second}; rename one")
            self._items[name] = item
            return item

        return decorator

    def unregister(self, name: str) -> None:
        """Remove ``name`` (plugins and tests that register an item for a while)."""
        self._items.pop(name, None)

    @contextlib.contextmanager
    def replaced(self, name: str, item: T) -> Iterator[T]:
        """Register ``item`` under ``name`` (replacing any item of that name) until the block ends (tests)."""
        missing = object()
        before = self._items.get(name, missing)
        self._items[name] = item
        try:
            yield item
        finally:
            if before is missing:
                self._items.pop(name, None)
            else:
                self._items[name] = before

    def get(self, name: str) -> T:
        """The item ``name``; one an installed plugin declares is imported first.

        Raises:
            RegistryError: no item and no plugin has that name (the message lists the valid names).
            PluginError: the plugin that declares ``name`` is not installed (and not trusted), fails to import, or
                registers no such item.
        """
        if name in self:
            return self._items[name]
        known = [*self._items, *self.plugin_names()]
        folded = {k.lower(): k for k in known}  # RDFCIL, LwF: the name in another case
        close = [folded[name.lower()]] if name.lower() in folded else difflib.get_close_matches(name, known, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        plugins = f"; plugins: {', '.join(self.plugin_names())}" if self.plugin_names() else ""
        raise RegistryError(
            f"unknown {self.kind} {name!r}.{hint} Registered {self.kind}s: {', '.join(sorted(self._items))}{plugins}"
        )

    def names(self) -> list[str]:
        """The registered names (plugins that are installed but not imported yet are :meth:`plugin_names`)."""
        return sorted(self._items)

    def plugin_names(self) -> list[str]:
        """The names installed packages declare under the registry's group and that are not registered (yet)."""
        if self.group is None:
            return []
        return sorted({ep.name for ep in entry_points(self.group)} - set(self._items))

    def __contains__(self, name: object) -> bool:
        """Whether ``name`` is registered, after importing the plugin that declares it, if one does."""
        if name in self._items:
            return True
        if self.group is None or not isinstance(name, str):
            return False
        where = load_entry_point(self.group, self.kind, name)
        if where is not None and name not in self._items:
            raise PluginError(
                f"{where} was imported but registered no {self.kind} {name!r}: its module must register it under the "
                f"name of its entry point"
            )
        return where is not None

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())


def _origin(item: object) -> str:
    """The module that defines ``item``, in words, for errors."""
    return f"module {getattr(item, '__module__', None) or '?'}"
