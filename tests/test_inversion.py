import logging
import math

import numpy as np
import pytest
import torch
from torch import nn

from dfcil.models.batchnorm import BNMode, BNStats
from dfcil.models.network import build_network
from dfcil.synthesis.inversion import InversionConfig, ModelInversion
from dfcil.synthesis.regularizers import (
    bn_kl,
    bn_statistics_loss,
    content_loss,
    diversity_loss,
    gaussian_kernel,
    smoothness_prior,
)


def test_content_and_diversity_hand_values():
    logits = torch.tensor([[2.0, 0.0]])
    assert content_loss(logits, tau=1.0).item() == pytest.approx(math.log(1 + math.exp(-2)), rel=1e-6)
    # τ = 1000 flattens the distribution: CE ≈ log K
    assert content_loss(logits, tau=1000.0).item() == pytest.approx(math.log(2), abs=2e-3)
    p = torch.tensor([[0.0, math.log(3.0)]])  # softmax = [1/4, 3/4]
    expected = 1 + (0.25 * math.log(0.25) + 0.75 * math.log(0.75)) / math.log(2)
    assert diversity_loss(p).item() == pytest.approx(expected, rel=1e-5)
    assert diversity_loss(torch.zeros(4, 10)).item() == pytest.approx(0, abs=1e-6)  # uniform mean prediction
    assert diversity_loss(torch.tensor([[100.0, 0, 0]] * 3)).item() == pytest.approx(1, abs=1e-6)
    assert diversity_loss(torch.randn(4, 1)).item() == 0  # a single class has no diversity to measure


def test_gaussian_kernel_keeps_the_reference_bug():
    k = gaussian_kernel()
    taps = k.sum(dim=0)
    assert taps.tolist() == pytest.approx([0.1117, 0.2365, 0.3036, 0.2365, 0.1117], abs=1e-4)
    assert k.sum().item() == pytest.approx(1.0)


def test_smoothness_prior_against_direct_blur():
    x = torch.randn(2, 3, 8, 8)
    k = gaussian_kernel()
    taps = k.sum(dim=0).double().numpy()
    xp = np.pad(x.double().numpy(), ((0, 0), (0, 0), (2, 2), (2, 2)), mode="reflect")
    blurred = np.zeros_like(x.double().numpy())
    for di in range(5):
        for dj in range(5):
            blurred += taps[di] * taps[dj] * xp[:, :, di : di + 8, dj : dj + 8]
    expected = ((x.double().numpy() - blurred) ** 2).mean()
    assert smoothness_prior(x, k).item() == pytest.approx(expected, rel=1e-5)
    assert smoothness_prior(torch.full((1, 3, 8, 8), 0.7), k).item() == pytest.approx(0, abs=1e-10)


def _teacher(n_classes=5, seed=0):
    torch.manual_seed(seed)
    net = build_network("resnet8")
    net.expand(n_classes)
    net.train()
    with torch.no_grad():  # give the BN layers non-trivial running statistics
        for _ in range(5):
            net(torch.randn(16, 3, 32, 32) * 1.5 + 0.3)
    return net.frozen_copy()


def test_bn_statistics_loss_against_direct_computation():
    teacher = _teacher()
    x = torch.randn(8, 3, 32, 32)
    inputs = []  # capture every BN input with plain forward hooks, independently of BNMode
    hooks = [
        m.register_forward_hook(lambda mod, inp, out: inputs.append((mod, inp[0].detach().double())))
        for m in teacher.modules()
        if isinstance(m, nn.BatchNorm2d)
    ]
    record = []
    teacher(x, bn=BNMode(record=record))
    for h in hooks:
        h.remove()
    assert len(record) == len(inputs) == 9  # resnet8: stem + 4 blocks × 2
    kls = []
    for mod, a in inputs:
        mean = a.mean(dim=(0, 2, 3))
        var = a.var(dim=(0, 2, 3), unbiased=False) + 1e-8
        rv, rm = mod.running_var.double() + 1e-8, mod.running_mean.double()
        kls.append((torch.log(var.sqrt() / rv.sqrt()) - 0.5 * (1 - (rv + (rm - mean) ** 2) / var)).mean())
    assert bn_statistics_loss(record).item() == pytest.approx(torch.stack(kls).mean().item(), rel=1e-5)
    assert len(_bn_count(build_network("resnet32"))) == 31


