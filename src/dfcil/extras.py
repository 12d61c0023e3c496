"""Optional dependencies, imported when a feature needs them, with an error that names the extra to install."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
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


def require_all(modules: Mapping[str, str], extra: str, feature: str) -> None:
    """Import every module of ``modules`` (module → the package that installs it) before ``feature`` does any work,
    or raise :class:`MissingExtraError` for the first that is missing (:func:`require`): a dependency of a dependency
    (scikit-learn's threadpoolctl) is named, and installed by the extra, as the others are."""
    for module, package in modules.items():
        require(module, extra, feature, package)
