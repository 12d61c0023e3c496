"""dfcil's version, in a module of its own so that any module may record it without importing the package's API."""

__version__ = "0.1.0"
