import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dfcil.models.backbones import BACKBONES
from dfcil.models.batchnorm import BatchNorm2d, BNMode, batch_moments
from dfcil.models.generator import build_generator
from dfcil.models.network import build_network
from dfcil.models.resnet_cifar import BasicBlock


def test_resnet32_structure_matches_reference():
    net = build_network("resnet32")
    body = net.backbone
    blocks = [m for m in body.modules() if isinstance(m, BasicBlock)]
    assert [len(s) for s in (body.stage_1, body.stage_2, body.stage_3, body.stage_4)] == [5, 5, 4, 1]
    assert len(blocks) == 15
    assert sum(isinstance(m, nn.BatchNorm2d) for m in body.modules()) == 31
    assert not any(isinstance(m, nn.Linear | nn.ReLU) for m in body.modules())  # option-A shortcuts, functional ReLU
    assert all(torch.all(b.bn_b.weight == 0) for b in blocks)  # zero_residual
    assert net.feature_dim == 64
    assert sum(p.numel() for p in body.parameters()) == pytest.approx(0.46e6, rel=0.05)


REFERENCE_CIFAR = [n for n in BACKBONES.names() if n.startswith("resnet") and n[6:].isdigit() and n != "resnet18"]


@pytest.mark.parametrize("name", REFERENCE_CIFAR)
def test_forward_shapes(name):
    net = build_network(name)
    net.expand(7)
    with torch.no_grad():  # leave the zero-residual init, which makes every block the identity
        for m in net.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.weight.fill_(1.0)
    out = net(torch.randn(4, 3, 32, 32))
    assert out.logits.shape == (4, 7) and out.features.shape == (4, 64)
    assert [f.shape[1:] for f in out.fmaps] == [(16, 32, 32), (32, 16, 16), (64, 8, 8), (64, 8, 8)]
    assert out.features.min() < 0  # pre-activation features: no ReLU after the last addition


@pytest.mark.parametrize("name", ["resnet20_relu", "resnet32_relu", "resnet56_relu"])
def test_the_common_cifar_resnet_is_he_et_al_s(name):
    """He et al.'s CIFAR ResNet-(6n+2) of the PyCIL and FACIL codes: three stages of n blocks, a ReLU after every
    addition (non-negative stage outputs and features), every BN starting at weight 1 (no zero residual)."""
    n = int(name[6:8]) // 6
    net = build_network(name)
    net.expand(7)
    body = net.backbone
    assert [len(s) for s in (body.stage_1, body.stage_2, body.stage_3, body.stage_4)] == [n, n, n, 0]
    assert sum(isinstance(m, nn.BatchNorm2d) for m in body.modules()) == 6 * n + 1
    assert all(torch.all(m.weight == 1) for m in body.modules() if isinstance(m, nn.BatchNorm2d))
    if n == 5:  # the same parameters as the reference's ResNet-32 (its stage 4 is stage 3's fifth block)
        reference = BACKBONES.get("resnet32")()
        assert sum(p.numel() for p in body.parameters()) == sum(p.numel() for p in reference.parameters())
    out = net(torch.randn(4, 3, 32, 32))
    assert [f.shape[1:] for f in out.fmaps] == [(16, 32, 32), (32, 16, 16), (64, 8, 8)]
    assert out.features.shape == (4, 64) and all(f.min() >= 0 for f in out.fmaps) and out.features.min() >= 0
    x = torch.randn(2, 16, 32, 32)
    block = body.stage_1[0]
    assert torch.equal(block(x), F.relu(x + block.bn_b(block.conv_b(F.relu(block.bn_a(block.conv_a(x)))))))


def test_the_cifar_resnet18_is_the_prototype_codes():
    """The EFC, LDC and FeCAM codes' ResNet-18 for 32 pixels: 3×3 stride-1 stem, no max-pool (stages at 32, 16, 8,
    4 pixels), a ReLU after every block, BN weights starting at 1, 11.2 M parameters, d = 512."""
    from dfcil.models.resnet import Block

    net = build_network("resnet18_cifar")
    net.expand(10)
    body = net.backbone
    assert sum(p.numel() for p in body.parameters()) == pytest.approx(11.17e6, rel=0.01)
    blocks = [b for b in body.modules() if isinstance(b, Block)]
    assert len(blocks) == 8 and all(b.last_relu for b in blocks)
    assert all(torch.all(m.weight == 1) for m in body.modules() if isinstance(m, nn.BatchNorm2d))
    out = net(torch.randn(2, 3, 32, 32))
    assert [f.shape[1:] for f in out.fmaps] == [(64, 32, 32), (128, 16, 16), (256, 8, 8), (512, 4, 4)]
    assert out.features.shape == (2, 512) and out.features.min() >= 0 and net.feature_dim == 512


