"""Named registries: a method, dataset or backbone is found by the name a config gives.

A registry is a table filled by decorators when the module that defines an item is imported. Each family's package
imports its built-in members by name (``dfcil/methods/__init__.py``, ``dfcil/data/__init__.py``,
``dfcil/models/__init__.py``), and Python runs a package's ``__init__`` before any module inside it, so a registry
is complete as soon as anything of its family is imported. Lookups of unknown names raise an error that lists the
valid names.
"""

from __future__ import annotations

import contextlib
import difflib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from dfcil.errors import RegistryError

T = TypeVar("T")


class Registry(Generic[T]):
    """A name → item table with decorator registration and helpful lookup errors."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}

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
        try:
            return self._items[name]
        except KeyError:
            close = difflib.get_close_matches(name, self._items, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise RegistryError(
                f"unknown {self.kind} {name!r}.{hint} Registered {self.kind}s: {', '.join(sorted(self._items))}"
            ) from None

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
