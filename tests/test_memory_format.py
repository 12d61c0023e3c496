"""One memory format through the network: NHWC in, NHWC activations and NHWC gradients in every layer (a layer
given another format converts it, e.g. cuDNN's ``convertTensor`` kernels on CUDA), with results equal bit for bit
to the format-agnostic autograd formulas."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dfcil.models.batchnorm import BNMode
from dfcil.models.network import build_network, spatial_mean
from dfcil.models.resnet_cifar import shortcut_a
from dfcil.synthesis.inversion import build_generator

CL = torch.channels_last


@pytest.mark.parametrize("fmt", [torch.contiguous_format, CL])
def test_shortcut_and_pooling_equal_autograd_bit_for_bit(fmt: torch.memory_format) -> None:
    torch.manual_seed(0)
    x = torch.randn(4, 8, 7, 6).contiguous(memory_format=fmt).requires_grad_()
    ref = x.detach().clone().requires_grad_()
    g = torch.randn(4, 16, 4, 3)
    out = shortcut_a(x)
    expected = torch.cat((ref[..., ::2, ::2], torch.zeros_like(ref[..., ::2, ::2])), dim=1)
    assert torch.equal(out, expected) and out.is_contiguous(memory_format=fmt)
    out.backward(g)
    expected.backward(g)
    assert torch.equal(x.grad, ref.grad) and x.grad.is_contiguous(memory_format=fmt)

    x.grad = ref.grad = None
    h = torch.randn(4, 8)
    m = spatial_mean(x)
    assert torch.equal(m, ref.mean(dim=(2, 3)))
    m.backward(h)
    ref.mean(dim=(2, 3)).backward(h)
    assert torch.equal(x.grad, ref.grad) and x.grad.is_contiguous(memory_format=fmt)


def _layers_in_other_formats(net: nn.Module, run) -> list[tuple]:  # noqa: ANN001
    """(direction, layer, shape) for every conv/BN input and incoming gradient that is not NHWC-contiguous."""
    found: list[tuple] = []

    def pre(m: nn.Module, args: tuple) -> None:
        if args[0].dim() == 4 and not args[0].is_contiguous(memory_format=CL):
            found.append(("input", type(m).__name__, tuple(args[0].shape)))

    def back(m: nn.Module, _: tuple, grad_out: tuple) -> None:
        g = grad_out[0]
        if g is not None and g.dim() == 4 and not g.is_contiguous(memory_format=CL):
            found.append(("gradient", type(m).__name__, tuple(g.shape)))

    hooks = []
    for m in net.modules():
        if isinstance(m, nn.Conv2d | nn.BatchNorm2d):
            hooks += [m.register_forward_pre_hook(pre), m.register_full_backward_hook(back)]
    try:
        run()
    finally:
        for h in hooks:
            h.remove()
    return found


@pytest.mark.filterwarnings("ignore:Full backward hook")
@pytest.mark.parametrize("backbone", ["resnet32", "resnet18"])
def test_rrl_pass_keeps_channels_last_everywhere(backbone: str) -> None:
    """The R-DFCIL student pass: real and synthetic images joined, per-half BN, backward from logits and features."""
    size = 32 if backbone == "resnet32" else 64
    net = build_network(backbone).to(memory_format=CL)
    net.expand(5)
    gen = build_generator(size, 64).to(memory_format=CL)
    real = torch.randn(4, 3, size, size).contiguous(memory_format=CL)

    def step() -> None:
        with torch.no_grad():
            syn = gen.eval()(torch.randn(4, 64))
        assert syn.is_contiguous(memory_format=CL)
        out = net(torch.cat([real, syn]), bn=BNMode(splits=2))
        (out.logits.square().sum() + out.features.square().sum()).backward()

    assert _layers_in_other_formats(net, step) == []


@pytest.mark.filterwarnings("ignore:Full backward hook")
def test_inversion_pass_keeps_channels_last_everywhere() -> None:
    """Model inversion: generator → frozen teacher (recording BN statistics), backward into the generator."""
    teacher = build_network("resnet32").to(memory_format=CL)
    teacher.expand(5)
    teacher.eval().requires_grad_(False)
    gen = build_generator(32, 64).to(memory_format=CL)
    both = nn.ModuleList([teacher, gen])

    def step() -> None:
        record: list = []
        out = teacher(gen(torch.randn(8, 64)), bn=BNMode(record=record))
        (out.logits.square().sum() + sum(s.mean.square().sum() for s in record)).backward()

    assert _layers_in_other_formats(both, step) == []
