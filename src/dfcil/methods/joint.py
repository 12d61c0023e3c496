"""The joint upper bound: not data-free. CE over all seen classes on the real data of every task so far."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from dfcil.config import MethodConfig, configclass
from dfcil.methods.base import Batch, Method, Phase, Task, TaskContext, register_method
from dfcil.models.network import IncrementalNet


@configclass
class JointConfig(MethodConfig):
    name: str = "joint"
    from_scratch: bool = True  # re-initialise the network at every task, as ABD's Oracle; False: keep training it
    last_only: bool = False  # train only in the last task, on all classes (A_N only; earlier rows are untrained)


@register_method(
    "joint",
    graph_safe=True,  # its step replays as a CUDA graph (checked by tests/test_graphs.py)
    static_head=True,  # plain CE over all columns: the masked ones add nothing
    distributed=True,  # a mean over samples: the processes' mean is the global batch's
    train_data="seen",
    stores="all data",
)
class Joint(Method):
    """Joint training, the upper bound: CE on the real data of all tasks so far."""

    Config = JointConfig

    def phases(self, task: Task) -> list[Phase]:
        if self.cfg.last_only and task.task_id < task.num_tasks - 1:
            return []
        return super().phases(task)

    def scored(self, task: Task) -> bool:
        return not self.cfg.last_only or task.task_id == task.num_tasks - 1

    def on_task_start(self, ctx: TaskContext) -> None:
        if self.cfg.from_scratch and ctx.task_id > 0 and self.phases(ctx):
            ctx.net.reset_parameters()

    def training_step(self, net: IncrementalNet, batch: Batch, ctx: TaskContext, phase: Phase) -> dict[str, Tensor]:
        return {"ce": F.cross_entropy(net(batch.x).logits, batch.y)}

    def task0_signature(self) -> str | None:
        return "ce"
