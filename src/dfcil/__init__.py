"""dfcil: data-free class-incremental learning (R-DFCIL and baselines) on PyTorch.

Public API::

    cfg, _ = dfcil.load_config(["configs/smoke.yaml"], [("train.epochs", "2")])
    summary = dfcil.run(cfg, "runs/smoke")
    dfcil.list_methods()
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__", "list_methods", "load_config", "run"]


def load_config(paths=(), overrides=()):
    """Merge YAML files and dotted ``(key, value)`` overrides into a validated :class:`~dfcil.config.RunConfig`.

    Returns:
        ``(config, dropped_method_keys)``, see :func:`dfcil.config.load_config`.
    """
    from dfcil.config import load_config as _load

    return _load(paths, overrides)


def run(cfg, out, progress=None):
    """Train ``cfg`` into the new run directory ``out``; returns the summary dict (also ``out/summary.json``)."""
    from dfcil.runner import train

    return train(cfg, out, progress=progress)


def list_methods() -> list[str]:
    from dfcil.methods import METHODS

    return METHODS.names()
