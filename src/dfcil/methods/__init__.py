"""Registered methods. Each module registers itself on import; the list is explicit (no folder scanning)."""

from dfcil.methods import abd, deepinversion, dgr, finetune, joint, lwf, lwf_mc, podnet_df, rdfcil, ucir_df  # noqa: F401
from dfcil.methods.base import (
    METHODS,
    Batch,
    Method,
    Phase,
    Task,
    TaskContext,
    build_method,
    register_method,
    unregister_method,
)

__all__ = [
    "METHODS", "Batch", "Method", "Phase", "Task", "TaskContext", "build_method", "register_method", "unregister_method",
]  # fmt: skip