def _bn_count(net):
    record = []
    net.expand(2)
    net.eval()
    net(torch.randn(2, 3, 32, 32), bn=BNMode(record=record))
    return record


def test_inversion_reduces_its_loss_and_samples_pseudo_labels():
    teacher = _teacher()
    cfg = InversionConfig(steps=40, lr=1e-2)
    inv = ModelInversion(teacher, cfg, image_size=32, batch_size=16, rng=torch.Generator().manual_seed(0))
    history = []
    inv.fit(lambda step, values: history.append(values.sum().item()))
    assert len(history) == 40 and all(math.isfinite(h) for h in history)
    assert np.mean(history[-5:]) < 0.7 * np.mean(history[:5])
    assert not inv.generator.training and not any(p.requires_grad for p in inv.generator.parameters())
    x, y = inv.sample(12)
    assert x.shape == (12, 3, 32, 32) and not x.requires_grad
    assert torch.equal(y, teacher(x).logits.argmax(1)) and y.max() < 5


def test_inversion_state_roundtrip_continues_identically():
    teacher = _teacher()
    cfg = InversionConfig(steps=6)

    def make():
        torch.manual_seed(0)  # same generator initialisation
        return ModelInversion(teacher, cfg, 32, 8, torch.Generator().manual_seed(3))

    full = make()
    full.fit()

    class Stop(Exception):
        pass

    def stop_at_3(step, terms):
        if step == 3:
            raise Stop

    half = make()
    with pytest.raises(Stop):
        half.fit(stop_at_3)
    state, rng_state = half.state_dict(), half.rng.get_state()
    assert state["step"] == 3 and not half.done
    resumed = make()
    resumed.load_state_dict(state)
    resumed.rng.set_state(rng_state)
    resumed.fit()
    assert resumed.done and resumed.optimizer is None
    for a, b in zip(full.generator.state_dict().values(), resumed.generator.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="trained"):
        resumed.state_dict()


def test_stacked_bn_loss_equals_the_layer_by_layer_loss_and_its_gradients():
    """Layers of equal width are computed together; value and gradients equal the reference's per-layer loop."""
    g = torch.Generator().manual_seed(0)
    widths = [16, 16, 32, 16, 64, 32, 64, 64]
    leaves = [(torch.randn(c, generator=g), torch.rand(c, generator=g) + 0.1) for c in widths]
    running = [(torch.randn(c, generator=g), torch.rand(c, generator=g) + 0.1) for c in widths]

    def loss(stacked):
        means = [m.clone().requires_grad_() for m, _ in leaves]
        variances = [v.clone().requires_grad_() for _, v in leaves]
        stats = [BNStats(m, v, rm, rv) for m, v, (rm, rv) in zip(means, variances, running, strict=True)]
        value = bn_statistics_loss(stats) if stacked else torch.stack([bn_kl(s) for s in stats]).mean()
        value.backward()
        return value, [t.grad for t in means + variances]

    (a, ga), (b, gb) = loss(True), loss(False)
    torch.testing.assert_close(a, b, rtol=1e-6, atol=0)
    for u, v in zip(ga, gb, strict=True):
        torch.testing.assert_close(u, v, rtol=1e-6, atol=1e-9)


