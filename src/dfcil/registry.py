"""Named registries: a method, dataset or backbone is found by the name a config gives.

A registry is filled by decorators at import time of the module that defines the item. A registry may name the
module that registers the built-in items (``builtins``): it is imported on the first lookup, so that code which
only reads names (the config layer) does not import the items' modules itself. Lookups of unknown names raise an
error that lists the valid names.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class RegistryError(KeyError):
    """An unknown or duplicate registry name."""

    def __str__(self) -> str:  # KeyError quotes its message; we want it readable
        return str(self.args[0])


class Registry(Generic[T]):
    """A name → item table with decorator registration and helpful lookup errors."""

    def __init__(self, kind: str, builtins: str | None = None) -> None:
        self.kind = kind
        self.builtins = builtins  # module whose import registers the built-in items
        self._items: dict[str, T] = {}

    def _load(self) -> dict[str, T]:
        if self.builtins is not None:
            importlib.import_module(self.builtins)  # registers into this registry (a no-op once imported)
        return self._items

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator that registers its target under ``name``."""

        def decorator(item: T) -> T:
            if name in self._items:
                raise RegistryError(f"{self.kind} {name!r} is registered twice")
            self._items[name] = item
            return item

        return decorator

    def unregister(self, name: str) -> None:
        """Remove ``name`` (plugins and tests that register an item for a while)."""
        self._items.pop(name, None)

    @contextlib.contextmanager
    def replaced(self, name: str, item: T) -> Iterator[T]:
        """Register ``item`` under ``name`` (replacing any item of that name) until the block ends (tests)."""
        items = self._load()
        missing = object()
        before = items.get(name, missing)
        items[name] = item
        try:
            yield item
        finally:
            if before is missing:
                items.pop(name, None)
            else:
                items[name] = before

    def get(self, name: str) -> T:
        items = self._load()
        try:
            return items[name]
        except KeyError:
            close = difflib.get_close_matches(name, items, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise RegistryError(
                f"unknown {self.kind} {name!r}.{hint} Registered {self.kind}s: {', '.join(sorted(items))}"
            ) from None

    def names(self) -> list[str]:
        return sorted(self._load())

    def __contains__(self, name: object) -> bool:
        return name in self._load()

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
