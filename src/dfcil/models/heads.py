"""Incremental classification heads: one block of weights per task, concatenated in task order."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dfcil.registry import Registry

HEADS: Registry = Registry("head")


class BlockHead(nn.Module):
    """Weights in per-task blocks (bias-free ``nn.Linear`` used as weight holders); a new block never changes
    the old ones. Subclasses define how a block is initialised and how features become logits."""

    rows_per_class = 1

    def __init__(self, in_features: int, init_std: float = 0.001) -> None:
        super().__init__()
        self.in_features = in_features
        self.init_std = init_std
        self.blocks = nn.ModuleList()

    @property
    def sizes(self) -> list[int]:
        """Classes of each block."""
        return [b.out_features // self.rows_per_class for b in self.blocks]

    @property
    def out_features(self) -> int:
        return sum(self.sizes)

    def init_block(self, block: nn.Linear) -> None:
        nn.init.normal_(block.weight, std=self.init_std)

    def expand(self, n_new: int, device: torch.device | None = None) -> None:
        block = nn.Linear(self.in_features, n_new * self.rows_per_class, bias=False)
        self.init_block(block)
        self.blocks.append(block.to(device))

    def truncate(self, n_classes: int) -> None:
        """Keep only the blocks that cover the first ``n_classes`` classes (must fall on a block boundary)."""
        kept, total = [], 0
        for block, size in zip(self.blocks, self.sizes, strict=True):
            if total >= n_classes:
                break
            kept.append(block)
            total += size
        if total != n_classes:
            raise ValueError(f"{n_classes} classes do not end on a head block boundary")
        self.blocks = nn.ModuleList(kept)

    def weight(self) -> Tensor:
        return torch.cat([b.weight for b in self.blocks])


@HEADS.register("linear")
class IncrementalLinear(BlockHead):
    """Bias-free linear classifiers, N(0, init_std²) (cl-lite ``DynamicSimpleHead``; R-DFCIL, ABD, LwF, ...)."""

    def forward(self, features: Tensor) -> Tensor:
        if not self.blocks:
            return features.new_zeros(features.shape[0], 0)
        return F.linear(features, self.weight())


@HEADS.register("cosine")
class CosineIncremental(BlockHead):
    """UCIR's cosine classifier: logits = σ · cos(f, w_c), one learned scale σ (init 1) shared by all blocks."""

    def __init__(self, in_features: int, init_std: float = 0.001) -> None:
        super().__init__(in_features, init_std)
        self.sigma = nn.Parameter(torch.ones(()))

    def init_block(self, block: nn.Linear) -> None:
        stdv = 1.0 / math.sqrt(self.in_features)  # UCIR's CosineLinear.reset_parameters
        nn.init.uniform_(block.weight, -stdv, stdv)

    def cosine(self, features: Tensor) -> Tensor:
        """(B, n_classes) cosine similarities before σ."""
        return F.linear(F.normalize(features, dim=1), F.normalize(self.weight(), dim=1))

    def forward(self, features: Tensor) -> Tensor:
        return self.sigma * self.cosine(features)


@HEADS.register("lsc")
class LocalSimilarity(BlockHead):
    """PODNet's local similarity classifier: K proxies per class; similarity to a proxy = −‖f̂ − p̂‖² (= 2cos − 2)
    of the L2-normalised feature and proxy; a class's similarity is the softmax(γ=1)-weighted sum over its proxies;
    logits = η · similarity with one learned η (init 1)."""

    rows_per_class = 10

    def __init__(self, in_features: int, init_std: float = 0.001) -> None:
        super().__init__(in_features, init_std)
        self.eta = nn.Parameter(torch.ones(()))

    def init_block(self, block: nn.Linear) -> None:
        nn.init.kaiming_normal_(block.weight, nonlinearity="linear")

    def similarities(self, features: Tensor) -> Tensor:
        """(B, n_classes) class similarities before η."""
        cos = F.linear(F.normalize(features, dim=1), F.normalize(self.weight(), dim=1))
        sim = (2.0 * cos - 2.0).view(features.shape[0], -1, self.rows_per_class)  # (B, classes, K)
        return (F.softmax(sim, dim=2) * sim).sum(dim=2)

    def forward(self, features: Tensor) -> Tensor:
        if not self.blocks:
            return features.new_zeros(features.shape[0], 0)
        return self.eta * self.similarities(features)
