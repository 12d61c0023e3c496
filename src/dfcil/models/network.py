"""IncrementalNet: a backbone plus a head that grows by one block of classes per task."""

from __future__ import annotations

import copy
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dfcil.models.batchnorm import BNMode
from dfcil.models.resnet_cifar import BACKBONES
from dfcil.registry import Registry

HEADS: Registry = Registry("head")


class NetOutput(NamedTuple):
    logits: Tensor  # (B, n_classes), classes in order position
    features: Tensor  # (B, d) globally average-pooled, pre-ReLU backbone features
    fmaps: tuple[Tensor, ...]  # each backbone stage's output, (B, C_s, H_s, W_s)


@HEADS.register("linear")
class IncrementalLinear(nn.Module):
    """Bias-free linear classifiers, one block per task, concatenated in task order (cl-lite ``DynamicSimpleHead``).

    Each block is initialised N(0, init_std²); a new block never changes the old ones.
    """

    def __init__(self, in_features: int, init_std: float = 0.001) -> None:
        super().__init__()
        self.in_features = in_features
        self.init_std = init_std
        self.blocks = nn.ModuleList()

    @property
    def out_features(self) -> int:
        return sum(b.out_features for b in self.blocks)

    def expand(self, n_new: int, device: torch.device | None = None) -> None:
        block = nn.Linear(self.in_features, n_new, bias=False)
        nn.init.normal_(block.weight, std=self.init_std)
        self.blocks.append(block.to(device))

    def truncate(self, n_classes: int) -> None:
        """Keep only the blocks that cover the first ``n_classes`` classes (must fall on a block boundary)."""
        kept, total = [], 0
        for block in self.blocks:
            if total >= n_classes:
                break
            kept.append(block)
            total += block.out_features
        if total != n_classes:
            raise ValueError(f"{n_classes} classes do not end on a head block boundary")
        self.blocks = nn.ModuleList(kept)

    def forward(self, features: Tensor) -> Tensor:
        if not self.blocks:
            return features.new_zeros(features.shape[0], 0)
        return F.linear(features, torch.cat([b.weight for b in self.blocks]))


class IncrementalNet(nn.Module):
    """Backbone + incremental head; ``forward`` returns a :class:`NetOutput`."""

    def __init__(self, backbone: nn.Module, head: nn.Module) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = head

    @property
    def feature_dim(self) -> int:
        return self.backbone.out_dim

    @property
    def n_classes(self) -> int:
        return self.head.out_features

    def forward(self, x: Tensor, bn: BNMode | None = None) -> NetOutput:
        fmap, stages = self.backbone(x, bn)
        features = fmap.mean(dim=(2, 3))
        return NetOutput(self.head(features), features, stages)

    def expand(self, n_new: int) -> None:
        self.head.expand(n_new, device=next(self.backbone.parameters()).device)

    def frozen_copy(self, n_classes: int | None = None) -> IncrementalNet:
        """A deep copy in eval mode with no trainable parameters; its head keeps the first ``n_classes`` classes."""
        twin = copy.deepcopy(self)
        twin._compiled_call_impl = None  # a frozen copy runs eagerly even when the original was torch.compile'd
        if n_classes is not None:
            twin.head.truncate(n_classes)
        twin.eval()
        twin.requires_grad_(False)
        return twin


def build_network(backbone: str, head: str = "linear", head_init_std: float = 0.001) -> IncrementalNet:
    """An :class:`IncrementalNet` with no classes yet (call ``expand`` per task)."""
    body = BACKBONES.get(backbone)()
    return IncrementalNet(body, HEADS.get(head)(body.out_dim, init_std=head_init_std))
