"""CUDA code paths. Skipped without a GPU; run on the lent GPU machine by benchmarks/gpu_check.sh."""

import json

import pytest
import torch

from conftest import CONFIGS
from dfcil.cli import main
from dfcil.methods import Batch, Phase

SMOKE = str(CONFIGS / "smoke.yaml")
pytestmark = pytest.mark.gpu


@pytest.mark.parametrize(
    "engine",
    [
        [],
        ["--engine.merge_passes", "none"],
        ["--engine.precision", "bf16", "--engine.channels_last", "true"],
        ["--engine.precision", "bf16", "--engine.compile", "default"],
    ],
    ids=["fast-fp32", "reference", "bf16-channels-last", "bf16-compile"],
)
def test_smoke_on_cuda(tmp_path, engine):
    out = tmp_path / "run"
    assert main(["train", "--config", SMOKE, "--out", str(out), "--no-progress", "--device", "cuda", *engine]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["device"].startswith("cuda") and s["acc_per_task"][0] > 20
    assert s["timings"][1]["peak_memory_mb"] > 0


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


def test_resume_on_cuda_continues(tmp_path):
    out = tmp_path / "run"
    args = ["train", "--config", SMOKE, "--out", str(out), "--no-progress", "--device", "cuda"]
    assert main(args) == 0
    (out / "summary.json").unlink()  # pretend the run stopped after its last checkpoint
    assert main(["resume", str(out), "--no-progress"]) == 0
    assert json.loads((out / "summary.json").read_text())["resumed"] is True
