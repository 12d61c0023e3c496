"""CUDA code paths. Skipped without a GPU; `bash benchmarks/gpu_check.sh tests` runs them on a GPU machine."""

import json

import pytest
import torch

from conftest import CONFIGS
from dfcil.cli import main
from dfcil.methods import Batch, Phase
from dfcil.training.loop import RunOptions

SMOKE = str(CONFIGS / "smoke.yaml")
pytestmark = pytest.mark.gpu


@pytest.mark.parametrize(
    "engine",
    [
        [],
        ["--engine.merge_passes", "none"],
        ["--engine.precision", "bf16", "--engine.channels_last", "true"],
        ["--engine.precision", "bf16", "--engine.compile", "default"],
        ["--engine.cuda_graphs", "on"],
        ["--engine.cuda_graphs", "on", "--engine.precision", "bf16", "--engine.channels_last", "true"],
    ],
    ids=["fast-fp32", "reference", "bf16-channels-last", "bf16-compile", "graphs", "graphs-bf16-channels-last"],
)
def test_smoke_on_cuda(tmp_path, engine):
    out = tmp_path / "run"
    assert main(["train", "--config", SMOKE, "--out", str(out), "--no-progress", "--device", "cuda", *engine]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["device"].startswith("cuda") and s["acc_per_task"][0] > 20
    assert s["timings"][1]["peak_memory_mb"] > 0
    if "on" in engine:  # every phase replayed, its captures timed apart
        phases = [p for t in s["timings"] for p in t["phases"].values()]
        assert all(p["cuda_graphs"] == "on" and p["captures"] >= 1 and p["capture_s"] > 0 for p in phases), phases


def test_compiled_steps_replayed_as_graphs_on_cuda(tmp_path):
    """engine.compile: step with inductor, the static head and CUDA graphs: three tasks, every phase replayed, and
    the third task compiles nothing (its steps reuse the second's compiled code)."""
    out = tmp_path / "run"
    engine = ["--engine.cuda_graphs", "on", "--engine.channels_last", "true", "--model.static_head", "true"]
    engine += ["--engine.compile", "step", "--data.num_tasks", "3"]
    assert main(["train", "--config", SMOKE, "--out", str(out), "--no-progress", "--device", "cuda", *engine]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["acc_per_task"][0] > 20
    assert [t["compiles"] > 0 for t in s["timings"]] == [True, True, False], s["timings"]
    phases = [p for t in s["timings"] for p in t["phases"].values()]
    assert all(p["cuda_graphs"] == "on" for p in phases), phases


def test_fast_and_reference_agree_on_cuda():
    from test_engine_modes import _setup

    results = []
    for merge in ("all", "none"):
        method, net, ctx = _setup(merge, device="cuda")
        g = torch.Generator(device="cuda").manual_seed(1)
        x = torch.randn(8, 3, 32, 32, device="cuda", generator=g)
        y = torch.randint(4, 8, (8,), device="cuda", generator=g)
        terms = method.training_step(net, Batch(x, y), ctx, Phase("rrl", 1, 0.1))
        results.append({k: v.item() for k, v in terms.items()})
    for k in results[0]:  # TF32 convolutions: agreement to about 1e-3
        assert results[0][k] == pytest.approx(results[1][k], rel=2e-3, abs=1e-4), k


def test_resume_on_cuda_inside_a_task_continues(tmp_path):
    """Interrupted inside task 1 with channels_last weights, fused SGD and graphs, resumed: the optimiser state comes
    back in its parameters' layout (fused kernels need it) and the run ends like an uninterrupted one (CUDA's
    kernels are not bit-deterministic here, so the accuracy is compared, not the weights)."""
    from conftest import StopAfterEpochs
    from dfcil.errors import RunInterrupted
    from dfcil.load import load_config
    from dfcil.runs.runner import resume, train
    from dfcil.training.state import Interrupt

    overrides = [("device", "cuda"), ("engine.channels_last", "true"), ("engine.cuda_graphs", "on")]
    cfg = load_config([SMOKE], overrides)[0]
    a = train(cfg, tmp_path / "a", options=RunOptions(progress=False))
    interrupt = Interrupt()
    with pytest.raises(RunInterrupted):  # task 0 has 2 epochs: stop after the first of task 1
        train(
            cfg,
            tmp_path / "b",
            options=RunOptions(progress=False, interrupt=interrupt, callbacks=[StopAfterEpochs(interrupt, 3)]),
        )
    b = resume(tmp_path / "b", options=RunOptions(progress=False))
    assert b["resumed"] is True and len(b["acc_per_task"]) == 2
    assert b["last_acc"] == pytest.approx(a["last_acc"], abs=10)


def test_captured_steps_train_like_eager_steps():
    """A toy model with BN, momentum SGD and a declared random stream: 8 steps captured and replayed against 8 eager
    steps from the same start (the graph key changes once, as at an lr milestone)."""
    from dfcil.compute.graphs import StepGraph
    from test_graphs import Toy, batches

    results = []
    for mode in ("off", "on"):
        toy = Toy()
        toy.noise = True
        toy.net.cuda()
        toy.weight = toy.weight.cuda()
        toy.rng = torch.Generator(device="cuda").manual_seed(1)
        toy.opt = torch.optim.SGD(toy.net.parameters(), lr=0.1, momentum=0.9, fused=True)
        step = StepGraph(toy.step, toy.opt, mode, torch.device("cuda"), generators=(toy.rng,), warmup=2)
        values = []
        for i, (x, y) in enumerate(batches(8)):
            if i == 5:
                for group in toy.opt.param_groups:
                    group["lr"] = 0.01
            toy.weight.fill_(1.0 + i / 10)  # state updated in place between steps
            key = toy.opt.param_groups[0]["lr"]
            values.append(step(key, x.cuda(), y.cuda()).clone())
        weights = [p.detach().clone() for p in toy.net.state_dict().values()]
        results.append((torch.stack(values), weights, toy.rng.get_state()))
        if mode == "on":
            assert step.captures == 2
    assert torch.equal(results[0][2], results[1][2])  # a replay advances the declared stream as eager steps do
    torch.testing.assert_close(results[0][0], results[1][0], rtol=1e-4, atol=1e-5)  # and draws the same numbers
    for a, b in zip(results[0][1], results[1][1], strict=True):
        torch.testing.assert_close(a.float(), b.float(), rtol=1e-4, atol=1e-5)


def test_captured_inversion_follows_the_eager_inversion():
    from dfcil.compute.runtime import Runtime
    from dfcil.models.network import build_network
    from dfcil.synthesis.inversion import InversionConfig, ModelInversion

    torch.manual_seed(0)
    teacher = build_network("resnet8").cuda()
    teacher.expand(4)
    teacher = teacher.frozen_copy()
    cfg = InversionConfig(steps=6, zdim=16)
    init = ModelInversion(teacher, cfg, 32, 8, torch.Generator(device="cuda")).generator.state_dict()
    losses = {}
    for mode in ("off", "on"):
        runtime = Runtime(device=torch.device("cuda"), fused=True, graphs=mode)
        inv = ModelInversion(teacher, cfg, 32, 8, torch.Generator(device="cuda").manual_seed(3), runtime)
        inv.generator.load_state_dict(init)
        seen = []
        inv.fit(lambda step, values, seen=seen: seen.append(values.clone()))
        losses[mode] = torch.stack(seen)
    torch.testing.assert_close(losses["off"], losses["on"], rtol=2e-3, atol=1e-4)  # TF32 convolutions


def test_batch_moments_on_cuda_match_the_cpu():
    from dfcil.models.batchnorm import batch_moments

    x = torch.randn(16, 8, 6, 6, dtype=torch.float64) * 2 + 1
    out = {}
    for device in ("cpu", "cuda"):
        xd = x.to(device).detach().requires_grad_()  # a leaf on both devices (x.to('cpu') is x itself)
        mean, var = batch_moments(xd)  # var_mean on CUDA, two passes on the CPU
        (mean.sum() + (var * torch.arange(8, device=device)).sum()).backward()
        out[device] = (mean.cpu(), var.cpu(), xd.grad.cpu())
    for a, b in zip(out["cpu"], out["cuda"], strict=True):  # fp32 statistics: fp32 tolerances throughout
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_checkpoint_bytes_of_cuda_tensors_round_trip_to_the_host():
    from dfcil.checkpoint import FORMAT, dumps, loads

    g = torch.Generator(device="cuda").manual_seed(0)
    payload = {
        "format": FORMAT,
        "net": {"w": torch.randn(8, 3, device="cuda", generator=g), "n": torch.tensor(3, device="cuda")},
        "cpu": torch.arange(5),  # beside CUDA tensors: one block per device
        "bf16": torch.randn(4, device="cuda", generator=g).bfloat16(),
    }
    back = loads(dumps(payload))
    for name, t in [("w", payload["net"]["w"]), ("n", payload["net"]["n"])]:
        assert back["net"][name].device.type == "cpu" and torch.equal(back["net"][name], t.cpu())
    assert torch.equal(back["cpu"], payload["cpu"]) and torch.equal(back["bf16"], payload["bf16"].cpu())
