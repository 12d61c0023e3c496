"""The static cosine head, and LwF and DPCR on a static head (``model.static_head``): the growing head's results within
rounding, a soft KD through the head's masks, and a step that ``engine.compile: step`` compiles once for every
later task."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from conftest import smoke_configs
from dfcil.compute.runtime import Runtime, StepCompiler
from dfcil.data.device import Normalizer, TrainBatches
from dfcil.load import load_config
from dfcil.losses.distillation import kd_soft_ce
from dfcil.methods import TaskContext, build_method
from dfcil.methods.base import loss_terms
from dfcil.models.heads import MASKED_LOGIT, CosineIncremental, StaticCosine
from dfcil.models.network import build_network
from dfcil.training.engine import run
from dfcil.training.loop import RunOptions

TINY = [("train.epochs", "2"), ("train.milestones", "[]"), ("data.num_classes", "6")]  # 2 tasks of 3 classes


def _heads(sizes=(3, 2), capacity=10):
    torch.manual_seed(0)
    grow = CosineIncremental(8)
    for n in sizes:
        grow.expand(n)
    torch.manual_seed(0)
    static = StaticCosine(8, capacity)
    for n in sizes:
        static.expand(n)
    return grow, static


def test_static_cosine_head_draws_the_same_weights_masks_the_rest_and_saves_the_growing_layout() -> None:
    grow, static = _heads()
    with torch.no_grad():
        grow.sigma.fill_(3.0), static.sigma.fill_(3.0)  # a learned scale away from 1: the logits carry it
    assert torch.equal(static.weight(), grow.weight())  # UCIR's uniform draws, in the growing head's order
    assert static.sizes == grow.sizes == [3, 2] and static.out_features == 10
    assert static.old_mask.tolist() == [True] * 3 + [False] * 7
    assert static.new_mask.tolist() == [False] * 3 + [True] * 2 + [False] * 5
    f = torch.randn(4, 8)
    logits = static(f)
    torch.testing.assert_close(logits[:, :5], grow(f), rtol=1e-6, atol=1e-6)  # σ·cos, |cos| ≤ 1
    assert (logits[:, 5:] == MASKED_LOGIT).all()
    assert torch.equal(torch.softmax(logits, 1)[:, 5:], torch.zeros(4, 5))
    state = static.state_dict()
    assert list(state) == list(grow.state_dict()) == ["sigma", "blocks.0.weight", "blocks.1.weight"]
    assert state["sigma"] == 3.0
    fresh = CosineIncremental(8)
    fresh.expand(3), fresh.expand(2)
    fresh.load_state_dict(state)  # the growing head loads the static one's checkpoint ...
    assert torch.equal(fresh.weight(), grow.weight()) and fresh.sigma == 3.0
    other = StaticCosine(8, 10)
    other.expand(3), other.expand(2)
    other.load_state_dict(grow.state_dict())  # ... and the other way round
    assert torch.equal(other.table, static.table) and other.sigma == 3.0
    with pytest.raises(RuntimeError, match="Unexpected key"):
        StaticCosine(8, 10).load_state_dict(grow.state_dict())  # no blocks yet: the saved ones are unexpected
    with pytest.raises(RuntimeError, match="Missing key.*sigma"):
        other.load_state_dict({k: v for k, v in state.items() if k != "sigma"})
    torch.manual_seed(4), grow.reset_parameters()
    torch.manual_seed(4), static.reset_parameters()
    assert torch.equal(static.weight(), grow.weight()) and (static.table[5:] == 0).all()
    static.truncate(3)
    assert static.sizes == [3] and static.mask.sum() == 3 and (static.table[3:] == 0).all()
    assert list(static.state_dict()) == ["sigma", "blocks.0.weight"]


def test_build_network_builds_a_static_head_of_the_growing_heads_kind() -> None:
    nets = []
    for capacity in (None, 10):
        torch.manual_seed(0)
        nets.append(build_network("resnet8", "cosine", capacity=capacity))
        nets[-1].expand(3)
    grow, static = nets
    assert isinstance(static.head, StaticCosine) and static.n_classes == 10
    assert grow.state_dict().keys() == static.state_dict().keys()  # checkpoints and model.pt: either layout
    assert all(torch.equal(v, static.state_dict()[k]) for k, v in grow.state_dict().items())
    with pytest.raises(ValueError, match="linear or cosine; the 'lsc' head grows by blocks"):
        build_network("resnet8", "lsc", capacity=10)


def test_static_cosine_unseen_rows_get_no_update_and_sigma_learns() -> None:
    _, static = _heads()
    opt = torch.optim.SGD(static.parameters(), lr=0.5, momentum=0.9, weight_decay=0.1)
    for _ in range(3):
        opt.zero_grad()
        F.cross_entropy(static(torch.randn(16, 8)), torch.randint(0, 5, (16,))).backward()
        grad = static.table.grad
        assert torch.isfinite(grad).all() and (grad[5:] == 0).all() and grad[:5].abs().sum() > 0
        assert static.sigma.grad != 0
        opt.step()
    assert (static.table[5:] == 0).all() and static.sigma != 1.0  # zero rows stay zero: cos 0, then masked


def test_masked_soft_kd_equals_the_sliced_one_and_the_hand_computation() -> None:
    """Old columns 0, 1 of a static head of 4, temperature 1: teacher (ln 3, 0) → target (3/4, 1/4); student
    (0, ln 3) → log-probabilities (ln 1/4, ln 3/4); L = −(3/4 · ln 1/4 + 1/4 · ln 3/4). The student's new column
    (5) and the teacher's column past the old ones (a wide teacher's 7) take no part, and get no gradient."""
    old = torch.tensor([True, True, False, False])
    s = torch.tensor([[0.0, math.log(3), 5.0, MASKED_LOGIT]], requires_grad=True)
    t = torch.tensor([[math.log(3), 0.0, 7.0, MASKED_LOGIT]])
    hand = -(0.75 * math.log(0.25) + 0.25 * math.log(0.75))
    masked = kd_soft_ce(s, t, 1.0, old)
    assert masked.item() == pytest.approx(hand, rel=1e-6)
    masked.backward()
    s_sliced = s.detach()[:, :2].clone().requires_grad_()
    sliced = kd_soft_ce(s_sliced, t[:, :2], 1.0)
    sliced.backward()
    assert kd_soft_ce(s.detach(), t[:, :2], 1.0, 2) == sliced  # old = n_old: the student's first columns
    torch.testing.assert_close(masked, sliced, rtol=1e-6, atol=0)
    torch.testing.assert_close(s.grad[:, :2], s_sliced.grad, rtol=1e-6, atol=1e-7)
    assert (s.grad[:, 2:] == 0).all()
    # a batch at temperature 2, the teacher as a truncated static head gives it: masked == sliced within rounding
    torch.manual_seed(1)
    s, t = torch.randn(6, 10), torch.randn(6, 10)
    t[:, 3:] = MASKED_LOGIT
    old = torch.arange(10) < 3
    torch.testing.assert_close(kd_soft_ce(s, t, 2.0, old), kd_soft_ce(s[:, :3], t[:, :3], 2.0), rtol=1e-6, atol=0)


def _task1(name: str, capacity: int | None, *extra: tuple[str, str]):
    """``name`` at the start of task 1 (4 + 4 classes): the teacher taken, then one step's terms and gradients."""
    cfg = load_config(smoke_configs(name), [("method.name", name), *extra])[0]
    method = build_method(cfg.method, cfg.train)
    torch.manual_seed(0)
    net = build_network("resnet8", method.head, capacity=capacity)
    net.expand(4)
    net.train()
    with torch.no_grad():  # BN statistics away from their initial values
        for _ in range(3):
            net(torch.randn(16, 3, 32, 32) + 0.5)
    net.expand(4)
    ctx = _context(net, task_id=1, n_old=4)
    method.on_task_start(ctx)
    torch.manual_seed(2)
    phase = method.phases(ctx)[0]
    terms = loss_terms(method, net, ctx, phase, torch.randn(8, 3, 32, 32), torch.randint(4, 8, (8,)), None)
    sum(terms.values()).backward()
    grads = {k: p.grad for k, p in net.named_parameters() if p.grad is not None}
    head = grads.pop("head.table", None)
    if head is not None:  # the static head's gradient: the seen rows as the growing head's blocks, zero after
        assert (head[8:] == 0).all()
        grads |= {"head.blocks.0.weight": head[:4], "head.blocks.1.weight": head[4:8]}
    return terms, grads


