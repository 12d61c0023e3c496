"""dfcil: data-free class-incremental learning (R-DFCIL and baselines) on PyTorch.

Public API::

    cfg, _ = dfcil.load_config(["smoke"], [("train.epochs", "2")])
    summary = dfcil.train(cfg, "runs/smoke")      # as `dfcil train`: a new run directory
    summary = dfcil.resume("runs/smoke")           # as `dfcil resume`: an unfinished one
    dfcil.list_methods()
    net = dfcil.load_model("runs/smoke/model.pt")   # the final network, in eval mode

The training loop itself is :func:`dfcil.training.engine.run`, which the two above call with the run directory's
loggers and checkpoints.
"""

from __future__ import annotations

from dfcil.version import __version__

__all__ = ["__version__", "list_methods", "load_config", "load_model", "resume", "train"]


def load_config(paths=(), overrides=()):
    """Merge YAML files and dotted ``(key, value)`` overrides into a validated :class:`~dfcil.config.RunConfig`.

    Returns:
        ``(config, dropped_method_keys)``, see :func:`dfcil.config.load_config`.
    """
    from dfcil.load import load_config as _load

    return _load(paths, overrides)


def train(cfg, out, progress=None):
    """Train ``cfg`` into the new run directory ``out``; returns the summary dict (also ``out/summary.json``)."""
    from dfcil.runs.runner import RunOptions
    from dfcil.runs.runner import train as _train

    return _train(cfg, out, RunOptions(progress=progress))


def resume(run_dir, progress=None):
    """Continue the unfinished run in ``run_dir`` from its newest checkpoint; returns the summary dict."""
    from dfcil.runs.runner import RunOptions
    from dfcil.runs.runner import resume as _resume

    return _resume(run_dir, options=RunOptions(progress=progress))


def load_model(path):
    """The final network a run saved (``RUN/model.pt``), in eval mode (:func:`dfcil.model_file.load_model`)."""
    from dfcil.model_file import load_model as _load

    return _load(path)


def list_methods() -> list[str]:
    from dfcil.methods import METHODS

    return METHODS.names()
