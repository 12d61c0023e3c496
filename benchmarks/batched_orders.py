"""One training step of G models at once: the prototype behind "train a cell's class orders as one model".

    python benchmarks/batched_orders.py                                  # CPU, G=3, resnet32, batch 64
    python benchmarks/batched_orders.py --device cuda --batch 256        # on a GPU
    python benchmarks/batched_orders.py --device cuda --compile reduce-overhead   # compiled, CUDA-graphed steps
    python benchmarks/batched_orders.py --check                          # the grouped step equals G separate ones

A paper table cell is three runs (class orders 0, 1, 2) of the same small ResNet. On a GPU, ResNet-32's 16-64
channel convolutions leave most of the card idle, so a cell could train its G runs as one network whose every
layer is G layers side by side: convolutions with ``groups=G`` (group g sees only model g's channels), batch
norm over G times the channels (per-channel statistics are per-model statistics), option A's zero padding per
group, and a per-group head (a batched matrix product). The G models' batches travel stacked along the channel
axis, and the loss is the sum of their losses, so each model's gradient is its own and one SGD step (elementwise
momentum and weight decay) is G separate steps. ``--check`` verifies that on the device: the grouped network's
parameters after one step equal the G separate networks'.

Timed, per step (forward, cross-entropy, backward, SGD with momentum), median of ``--rounds`` rounds of
``--steps`` steps after warm-up, the three sides alternating:

* one: a single model at ``--batch`` images: what one run's step costs;
* sequential: the G models one after the other (G times "one", the cost of running them in turn);
* grouped: the G models as one grouped network, each at ``--batch`` images.

The ratio grouped/one is the figure to compare with G runs under CUDA MPS (``benchmarks/concurrency.py``): a
batched cell is only worth building into the engine where it is clearly below what MPS reaches. This is one
classification step, not R-DFCIL's full step (no teacher, generator or distillation terms): the prototype the
measurement needs before any of that is written.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dfcil.models.resnet_cifar import BasicBlock, CifarResNet

DEPTHS = {"resnet8": 1, "resnet20": 3, "resnet32": 5}
STAGES = ("stage_1", "stage_2", "stage_3", "stage_4")


class Single(nn.Module):
    """One model: the CIFAR ResNet, global average pooling and a linear head."""

    def __init__(self, n: int, classes: int) -> None:
        super().__init__()
        self.backbone = CifarResNet(n=n)
        self.head = nn.Linear(self.backbone.out_dim, classes)

    def forward(self, x: Tensor) -> Tensor:
        features, _ = self.backbone(x)
        return self.head(features.mean(dim=(2, 3)))


def _grouped_conv(convs: list[nn.Conv2d]) -> nn.Conv2d:
    c = convs[0]
    g = len(convs)
    out = nn.Conv2d(c.in_channels * g, c.out_channels * g, c.kernel_size, c.stride, c.padding, groups=g, bias=False)
    with torch.no_grad():
        out.weight.copy_(torch.cat([m.weight for m in convs]))  # group k: output channels k*out:(k+1)*out
    return out


def _grouped_bn(bns: list[nn.BatchNorm2d]) -> nn.BatchNorm2d:
    b = bns[0]
    out = nn.BatchNorm2d(b.num_features * len(bns), b.eps, b.momentum)
    with torch.no_grad():
        for name in ("weight", "bias", "running_mean", "running_var"):
            getattr(out, name).copy_(torch.cat([getattr(m, name) for m in bns]))
    return out


class GroupedBlock(nn.Module):
    def __init__(self, blocks: list[BasicBlock]) -> None:
        super().__init__()
        self.groups, self.increase_dim = len(blocks), blocks[0].increase_dim
        self.conv_a = _grouped_conv([b.conv_a for b in blocks])
        self.bn_a = _grouped_bn([b.bn_a for b in blocks])
        self.conv_b = _grouped_conv([b.conv_b for b in blocks])
        self.bn_b = _grouped_bn([b.bn_b for b in blocks])

    def forward(self, x: Tensor) -> Tensor:
        y = F.relu(self.bn_a(self.conv_a(x)))
        y = self.bn_b(self.conv_b(y))
        if self.increase_dim:  # option A within each group: subsample, then as many zero channels as it had
            sub = x[..., ::2, ::2]
            n, gc, h, w = sub.shape
            sub = sub.reshape(n, self.groups, gc // self.groups, h, w)
            x = torch.cat((sub, torch.zeros_like(sub)), dim=2).reshape(n, 2 * gc, h, w)
        return x + y


class Grouped(nn.Module):
    """G :class:`Single` models as one network (a copy of their weights): input (B, 3G, H, W), the G batches
    side by side on the channel axis; output (B, G, classes), model g's logits at ``[:, g]``."""

    def __init__(self, models: list[Single]) -> None:
        super().__init__()
        self.groups = len(models)
        nets = [m.backbone for m in models]
        self.conv_1 = _grouped_conv([n.conv_1 for n in nets])
        self.bn_1 = _grouped_bn([n.bn_1 for n in nets])
        self.blocks = nn.ModuleList(  # every stage's blocks in order: block i of each model, side by side
            GroupedBlock([getattr(net, stage)[i] for net in nets])
            for stage in STAGES
            for i in range(len(getattr(nets[0], stage)))
        )
        self.head_weight = nn.Parameter(torch.stack([m.head.weight.detach() for m in models]))  # (G, K, D)
        self.head_bias = nn.Parameter(torch.stack([m.head.bias.detach() for m in models]))  # (G, K)

    def forward(self, x: Tensor) -> Tensor:
        x = F.relu(self.bn_1(self.conv_1(x)))
        for block in self.blocks:
            x = block(x)
        f = x.mean(dim=(2, 3)).reshape(x.shape[0], self.groups, -1)  # (B, G, D)
        return torch.einsum("bgd,gkd->bgk", f, self.head_weight) + self.head_bias

    def parameters_of(self, g: int) -> dict[str, Tensor]:
        """Model g's share of every parameter, named as in :class:`Single` (for the equality check)."""
        out: dict[str, Tensor] = {}
        for name, p in self.named_parameters():
            if name.startswith("head_"):
                out[name.replace("head_", "head.")] = p[g]
            else:
                per = p.shape[0] // self.groups
                out[name] = p[g * per : (g + 1) * per]
        return out