def test_the_imagenet_resnet18_is_the_references():
    """3×3 stride-1 stem and max-pool: stages at 112, 56, 28, 14 pixels for 224; no ReLU after the last block of a
    stage (pre-activation outputs), ReLU after the others; zero-initialised last BN; 11.2 M parameters."""
    from dfcil.models.resnet import Block

    net = build_network("resnet18")
    net.expand(10)
    body = net.backbone
    assert sum(p.numel() for p in body.parameters()) == pytest.approx(11.2e6, rel=0.01)
    blocks = [b for b in body.modules() if isinstance(b, Block)]
    assert len(blocks) == 8 and all(torch.all(b.bn_b.weight == 0) for b in blocks)
    assert [b.last_relu for b in blocks] == [True, False] * 4
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.weight.fill_(1.0)
        net.eval()
        x = torch.randn(2, 3, 224, 224)
        out = net(x)
        first = blocks[0](torch.nn.functional.max_pool2d(torch.relu(body.bn_1(body.conv_1(x))), 3, 2, 1))
    assert [f.shape[1:] for f in out.fmaps] == [(64, 112, 112), (128, 56, 56), (256, 28, 28), (512, 14, 14)]
    assert out.features.shape == (2, 512) and out.logits.shape == (2, 10) and net.feature_dim == 512
    assert first.min() >= 0 and out.fmaps[0].min() < 0  # ReLU after the first block, none after a stage's last


def test_head_grows_without_touching_old_classes():
    net = build_network("resnet8", head_init_std=0.001)
    net.expand(50)
    old = net.head.blocks[0].weight.detach().clone()
    net.expand(50)
    assert net.n_classes == 100 and torch.equal(net.head.blocks[0].weight, old)
    assert net.head.blocks[1].weight.std().item() == pytest.approx(0.001, rel=0.1)
    assert net.head.blocks[1].bias is None
    x = torch.randn(3, 3, 32, 32)
    net.eval()
    out = net(x)
    assert torch.allclose(out.logits[:, :50], F.linear(out.features, old))


@pytest.mark.parametrize("head", ["linear", "cosine", "lsc"])
def test_weight_decay_reaches_old_blocks_that_no_loss_touches(head):
    """The reference (torch 1.x) zero-fills gradients, so SGD's weight decay and momentum keep acting on every
    classifier, even one no loss term reaches (R-DFCIL w/o HKD: the local CE sees only the new logits). Every block
    takes part in every forward here, so an old block gets a zero gradient, not None, and SGD decays it as there."""
    net = build_network("resnet8", head=head)
    net.expand(3)
    net.expand(2)
    old = net.head.blocks[0].weight.detach().clone()
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    logits = net(torch.randn(4, 3, 32, 32)).logits
    F.cross_entropy(logits[:, 3:], torch.tensor([0, 1, 0, 1])).backward()  # new classes only
    grad = net.head.blocks[0].weight.grad
    assert grad is not None and torch.count_nonzero(grad) == 0
    opt.step()
    torch.testing.assert_close(net.head.blocks[0].weight, old * (1 - 0.1 * 5e-4))


def test_frozen_copy_truncates_and_freezes():
    net = build_network("resnet8")
    net.expand(3)
    net.expand(2)
    teacher = net.frozen_copy(n_classes=3)
    assert teacher.n_classes == 3 and not teacher.training
    assert not any(p.requires_grad for p in teacher.parameters())
    assert net.n_classes == 5 and all(p.requires_grad for p in net.parameters())
    with pytest.raises(ValueError, match="block boundary"):
        net.frozen_copy(n_classes=4)


def test_a_frozen_copy_of_a_compiled_network_compiles_its_own_backbone():
    torch.manual_seed(0)
    net = build_network("resnet8")
    net.expand(3)
    keys = list(net.state_dict())
    net.compile_backbone(backend="eager")  # dynamo's tracing without inductor: fast, and exact
    assert list(net.state_dict()) == keys  # checkpoints of compiled and eager runs are interchangeable
    twin = net.frozen_copy()
    assert twin.backbone._compiled_call_impl is not None and twin._compiled_call_impl is None
    net.eval()
    x = torch.randn(4, 3, 32, 32)
    before = twin(x).logits
    torch.testing.assert_close(before, net(x).logits)
    with torch.no_grad():
        for p in net.backbone.parameters():
            p.mul_(0.5)  # the copy must run its own weights, not the compiled original's
    torch.testing.assert_close(twin(x).logits, before, rtol=0, atol=0)
    assert not torch.allclose(net(x).logits, before)


