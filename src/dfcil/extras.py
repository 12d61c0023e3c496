"""Optional dependencies, imported when a feature needs them, with an error that names the extra to install."""

from __future__ import annotations

import importlib
from types import ModuleType

from dfcil.errors import MissingExtraError


def require(module: str, extra: str, feature: str, package: str | None = None) -> ModuleType:
    """Import ``module`` for ``feature``, or raise :class:`MissingExtraError` naming ``package`` (default: the
    module's top-level name) and saying ``pip install 'dfcil[extra]'``."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        package = package or module.split(".")[0]
        raise MissingExtraError(
            f"{feature} needs {package}, which is not installed ({err}); install it with: pip install 'dfcil[{extra}]'"
        ) from None