def _sgd(params) -> torch.optim.Optimizer:  # noqa: ANN001
    return torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=5e-4)


def make_steps(
    n: int, groups: int, batch: int, classes: int, device: torch.device, compile_mode: str
) -> dict[str, Callable[[], None]]:
    """The three timed steps, each with its own models, optimisers and fixed random batches."""
    gen = torch.Generator().manual_seed(0)
    models = [Single(n, classes).to(device) for _ in range(groups)]
    grouped = Grouped(models).to(device)
    xs = [torch.randn(batch, 3, 32, 32, generator=gen).to(device) for _ in range(groups)]
    ys = [torch.randint(classes, (batch,), generator=gen).to(device) for _ in range(groups)]
    x_grouped, y_grouped = torch.cat(xs, dim=1), torch.stack(ys, dim=1)  # (B, 3G, H, W), (B, G)

    def single_step(model: Single, opt: torch.optim.Optimizer) -> Callable[[Tensor, Tensor], None]:
        def step(x: Tensor, y: Tensor) -> None:
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
            opt.step()

        return step

    def grouped_step(x: Tensor, y: Tensor) -> None:
        g_opt.zero_grad(set_to_none=True)
        logits = grouped(x)  # the sum of the G models' mean cross-entropies: each model's gradient is its own
        F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="sum").div(batch).backward()
        g_opt.step()

    g_opt = _sgd(grouped.parameters())
    steps = [single_step(m, _sgd(m.parameters())) for m in models]
    if compile_mode != "off":
        steps = [torch.compile(s, mode=compile_mode) for s in steps]
        grouped_step = torch.compile(grouped_step, mode=compile_mode)

    def sequential() -> None:
        for s, x, y in zip(steps, xs, ys, strict=True):
            s(x, y)

    return {
        "one": lambda: steps[0](xs[0], ys[0]),
        "sequential": sequential,
        "grouped": lambda: grouped_step(x_grouped, y_grouped),
    }


