"""Registered methods. Each module registers itself on import; the list is explicit (no folder scanning)."""

from dfcil.methods import abd, deepinversion, dgr, finetune, joint, lwf, lwf_mc, podnet_df, rdfcil, ucir_df  # noqa: F401
from dfcil.methods.base import METHODS, Batch, Method, Phase, TaskContext, register_method

__all__ = ["METHODS", "Batch", "Method", "Phase", "TaskContext", "register_method", "build_method"]


def build_method(cfg, train) -> Method:
    """Instantiate the method named by ``cfg.name`` with its validated config."""
    return METHODS.get(cfg.name)(cfg, train)
