"""Registered methods. Every module of this package is imported here, in name order, and each method module
registers its method (``@register_method``): adding a built-in method is adding its file."""

import importlib
import pkgutil

from dfcil.methods.base import (
    METHODS,
    Batch,
    Method,
    Phase,
    Task,
    TaskContext,
    build_method,
    loss_terms,
    register_method,
    unregister_method,
)

for _module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    importlib.import_module(f"{__name__}.{_module}")

__all__ = [
    "METHODS",
    "Batch",
    "Method",
    "Phase",
    "Task",
    "TaskContext",
    "build_method",
    "loss_terms",
    "register_method",
]
__all__ += ["unregister_method"]
