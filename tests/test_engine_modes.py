"""The fast path (merged passes, split BN) against the reference mode (separate passes), and the precision and
memory-format switches."""

import dataclasses
import json

import pytest
import torch

from conftest import CONFIGS
from dfcil.cli import main
from dfcil.compute.runtime import Runtime
from dfcil.data.device import Normalizer, TrainBatches
from dfcil.load import load_config
from dfcil.methods import Batch, Phase, TaskContext, build_method
from dfcil.models.network import build_network
from dfcil.training.loop import RunOptions

SMOKE = str(CONFIGS / "smoke.yaml")


def _setup(merge: str, seed: int = 0, device: str = "cpu"):
    cfg = load_config([SMOKE], [("method.inversion.steps", "3")])[0]
    method = build_method(cfg.method, cfg.train)
    torch.manual_seed(seed)
    net = build_network("resnet8").to(device)
    net.expand(4)
    net.train()
    with torch.no_grad():
        for _ in range(3):
            net(torch.randn(16, 3, 32, 32, device=device) + 0.5)
    net.expand(4)
    dev = torch.device(device)
    x = torch.zeros(8, 32, 32, 3, dtype=torch.uint8, device=dev)  # the task's images: only their size is read
    data = TrainBatches(x, x.new_zeros(8, dtype=torch.long), 8, Normalizer((0.5,) * 3, (0.25,) * 3, dev), None)
    runtime = Runtime(device=dev, merge_teacher=merge != "none", merge_student=merge == "all")
    rng = torch.Generator(device=device).manual_seed(5)
    ctx = TaskContext(task_id=1, n_old=4, n_new=4, num_tasks=2, net=net, data=data, rng=rng, runtime=runtime)
    method.on_task_start(ctx)
    method.synthesize(ctx, lambda: None)
    return method, net, ctx


@pytest.mark.parametrize("merge", ["all", "teacher"])
@pytest.mark.parametrize("phase", [Phase("rrl", 1, 0.1), Phase("chr", 1, 0.005, trainable="head")], ids=["rrl", "chr"])
def test_fast_and_reference_give_the_same_losses_gradients_and_bn_statistics(phase, merge):
    fast_method, fast_net, fast_ctx = _setup(merge)
    ref_method, ref_net, ref_ctx = _setup("none")
    for a, b in zip(fast_net.state_dict().values(), ref_net.state_dict().values(), strict=True):
        assert torch.equal(a, b)  # identical starting points, inversion included
    if phase.trainable == "head":
        for net in (fast_net, ref_net):
            net.backbone.eval()
            net.backbone.requires_grad_(False)
    x, y = torch.randn(8, 3, 32, 32), torch.randint(4, 8, (8,))
    fast = fast_method.training_step(fast_net, Batch(x, y), fast_ctx, phase)
    ref = ref_method.training_step(ref_net, Batch(x, y), ref_ctx, phase)
    assert fast.keys() == ref.keys()
    for k in fast:
        torch.testing.assert_close(fast[k], ref[k], rtol=1e-5, atol=1e-6, msg=k)
    sum(fast.values()).backward()
    sum(ref.values()).backward()
    grads = 0
    for (name, a), b in zip(fast_net.named_parameters(), ref_net.parameters(), strict=True):
        if a.grad is None:
            assert b.grad is None, name
            continue
        grads += 1
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-6, msg=name)
    assert grads > 0
    for (name, a), b in zip(fast_net.state_dict().items(), ref_net.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)  # running statistics too
    torch.testing.assert_close(fast_method.class_counts, ref_method.class_counts)


@pytest.mark.slow  # three smoke runs; the merged and separate passes are compared step by step above
def test_fast_and_reference_reach_the_same_accuracy_on_the_smoke_preset(tmp_path):
    acc = {}
    for merge in ("all", "teacher", "none"):
        out = tmp_path / merge
        args = ["train", "--config", SMOKE, "--out", str(out), "--no-progress", "--device", "cpu"]
        assert main([*args, "--engine.merge_passes", merge]) == 0  # bit-equal on the CPU; TF32 differs on CUDA
        acc[merge] = json.loads((out / "summary.json").read_text())["accuracy_matrix"]
    assert acc["all"] == acc["teacher"] == acc["none"]


