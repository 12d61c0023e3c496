"""One run over two processes (torchrun, gloo on the CPU): the same run as one process with the same global batch,
within rounding; files written once; a run killed inside RRL resumes under torchrun to the uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from conftest import CONFIGS
from dfcil.checkpoint import Checkpointer, loads, peek_position
from dfcil.compute.distributed import Dist
from dfcil.errors import CheckpointError, ConfigError
from dfcil.load import load_config

SMOKE = str(CONFIGS / "smoke.yaml")
# inversion.steps 0: the generator stays at its initialisation, so its images do not depend on the teacher's
# rounding (Adam turns a teacher that differs in the last bit into visibly different images)
ARGS = ["--train.batch_size", "32", "--method.inversion.steps", "0", "--device", "cpu", "--no-progress"]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR")}
    return env | {"OMP_NUM_THREADS": "1"}


def _torchrun(*args: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "dfcil",
        *args,
    ]


def _one(*args: str) -> list[str]:
    return [sys.executable, "-m", "dfcil", *args]


def _run(cmd: list[str]) -> None:
    done = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]


def _losses(run) -> list[dict[str, float]]:
    return [
        r["loss"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["type"] == "epoch"
    ]


def _weights(run) -> dict[str, torch.Tensor]:
    return loads((run / "model.pt").read_bytes())["net"]


@pytest.mark.parametrize("method", ["rdfcil", pytest.param("finetune", marks=pytest.mark.slow)])
def test_two_processes_train_as_one_with_the_same_global_batch(tmp_path, method):
    """Each process a half of every batch, BN statistics over both halves, RKD and the weighted CE over the global
    batch, gradients averaged: the losses of every epoch and the final weights equal one process's within rounding,
    the accuracy counts exactly; metrics.jsonl is written once."""
    config = SMOKE
    if method == "finetune":  # the smoke preset's data, model and schedule; its R-DFCIL keys do not apply
        config = str(tmp_path / "finetune.yaml")
        (tmp_path / "finetune.yaml").write_text(
            "method:\n  name: finetune\ndata:\n  name: fake\n  num_tasks: 2\nmodel:\n  backbone: resnet8\n"
            "train:\n  epochs: 3\n  milestones: [2]\nseed: 1\n"
        )
    args = ARGS if method == "rdfcil" else [a for a in ARGS if "inversion" not in a and a != "0"]
    one, two = tmp_path / "one", tmp_path / "two"
    _run(_one("train", "--config", config, *args, "--out", str(one)))
    _run(_torchrun("train", "--config", config, *args, "--out", str(two)))
    a, b = (json.loads((d / "summary.json").read_text()) for d in (one, two))
    assert a["correct_matrix"] == b["correct_matrix"]
    la, lb = _losses(one), _losses(two)
    assert len(la) == len(lb)  # one line per epoch: the second process writes none
    for x, y in zip(la, lb, strict=True):
        assert x.keys() == y.keys()
        for k in x:
            assert y[k] == pytest.approx(x[k], rel=1e-3, abs=1e-6), (k, x, y)
    wa, wb = _weights(one), _weights(two)
    for k in wa:
        scale = float(wa[k].float().abs().max()) or 1.0
        torch.testing.assert_close(wb[k].float(), wa[k].float(), rtol=0, atol=2e-2 * scale, msg=k)


def _peek(run):
    try:
        return peek_position(Checkpointer(run).last.read_bytes())
    except (OSError, CheckpointError):
        return None


def _stopped_in_rrl(tmp_path, args, sig):
    """A two-process run stopped by ``sig`` to one process once task 1's RRL has checkpointed an epoch."""
    cut = tmp_path / "cut"
    proc = subprocess.Popen(
        _torchrun("train", "--config", SMOKE, *args, "--out", str(cut)),
        env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        pos = _peek(cut)
        if pos and pos["task"] == 1 and pos["stage"] == "train" and pos["phase"] == 0 and pos["epoch"] >= 1:
            break
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        time.sleep(0.01)
    workers = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
    os.kill(int(workers[-1]), sig)  # one rank
    try:
        proc.wait(timeout=120)  # SIGKILL: torchrun stops the other rank; SIGTERM: both stop at the same step
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode != 0
    assert not (cut / "summary.json").exists()
    return cut


RESUME_ARGS = [*ARGS, "--train.epochs", "5", "--method.chr_epochs", "2", "--epoch_checkpoint_interval_s", "0"]


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["kill", "term"])
def test_killed_in_rrl_resumes_under_torchrun_to_the_uninterrupted_run(tmp_path, sig):
    """One process killed (SIGKILL: torchrun then stops the other) or stopped (SIGTERM: every process stops at the
    same step, the first writes a checkpoint) once task 1's RRL has checkpointed an epoch; ``torchrun ... dfcil
    resume`` finishes the run with the same weights, bit for bit, as an uninterrupted run."""
    whole = tmp_path / "whole"
    _run(_torchrun("train", "--config", SMOKE, *RESUME_ARGS, "--out", str(whole)))
    cut = _stopped_in_rrl(tmp_path, RESUME_ARGS, sig)
    _run(_torchrun("resume", str(cut), "--no-progress"))
    assert json.loads((cut / "summary.json").read_text())["resumed"] is True
    wa, wb = _weights(whole), _weights(cut)
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k
    assert _losses(whole) == _losses(cut)


