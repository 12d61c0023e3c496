"""LwF.MC (Rebuffi et al., 2017: iCaRL's loss without exemplars), as ABD's code runs it: per-class sigmoids, binary
CE on the new data with the old classes' targets taken from the old model."""

from __future__ import annotations

import torch
from torch import Tensor

from dfcil.config import MethodConfig, configclass
from dfcil.losses.distillation import sigmoid_bce_kd
from dfcil.methods.base import Batch, Method, Phase, TaskContext, register_method
from dfcil.models.network import IncrementalNet


@configclass
class LwFMCConfig(MethodConfig):
    name: str = "lwf_mc"  # no hyper-parameters: ABD's LWF_MC has neither a KD weight nor a temperature


@register_method("lwf_mc")
class LwFMC(Method):
    """LwF.MC (Rebuffi et al., 2017): per-class sigmoid BCE, the old classes' targets from the old model.

    The target is the one-hot label with its old-class entries replaced by the old model's sigmoid outputs; binary
    CE over the seen classes (ABD's ``LWF_MC``; spec/baselines.md §5).
    """

    graph_safe = True  # its step replays as a CUDA graph (checked by tests/test_graphs.py)

    Config = LwFMCConfig

    def __init__(self, cfg: LwFMCConfig, train) -> None:
        super().__init__(cfg, train)
        self.teacher: IncrementalNet | None = None

    def on_task_start(self, ctx: TaskContext) -> None:
        self.teacher = ctx.net.frozen_copy(n_classes=ctx.n_old) if ctx.task_id > 0 else None

    def on_task_end(self, ctx: TaskContext) -> None:
        self.teacher = None

    def training_step(self, net: IncrementalNet, batch: Batch, ctx: TaskContext, phase: Phase) -> dict[str, Tensor]:
        logits = net(batch.x).logits
        old = None
        if self.teacher is not None:
            with torch.no_grad():
                old = self.teacher(batch.x).logits  # (B, n_old)
        return {"bce": sigmoid_bce_kd(logits, batch.y, old)}  # one term: ABD logs no separate KD

    def static_state_dict(self) -> dict:  # the teacher is a snapshot: fixed for the whole task
        return {"teacher": self.teacher.state_dict()} if self.teacher is not None else {}

    def load_state_dict(self, state: dict, ctx: TaskContext, static: dict | None = None) -> None:
        self.teacher = None
        if static:
            self.teacher = ctx.net.frozen_copy(n_classes=ctx.n_old)
            self.teacher.load_state_dict(static["teacher"])

    def task0_signature(self) -> str | None:
        return "sigmoid-bce"  # one-hot BCE over the first task's classes: its own first-task model