def check(n: int, groups: int, batch: int, classes: int, device: torch.device) -> float:
    """The largest difference between a grouped SGD step's parameters and G separate steps', relative to each
    parameter's scale."""
    torch.manual_seed(0)
    models = [Single(n, classes).to(device) for _ in range(groups)]
    for m in models:  # a non-zero last BN weight, so every block's residual branch carries gradient
        for b in m.backbone.modules():
            if isinstance(b, BasicBlock):
                nn.init.uniform_(b.bn_b.weight, 0.5, 1.5)
    grouped = Grouped(models).to(device)
    xs = [torch.randn(batch, 3, 32, 32, device=device) for _ in range(groups)]
    ys = [torch.randint(classes, (batch,), device=device) for _ in range(groups)]
    for m, x, y in zip(models, xs, ys, strict=True):
        opt = _sgd(m.parameters())
        F.cross_entropy(m(x), y).backward()
        opt.step()
    opt = _sgd(grouped.parameters())
    logits = grouped(torch.cat(xs, dim=1))
    F.cross_entropy(logits.flatten(0, 1), torch.stack(ys, dim=1).flatten(), reduction="sum").div(batch).backward()
    opt.step()
    worst = 0.0
    for g, m in enumerate(models):
        mine = dict(m.named_parameters())
        for name, p in grouped.parameters_of(g).items():
            ref = mine[_single_name(name, m)]
            worst = max(worst, ((p - ref).abs().max() / ref.abs().max().clamp(min=1e-12)).item())
    return worst


def _single_name(name: str, model: Single) -> str:
    """The :class:`Single` parameter that a :class:`Grouped` parameter name stands for."""
    if name.startswith("head."):
        return name
    if name.startswith(("conv_1", "bn_1")):
        return "backbone." + name
    _, index, rest = name.split(".", 2)  # blocks.<i>.<layer>
    i = int(index)
    for stage in STAGES:
        size = len(getattr(model.backbone, stage))
        if i < size:
            return f"backbone.{stage}.{i}.{rest}"
        i -= size
    raise KeyError(name)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--models", type=int, default=3, help="G: the models trained at once (a cell's class orders)")
    p.add_argument("--backbone", choices=sorted(DEPTHS), default="resnet32")
    p.add_argument("--batch", type=int, default=64, help="images per model and step (the paper: 128 + 128)")
    p.add_argument("--classes", type=int, default=100)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3, help="untimed steps of each side first (compiling happens there)")
    p.add_argument(
        "--compile", choices=["off", "default", "reduce-overhead", "max-autotune-no-cudagraphs"], default="off"
    )
    p.add_argument("--check", action="store_true", help="only check that a grouped step equals G separate steps")
    a = p.parse_args(argv)
    device = torch.device(a.device)
    if a.device == "cuda":
        torch.backends.cudnn.benchmark = True
    n = DEPTHS[a.backbone]
    if a.check:
        worst = check(n, a.models, min(a.batch, 16), a.classes, device)
        ok = worst < 1e-4
        print(f"grouped step against {a.models} separate steps: largest relative difference {worst:.2e}", end=" ")
        print("(equal)" if ok else "(DIFFERENT)")
        return 0 if ok else 1
    steps = make_steps(n, a.models, a.batch, a.classes, device, a.compile)
    for step in steps.values():
        for _ in range(a.warmup):
            step()
    sync(device)
    times: dict[str, list[float]] = {k: [] for k in steps}
    for r in range(a.rounds):
        order = list(steps) if r % 2 == 0 else list(reversed(steps))
        for name in order:
            sync(device)
            t = time.perf_counter()
            for _ in range(a.steps):
                steps[name]()
            sync(device)
            times[name].append((time.perf_counter() - t) / a.steps * 1e3)
    ms = {k: statistics.median(v) for k, v in times.items()}
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"{a.backbone}, G={a.models}, batch {a.batch} per model, compile {a.compile}, {name}; ", end="")
    print(f"median of {a.rounds} rounds of {a.steps} steps\n")
    print("| side | ms/step | ratio to one |")
    print("|---|---:|---:|")
    for k, v in ms.items():
        print(f"| {k} | {v:.2f} | {v / ms['one']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
