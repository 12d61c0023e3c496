"""The static head (``model.static_head``): allocated for every class at the start, unseen columns masked; the same
run as the growing head within rounding, and a step whose shapes never change between tasks."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from conftest import smoke_configs
from dfcil.compute.runtime import Runtime
from dfcil.data.device import Normalizer, TrainBatches
from dfcil.errors import ConfigError
from dfcil.load import load_config
from dfcil.losses.classification import local_ce
from dfcil.losses.distillation import hkd_l1
from dfcil.methods import Batch, Phase, TaskContext, build_method
from dfcil.models.heads import MASKED_LOGIT, IncrementalLinear, StaticLinear
from dfcil.models.network import build_network
from dfcil.synthesis.regularizers import diversity_loss
from dfcil.training.engine import build, run
from dfcil.training.loop import RunOptions
from dfcil.training.protocol import prepare


def _heads(sizes=(3, 2), capacity=10):
    torch.manual_seed(0)
    grow = IncrementalLinear(8)
    for n in sizes:
        grow.expand(n)
    torch.manual_seed(0)
    static = StaticLinear(8, capacity)
    for n in sizes:
        static.expand(n)
    return grow, static


def test_static_head_draws_the_same_weights_masks_the_rest_and_saves_the_growing_layout() -> None:
    grow, static = _heads()
    assert torch.equal(static.weight(), grow.weight())
    assert static.sizes == grow.sizes == [3, 2] and static.out_features == 10
    assert static.mask.tolist() == [True] * 5 + [False] * 5
    assert static.old_mask.tolist() == [True] * 3 + [False] * 7
    assert static.new_mask.tolist() == [False] * 3 + [True] * 2 + [False] * 5
    f = torch.randn(4, 8)
    logits = static(f)
    # one matrix product over 10 columns against one over 5: BLAS may sum in another order on another CPU
    torch.testing.assert_close(logits[:, :5], grow(f), rtol=1e-6, atol=1e-7)
    assert (logits[:, 5:] == MASKED_LOGIT).all()
    assert torch.equal(torch.softmax(logits, 1)[:, 5:], torch.zeros(4, 5))  # masked columns add exactly nothing
    state = static.state_dict()
    assert list(state) == ["blocks.0.weight", "blocks.1.weight"]  # the growing head's keys and shapes
    assert grow.load_state_dict(state) is not None
    other = StaticLinear(8, 10)
    other.expand(3), other.expand(2)
    other.load_state_dict(grow.state_dict())
    assert torch.equal(other.table, static.table)
    with pytest.raises(RuntimeError, match="Unexpected key"):
        StaticLinear(8, 10).load_state_dict(grow.state_dict())  # no blocks yet: the saved ones are unexpected
    static.truncate(3)
    assert static.sizes == [3] and static.mask.sum() == 3 and static.new_mask.tolist()[:3] == [True] * 3
    assert (static.table[3:] == 0).all()
    with pytest.raises(ValueError, match="block boundary"):
        static.truncate(2)
    with pytest.raises(ValueError, match="cannot grow"):
        static.expand(8)


def test_unseen_rows_get_no_update_and_no_weight_decay() -> None:
    _, static = _heads()
    opt = torch.optim.SGD(static.parameters(), lr=0.5, momentum=0.9, weight_decay=0.1)
    for _ in range(3):
        opt.zero_grad()
        F.cross_entropy(static(torch.randn(16, 8)), torch.randint(0, 5, (16,))).backward()
        assert (static.table.grad[5:] == 0).all() and static.table.grad[:5].abs().sum() > 0
        opt.step()
    assert (static.table[5:] == 0).all()  # zero weight, zero gradient: SGD and weight decay leave them at zero


def test_masked_losses_equal_the_sliced_ones() -> None:
    torch.manual_seed(1)
    _, static = _heads()
    s, t = torch.randn(6, 10), torch.randn(6, 10)
    s[:, 5:] = t[:, 5:] = MASKED_LOGIT
    y = torch.randint(3, 5, (6,))
    torch.testing.assert_close(local_ce(s, y, static.new_mask), local_ce(s[:, :5], y, 3), rtol=1e-6, atol=0)
    torch.testing.assert_close(hkd_l1(s, t, static.old_mask), hkd_l1(s[:, :3], t[:, :3]), rtol=1e-6, atol=0)
    torch.testing.assert_close(diversity_loss(s, static.mask), diversity_loss(s[:, :5]), rtol=1e-6, atol=1e-7)
    z = s.clone().requires_grad_()
    diversity_loss(z, static.mask).backward()  # finite: a masked column's probability is exactly 0
    assert torch.isfinite(z.grad).all() and (z.grad[:, 5:] == 0).all()
    one = StaticLinear(8, 10)
    one.expand(1)
    assert diversity_loss(s, one.mask) == 0  # one class: no diversity to ask for


def _run(method: str, static: bool, *extra: tuple[str, str]):
    cfg = load_config(smoke_configs(method), [("model.static_head", str(static).lower()), *extra])[0]
    return run(cfg, options=RunOptions(progress=False)), cfg


@pytest.mark.parametrize("method", ["rdfcil", "lwf_mc", pytest.param("finetune", marks=pytest.mark.slow)])
def test_static_head_run_equals_growing_head_run(method: str) -> None:
    """The smoke preset with each head: the same accuracy matrix, and the same weights within rounding (a wider
    matrix product or softmax may sum in another order). Not R-DFCIL+: its anti-collapse term (a Cholesky factor
    of a batch covariance) and its drift fit carry such rounding into another prediction of one test image on one
    thread and not on another; its steps are compared within rounding instead (below), and its compiled run with
    its eager one (test_compile_step_compiles_once_per_phase_kind_and_keeps_the_results)."""
    (grow, _), (static, _) = _run(method, False, ("method.name", method)), _run(method, True, ("method.name", method))
    assert grow["correct_matrix"] == static["correct_matrix"]
    np.testing.assert_allclose(grow["avg_inc_acc"], static["avg_inc_acc"])


def _task1(capacity: int | None, phase: Phase, name: str = "rdfcil"):
    """R-DFCIL (or R-DFCIL+) at the start of task 1 of a smoke-sized protocol (4 + 4 classes), the generator
    inverted; R-DFCIL+'s memory holds a Gaussian for each of the 4 old classes."""
    cfg = load_config(smoke_configs(name), [("method.name", name), ("method.inversion.steps", "3")])[0]
    method = build_method(cfg.method, cfg.train)
    torch.manual_seed(0)
    net = build_network("resnet8", capacity=capacity)
    if name == "rdfcil_plus":  # class Gaussians as task 0's end leaves them: means, and covariances of full rank
        f = torch.randn(40, net.feature_dim)
        method.memory.add(f, torch.arange(4).repeat(10), range(4))
    net.expand(4)
    net.train()
    with torch.no_grad():
        for _ in range(3):
            net(torch.randn(16, 3, 32, 32) + 0.5)
    net.expand(4)
    x = torch.zeros(8, 32, 32, 3, dtype=torch.uint8)
    data = TrainBatches(x, x.new_zeros(8, dtype=torch.long), 8, Normalizer((0.5,) * 3, (0.25,) * 3, x.device), None)
    rng = torch.Generator().manual_seed(5)
    ctx = TaskContext(task_id=1, n_old=4, n_new=4, num_tasks=2, net=net, data=data, rng=rng, runtime=Runtime())
    method.on_task_start(ctx)
    inv = method.replay.synth
    z = inv.latent(8)
    inversion = inv.loss_terms(inv.generator(z))  # the first inversion step's terms and gradients
    sum(inversion.values()).backward()
    inv_grads = [p.grad.clone() for p in inv.generator.parameters()]
    inv.optimizer.zero_grad()
    method.synthesize(ctx, lambda: None)
    if phase.trainable == "head":
        net.backbone.eval().requires_grad_(False)
    torch.manual_seed(2)
    terms = method.training_step(net, Batch(torch.randn(8, 3, 32, 32), torch.randint(4, 8, (8,))), ctx, phase)
    sum(terms.values()).backward()
    grads = {k: p.grad for k, p in net.named_parameters() if p.grad is not None}
    head = grads.pop("head.table", None)
    if head is not None:  # the static head's gradient: the seen rows as the growing head's blocks, zero after
        assert (head[8:] == 0).all()
        grads |= {"head.blocks.0.weight": head[:4], "head.blocks.1.weight": head[4:8]}
    return inversion, inv_grads, terms, grads


