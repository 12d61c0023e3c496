"""Per-step speed of the R-DFCIL phases: fast path against reference mode (or fp32 against bf16), A/B in one process.

    python benchmarks/speed.py                           # CPU, fp32, reference vs fast, batch 128
    python benchmarks/speed.py --ab precision            # fast path, fp32 vs bf16 autocast
    python benchmarks/speed.py --device cuda --rounds 20 # on a GPU
    python benchmarks/speed.py --device cuda --ab graphs # fast path, eager vs one CUDA graph per step
    python benchmarks/speed.py --device cuda --ab compile # graphs, with and without engine.compile (backbones)
    python benchmarks/speed.py --device cuda --ab compile-step # graphs, with and without compiling whole steps
    python benchmarks/speed.py --device cuda --ab autotune # compiled, graphed steps, with and without max-autotune

Each round times ``--steps`` steps of every phase for A and then B (the order alternates between rounds) after
untimed warm-up steps (in the first round enough to capture the graphs); the table gives the median milliseconds
per step over rounds and the ratio A/B.

* task0: one step of the first task (plain CE; the same code in both modes, timed with ``--phases task0,...``).
* inversion: one generator Adam step against the frozen teacher. Reference: BN statistics collected by forward
  hooks on every BN layer and the KL layer by layer (as cl-lite/ABD); fast: the explicit ``BNMode(record=...)``
  path and the KL of equally wide layers stacked.
* rrl: one R-DFCIL RRL step (forward, three loss terms, backward, SGD step). Reference: separate student passes
  and the reference's three teacher passes; fast: one teacher pass, and with ``--fast all`` (the CUDA default)
  one student pass with per-half BN.
* chr: one CHR step (backbone frozen in eval mode). Reference: separate passes; fast: one pass each.
* eval: a no-grad forward of 1000 test images (identical in both modes: a control for noise).

``--ab memory`` compares NCHW with channels_last (fast path, eager unless ``--graphs``). ``--profile N`` then
profiles N eager steps of each phase with B's settings and prints where the device's time goes: the kernels (on
a GPU; the CPU's operators on a CPU) by share of the step, grouped into convolutions, batch norm, elementwise,
reductions, optimiser, copies and the rest. The engine's ``cudnn_benchmark`` default (on) applies on CUDA.

With ``--ab graphs`` both sides take the fast path; B replays each step as one CUDA graph (``dfcil.compute.graphs``).
With ``--ab compile`` both sides replay graphs (eager steps on a CPU); B compiles the student's and the teacher's
backbones with ``torch.compile``, as ``engine.compile: default`` does (fused kernels; the compile time is in the
untimed warm-up). ``--ab compile-step`` compiles each step's whole forward and loss terms instead (generator,
heads and losses too; not an engine switch: it would compile again for every task as the head grows).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import re
import statistics
import sys
import time
from collections.abc import Callable

import torch
from torch import nn

from dfcil.compute.graphs import StepGraph
from dfcil.compute.optim import fill_momentum
from dfcil.compute.runtime import Runtime
from dfcil.data.device import Normalizer, TrainBatches
from dfcil.load import load_config
from dfcil.methods import Batch, Phase, TaskContext, build_method
from dfcil.models.batchnorm import BNStats
from dfcil.models.network import build_network
from dfcil.synthesis.regularizers import bn_kl, content_loss, diversity_loss, smoothness_prior


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def build(
    device: torch.device, batch: int, n_old: int, n_new: int, merge: str, precision: str, channels_last: bool,
    compile_backbone: bool = False,
):  # fmt: skip
    cfg = load_config([], [("method.inversion.steps", "0"), ("train.batch_size", str(batch))])[0]
    method = build_method(cfg.method, cfg.train)
    torch.manual_seed(0)
    net = build_network("resnet32").to(device)
    if channels_last:
        net.to(memory_format=torch.channels_last)
    net.expand(n_old)
    net.expand(n_new)
    if compile_backbone:  # as engine.compile: the student's backbone here, the teacher's in its frozen copy
        net.compile_backbone(mode=None)

    runtime = Runtime(
        device=device, precision=precision, merge_teacher=merge != "none", merge_student=merge == "all",
        channels_last=channels_last,
    )  # fmt: skip
    images = torch.zeros(batch, 32, 32, 3, dtype=torch.uint8, device=device)  # only their size is read
    data = TrainBatches(
        images, images.new_zeros(batch, dtype=torch.long), batch, Normalizer((0.5,) * 3, (0.25,) * 3, device), None
    )
    rng = torch.Generator(device=device).manual_seed(0)
    ctx = TaskContext(task_id=1, n_old=n_old, n_new=n_new, num_tasks=2, net=net, data=data, rng=rng, runtime=runtime)
    method._build_task_state(ctx)  # projectors and loss weights
    method.replay._build(ctx)  # teacher and an (untrained) generator: no inversion needed for timing
    params = [p for m in (net, method.projector) for p in m.parameters()]
    fused = {"fused": True} if device.type == "cuda" else {}
    optimizer = torch.optim.SGD(params, lr=0.01, momentum=0.9, weight_decay=5e-4, **fused)
    x = torch.randn(batch, 3, 32, 32, device=device)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    y = torch.randint(n_old, n_old + n_new, (batch,), device=device)
    return method, net, ctx, optimizer, Batch(x, y)


def hooked_inversion_terms(inv, x):
    """The reference's way to get BN statistics: forward hooks on every BN layer of the teacher, and the KL
    computed layer by layer."""
    stats: list[BNStats] = []

    def hook(module, inputs, output):
        a = inputs[0].float()
        stats.append(
            BNStats(a.mean((0, 2, 3)), a.var((0, 2, 3), unbiased=False), module.running_mean, module.running_var)
        )

    handles = [m.register_forward_hook(hook) for m in inv.teacher.modules() if isinstance(m, nn.BatchNorm2d)]
    try:
        logits = inv.teacher(x).logits.float()
    finally:
        for h in handles:
            h.remove()
    c = inv.cfg
    return [
        c.w_content * content_loss(logits, c.tau),
        c.w_diversity * diversity_loss(logits),
        c.w_bn * torch.stack([bn_kl(s) for s in stats]).mean(),  # the reference: one layer at a time
        c.w_prior * smoothness_prior(x.float(), inv.kernel),
    ]


def optimizer_step(
    compute: Callable[..., torch.Tensor], optimizer: torch.optim.Optimizer
) -> Callable[..., torch.Tensor]:
    """The engine's step around ``compute`` (the loss terms): zero_grad, backward, the optimiser's step."""

    def step(*inputs: torch.Tensor) -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        values = compute(*inputs)
        values.sum().backward()
        optimizer.step()
        return values.detach()

    return step


def steps_for(
    setup, hooks: bool, graphs: str = "off", compile: str | None = None, made: list[StepGraph] | None = None
) -> dict[str, Callable[[], None]]:
    """Each phase's step; ``compile`` (an ``engine.compile_mode``; None: eager): the whole step's forward and loss
    terms through ``torch.compile`` (the backward through AOTAutograd), inside the CUDA graph when ``graphs`` is on.
    Every :class:`StepGraph` is appended to ``made``, so the caller can say which steps really ran as graphs."""
    made = made if made is not None else []
    method, net, ctx, optimizer, batch = setup
    mode = None if compile in (None, "default") else compile
    maybe_compiled = (lambda f: torch.compile(f, mode=mode)) if compile else (lambda f: f)
    inv = method.replay.synth
    # as the engine's: fused on CUDA, and capturable (its step count on the device) when graphed
    kernels = {"fused": True} if ctx.device.type == "cuda" else {}
    kernels |= {"capturable": True} if graphs == "on" else {}
    inv_opt = torch.optim.Adam(inv.generator.parameters(), lr=1e-3, **kernels)
    test = torch.randn(1000, 3, 32, 32, device=ctx.device)

    def inversion_terms():
        with ctx.runtime.autocast():
            x = inv.generator(inv.latent(inv.batch_size))
            terms = hooked_inversion_terms(inv, x) if hooks else list(inv.loss_terms(x).values())
        return torch.stack([t.float() for t in terms])

    inv_step = StepGraph(
        optimizer_step(maybe_compiled(inversion_terms), inv_opt), inv_opt, graphs, ctx.device, generators=(inv.rng,)
    )
    made.append(inv_step)

    def inversion():
        inv.generator.train()
        inv_step("inversion")

    def train_step(phase: Phase, ctx: TaskContext = ctx):
        def terms(x, y):
            with ctx.runtime.autocast():
                terms = method.training_step(net, Batch(x, y), ctx, phase)
            return torch.stack([t.float() for t in terms.values()])

        graph = StepGraph(
            optimizer_step(maybe_compiled(terms), optimizer), optimizer, graphs, ctx.device, generators=(ctx.rng,)
        )
        made.append(graph)

        def step():
            if phase.trainable == "head":
                net.backbone.eval()
                net.backbone.requires_grad_(False)
            else:
                net.train()
                net.requires_grad_(True)
            # as the engine at a phase's start: the phases share one optimiser, and a parameter that an earlier
            # phase left without a momentum buffer (task 0 trains no projector) would stop the fused SGD kernel
            fill_momentum(optimizer)
            graph(phase.name, batch.x, batch.y)

        return step

    @torch.no_grad()
    def evaluation():
        net.eval()
        with ctx.runtime.autocast():
            net(test).logits.argmax(1)

    return {
        "task0": train_step(Phase("base", 1, 0.1), dataclasses.replace(ctx, task_id=0)),
        "inversion": inversion,
        "rrl": train_step(Phase("rrl", 1, 0.1)),
        "chr": train_step(Phase("chr", 1, 0.005, trainable="head")),
        "eval": evaluation,
    }


KERNEL_GROUPS = (  # first match wins; names of cuDNN/cuBLAS/ATen kernels and of the CPU's aten operators
    ("batch norm", r"batch_norm|batchnorm|\bbn_|::bn_|bn_fw|bn_bw|welford|var_mean"),
    ("convolution / matmul", r"conv|cudnn|xmma|implicit|wgrad|dgrad|fprop|winograd|gemm|cutlass|sm\d\d_|mm\b|matmul"),
    ("optimiser", r"multi_tensor|foreach|fused_sgd|fused_adam|sgd|adam"),
    ("copy / cat / fill", r"copy|memcpy|memset|cat|fill|zero|index|gather|scatter|pad"),
    ("reduction", r"reduce|sum|mean|max|min|norm|softmax"),
    ("elementwise", r"elementwise|vectorized|unrolled|relu|add|mul|sub|div|where|clamp|sqrt|exp|log|pow"),
)


def profile(steps: dict[str, Callable[[], None]], phases: list[str], n: int, device: torch.device) -> None:
    """Print, per phase, where ``n`` steps spend the device's time: kernels on a GPU, aten operators' own time on
    a CPU (µs per step, share, calls per step), top 12 and by group."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    for phase in phases:
        fn = steps[phase]
        for _ in range(3):
            fn()
        _sync(device)
        with torch_profile(activities=activities) as prof:
            for _ in range(n):
                fn()
            _sync(device)
        per_name: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])
        for e in prof.events():
            if cuda and e.device_type == DeviceType.CUDA:
                us = e.time_range.elapsed_us()
            elif not cuda and e.device_type == DeviceType.CPU and e.name.startswith("aten::"):
                us = e.self_cpu_time_total
            else:
                continue
            per_name[e.name][0] += us / n
            per_name[e.name][1] += 1 / n
        total = sum(us for us, _ in per_name.values())
        kind = "kernels" if cuda else "aten operators (self time)"
        calls = sum(c for _, c in per_name.values())
        print(f"\n{phase}: {total / 1000:.2f} ms of {kind} per step, {calls:.0f} per step ({n} eager steps)")
        if cuda:  # a layer fed another memory format than its weights' converts it first: there should be none
            converts = sum(c for name, (_, c) in per_name.items() if "convertTensor" in name)
            print(f"memory-format conversions (cuDNN convertTensor kernels): {converts:.0f} per step")
        if not per_name:
            print("(no events recorded)")
            continue
        groups: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])
        for name, (us, c) in per_name.items():
            group = next((g for g, rx in KERNEL_GROUPS if re.search(rx, name, re.IGNORECASE)), "other")
            groups[group][0] += us
            groups[group][1] += c
        print("| group | µs/step | share | calls/step |\n|---|---:|---:|---:|")
        for group, (us, c) in sorted(groups.items(), key=lambda kv: -kv[1][0]):
            print(f"| {group} | {us:.0f} | {us / total:.0%} | {c:.0f} |")
        print("| top kernel | µs/step | share | calls/step |\n|---|---:|---:|---:|")
        for name, (us, c) in sorted(per_name.items(), key=lambda kv: -kv[1][0])[:12]:
            short = name if len(name) <= 90 else name[:87] + "..."
            print(f"| `{short}` | {us:.0f} | {us / total:.0%} | {c:.0f} |")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument(
        "--ab", default="merge",
        choices=["merge", "precision", "graphs", "compile", "compile-step", "autotune", "memory"],
        help="what A and B differ in",
    )  # fmt: skip
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32", help="for --ab merge")
    p.add_argument("--fast", choices=["auto", "all", "teacher"], default="auto", help="the fast path's merge_passes")
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--graphs", action="store_true", help="for --ab memory and precision: both sides graphed")
    p.add_argument("--no-cudnn-benchmark", action="store_true", help="cuDNN's heuristics instead of autotuning")
    p.add_argument("--profile", type=int, default=0, metavar="N", help="then profile N eager steps of B")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--n-old", type=int, default=20)
    p.add_argument("--n-new", type=int, default=20)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=3, help="timed steps per phase per round")
    p.add_argument("--phases", default="inversion,rrl,chr,eval")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    phases = args.phases.split(",")
    fast = args.fast if args.fast != "auto" else ("all" if device.type == "cuda" else "teacher")
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = not args.no_cudnn_benchmark  # the engine's default: autotuned
    both = "on" if args.graphs else "off"
    base = {
        "merge": fast, "precision": args.precision, "hooks": False, "graphs": both, "compile": "none",
        "channels_last": args.channels_last,
    }  # fmt: skip
    variants = {  # what A and B change of the fast path
        "merge": {"reference": {"merge": "none", "hooks": True}, f"fast-{fast}": {}},
        "graphs": {"eager": {}, "graphs": {"graphs": "on"}},
        "compile": {"graphs": {"graphs": "on"}, "graphs+compile": {"graphs": "on", "compile": "backbone"}},
        "compile-step": {"graphs": {"graphs": "on"}, "graphs+compiled-step": {"graphs": "on", "compile": "step"}},
        "autotune": {  # engine.compile_mode: inductor's kernel choice timed at compile time
            "compiled-step": {"graphs": "on", "compile": "step"},
            "compiled-step+autotune": {"graphs": "on", "compile": "step-autotune"},
        },
        "precision": {"fp32": {"precision": "fp32"}, "bf16": {"precision": "bf16"}},
        "memory": {"nchw": {"channels_last": False}, "channels_last": {"channels_last": True}},
    }[args.ab]
    steps = {}
    made: dict[str, list[StepGraph]] = {}
    for name, change in variants.items():
        v = base | change
        setup = build(
            device, args.batch, args.n_old, args.n_new, v["merge"], v["precision"], v["channels_last"],
            v["compile"] == "backbone",
        )  # fmt: skip
        compile_mode = {"step": "default", "step-autotune": "max-autotune-no-cudagraphs"}.get(v["compile"])
        steps[name] = steps_for(setup, v["hooks"], v["graphs"], compile_mode, made.setdefault(name, []))
    times: dict[tuple[str, str], list[float]] = {(v, ph): [] for v in variants for ph in phases}
    names = list(variants)
    for r in range(args.rounds):
        order = names if r % 2 == 0 else names[::-1]
        for phase in phases:
            for v in order:
                fn = steps[v][phase]
                for _ in range(4 if r == 0 else 1):  # warm-up: cuDNN autotuning, graph capture in the first round
                    fn()
                _sync(device)
                t0 = time.perf_counter()
                for _ in range(args.steps):
                    fn()
                _sync(device)
                times[(v, phase)].append((time.perf_counter() - t0) / args.steps * 1000)
    a, b = names
    info = f"device {device}, batch {args.batch}, n_old {args.n_old}, n_new {args.n_new}, threads "
    info += f"{torch.get_num_threads()}, torch {torch.__version__}, rounds {args.rounds} x {args.steps} steps"
    if args.ab != "precision":
        info += f", {args.precision}"
    if args.ab != "memory":
        info += ", channels_last" if args.channels_last else ", NCHW"
    if args.graphs and args.ab in ("memory", "precision", "merge"):
        info += ", both graphed"
    if device.type == "cuda":
        info += f", cudnn.benchmark {torch.backends.cudnn.benchmark}"
    print(info)
    print(f"| phase | {a} ms/step | {b} ms/step | ratio {a}/{b} |")
    print("|---|---:|---:|---:|")
    for phase in phases:
        ta, tb = statistics.median(times[(a, phase)]), statistics.median(times[(b, phase)])
        print(f"| {phase} | {ta:.1f} | {tb:.1f} | {ta / tb:.2f} |")
    for name, graphs in made.items():  # a step whose graph could not be set up ran eagerly: say so
        ran = [f"{g.key}: {g.mode}" + (f" ({g.failure})" if g.failure else "") for g in graphs if g.key is not None]
        if any(g.mode != "off" or g.failure for g in graphs):
            print(f"{name} steps ran as: {', '.join(ran)}")
    if args.profile:
        v = base | variants[b] | {"graphs": "off", "compile": "none"}  # kernels' own times: eager steps
        setup = build(device, args.batch, args.n_old, args.n_new, v["merge"], v["precision"], v["channels_last"])
        print(f"\nprofile of {b}'s settings, eager")
        profile(steps_for(setup, v["hooks"]), phases, args.profile, device)
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