def _context(net, task_id: int, n_old: int, n_new: int = 4) -> TaskContext:
    x = torch.zeros(8, 32, 32, 3, dtype=torch.uint8)
    data = TrainBatches(x, x.new_zeros(8, dtype=torch.long), 8, Normalizer((0.5,) * 3, (0.25,) * 3, x.device), None)
    rng = torch.Generator().manual_seed(5)
    return TaskContext(
        task_id=task_id, n_old=n_old, n_new=n_new, num_tasks=3, net=net, data=data, rng=rng, runtime=Runtime()
    )


@pytest.mark.parametrize(
    ("name", "extra"),
    [("dpcr", ()), ("lwf", ()), ("lwf", (("method.head", "cosine"), ("method.ce", "local")))],
    ids=["dpcr", "lwf", "lwf-cosine-local"],
)
def test_static_head_step_equals_growing_head_step_within_rounding(name: str, extra) -> None:
    """DPCR (cosine head, local CE), ABD's LwF (linear head, CE over the seen classes) and LDC's LwF: from the same
    state, the same loss terms and gradients within float32 rounding (a wider matrix product may sum in another
    order: within 1e-6 of each tensor's largest value)."""
    (grow_terms, grow_grads), (static_terms, static_grads) = _task1(name, None, *extra), _task1(name, 12, *extra)
    assert grow_terms.keys() == static_terms.keys() == {"ce", "kd"}
    assert grow_grads.keys() == static_grads.keys()
    for a, b in ((grow_terms, static_terms), (grow_grads, static_grads)):
        for k in a:
            scale = float(a[k].detach().abs().max())
            torch.testing.assert_close(b[k], a[k], rtol=1e-5, atol=1e-6 * max(scale, 1.0), msg=k)