@pytest.mark.parametrize("name", ["rdfcil", "rdfcil_plus"])
@pytest.mark.parametrize("phase", [Phase("rrl", 1, 0.1), Phase("chr", 1, 0.005, trainable="head")], ids=["rrl", "chr"])
def test_static_head_steps_equal_growing_head_steps_within_rounding(phase: Phase, name: str) -> None:
    """Inversion and training steps from the same state: the same loss terms and gradients, within float32
    rounding: a wider matrix product may sum in another order, so within 1e-6 of each tensor's largest value.
    Over a run Adam and SGD amplify such differences; test_static_head_run_equals_growing_head_run covers runs.
    R-DFCIL+ adds the anti-collapse term in RRL and, in CHR, the head's CE on features replayed from the memory."""
    grow, static = _task1(None, phase, name), _task1(12, phase, name)
    assert {"rdfcil": set(), "rdfcil_plus": {"rrl": {"ac"}, "chr": {"replay"}}[phase.name]}[name] <= set(grow[2])
    for a, b, what in zip(grow, static, ("inversion terms", "generator gradients", "terms", "gradients"), strict=True):
        a, b = (a, b) if isinstance(a, dict) else (dict(enumerate(a)), dict(enumerate(b)))
        assert a.keys() == b.keys(), what
        for k in a:
            scale = float(a[k].detach().abs().max())  # a gradient 0 in exact arithmetic (bias before BN) is noise
            torch.testing.assert_close(b[k], a[k], rtol=1e-5, atol=1e-6 * max(scale, 1.0), msg=f"{what}: {k}")


