"""Precision regions inside forward passes."""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager

import torch


def full_precision(device_type: str) -> AbstractContextManager:
    """fp32 for the maths inside: autocast switched off where it is on (``engine.precision: bf16``), nothing at all
    where it is off. No context in fp32 runs keeps compiled steps free of autocast ops, which AOTAutograd's on-disk
    cache refuses (a later run would compile the graph again)."""
    if torch.is_autocast_enabled(device_type):
        return torch.autocast(device_type, enabled=False)
    return contextlib.nullcontext()