def test_dpcr_step_compiles_once_for_every_later_task() -> None:
    """DPCR's step through ``engine.compile: step``'s compiler (dynamo, eager backend): task 1's step compiles,
    task 2's (another teacher, more old classes, another new block) finds it, and both give the eager step's
    terms. What changes between tasks reaches the step as the head's masks, never as a Python number."""
    torch._dynamo.reset()
    cfg = load_config(smoke_configs("dpcr"), [("method.name", "dpcr")])[0]
    method, compiler = build_method(cfg.method, cfg.train), StepCompiler("eager")
    step = compiler(loss_terms)
    torch.manual_seed(0)
    net = build_network("resnet8", "cosine", capacity=12)
    net.expand(4)
    compiles = []
    for task in (1, 2):
        net.expand(4)
        ctx = _context(net, task_id=task, n_old=4 * task)
        method.on_task_start(ctx)
        phase = method.phases(ctx)[0]
        x, y = torch.randn(8, 3, 32, 32), torch.randint(4 * task, 4 * task + 4, (8,))
        before = compiler.compiles
        compiled = step(method, net, ctx, phase, x, y, None)
        compiles.append(compiler.compiles - before)
        eager = loss_terms(method, net, ctx, phase, x, y, None)
        assert compiled.keys() == eager.keys() == {"ce", "kd"}
        for k in eager:
            torch.testing.assert_close(compiled[k], eager[k], rtol=1e-6, atol=1e-7, msg=k)
    assert compiles[0] > 0 and compiles[1] == 0, compiles


def _run(name: str, *extra: tuple[str, str]):
    cfg = load_config(smoke_configs(name), [("method.name", name), *extra])[0]
    return run(cfg, options=RunOptions(progress=False))


@pytest.fixture(scope="module")
def dpcr_static_run(tmp_path_factory):
    """DPCR's tiny smoke run on a static head, trained into a run directory (for ``dfcil eval``)."""
    from dfcil.runs.runner import train

    cfg = load_config(smoke_configs("dpcr"), [("method.name", "dpcr"), *TINY, ("model.static_head", "true")])[0]
    out = tmp_path_factory.mktemp("dpcr") / "run"
    return train(cfg, out, options=RunOptions(progress=False)), out