def test_bf16_and_channels_last_run_and_stay_close_to_fp32():
    from dfcil.load import load_config
    from dfcil.training.callbacks import Callback
    from dfcil.training.engine import run

    class Losses(Callback):
        def __init__(self):
            self.epochs = []

        def on_run_start(self, loop):
            self.net = loop.net

        def on_epoch_end(self, record):
            self.epochs.append(record["loss"])

    results = {}
    for name, overrides in {
        "fp32": [],
        "bf16": [("engine.precision", "bf16"), ("engine.channels_last", "true")],
    }.items():
        losses = Losses()
        summary = run(load_config([SMOKE], overrides)[0], options=RunOptions(callbacks=[losses], progress=False))
        results[name] = (summary, losses.net, losses.epochs)
    (_, _, l32), (s16, net16, l16) = results["fp32"], results["bf16"]
    conv = next(m for m in net16.modules() if isinstance(m, torch.nn.Conv2d))
    assert conv.weight.is_contiguous(memory_format=torch.channels_last) and conv.weight.dtype == torch.float32
    for term, value in l32[0].items():  # the first epoch, before the runs drift apart: within bf16's rounding
        assert l16[0][term] == pytest.approx(value, rel=5e-2), term
    assert s16["timings"][1]["peak_memory_mb"] > 0 and 0 <= s16["last_acc"] <= 100


def test_bf16_step_keeps_fp32_weights_and_losses():
    method, net, ctx = _setup("all")
    ctx = dataclasses.replace(ctx, runtime=dataclasses.replace(ctx.runtime, precision="bf16"))
    x, y = torch.randn(8, 3, 32, 32), torch.randint(4, 8, (8,))
    with ctx.runtime.autocast():
        assert net(x).logits.dtype == torch.bfloat16  # autocast is on: the network computes in bf16
        terms = method.training_step(net, Batch(x, y), ctx, Phase("rrl", 1, 0.1))
    assert all(t.dtype == torch.float32 for t in terms.values())
    sum(terms.values()).backward()
    assert all(
        p.dtype == torch.float32 and p.grad.dtype == torch.float32 for p in net.parameters() if p.grad is not None
    )


@pytest.mark.slow  # a three-task compiled run; engine.compile: step is tested in the default run (test_static_head)
def test_compile_traces_each_backbone_variant_once_for_the_whole_run(monkeypatch):
    """``engine.compile`` compiles the backbones (the student's and every frozen teacher's), whose graphs stay the
    same as the head grows: the variants are traced in the first two tasks and never again, with no graph break,
    well below dynamo's recompile limit (compiling the whole network traced every variant again for every task
    and hit the limit in task 3, then ran eagerly). Dynamo's ``eager`` backend runs the traced graphs without
    inductor's code generation, so the run must train exactly as without compile."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    from dfcil.training.callbacks import Callback
    from dfcil.training.engine import run

    compiled, original = [], torch.nn.Module.compile

    def compile_eagerly(module, **options):
        compiled.append((type(module).__name__, options))
        original(module, backend="eager")

    class GraphsPerTask(Callback):
        def __init__(self):
            self.after = {}

        def on_epoch_end(self, record):
            self.after[record["task"]] = counters["stats"]["unique_graphs"]

    monkeypatch.setattr(torch.nn.Module, "compile", compile_eagerly)
    monkeypatch.setattr(
        "dfcil.training.protocol.check_compiler", lambda device: None
    )  # the eager backend needs no compiler
    five = [("data.num_tasks", "5"), ("engine.merge_passes", "all")]  # all: the BN groups of the merged student
    torch._dynamo.reset()
    counters.clear()
    per_task = GraphsPerTask()
    compiled_run = run(
        load_config([SMOKE], [*five, ("engine.compile", "default")])[0],
        options=RunOptions(callbacks=[per_task], progress=False),
    )
    eager_run = run(load_config([SMOKE], five)[0], options=RunOptions(progress=False))
    assert compiled == [("CifarResNet", {"mode": None})] * 5  # the student's backbone, then each task's teacher's
    assert 4 <= per_task.after[1] <= 8
    assert per_task.after == {0: per_task.after[0], **dict.fromkeys(range(1, 5), per_task.after[1])}
    assert not counters["graph_break"] and not counters["unimplemented"]  # no break, no recompile limit hit
    assert compiled_run["accuracy_matrix"] == eager_run["accuracy_matrix"]
    torch._dynamo.reset()