def test_split_batchnorm_equals_two_separate_passes():
    torch.manual_seed(0)
    a = build_network("resnet8")
    a.expand(4)
    with torch.no_grad():  # non-trivial affine parameters and running stats
        for m in a.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.5, 0.5)
    b = build_network("resnet8")
    b.expand(4)
    b.load_state_dict(a.state_dict())
    a.train()
    b.train()
    x_real, x_syn = torch.randn(6, 3, 32, 32), torch.randn(6, 3, 32, 32) * 2 + 1
    merged = a(torch.cat([x_real, x_syn]), bn=BNMode(splits=2))
    real, syn = b(x_real), b(x_syn)
    torch.testing.assert_close(merged.logits, torch.cat([real.logits, syn.logits]), rtol=1e-4, atol=1e-5)
    for (name, ba), bb in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        torch.testing.assert_close(ba, bb, rtol=1e-5, atol=1e-6, msg=name)  # running stats updated the same way
    assert all(int(m.num_batches_tracked) == 2 for m in a.modules() if isinstance(m, nn.BatchNorm2d))
    # and gradients match
    (merged.logits.square().sum()).backward()
    (real.logits.square().sum() + syn.logits.square().sum()).backward()
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(pa.grad, pb.grad, rtol=1e-4, atol=1e-5)


def test_train_forward_counts_batches_as_nn_batchnorm_in_one_operation():
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.names: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
            self.names.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    torch.manual_seed(0)
    a = build_network("resnet8")
    a.expand(3)
    a.backbone.stage_2[0].bn_a.momentum = None  # a cumulative average: counts per layer, as nn.BatchNorm2d does
    b = copy.deepcopy(a)
    for m in b.modules():  # the plain nn.BatchNorm2d forward, counting in each layer
        if isinstance(m, BatchNorm2d):
            m.forward = lambda x, bn=None, m=m: nn.BatchNorm2d.forward(m, x)
    a.train()
    b.train()
    for step in range(2):
        x = torch.randn(4, 3, 32, 32) * (step + 1)
        with Ops() as ops:
            out_a = a(x)
        out_b = b(x)
        assert torch.equal(out_a.logits, out_b.logits)
        assert ops.names.count("_foreach_add_") == 1 and ops.names.count("add_") == 1  # the momentum=None layer's
    for (name, va), vb in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        assert torch.equal(va, vb), name
    assert int(a.backbone.bn_1.num_batches_tracked) == 2
    a.eval()
    a(torch.randn(2, 3, 32, 32))  # eval mode counts nothing
    assert int(a.backbone.bn_1.num_batches_tracked) == 2


def test_batchnorm_records_input_statistics():
    bn = BatchNorm2d(3).eval()
    x = torch.randn(5, 3, 4, 4) * 3 + 2
    mode = BNMode(record=[])
    bn(x, mode)
    (stats,) = mode.record
    torch.testing.assert_close(stats.mean, x.mean(dim=(0, 2, 3)))
    torch.testing.assert_close(stats.var, x.permute(1, 0, 2, 3).reshape(3, -1).var(dim=1, unbiased=False))
    assert stats.running_var is bn.running_var


def test_batch_moments_values_and_gradients():
    torch.manual_seed(0)
    x = (
        torch.randn(6, 3, 5, 4, dtype=torch.float64) * torch.tensor([0.5, 2.0, 1.0]).view(1, 3, 1, 1) + 3
    ).requires_grad_()
    mean, var = batch_moments(x)
    assert mean.dtype == var.dtype == torch.float32  # fp32 statistics, whatever the input
    torch.testing.assert_close(mean.double(), x.mean(dim=(0, 2, 3)), rtol=1e-6, atol=1e-6)  # fp32 rounding
    torch.testing.assert_close(var.double(), x.var(dim=(0, 2, 3), unbiased=False), rtol=1e-6, atol=1e-6)
    # the hand-written backward against autograd's, for a loss that mixes both moments with weights per channel
    w_m, w_v = torch.tensor([1.0, -2.0, 0.5]), torch.tensor([0.3, 1.5, -1.0])
    (g,) = torch.autograd.grad((mean * w_m + var * w_v).sum(), x)
    (g_ref,) = torch.autograd.grad((x.mean(dim=(0, 2, 3)) * w_m + x.var(dim=(0, 2, 3), unbiased=False) * w_v).sum(), x)
    assert g.dtype == torch.float64
    torch.testing.assert_close(g, g_ref, rtol=1e-5, atol=1e-6)


def test_batch_moments_keep_the_input_dtype_for_the_gradient():
    x = torch.randn(4, 2, 3, 3).bfloat16().requires_grad_()
    mean, var = batch_moments(x)
    (mean.sum() + var.sum()).backward()
    assert mean.dtype == torch.float32 and x.grad.dtype == torch.bfloat16
    torch.testing.assert_close(var, x.float().var(dim=(0, 2, 3), unbiased=False))


@pytest.mark.parametrize(("size", "shape"), [(32, (3, 32, 32)), (64, (3, 64, 64))])
def test_generator_output(size, shape):
    gen = build_generator(size)
    z = torch.randn(8, 1000)
    x = gen(z)
    assert x.shape == (8, *shape)
    # the final affine-free BN standardises each channel in train mode
    torch.testing.assert_close(x.mean(dim=(0, 2, 3)), torch.zeros(3), atol=1e-4, rtol=0)
    eps_08 = [m for m in gen.modules() if isinstance(m, nn.BatchNorm2d) and m.eps == 0.8]
    assert len(eps_08) == (2 if size == 32 else 3)
    assert not gen.out[-1].affine