def test_dpcr_static_head_run_equals_growing_head_run_and_dfcil_eval_agrees(dpcr_static_run) -> None:
    """The same accuracy matrix as the growing head's run; ``dfcil eval`` of the finished run (the ridge head's
    scores from model.pt) gives the run's last row."""
    from dfcil.analysis.tools import evaluate_run

    static, out = dpcr_static_run
    grow = _run("dpcr", *TINY)
    assert grow["correct_matrix"] == static["correct_matrix"]
    np.testing.assert_allclose(grow["avg_inc_acc"], static["avg_inc_acc"])
    report = evaluate_run(out)
    assert [t["correct"] for t in report["tasks"]] == static["correct_matrix"][-1]


def test_dpcr_static_head_keeps_its_graph_promise(dpcr_static_run) -> None:
    """``engine.cuda_graphs: check`` records and compares every step of DPCR on a static head: the eager run's
    results (tests/test_graphs.py runs it on the growing head)."""
    static, _ = dpcr_static_run
    checked = _run("dpcr", *TINY, ("model.static_head", "true"), ("engine.cuda_graphs", "check"))
    assert checked["accuracy_matrix"] == static["accuracy_matrix"]
    phases = [p for t in checked["timings"] for p in t["phases"].values()]
    assert phases and all(p["cuda_graphs"] == "check" and p["captures"] >= 1 for p in phases)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["dpcr", "lwf", "lwf_mc"])
def test_compile_step_compiles_once_per_phase_kind_and_keeps_the_results(name: str, monkeypatch) -> None:
    """Three tasks of the smoke preset with ``engine.compile: step`` (dynamo, eager backend): task 0 compiles the
    first task's step (no teacher), task 1 the step with the teacher, task 2 nothing; the compiled run's results
    are the uncompiled one's, and every graph is one AOTAutograd's disk cache accepts (as R-DFCIL's,
    tests/test_static_head.py)."""
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
    short = [("model.static_head", "true"), ("data.num_tasks", "3"), ("train.epochs", "2"), ("train.milestones", "[]")]
    plain = _run(name, *short)
    compiled = _run(name, *short, ("engine.compile", "step"), ("engine.compile_backend", "eager"))
    compiles = [t.get("compiles") for t in compiled["timings"]]
    assert compiles[0] > 0 and compiles[1] > 0 and compiles[2] == 0, compiles
    assert compiled["correct_matrix"] == plain["correct_matrix"]
    assert len(graphs) >= 2 and refused == [], refused


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "extra"),
    [("dpcr", ()), ("lwf", ()), ("lwf", (("method.head", "cosine"), ("method.ce", "local")))],
    ids=["dpcr", "lwf", "lwf-cosine-local"],
)
def test_static_head_smoke_run_equals_growing_head_run(name: str, extra) -> None:
    """The whole smoke preset (10 classes, 3 epochs) with each head: the same accuracy matrix."""
    grow, static = _run(name, *extra), _run(name, *extra, ("model.static_head", "true"))
    assert grow["correct_matrix"] == static["correct_matrix"]
    np.testing.assert_allclose(grow["avg_inc_acc"], static["avg_inc_acc"])


@pytest.mark.slow
def test_dpcr_static_head_run_interrupted_in_task_1_resumes_exactly(tmp_path) -> None:
    """The teacher (a truncated static head, saved in the growing layout) and the ridge head's statistics come back
    from the checkpoint: the resumed run is the uninterrupted one, weights and σ bit for bit."""
    from conftest import StopAfterEpochs
    from dfcil.checkpoint import loads
    from dfcil.errors import RunInterrupted
    from dfcil.runs.runner import resume, train
    from dfcil.training.state import Interrupt

    over = [("method.name", "dpcr"), *TINY, ("model.static_head", "true"), ("epoch_checkpoint_interval_s", "0")]
    cfg = load_config(smoke_configs("dpcr"), over)[0]
    whole = train(cfg, tmp_path / "whole", options=RunOptions(progress=False))
    interrupt = Interrupt()
    with pytest.raises(RunInterrupted):  # after task 0's 2 epochs and the first epoch of task 1
        options = RunOptions(progress=False, interrupt=interrupt, callbacks=[StopAfterEpochs(interrupt, 3)])
        train(cfg, tmp_path / "split", options=options)
    split = resume(tmp_path / "split", options=RunOptions(progress=False))
    assert split["correct_matrix"] == whole["correct_matrix"]
    a, b = (loads((tmp_path / d / "model.pt").read_bytes())["net"] for d in ("whole", "split"))
    assert a.keys() == b.keys() and {"head.sigma", "head.blocks.1.weight"} <= a.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
