"""The CIFAR ResNet of the R-DFCIL reference (cl-lite ``resnet_cifar``, a port of PODNet's "rebuffi" ResNet).

Differences from the common (Idelbayev/ABD) CIFAR ResNet, all kept on purpose (reference §3):
* no ReLU after any residual addition and no final ReLU: features are pre-activation;
* an extra one-block stage at the widest width (``stage_4``), so ResNet-32 has 5 + 5 + 4 + 1 = 15 blocks;
* widening blocks use the "option A" shortcut: ``x[..., ::2, ::2]`` and zero channel padding;
* Kaiming-normal (fan_out) convs, and the last BN of every block starts with weight 0.

``resnet20_relu``/``resnet32_relu``/``resnet56_relu`` are the common CIFAR ResNet of He et al. (2016) instead, the
network of the PyCIL and FACIL codes (FeCAM's, LDC's, EFC's comparisons): a ReLU after every residual addition (so
the pooled features are non-negative), three stages (5 + 5 + 5 blocks for ResNet-32), and every BN starting at
weight 1. Option A shortcuts and Kaiming-normal convolutions in both.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dfcil.models.backbones import BACKBONES
from dfcil.models.batchnorm import BatchNorm2d, BNMode


def memory_format_of(x: Tensor) -> torch.memory_format:
    """``channels_last`` for an NHWC-contiguous 4-d tensor, else ``contiguous_format``."""
    nhwc = x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()
    return torch.channels_last if nhwc else torch.contiguous_format


class _ShortcutA(torch.autograd.Function):
    """``cat((x[..., ::2, ::2], 0), dim=1)``: option A's subsampled, zero-padded shortcut, forward and backward in
    ``x``'s memory format. Autograd's slice and cat would hand back an NCHW gradient (a fresh zero tensor) to an NHWC
    network, and every layer before it would then convert formats (cuDNN's ``convertTensor``) in the backward. Both
    directions only copy values, so the result is the same bit for bit."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:  # noqa: ANN001
        ctx.shape, ctx.fmt = x.shape, memory_format_of(x)
        n, c, h, w = x.shape
        out = x.new_zeros((n, 2 * c, (h + 1) // 2, (w + 1) // 2)).contiguous(memory_format=ctx.fmt)
        out[:, :c] = x[..., ::2, ::2]
        return out

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:  # noqa: ANN001
        gx = grad.new_zeros(ctx.shape).contiguous(memory_format=ctx.fmt)
        gx[..., ::2, ::2] = grad[:, : ctx.shape[1]]
        return gx


def shortcut_a(x: Tensor) -> Tensor:
    """Option A shortcut of a widening block: subsample by 2, then as many zero channels as ``x`` has. Inside
    ``torch.compile`` as plain ops: the compiler keeps memory formats itself, and a custom Function would keep the
    graph out of AOTAutograd's disk cache."""
    if torch.compiler.is_compiling():
        sub = x[..., ::2, ::2]
        return torch.cat((sub, torch.zeros_like(sub)), dim=1)
    return _ShortcutA.apply(x)


class BasicBlock(nn.Module):
    def __init__(self, in_planes: int, increase_dim: bool = False, relu: bool = False) -> None:
        super().__init__()
        self.increase_dim = increase_dim
        self.relu = relu
        planes = in_planes * 2 if increase_dim else in_planes
        self.conv_a = nn.Conv2d(in_planes, planes, 3, stride=2 if increase_dim else 1, padding=1, bias=False)
        self.bn_a = BatchNorm2d(planes)
        self.conv_b = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn_b = BatchNorm2d(planes)

    def forward(self, x: Tensor, bn: BNMode | None = None) -> Tensor:
        y = F.relu(self.bn_a(self.conv_a(x), bn))
        y = self.bn_b(self.conv_b(y), bn)
        if self.increase_dim:  # option A: subsample, then pad the new channels with zeros
            x = shortcut_a(x)
        return F.relu(x + y) if self.relu else x + y  # the reference: no ReLU after the addition (last_relu=False)


class CifarResNet(nn.Module):
    """ResNet-(6n+2) for 32×32 (or 64×64) inputs; returns the last feature map and each stage's output.

    Stage outputs (shapes for 32×32 input, nf=16): (B,16,32,32), (B,32,16,16), (B,64,8,8), (B,64,8,8).
    """

    def __init__(self, n: int = 5, nf: int = 16, in_channels: int = 3, common: bool = False) -> None:
        super().__init__()
        self.common = common  # He et al.'s network: ReLU after each addition, 3 stages of n, BN weights start at 1
        self.conv_1 = nn.Conv2d(in_channels, nf, 3, stride=1, padding=1, bias=False)
        self.bn_1 = BatchNorm2d(nf)

        def block(planes: int, increase_dim: bool = False) -> BasicBlock:
            return BasicBlock(planes, increase_dim, relu=common)

        self.stage_1 = nn.ModuleList([block(nf) for _ in range(n)])
        self.stage_2 = nn.ModuleList([block(nf, increase_dim=True)] + [block(2 * nf) for _ in range(n - 1)])
        last = n - 1 if common else n - 2  # the reference moves stage 3's last block into a stage 4 of its own
        self.stage_3 = nn.ModuleList([block(2 * nf, increase_dim=True)] + [block(4 * nf) for _ in range(last)])
        self.stage_4 = nn.ModuleList([] if common else [block(4 * nf)])
        self.out_dim = 4 * nf
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                m.reset_running_stats()
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        for m in () if self.common else self.modules():
            if isinstance(m, BasicBlock):  # zero_residual: every block starts as the identity
                nn.init.zeros_(m.bn_b.weight)

    def forward(self, x: Tensor, bn: BNMode | None = None) -> tuple[Tensor, tuple[Tensor, ...]]:
        if bn is None and self.training:
            bn = BNMode()  # the layers' batch counters advance together at the end (BNMode.count)
        x = F.relu(self.bn_1(self.conv_1(x), bn))
        stage_outputs = []
        for stage in (self.stage_1, self.stage_2, self.stage_3, self.stage_4):
            if not len(stage):
                continue
            for block in stage:
                x = block(x, bn)
            stage_outputs.append(x)
        if bn is not None:
            bn.count()
        return x, tuple(stage_outputs)


def _register(name: str, n: int) -> None:
    BACKBONES.register(name)(lambda: CifarResNet(n=n))
    if n > 1:
        BACKBONES.register(f"{name}_relu")(lambda: CifarResNet(n=n, common=True))


_register("resnet8", 1)  # 4 blocks: tests and smoke runs only
_register("resnet20", 3)
_register("resnet32", 5)  # the reference backbone for CIFAR-100 and Tiny-ImageNet
_register("resnet56", 9)
