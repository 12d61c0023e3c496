"""The final network's file, ``model.pt``: written when a run ends (:class:`dfcil.training.callbacks.SaveModel`),
read by ``dfcil eval``, ``export`` and ``inspect`` and by users (:func:`load_model`), none of which imports the
engine.

The file is in the safe checkpoint format (:mod:`dfcil.checkpoint`): the weights, the head's block sizes, the
backbone's and the head's registered names, and what the inputs and outputs mean.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from dfcil.checkpoint import FORMAT, dumps, loads
from dfcil.errors import CheckpointError
from dfcil.io import write_atomic
from dfcil.models.network import IncrementalNet, build_network


def save_model(path: Path, net: IncrementalNet, head: str, backbone: str, about: dict[str, Any] | None = None) -> None:
    """Write the final network: weights, head block sizes and the backbone's and head's names; ``about``: what its
    inputs and outputs mean (``inputs``: image size, normalisation; ``class_order``: the raw class of each output;
    ``task_sizes``; ``class_names``, where the dataset names its classes: indexed by output here, unlike
    ``summary.json`` and the exported model card, which index it by raw class id; docs/metrics.md)."""
    payload = {
        "format": FORMAT,
        "net": net.state_dict(),
        "head_sizes": net.head.sizes,
        "head": head,
        "backbone": backbone,
    }
    write_atomic(path, dumps(payload | (about or {})))


def load_model(path: str | os.PathLike) -> IncrementalNet:
    """Rebuild the network saved by :func:`save_model` (weights-only load; refuses anything else), in eval mode."""
    return network_from(loads(Path(path).read_bytes(), str(path)))


def network_from(payload: dict[str, Any]) -> IncrementalNet:
    """The network of a :func:`save_model` payload, in eval mode."""
    net = build_network(payload["backbone"], payload["head"])
    for n in payload["head_sizes"]:
        net.expand(n)
    net.load_state_dict(payload["net"])
    return net.eval()


def check_model(payload: dict[str, Any], source: str = "model.pt") -> None:
    """Refuse a :func:`save_model` payload whose weights do not fit what it says of them (backbone, head, head
    sizes): one that would fail at the first use, or be exported as a network no one can load."""
    try:
        network_from(payload)
    except (KeyError, TypeError, ValueError, RuntimeError) as err:
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        sizes = payload.get("head_sizes") if isinstance(payload, dict) else None
        raise CheckpointError(
            f"{source} does not hold the network it describes (head sizes {sizes}: {reason}); the file is damaged: "
            f"restore it, or train the run again"
        ) from None