@pytest.mark.slow
def test_a_two_process_run_resumes_as_one_process_within_rounding(tmp_path):
    """The processes' random streams are equal and each step is the global batch's, so a checkpoint of two
    processes continues in one: the run ends as the uninterrupted two-process run, within rounding."""
    whole = tmp_path / "whole"
    _run(_torchrun("train", "--config", SMOKE, *RESUME_ARGS, "--out", str(whole)))
    cut = _stopped_in_rrl(tmp_path, RESUME_ARGS, signal.SIGTERM)
    _run(_one("resume", str(cut), "--no-progress"))
    a, b = (json.loads((d / "summary.json").read_text()) for d in (whole, cut))
    assert a["correct_matrix"] == b["correct_matrix"]
    for x, y in zip(_losses(whole), _losses(cut), strict=True):
        for k in x:
            assert y[k] == pytest.approx(x[k], rel=1e-3, abs=1e-6), (k, x, y)


INVERSION_WORKER = """
import json, sys, torch
from dfcil.compute import distributed
from dfcil.models.network import build_network
from dfcil.compute.runtime import Runtime
from dfcil.synthesis.inversion import InversionConfig, ModelInversion

def setup(dist):
    torch.manual_seed(0)
    net = build_network("resnet8"); net.expand(4); net.train()
    with torch.no_grad():
        for _ in range(3): net(torch.randn(16, 3, 32, 32) + 0.5)
    torch.manual_seed(1)
    cfg = InversionConfig(steps=1, zdim=32)
    return ModelInversion(net.frozen_copy(4), cfg, 32, 16, torch.Generator().manual_seed(3), Runtime(dist=dist))

def step(inv):
    inv.generator.train()
    terms = inv.loss_terms(inv.generator(inv.dist.shard(inv.latent(inv.batch_size))))
    sum(terms.values()).backward()
    inv.dist.average_gradients(list(inv.generator.parameters()))
    values = inv.dist.mean(torch.stack([t.detach() for t in terms.values()]))
    return values.tolist(), {n: p.grad.tolist() for n, p in inv.generator.named_parameters()}

if __name__ == "__main__":
    dist = distributed.start("cpu")
    out = step(setup(dist))
    if dist.main:
        json.dump(out, open(sys.argv[1], "w"))
    distributed.stop()
"""


def test_split_inversion_step_equals_one_process_step(tmp_path):
    """engine.distributed_inversion split: each of two processes trains the generator on half the latent batch, with
    the teacher's BN statistics, the generator's BN and the diversity term over the global batch: the loss terms and
    the averaged gradients are one process's within rounding."""
    import importlib.util

    script = tmp_path / "inversion_worker.py"
    script.write_text(INVERSION_WORKER)
    out = tmp_path / "two.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script)]
    done = subprocess.run([*cmd, str(out)], env=_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    spec = importlib.util.spec_from_file_location("inversion_worker", script)
    worker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(worker)
    terms, grads = worker.step(worker.setup(Dist()))
    two_terms, two_grads = json.loads(out.read_text())
    assert two_terms == pytest.approx(terms, rel=1e-5, abs=1e-7)
    for name, g in grads.items():
        a, b = torch.tensor(g), torch.tensor(two_grads[name])
        layer = float(torch.tensor(grads[name.replace(".bias", ".weight")]).abs().max())
        if name.endswith(".bias") and float(a.abs().max()) < 1e-4 * layer:
            # a convolution's bias before BN: its exact gradient is 0, so both sides hold only rounding noise, a sum
            # over the batch in an order that differs between the two layouts and between CPUs
            assert float(b.abs().max()) < 1e-4 * layer, name
            continue
        scale = max(float(a.abs().max()), 1.0)
        # a bias's gradient sums the upstream gradient over every position of the batch (batch x 32 x 32 for the
        # output convolution) with cancellation: its rounding follows that count, not its small result (out.0.bias
        # on one Xeon: 2.6e-4 off a gradient of 4.5 in the two layouts)
        atol = (1e-4 if name.endswith(".bias") else 1e-5) * scale
        torch.testing.assert_close(b, a, rtol=1e-4, atol=atol, msg=name)


def test_batch_must_split_over_the_processes_and_methods_must_support_it(monkeypatch):
    with pytest.raises(ConfigError, match="multiple of the number of processes"):
        Dist(0, 3).check_batch(32)
    from dfcil.compute import distributed
    from dfcil.training.protocol import prepare

    monkeypatch.setattr(distributed, "current", lambda: Dist(0, 2))
    cfg = load_config([], [("method.name", "lwf")])[0]
    with pytest.raises(ConfigError, match="lwf does not train over several processes"):
        prepare(cfg)
    cfg = load_config([SMOKE], [("method.inversion.batch_size", "15")])[0]
    with pytest.raises(ConfigError, match="method.inversion.batch_size 15 does not split over 2"):
        prepare(cfg)
    cfg = load_config([SMOKE], [("engine.cuda_graphs", "on")])[0]
    with pytest.raises(ConfigError, match="cuda_graphs: on and engine.compile do not work over several"):
        prepare(cfg)
