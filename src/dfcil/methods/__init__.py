"""Registered methods. Each module registers itself on import; the list is explicit (no folder scanning)."""

from dfcil.methods import finetune, rdfcil  # noqa: F401  (registration)
from dfcil.methods.base import METHODS, Batch, Method, Phase, TaskContext, register_method

__all__ = ["METHODS", "Batch", "Method", "Phase", "TaskContext", "register_method", "build_method"]


def build_method(cfg, train) -> Method:
    """Instantiate the method named by ``cfg.name`` with its validated config."""
    return METHODS.get(cfg.name)(cfg, train)
