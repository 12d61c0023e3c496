"""IncrementalNet: a backbone plus a head that grows by one block of classes per task."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from dfcil.models.backbones import BACKBONES
from dfcil.models.batchnorm import BatchNorm2d, BNMode
from dfcil.models.heads import HEADS, STATIC_HEADS
from dfcil.models.resnet_cifar import memory_format_of


class _SpatialMean(torch.autograd.Function):
    """``x.mean(dim=(2, 3))`` whose gradient keeps ``x``'s memory format: autograd's expands into an NCHW tensor,
    which an NHWC network would convert back in every layer of its backward. The gradient's values are the same
    (each is grad / (H·W))."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:  # noqa: ANN001
        ctx.shape, ctx.fmt = x.shape, memory_format_of(x)
        return x.mean(dim=(2, 3))

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:  # noqa: ANN001
        n = ctx.shape[2] * ctx.shape[3]
        return (grad / n)[:, :, None, None].expand(ctx.shape).contiguous(memory_format=ctx.fmt)


def spatial_mean(x: Tensor) -> Tensor:
    """Global average pooling, (B, C, H, W) → (B, C); inside ``torch.compile`` the plain mean (a custom Function
    would keep the graph out of AOTAutograd's disk cache)."""
    if torch.compiler.is_compiling():
        return x.mean(dim=(2, 3))
    return _SpatialMean.apply(x)


class NetOutput(NamedTuple):
    logits: Tensor  # (B, n_classes), classes in order position
    features: Tensor  # (B, d) globally average-pooled backbone features (pre-ReLU in the reference's networks)
    fmaps: tuple[Tensor, ...]  # each backbone stage's output, (B, C_s, H_s, W_s)

    def rows(self, start: int, stop: int | None = None) -> NetOutput:
        """Rows ``start:stop`` of every output: one part of a batch that was one pass over several parts."""
        return NetOutput(self.logits[start:stop], self.features[start:stop], tuple(f[start:stop] for f in self.fmaps))


class IncrementalNet(nn.Module):
    """Backbone + incremental head; ``forward`` returns a :class:`NetOutput`."""

    def __init__(self, backbone: nn.Module, head: nn.Module) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = head
        self.compile_options: dict[str, Any] | None = None  # set by compile_backbone; frozen copies compile alike

    @property
    def feature_dim(self) -> int:
        return self.backbone.out_dim

    @property
    def n_classes(self) -> int:
        return self.head.out_features

    def old_and_new(self, n_old: int) -> tuple[int | Tensor, int | Tensor]:
        """Where the old and the new classes' logits are, for losses that compare them (``local_ce``, ``hkd_l1``):
        ``n_old`` (old columns before it, new ones from it) on a growing head; a static head's boolean masks, whose
        shapes never change between tasks (``model.static_head``)."""
        head = self.head
        return (head.old_mask, head.new_mask) if head.mask is not None else (n_old, n_old)

    def forward(self, x: Tensor, bn: BNMode | None = None) -> NetOutput:
        fmap, stages = self.backbone(x, bn)
        features = spatial_mean(fmap)
        return NetOutput(self.head(features), features, stages)

    def reset_parameters(self) -> None:
        """Re-initialise backbone and head as if freshly built (the joint upper bound trains from scratch)."""
        self.backbone.reset_parameters()
        self.head.reset_parameters()

    def set_trainable(self, trainable: str, extra: Sequence[nn.Module] = ()) -> None:
        """Train everything (``"all"``); or only the head (``"head"``) with the backbone frozen in eval mode (its BN
        running statistics fixed) and the ``extra`` modules trained alongside (projectors) frozen too; or everything
        but the backbone's BN layers (``"frozen_bn"``), which stay in eval mode with their affine parameters fixed."""
        if trainable in ("all", "frozen_bn"):
            for m in (self, *extra):
                m.train().requires_grad_(True)
            if trainable == "frozen_bn":
                for m in self.backbone.modules():
                    if isinstance(m, nn.modules.batchnorm._BatchNorm):
                        m.eval().requires_grad_(False)
        elif trainable == "head":
            self.backbone.eval().requires_grad_(False)
            self.head.train().requires_grad_(True)
            for m in extra:
                m.requires_grad_(False)
        else:
            raise ValueError(f"unknown trainable set {trainable!r}")

    def compile_backbone(self, **options: Any) -> None:
        """``torch.compile`` the backbone (``options`` as for :meth:`nn.Module.compile`), and the backbone of every
        later :meth:`frozen_copy`.

        The backbone, not the whole network: its graphs do not change as the head grows, so a run compiles each
        way of calling it (train or eval mode, gradients or not, BN groups or recorded statistics, batch size)
        once, whatever its number of tasks. The whole network's graphs would change with every task, and dynamo
        stops compiling (runs eagerly) after its recompile limit. A frozen copy's parameters are the graph's
        inputs, so teachers share the student's graphs.
        """
        self.compile_options = options
        self.backbone.compile(**options)

    def sync_batch_norm(self, dist: Any) -> None:
        """Normalise training batches with the global batch's statistics over ``dist``'s processes (every BN layer of
        the backbone; frozen copies are in eval mode and use running statistics)."""
        for module in self.backbone.modules():
            if isinstance(module, BatchNorm2d):
                module.sync = dist

    def expand(self, n_new: int) -> None:
        self.head.expand(n_new, device=next(self.backbone.parameters()).device)

    def frozen_copy(self, n_classes: int | None = None) -> IncrementalNet:
        """A deep copy in eval mode with no trainable parameters; its head keeps the first ``n_classes`` classes."""
        twin = copy.deepcopy(self)  # a deep copy of a torch.compile'd module runs eagerly: compile it again
        if self.compile_options is not None:
            twin.backbone.compile(**self.compile_options)
        if n_classes is not None:
            twin.head.truncate(n_classes)
        twin.eval()
        twin.requires_grad_(False)
        return twin


def backbone_for(name: str, image_size: int) -> str:
    """The backbone ``name`` (``model.backbone``) stands for at ``image_size`` pixels. ``auto``: the reference's
    choice, the CIFAR ResNet-32 up to 64 pixels (CIFAR-100, Tiny-ImageNet), its ResNet-18 above (ImageNet)."""
    if name == "auto":
        name = "resnet32" if image_size <= 64 else "resnet18"
    BACKBONES.get(name)
    return name


def build_network(
    backbone: str, head: str = "linear", head_init_std: float = 0.001, capacity: int | None = None
) -> IncrementalNet:
    """An :class:`IncrementalNet` with no classes yet (call ``expand`` per task). ``capacity``: a
    :class:`~dfcil.models.heads.StaticHead` for that many classes instead of a growing one (linear or cosine)."""
    body = BACKBONES.get(backbone)()
    if capacity is None:
        return IncrementalNet(body, HEADS.get(head)(body.out_dim, init_std=head_init_std))
    if head not in STATIC_HEADS:
        raise ValueError(f"a static head is {' or '.join(STATIC_HEADS)}; the {head!r} head grows by blocks")
    return IncrementalNet(body, STATIC_HEADS[head](body.out_dim, capacity, init_std=head_init_std))
