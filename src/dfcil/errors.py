"""Every error dfcil raises on purpose, in one module that imports nothing: any module may use them, and the
command line (:mod:`dfcil.cli`) turns the user-facing ones into one line without loading the rest of dfcil."""

from __future__ import annotations


class ConfigError(ValueError):
    """A config that cannot be run: unknown key, wrong type, impossible value."""


class MissingExtraError(ConfigError):
    """A feature needs an optional dependency that is not installed."""


class PluginError(ConfigError):
    """A plugin (an entry point of a ``dfcil.*`` group, or a ``plugins:`` module or file) that cannot be imported."""


class RegistryError(KeyError):
    """An unknown or duplicate registry name."""

    def __str__(self) -> str:  # KeyError quotes its message; we want it readable
        return str(self.args[0])


class DatasetError(RuntimeError):
    """A dataset that is missing, corrupt or cannot be fetched; the message says how to fix it."""


class SplitError(ValueError):
    """A protocol that cannot be built (impossible split, bad class order)."""


class CheckpointError(RuntimeError):
    """A checkpoint that is missing, truncated, tampered with or from another run."""


# Exit statuses of the dfcil command for failures that the same command meets again (a sweep does not retry them)
EXIT_BAD_INPUT = 2  # a config, dataset, protocol or checkpoint refused
EXIT_DIVERGED = 3  # the training diverged (DivergedError): lower the learning rate or the term's weight
# Not a failure: the run stopped at a task boundary, its next task not within the time it was given (BudgetSpent);
# the same command continues it, with time to spare (a sweep does not start it again within its own budget)
EXIT_BUDGET = 4


class DivergedError(FloatingPointError):
    """The training diverged: a loss term became NaN or infinite, or its epoch mean passed ``train.max_loss``."""


class NonFiniteLossError(DivergedError):
    """A loss term became NaN or infinite."""


class LossLimitError(DivergedError):
    """A loss term's mean over an epoch passed ``train.max_loss``."""


class RunInterrupted(Exception):
    """The run stopped on request (Ctrl-C, SIGTERM) after writing a checkpoint."""


class BudgetSpent(RunInterrupted):
    """The run stopped at the end of a task, its checkpoint written, because the next task was not expected to end
    within the time the process was given (``--budget-s``)."""


class GraphSafetyError(RuntimeError):
    """A step does something a CUDA graph cannot replay faithfully."""


class GraphCaptureError(RuntimeError):
    """A CUDA graph capture failed after it began; the process's CUDA state is not to be trusted any more."""


class ReportError(ValueError):
    """``dfcil report``: paths without runs, unreadable run files, a bad ``--by``."""


class PlotError(RuntimeError):
    """Plots cannot be made (matplotlib missing)."""
