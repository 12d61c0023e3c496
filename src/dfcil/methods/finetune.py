"""Fine-tuning, the lower bound: plain CE over all seen classes on the current task's data; no replay, no KD."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from dfcil.methods.base import Batch, Method, Phase, TaskContext, register_method
from dfcil.models.network import IncrementalNet


@register_method(
    "finetune",
    graph_safe=True,  # its step replays as a CUDA graph (checked by tests/test_graphs.py)
    static_head=True,  # plain CE over all columns: the masked ones add nothing
    distributed=True,  # a mean over samples: the processes' mean is the global batch's
)
class Finetune(Method):
    """Fine-tuning, the lower bound: CE on the current task's data only (ABD's "Base")."""

    def training_step(self, net: IncrementalNet, batch: Batch, ctx: TaskContext, phase: Phase) -> dict[str, Tensor]:
        return {"ce": F.cross_entropy(net(batch.x).logits, batch.y)}

    def task0_signature(self) -> str | None:
        return "ce"