def test_static_head_is_refused_for_methods_that_slice_columns() -> None:
    cfg = load_config([], [("method.name", "ucir_df"), ("model.static_head", "true")])[0]
    with pytest.raises(ConfigError, match="static_head: ucir_df .* rdfcil"):
        prepare(cfg)
    assert build  # the engine builds a static head only after prepare() accepted it


def test_compile_step_needs_the_static_head() -> None:
    cfg = load_config(smoke_configs("rdfcil"), [("engine.compile", "step")])[0]
    with pytest.raises(ConfigError, match="compile: step .*static_head: true"):
        prepare(cfg)


# R-DFCIL's steps are a subset of R-DFCIL+'s (which adds the replay kept out of the graphs): R-DFCIL's case is slow
@pytest.mark.parametrize("name", [pytest.param("rdfcil", marks=pytest.mark.slow), "rdfcil_plus"])
def test_compile_step_compiles_once_per_phase_kind_and_keeps_the_results(monkeypatch, name) -> None:
    """Three tasks with ``engine.compile: step`` (dynamo with an eager backend: tracing and guards as inductor's,
    no code generation): task 0 compiles the base step, task 1 the inversion, RRL and CHR steps, task 2 nothing.
    The compiled run's results equal the uncompiled one's. Every graph is one AOTAutograd's disk cache accepts
    (its own check, on the graphs inductor would get): no autocast context, no custom autograd Function, else every
    later run would compile it again (engine.compile_cache). R-DFCIL+'s replay of the memory, which grows with
    every task, runs outside the graphs: compiled, it compiled again in task 2."""
    from torch._functorch._aot_autograd.autograd_cache import BypassAOTAutogradCache, check_cacheable

    refused, graphs, compile_ = [], [], torch.compile

    def cacheable(gm: torch.fx.GraphModule, example_inputs):  # noqa: ANN001, ANN202
        graphs.append(gm)
        try:
            check_cacheable(gm)
        except BypassAOTAutogradCache as err:
            refused.append(str(err))
        return gm.forward

    monkeypatch.setattr(torch, "compile", lambda fn, backend, **kw: compile_(fn, backend=cacheable, **kw))
    torch._dynamo.reset()  # compiled code is cached per process: start from none
    short = [("data.num_tasks", "3"), ("train.epochs", "2"), ("train.milestones", "[]")]
    short += [("method.inversion.steps", "2"), ("method.name", name)]
    plain, _ = _run(name, True, *short)
    compiled, _ = _run(name, True, *short, ("engine.compile", "step"), ("engine.compile_backend", "eager"))
    compiles = [t.get("compiles") for t in compiled["timings"]]
    assert compiles[0] > 0 and compiles[1] > 0 and compiles[2] == 0, compiles
    assert all(t["compile_s"] > 0 for t in compiled["timings"][:2])
    assert compiled["correct_matrix"] == plain["correct_matrix"]
    assert len(graphs) >= 4 and refused == [], refused


@pytest.mark.slow
def test_static_head_run_interrupted_in_rrl_resumes_exactly(tmp_path) -> None:
    """Checkpoints hold the static head in the growing head's layout; a resumed run is the uninterrupted one."""
    from conftest import StopAfterEpochs
    from dfcil.checkpoint import loads
    from dfcil.errors import RunInterrupted
    from dfcil.runs.runner import resume, train
    from dfcil.training.state import Interrupt

    over = [("model.static_head", "true"), ("train.epochs", "3"), ("train.milestones", "[1]")]
    over += [("method.chr_epochs", "1"), ("epoch_checkpoint_interval_s", "0")]
    cfg = load_config(smoke_configs("rdfcil"), over)[0]
    whole = train(cfg, tmp_path / "whole", options=RunOptions(progress=False))
    interrupt = Interrupt()
    with pytest.raises(RunInterrupted):  # after task 0's 2 epochs and the first RRL epoch of task 1
        train(
            cfg,
            tmp_path / "split",
            options=RunOptions(progress=False, interrupt=interrupt, callbacks=[StopAfterEpochs(interrupt, 3)]),
        )
    split = resume(tmp_path / "split", options=RunOptions(progress=False))
    assert split["correct_matrix"] == whole["correct_matrix"]
    a, b = (loads((tmp_path / d / "model.pt").read_bytes())["net"] for d in ("whole", "split"))
    assert a.keys() == b.keys() and "head.blocks.1.weight" in a
    for k in a:
        assert torch.equal(a[k], b[k]), k
