"""The backbone registry: every network body dfcil builds, by name. Filled by the modules
``dfcil/models/__init__.py`` imports (:mod:`~dfcil.models.resnet_cifar`, :mod:`~dfcil.models.resnet`) and by
plugins (entry points of ``dfcil.backbones``); read by :func:`dfcil.models.network.build_network`."""

from __future__ import annotations

from dfcil.registry import Registry

BACKBONES: Registry = Registry("backbone", group="dfcil.backbones")
