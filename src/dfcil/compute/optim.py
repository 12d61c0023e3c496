"""Optimiser helpers shared by the engine (SGD on the network) and the synthesizer (Adam on the generator)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

_KERNEL_FLAGS = ("fused", "foreach", "capturable", "differentiable")  # how an optimiser computes, not its state


def fused_kwargs(params: Sequence[torch.Tensor], fused: bool) -> dict[str, bool]:
    """``{"fused": True}`` when asked for and every parameter is a floating CUDA tensor, else nothing."""
    ok = fused and params and all(p.is_cuda and p.is_floating_point() for p in params)
    return {"fused": True} if ok else {}


def sgd(
    params: Sequence[torch.Tensor], lr: float, momentum: float, weight_decay: float, fused: bool
) -> torch.optim.SGD:
    """The network's optimiser: SGD with the run's momentum and weight decay (on every parameter), fused on CUDA
    when ``fused``."""
    return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay, **fused_kwargs(params, fused))


def adam(params: Sequence[torch.Tensor], lr: float, weight_decay: float, fused: bool) -> torch.optim.Adam:
    """Adam (betas 0.9, 0.999, eps 1e-8) with coupled weight decay (added to the gradient, as ``torch.optim.Adam``
    and EFC's code), fused on CUDA when ``fused``."""
    return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay, **fused_kwargs(params, fused))


OPTIMIZER_KINDS = {torch.optim.SGD: "sgd", torch.optim.Adam: "adam"}  # Phase.optimizer of each optimiser class


def phase_optimizer(
    kind: str, params: Sequence[torch.Tensor], lr: float, momentum: float, weight_decay: float, fused: bool
) -> torch.optim.Optimizer:
    """The optimiser a phase asks for (``Phase.optimizer``): ``"sgd"`` with its ``momentum``, or ``"adam"`` (which
    has none: ``momentum`` is not read)."""
    if kind == "sgd":
        return sgd(params, lr, momentum, weight_decay, fused)
    if kind == "adam":
        return adam(params, lr, weight_decay, fused)
    raise ValueError(f"unknown optimiser {kind!r}: use 'sgd' or 'adam'")


def set_hyperparameters(optimizer: torch.optim.Optimizer, weight_decay: float, momentum: float) -> None:
    """Give an optimiser carried over from a task's previous phase the next phase's weight decay and, for SGD,
    momentum: one optimiser per task keeps its moments, each phase its own settings."""
    for group in optimizer.param_groups:
        group["weight_decay"] = weight_decay
        if "momentum" in group and isinstance(optimizer, torch.optim.SGD):
            group["momentum"] = momentum


def fill_momentum(optimizer: torch.optim.SGD) -> None:
    """Give every trainable parameter without a momentum buffer a zero one, once some parameter has one.

    A parameter trained in a later phase of the same optimiser (frozen before) has none, and the fused SGD kernel
    refuses a mix of buffers and missing ones. With no dampening a zero buffer gives exactly eager SGD's first
    step for that parameter (the buffer becomes the gradient).
    """
    if not any("momentum_buffer" in s for s in optimizer.state.values()):
        return
    for group in optimizer.param_groups:
        for p in group["params"] if group["momentum"] else ():
            if p.requires_grad and optimizer.state[p].get("momentum_buffer") is None:
                optimizer.state[p]["momentum_buffer"] = torch.zeros_like(p)


def load_optimizer_state(optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """``optimizer.load_state_dict(state)`` that keeps how ``optimizer`` was built to compute.

    ``Optimizer.load_state_dict`` would restore the saved run's kernel flags (``fused``, ``capturable``, ...), so a
    checkpoint written on a CPU would resume on a GPU unfused and, for Adam, not capturable by a CUDA graph; and it
    restores every moment contiguous, while a fused kernel needs the layout of its parameter (``channels_last``
    conv weights). Here the optimiser's own flags win, and a state tensor shaped like its parameter takes the
    parameter's strides.
    """
    groups = [
        {**saved, **{k: current[k] for k in _KERNEL_FLAGS if k in current}}
        for saved, current in zip(state["param_groups"], optimizer.param_groups, strict=False)
    ]
    optimizer.load_state_dict({**state, "param_groups": groups})
    for group in optimizer.param_groups:
        for p in group["params"]:
            moments = optimizer.state.get(p, {})
            for key, value in moments.items():
                if isinstance(value, torch.Tensor) and value.shape == p.shape and value.stride() != p.stride():
                    moments[key] = torch.empty_like(p, dtype=value.dtype).copy_(value)
