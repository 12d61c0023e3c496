"""The ImageNet ResNet-18 of the R-DFCIL reference (cl-lite ``resnet.resnet18``, PODNet's port), for 224×224
inputs (docs/reference.md, Model).

Differences from torchvision's ResNet-18, kept on purpose:
* a 3×3 stride-1 stem (not 7×7 stride 2) before the 3×3 stride-2 max-pool, so the stages run at 112, 56, 28 and
  14 pixels for a 224-pixel input (about 4× the FLOPs of torchvision's);
* no ReLU after the addition of the last block of each stage: stage outputs and features are pre-activation;
* Kaiming-normal (fan_out) convolutions, and the last BN of every block starts with weight 0.

``resnet18_cifar`` is the CIFAR ResNet-18 of the EFC, LDC and FeCAM codes instead (for 32-pixel inputs): the same
3×3 stride-1 stem with no max-pool, so the stages run at 32, 16, 8 and 4 pixels; a ReLU after every addition (the
pooled 512-d features are non-negative); every BN starting at weight 1.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from dfcil.models.backbones import BACKBONES
from dfcil.models.batchnorm import BatchNorm2d, BNMode


class Block(nn.Module):
    """Basic block: conv3×3, BN, ReLU, conv3×3, BN, plus the shortcut (1×1 conv + BN when the shape changes)."""

    def __init__(self, in_planes: int, planes: int, stride: int, last_relu: bool) -> None:
        super().__init__()
        self.conv_a = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn_a = BatchNorm2d(planes)
        self.conv_b = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn_b = BatchNorm2d(planes)
        self.last_relu = last_relu
        self.down_conv = self.down_bn = None
        if stride != 1 or in_planes != planes:
            self.down_conv = nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False)
            self.down_bn = BatchNorm2d(planes)

    def forward(self, x: Tensor, bn: BNMode | None = None) -> Tensor:
        y = F.relu(self.bn_a(self.conv_a(x), bn))
        y = self.bn_b(self.conv_b(y), bn)
        shortcut = x if self.down_conv is None else self.down_bn(self.down_conv(x), bn)
        out = shortcut + y
        return F.relu(out) if self.last_relu else out


class ImageNetResNet(nn.Module):
    """ResNet-18 (``blocks`` per stage) returning the last feature map and each stage's output.

    Stage outputs for a 224×224 input: (B,64,112,112), (B,128,56,56), (B,256,28,28), (B,512,14,14).
    """

    def __init__(
        self, blocks: tuple[int, ...] = (2, 2, 2, 2), nf: int = 64, in_channels: int = 3, cifar: bool = False
    ) -> None:
        super().__init__()
        self.cifar = cifar  # the common CIFAR ResNet-18: no max-pool, ReLU after every block, BN weights start at 1
        self.conv_1 = nn.Conv2d(in_channels, nf, 3, stride=1, padding=1, bias=False)
        self.bn_1 = BatchNorm2d(nf)
        stages, planes = [], nf
        for i, n in enumerate(blocks):
            width, stride = nf * 2**i, 2 if i else 1  # the first block of a stage changes width and resolution
            relu = [cifar or j < n - 1 for j in range(n)]  # the reference: none after a stage's last block
            stage = [Block(planes if j == 0 else width, width, stride if j == 0 else 1, relu[j]) for j in range(n)]
            stages.append(nn.ModuleList(stage))
            planes = width
        self.stages = nn.ModuleList(stages)
        self.out_dim = planes
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                m.reset_running_stats()
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        for m in () if self.cifar else self.modules():
            if isinstance(m, Block):  # every block starts as its shortcut
                nn.init.zeros_(m.bn_b.weight)

    def forward(self, x: Tensor, bn: BNMode | None = None) -> tuple[Tensor, tuple[Tensor, ...]]:
        if bn is None and self.training:
            bn = BNMode()  # the layers' batch counters advance together at the end (BNMode.count)
        x = F.relu(self.bn_1(self.conv_1(x), bn))
        if not self.cifar:
            x = F.max_pool2d(x, 3, stride=2, padding=1)
        stage_outputs = []
        for stage in self.stages:
            for block in stage:
                x = block(x, bn)
            stage_outputs.append(x)
        if bn is not None:
            bn.count()
        return x, tuple(stage_outputs)


BACKBONES.register("resnet18")(lambda: ImageNetResNet((2, 2, 2, 2)))  # the reference backbone for ImageNet-100
BACKBONES.register("resnet18_cifar")(lambda: ImageNetResNet((2, 2, 2, 2), cifar=True))  # EFC/LDC/FeCAM codes
