"""A backbone with a linear bottleneck: any registered body followed by a 1×1 convolution (with bias) to ``width``
channels, so that the pooled features are ``width``-dimensional. Pooling is linear, so the 1×1 convolution before
the spatial mean is the same map as a linear layer after it.

``resnet18_cifar_b64`` is AdaGauss's network (Rypeść et al., NeurIPS 2024; docs/baselines.md, AdaGauss): the CIFAR
ResNet-18 (3×3 stride-1 stem, no max-pool, ReLU after every block) and a 512 → 64 bottleneck, its weight
N(0, 2/64) (the authors' initialisation of every convolution, std √(2/(k·k·out))), its bias nn.Conv2d's default.
``resnet18_b64`` is the same bottleneck on the reference's ImageNet ResNet-18 (``resnet18``), for AdaGauss on
ImageNet-100.
"""

from __future__ import annotations

import math

from torch import Tensor, nn

from dfcil.models.backbones import BACKBONES
from dfcil.models.batchnorm import BNMode
from dfcil.models.resnet import ImageNetResNet


class Bottlenecked(nn.Module):
    """``body`` (returning its last feature map and its stage outputs) then a 1×1 convolution to ``width``
    channels; the stage outputs are the body's."""

    def __init__(self, body: nn.Module, width: int) -> None:
        super().__init__()
        self.body = body
        self.bottleneck = nn.Conv2d(body.out_dim, width, 1)
        self.out_dim = width
        self._init_bottleneck()

    def _init_bottleneck(self) -> None:
        nn.init.normal_(self.bottleneck.weight, 0.0, math.sqrt(2.0 / self.out_dim))  # fan-out of a 1×1 conv
        bound = 1 / math.sqrt(self.body.out_dim)  # nn.Conv2d's default bias
        nn.init.uniform_(self.bottleneck.bias, -bound, bound)

    def reset_parameters(self) -> None:
        self.body.reset_parameters()
        self._init_bottleneck()

    def forward(self, x: Tensor, bn: BNMode | None = None) -> tuple[Tensor, tuple[Tensor, ...]]:
        fmap, stages = self.body(x, bn)
        return self.bottleneck(fmap), stages


BACKBONES.register("resnet18_cifar_b64")(lambda: Bottlenecked(ImageNetResNet((2, 2, 2, 2), cifar=True), 64))
BACKBONES.register("resnet18_b64")(lambda: Bottlenecked(ImageNetResNet((2, 2, 2, 2)), 64))  # the same on ImageNet-100
