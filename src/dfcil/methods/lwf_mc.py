"""LwF.MC (Rebuffi et al., 2017: iCaRL's loss without exemplars), as ABD's code runs it: per-class sigmoids, binary
CE on the new data with the old classes' targets taken from the old model."""

from __future__ import annotations

from torch import Tensor

from dfcil.config import MethodConfig, configclass
from dfcil.losses.distillation import sigmoid_bce_kd
from dfcil.methods.base import Batch, Phase, TaskContext, register_method
from dfcil.methods.lifecycle import TeacherMethod
from dfcil.models.network import IncrementalNet


@configclass
class LwFMCConfig(MethodConfig):
    name: str = "lwf_mc"  # no hyper-parameters: ABD's LWF_MC has neither a KD weight nor a temperature


@register_method(
    "lwf_mc",
    graph_safe=True,  # its step replays as a CUDA graph (checked by tests/test_graphs.py)
    static_head=True,  # the teacher's targets through the head's old-class mask when it is static
)
class LwFMC(TeacherMethod):
    """LwF.MC (Rebuffi et al., 2017): per-class sigmoid BCE, the old classes' targets from the old model.

    The target is the one-hot label with its old-class entries replaced by the old model's sigmoid outputs; binary
    CE over the seen classes (ABD's ``LWF_MC``; docs/reference.md, LwF and LwF.MC).
    """

    Config = LwFMCConfig

    def training_step(self, net: IncrementalNet, batch: Batch, ctx: TaskContext, phase: Phase) -> dict[str, Tensor]:
        logits = net(batch.x).logits
        teacher = self.teacher.logits(batch.x)  # (B, n_old), a static head's (B, capacity); None on the first task
        old, _ = net.old_and_new(ctx.n_old)
        return {"bce": sigmoid_bce_kd(logits, batch.y, teacher, old)}  # one term: ABD logs no separate KD

    def task0_signature(self) -> str | None:
        return "sigmoid-bce"  # one-hot BCE over the first task's classes: its own first-task model