def test_inversion_terms_carry_their_weights_and_tau_reaches_the_content_term_only():
    """Each term is its weight × its function of the teacher's logits (τ in the content CE only, temperature 1 in
    the diversity term), the BN statistics of every teacher layer, and the images' smoothness."""
    teacher = _teacher()
    cfg = InversionConfig(tau=7.0, w_content=2.0, w_diversity=3.0, w_bn=5.0, w_prior=11.0)
    inv = ModelInversion(teacher, cfg, image_size=32, batch_size=8, rng=torch.Generator().manual_seed(0))
    x = torch.randn(8, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    got = inv.loss_terms(x)
    record: list[BNStats] = []
    logits = teacher(x, bn=BNMode(record=record)).logits
    p = torch.softmax(logits, dim=1).mean(dim=0)
    want = {
        "content": 2.0 * nn.functional.cross_entropy(logits / 7.0, logits.argmax(dim=1)),
        "diversity": 3.0 * (1 + (p * p.log()).sum() / math.log(logits.shape[1])),
        "bn": 5.0 * bn_statistics_loss(record),
        "prior": 11.0 * smoothness_prior(x, gaussian_kernel()),
    }
    assert set(got) == set(want) and len(record) == sum(isinstance(m, nn.BatchNorm2d) for m in teacher.modules())
    for k in want:
        torch.testing.assert_close(got[k], want[k], msg=k)


def test_generator_adam_is_fused_and_steps_like_the_unfused_one():
    """The generator's Adam uses the fused kernel where the engine's runtime allows it (CUDA in runs; PyTorch's CPU
    implementation here), with the same update as the default one within rounding (one step: after it, Adam turns
    the rounding noise of gradients that are 0 in exact arithmetic, a conv bias before BN, into ±lr)."""
    from dfcil.compute.runtime import Runtime

    cfg = InversionConfig(steps=1)
    runs = {}
    for fused in (False, True):
        torch.manual_seed(0)
        inv = ModelInversion(_teacher(), cfg, 32, 8, torch.Generator().manual_seed(3), Runtime(fused=fused))
        assert bool(inv.optimizer.defaults.get("fused")) == fused
        inv.fit()
        runs[fused] = inv.generator.state_dict()
    for k, v in runs[False].items():
        torch.testing.assert_close(runs[True][k], v, rtol=1e-4, atol=1e-5, msg=k)


def _replay_inversion(runtime, steps=20):
    """A task's inversion as the engine runs it (:meth:`Replay.fit`), on a small teacher; returns the generator."""
    from types import SimpleNamespace

    from dfcil.synthesis.replay import Replay

    torch.manual_seed(0)
    net = _teacher()
    ctx = SimpleNamespace(task_id=1, n_old=5, net=net, image_size=32, batch_size=8, runtime=runtime,
                          rng=torch.Generator().manual_seed(3))  # fmt: skip
    replay = Replay(InversionConfig(steps=steps, zdim=32, batch_size=8))
    replay.begin(ctx)
    replay.fit(ctx, lambda: None)
    return replay.synth.generator.state_dict()


def test_inversion_logs_every_tenth_reads_terms_outside_the_checked_graph_and_changes_nothing(caplog, monkeypatch):
    """A line at steps 2, 4, .., 20 with the four weighted terms, read after each step (the graph check, which fails
    on a host sync inside a step, passes); the generator is the one trained without lines; a second process logs
    nothing."""
    from dfcil.compute.distributed import Dist
    from dfcil.compute.runtime import Runtime
    from dfcil.progress import ProgressLog

    caplog.set_level(logging.INFO, logger="dfcil")
    logged = _replay_inversion(Runtime(graphs="check"))
    lines = [r.getMessage() for r in caplog.records if "inversion step" in r.getMessage()]
    assert [int(line.split("step ")[1].split("/")[0]) for line in lines] == list(range(2, 21, 2))
    assert all(f" {k}=" in line or f": {k}=" in line for line in lines for k in ("content", "diversity", "bn", "prior"))
    assert lines[-1].startswith("task 1 inversion step 20/20 (100%): content=") and "steps/s, 0s left" in lines[-1]

    caplog.clear()
    with monkeypatch.context() as patch:
        patch.setattr(ProgressLog, "due", lambda self, step: False)
        quiet = _replay_inversion(Runtime(graphs="check"))
    _replay_inversion(Runtime(dist=Dist(rank=1, world=2), split_inversion=False), steps=2)  # a second process
    assert not [r for r in caplog.records if "inversion step" in r.getMessage()]
    assert all(torch.equal(logged[k], quiet[k]) for k in logged)


# ----------------------------------------------------------------------------------------- a diverged inversion


def _diverging(steps=20, max_loss=1e10, **cfg):
    from dfcil.compute.runtime import Runtime

    teacher = _teacher()
    torch.manual_seed(0)
    cfg = InversionConfig(steps=steps, **({"w_bn": 1e38} | cfg))
    return ModelInversion(teacher, cfg, 32, 8, torch.Generator().manual_seed(0), Runtime(max_loss=max_loss))


def test_first_diverged_finds_the_first_bad_step_in_step_order():
    from dfcil.synthesis.inversion import first_diverged

    values = torch.tensor([[1.0, 2.0], [3.0, float("nan")], [float("inf"), 1.0]])
    assert first_diverged(values, None) == (1, 1)
    assert first_diverged(values, 2.5) == (1, 0)  # 3 > 2.5 comes before the NaN in its own row
    assert first_diverged(torch.ones(3, 2), 2.5) is None and first_diverged(-3 * torch.ones(1, 1), 2.5) == (0, 0)


def test_an_exploding_inversion_stops_at_its_first_step_naming_the_term_and_the_keys():
    """w_bn 1e38 (issue 46): the bn term passes train.max_loss at step 1; the inversion used to run every step
    and print 'inversion done'. Now it stops there, naming the term, the step and what to lower."""
    from dfcil.errors import LossLimitError

    inv, steps = _diverging(), []
    with pytest.raises(LossLimitError) as err:
        inv.fit(lambda step, values: steps.append(step))
    assert steps == [] and inv.step == 1  # stopped before its step was handed on (progress, checkpoints)
    text = str(err.value)
    assert "its loss term 'bn' reached" in text and "at step 1 of 20, above train.max_loss (1e+10" in text
    assert "Lower method.inversion.w_bn (now 1e+38) or method.inversion.lr (now 0.001)" in text


def test_a_nan_inversion_names_every_nan_term_and_blames_the_largest_term_of_the_step_before():
    from dfcil.errors import NonFiniteLossError

    inv = _diverging(max_loss=None)
    with pytest.raises(NonFiniteLossError) as err:
        inv.fit()
    text = str(err.value)
    assert "its loss terms 'content', 'diversity', 'bn', 'prior' became nan at step 2 of 20" in text, text
    assert "(the step before, the largest was 'bn': " in text and "Lower method.inversion.w_bn (now 1e+38)" in text


def test_on_a_gpu_the_check_reads_every_10_steps_and_before_any_save_of_the_generator():
    """A GPU reads the terms every CHECK_EVERY steps (a host sync each): a checkpoint taken in between (state_dict)
    checks first, so the diverged generator is never saved; the error names the first bad step all the same."""
    from dfcil.errors import NonFiniteLossError
    from dfcil.synthesis.inversion import CHECK_EVERY

    inv, seen = _diverging(max_loss=None), []
    inv.check_every = CHECK_EVERY  # as on a GPU

    def checkpoint_at_3(step, values):
        seen.append(step)
        if step == 3:
            inv.state_dict()

    with pytest.raises(NonFiniteLossError, match="at step 2 of 20"):
        inv.fit(checkpoint_at_3)
    assert seen == [1, 2, 3]
    healthy = _diverging(w_bn=50.0, steps=12)
    healthy.check_every = CHECK_EVERY
    healthy.fit()  # checks at 10 and at the end, finds nothing
    assert healthy.done and healthy.final_terms is not None


def test_a_diverged_inversion_stops_the_run_with_one_line_and_writes_no_checkpoint_of_it(tmp_path, capsys):
    """The issue's command: exit status 3 at once, the inversion term and keys named (not 'hkd' in RRL and the
    learning rate), no task1-static.pt, and the checkpoint left is task 0's."""
    from conftest import CONFIGS
    from dfcil.checkpoint import loads
    from dfcil.cli import main

    out = tmp_path / "run"
    argv = ["train", "--config", str(CONFIGS / "smoke.yaml"), "--method.inversion.w_bn", "1e38", "--data.num_classes",
            "4", "--data.image_size", "16", "--train.epochs", "2", "--train.milestones", "[]", "--out", str(out),
            "--no-progress"]  # fmt: skip
    assert main(argv) == 3
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("dfcil: training stopped: task 1: model inversion diverged: its loss term 'bn'"), err
    assert "method.inversion.w_bn" in err and "hkd" not in err
    assert not (out / "checkpoints" / "task1-static.pt").exists()
    last = loads((out / "checkpoints" / "last.pt").read_bytes())  # task 1 before its setup: no partial generator
    assert (last["position"]["task"], last["position"]["stage"]) == (1, "start") and last["method"] == {}
    assert "inversion done" not in (out / "run.log").read_text()
