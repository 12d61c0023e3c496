"""Kept so that ``from dfcil.runner import train, resume, RunOptions`` (dfcil before its layout in subpackages)
works: run directories are :mod:`dfcil.runs.runner`."""

from dfcil.runs.runner import RunOptions, resume, train

__all__ = ["RunOptions", "resume", "train"]
