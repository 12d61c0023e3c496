"""Every registered method, through the engine: a 2-task run finishes with finite, named loss terms."""

import copy
import dataclasses
import json
import math

import pytest
import torch

from conftest import StopAfterEpochs, smoke_configs
from dfcil.data.device import Normalizer, TrainBatches
from dfcil.errors import NonFiniteLossError
from dfcil.load import load_config
from dfcil.methods import METHODS, Batch, Method, Phase, Task, TaskContext, build_method
from dfcil.models.network import build_network
from dfcil.training.callbacks import Callback
from dfcil.training.engine import Loop, fit_task, run
from dfcil.training.loop import RunOptions
from dfcil.training.state import Position, RunState

TINY = [("train.epochs", "2"), ("train.milestones", "[]"), ("data.num_classes", "6")]  # R-DFCIL: 1 + 1 CHR epoch


class Records(Callback):
    def __init__(self):
        self.epochs, self.tasks, self.starts = [], [], []

    def on_task_start(self, info):
        self.starts.append(info)

    def on_epoch_end(self, record):
        self.epochs.append(record)

    def on_task_end(self, record):
        self.tasks.append(record)


def tiny_config(name, extra=()):
    """The method's smoke preset, shortened to 2 epochs and 6 classes."""
    cfg, _ = load_config(smoke_configs(name), [("method.name", name), *TINY, *extra])
    return cfg


@pytest.mark.parametrize("name", METHODS.names())
def test_two_task_run_of_every_method(name, tmp_path):
    from dfcil.cli import main

    args = ["train", *(f"--config={c}" for c in smoke_configs(name)), "--out", str(tmp_path / "run"), "--no-progress"]
    overrides = [("method.name", name), *TINY]
    assert main(args + [f"--{k}={v}" for k, v in overrides]) == 0  # through the command line
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert len(summary["acc_per_task"]) == 2 and summary["last_acc"] == summary["acc_per_task"][1]
    assert summary["stores"] == METHODS.get(name).info.stores  # what it kept between tasks, for the report
    cfg = tiny_config(name)  # the method keys the smoke preset sets away from the method's defaults, for the report

    def leaves(tree, prefix=""):
        for k, v in tree.items():
            yield from leaves(v, f"{prefix}{k}.") if isinstance(v, dict) else [(f"{prefix}{k}", v)]

    default = dict(leaves(dataclasses.asdict(type(cfg.method)())))
    assert summary["method_changed"] == sorted(k for k, v in leaves(dataclasses.asdict(cfg.method)) if default[k] != v)
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    epochs = [r for r in records if r["type"] == "epoch"]
    assert epochs and all(r["loss"] for r in epochs)  # named terms every epoch
    assert all(math.isfinite(v) for r in epochs for v in r["loss"].values())
    # joint may skip training with last_only; FeCAM trains the first task only
    assert any(r["task"] == 1 for r in epochs) or name == "joint" or not trains_after_task0(name)
    assert [r["task"] for r in records if r["type"] == "task"] == [0, 1]


def test_lr_schedule_follows_phase_milestones():
    rec = Records()
    run(
        tiny_config("finetune", [("train.epochs", "4"), ("train.milestones", "[1, 3]")]),
        options=RunOptions(callbacks=[rec]),
    )
    assert [r["lr"] for r in rec.epochs if r["task"] == 0] == pytest.approx([0.1, 0.01, 0.01, 0.001])


def test_a_run_gives_the_process_its_random_streams_and_cudnn_switch_back():
    import random

    import numpy as np

    def draws():
        return random.random(), float(np.random.rand()), torch.rand(3)

    random.seed(7), np.random.seed(7), torch.manual_seed(7)
    expected = draws()
    random.seed(7), np.random.seed(7), torch.manual_seed(7)
    benchmark = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = not benchmark  # a run on CUDA sets it from engine.cudnn_benchmark
    try:
        first = run(
            tiny_config("rdfcil"), options=RunOptions(progress=False)
        )  # seeds every global stream with cfg.seed
        assert torch.backends.cudnn.benchmark is (not benchmark)
    finally:
        torch.backends.cudnn.benchmark = benchmark
    got = draws()
    assert got[:2] == expected[:2] and torch.equal(got[2], expected[2])
    second = run(
        tiny_config("rdfcil"), options=RunOptions(progress=False)
    )  # and a second run in the process is the same run
    assert second["accuracy_matrix"] == first["accuracy_matrix"]


def _task1_setup(extra=(), name="rdfcil", n=24, old=3, new=3):
    cfg = tiny_config(name, extra)
    method = build_method(cfg.method, cfg.train)
    torch.manual_seed(0)
    net = build_network("resnet8", method.head)
    net.expand(old)
    net.train()
    with torch.no_grad():
        for _ in range(3):
            net(torch.randn(16, 3, 32, 32))
    net.expand(new)
    x = torch.randint(0, 256, (n, 32, 32, 3), dtype=torch.uint8)
    y = torch.randint(old, old + new, (n,))
    batches = TrainBatches(x, y, 8, Normalizer((0.5,) * 3, (0.25,) * 3, torch.device("cpu")), torch.Generator())
    ctx = TaskContext(
        task_id=1, n_old=old, n_new=new, num_tasks=2, net=net, data=batches, rng=torch.Generator().manual_seed(0)
    )
    method.on_task_start(ctx)
    method.synthesize(ctx, lambda: None)
    return cfg, method, net, ctx, batches


def fit_phases(cfg, method, ctx, phases, position=None):
    """``fit_task`` on its own: the phases of task 1 from their start (or from ``position``), no callbacks."""
    loop = Loop(net=ctx.net, method=method, state=RunState.new(2, cfg.seed, ctx.device))
    loop.state.position = position or Position(1, "train")
    fit_task(loop, ctx, phases)


def test_rdfcil_terms_per_phase_and_switches():
    cfg, method, net, ctx, batches = _task1_setup()
    x, y = next(iter(batches))
    rrl = method.training_step(net, Batch(x, y), ctx, Phase("rrl", 1, 0.1))
    chr_ = method.training_step(net, Batch(x, y), ctx, Phase("chr", 1, 0.005, trainable="head"))
    assert set(rrl) == {"lce", "hkd", "rkd"} and set(chr_) == {"gce", "hkd"}
    assert method.weights.lce == pytest.approx(0.5 * (1 + 1 / math.log2(2.5)))
    assert method.class_counts.sum().item() == 2 * 2 * len(x)  # real + pseudo labels, both steps counted
    assert method.class_counts[3:].sum().item() == 2 * len(x) and method.class_counts[:3].sum().item() == 2 * len(x)
    _, m2, net2, ctx2, _ = _task1_setup([("method.chr_hkd", "false")])
    assert set(m2.training_step(net2, Batch(x, y), ctx2, Phase("chr", 1, 0.005, trainable="head"))) == {"gce"}


def test_chr_trains_the_head_only_and_keeps_bn_statistics():
    cfg, method, net, ctx, batches = _task1_setup()
    backbone = copy.deepcopy(net.backbone.state_dict())
    head = copy.deepcopy(net.head.state_dict())
    fit_phases(cfg, method, ctx, [Phase("chr", 2, 0.005, trainable="head")])
    for k, v in net.backbone.state_dict().items():
        assert torch.equal(v, backbone[k]), k  # weights and BN running statistics untouched
    assert any(not torch.equal(v, head[k]) for k, v in net.head.state_dict().items())
    counts = method.class_counts
    torch.testing.assert_close(
        method.class_weights, (counts.sum() / counts.clamp(min=1)) / (counts.sum() / counts.max())
    )


def test_rrl_updates_backbone_old_heads_and_projectors():
    cfg, method, net, ctx, batches = _task1_setup()
    before = copy.deepcopy(net.state_dict())
    proj = copy.deepcopy(method.projector.state_dict())
    fit_phases(cfg, method, ctx, [Phase("rrl", 1, 0.1)])
    after = net.state_dict()
    assert not torch.equal(after["head.blocks.0.weight"], before["head.blocks.0.weight"])  # old head moves (HKD, wd)
    assert not torch.equal(after["backbone.conv_1.weight"], before["backbone.conv_1.weight"])
    assert not torch.equal(method.projector.teacher.weight, proj["teacher.weight"])  # ψ/φ both train
    teacher = method.replay.teacher.state_dict()
    assert all(torch.equal(teacher[k], before[k]) for k in teacher)  # the teacher is a frozen snapshot


def test_podnet_df_finetuning_trains_every_proxy_but_not_eta_with_a_fresh_optimiser():
    cfg, method, net, ctx, batches = _task1_setup(name="podnet_df", n=48)
    old_norm = net.head.weight()[: 3 * net.head.rows_per_class].norm(dim=1).mean()
    new_norms = net.head.blocks[-1].weight.norm(dim=1)  # imprinted: centres of unit vectors × the old mean norm
    assert (new_norms <= old_norm * (1 + 1e-6)).all() and not torch.allclose(new_norms, old_norm.expand_as(new_norms))
    main, ft = method.phases(ctx)
    assert (ft.name, ft.trainable, ft.reset_optimizer, ft.lr) == ("ft", "head", True, 0.05)
    eta = net.head.eta.detach().clone()
    fit_phases(cfg, method, ctx, [main])
    assert net.head.eta.item() != eta.item()  # η learns in the main phase
    before = copy.deepcopy(net.state_dict())
    fit_phases(cfg, method, ctx, [ft])
    after = net.state_dict()
    assert torch.equal(after["head.eta"], before["head.eta"])
    for i in range(2):
        assert not torch.equal(after[f"head.blocks.{i}.weight"], before[f"head.blocks.{i}.weight"])  # old ones too
    assert all(torch.equal(after[k], before[k]) for k in before if k.startswith("backbone."))


def test_a_phase_that_resets_the_optimiser_starts_without_momentum():
    def fit(*groups):
        cfg, method, net, ctx, batches = _task1_setup(name="finetune")
        for phases in groups:  # each fit_task call builds its own optimiser
            fit_phases(cfg, method, ctx, phases)
        return net.state_dict()

    a, b = Phase("a", 1, 0.1), Phase("b", 1, 0.05)
    reset = dataclasses.replace(b, reset_optimizer=True)
    separate = fit([a], [b])
    assert all(torch.equal(v, separate[k]) for k, v in fit([a, reset]).items())
    carried = fit([a, b])
    assert any(not torch.equal(v, separate[k]) for k, v in carried.items())  # momentum carried over


class _NaNAtStep2(Method):
    """Not registered: a method whose second loss term turns NaN at step 2."""

    name = "nan_at_step_2"

    def __init__(self):
        self.step = 0

    def training_step(self, net, batch, ctx, phase):
        self.step += 1
        bad = torch.tensor(float("nan") if self.step == 3 else 0.0)
        return {"ce": torch.nn.functional.cross_entropy(net(batch.x).logits, batch.y), "broken": bad}


def test_non_finite_losses_are_named():
    cfg, _, net, ctx, batches = _task1_setup()
    epoch_4 = Position(1, "train", 0, 4)  # 3 steps per epoch; the phase continues at its fifth epoch
    with pytest.raises(NonFiniteLossError, match=r"'broken' became non-finite in task 1, phase rrl, epoch 4, step 2"):
        fit_phases(cfg, _NaNAtStep2(), ctx, [Phase("rrl", 5, 0.1)], epoch_4)


@pytest.mark.parametrize("name", METHODS.names())
def test_every_method_resumes_exactly_inside_an_incremental_task(name, tmp_path):
    from dfcil.checkpoint import loads
    from dfcil.errors import RunInterrupted
    from dfcil.runs.runner import resume, train
    from dfcil.training.state import Interrupt

    cfg = tiny_config(name, [("method.inversion.zdim", "32")] if "inversion" in _fields(name) else [])
    train(cfg, tmp_path / "a", options=RunOptions(progress=False))
    interrupt = Interrupt()
    # stop after the first epoch of task 1: task 0 has 2 epochs, or 1 where the last epoch of a task belongs to a
    # head-only phase (CHR, PODNet's finetuning), which task 0 does not run; resuming then starts that phase. A
    # method that does not train task 1 (FeCAM) stops after task 0: task 1 starts from the method's saved state
    task0 = Task(task_id=0, n_old=0, n_new=3, num_tasks=2)
    trains = trains_after_task0(name)
    epochs0 = sum(p.epochs for p in build_method(cfg.method, cfg.train).phases(task0))
    stop = StopAfterEpochs(interrupt, epochs0 + 1) if trains else StopAfterTask0(interrupt)
    with pytest.raises(RunInterrupted):
        train(cfg, tmp_path / "b", options=RunOptions(progress=False, interrupt=interrupt, callbacks=[stop]))
    position = loads((tmp_path / "b" / "checkpoints" / "last.pt").read_bytes())["position"]
    if trains:
        assert position["task"] == 1 and position["stage"] == "train" and position["epoch"] + position["phase"] == 1
    else:
        assert position["task"] == 1 and position["stage"] == "start"
    resume(tmp_path / "b", options=RunOptions(progress=False))
    a, b = (json.loads((tmp_path / d / "summary.json").read_text()) for d in "ab")
    assert a["correct_matrix"] == b["correct_matrix"]
    wa, wb = (loads((tmp_path / d / "model.pt").read_bytes())["net"] for d in "ab")
    assert all(torch.equal(wa[k], wb[k]) for k in wa), name


def trains_after_task0(name):
    """Whether the method has epochs to train in the second task of a run."""
    cfg = tiny_config(name)
    task1 = Task(task_id=1, n_old=3, n_new=3, num_tasks=2)
    return sum(p.epochs for p in build_method(cfg.method, cfg.train).phases(task1)) > 0


class StopAfterTask0(Callback):
    """Ask a run to stop (as Ctrl-C would) once task 0 has ended and been checkpointed."""

    def __init__(self, interrupt):
        self.interrupt = interrupt

    def on_task_end(self, record):
        self.interrupt.requested = self.interrupt.requested or record["task"] == 0


def _fields(name):
    import dataclasses

    return {f.name for f in dataclasses.fields(METHODS.get(name).Config)}


def test_student_pass_mixes_or_separates_the_bn_statistics_of_real_and_synthetic_images():
    from dfcil.synthesis.replay import student_pass

    torch.manual_seed(0)
    net = build_network("resnet8")
    net.expand(4)
    net.train()
    real, syn = torch.randn(6, 3, 32, 32), torch.randn(6, 3, 32, 32) * 2 + 1

    def run_(fn):
        n = copy.deepcopy(net)
        out = fn(n)
        return out, {k: v for k, v in n.state_dict().items() if "running" in k}

    mixed, mixed_stats = run_(lambda n: student_pass(n, real, syn, "mixed"))
    one, one_stats = run_(lambda n: n(torch.cat([real, syn])))
    assert torch.equal(mixed.logits, one.logits) and all(torch.equal(v, one_stats[k]) for k, v in mixed_stats.items())

    def two(n):
        a, b = n(real), n(syn)
        return torch.cat([a.logits, b.logits]), torch.cat([a.features, b.features])

    (logits, features), two_stats = run_(two)
    for merge in (False, True):
        out, stats = run_(lambda n, m=merge: student_pass(n, real, syn, "separate", m, fmaps=True))
        torch.testing.assert_close(out.logits, logits)
        torch.testing.assert_close(out.features, features)
        assert len(out.fmaps) == len(one.fmaps) and out.fmaps[0].shape[0] == 12
        for k, v in stats.items():
            torch.testing.assert_close(v, two_stats[k])
    assert not torch.allclose(mixed.logits, logits)  # the choice matters
    unequal, _ = run_(lambda n: student_pass(n, real, syn[:2], "separate", True))  # parts of unequal size
    assert unequal.logits.shape[0] == 8 and unequal.fmaps == ()
    torch.testing.assert_close(unequal.logits[:6], logits[:6])


def test_synthetic_images_per_step():
    from dfcil.synthesis.replay import synthetic_count

    assert synthetic_count(0, 50, 128, 39) == 128  # 1:1 with the real batch
    assert synthetic_count(20, 50, 128, 39) == 26  # 20 per old class per epoch: ceil(1000 / 39)
    assert synthetic_count(20, 90, 128, 39) == 47  # grows with the old classes
    assert synthetic_count(1, 2, 128, 100) == 1  # at least one


@pytest.mark.parametrize("name", ["abd", "deepinversion", "ucir_df", "podnet_df", "dgr"])
def test_replay_baselines_take_separate_bn_statistics_and_a_synthetic_dose(name):
    extra = [("method.replay_bn", "separate")]
    if name in ("ucir_df", "podnet_df"):
        extra.append(("method.synthetic_per_class", "2"))  # 2 × 3 old classes over 3 steps: 2 per step
    cfg, method, net, ctx, batches = _task1_setup(extra, name=name)
    x, y = next(iter(batches))
    drawn = []
    if name != "dgr":  # DGR replays from its VAE, not from a generator
        x_syn = torch.randn(len(x), 3, 32, 32, generator=torch.Generator().manual_seed(3))
        method.replay.generate = lambda n: drawn.append(n) or x_syn[:n]
    apart = copy.deepcopy(net)
    terms = method.training_step(net, Batch(x, y), ctx, method.phases(ctx)[0])
    assert terms and all(torch.isfinite(v) for v in terms.values())
    if name in ("ucir_df", "podnet_df"):
        assert drawn == [2]
    elif name != "dgr":
        assert drawn == [len(x)]
    if name == "deepinversion":  # one student pass: its BN statistics are those of two separate passes
        apart(x), apart(x_syn)
        for (k, v), w in zip(net.state_dict().items(), apart.state_dict().values(), strict=True):
            if "running" in k:
                torch.testing.assert_close(v, w, msg=k)
    if name == "podnet_df":
        assert method.class_counts.sum().item() == len(x) + 2  # real images + 2 pseudo-labelled synthetic ones


def test_a_parameter_unfrozen_under_a_kept_optimiser_gets_a_zero_momentum_buffer():
    """The fused SGD kernel refuses a mix of momentum buffers and missing ones; a zero buffer gives exactly the
    first step eager SGD would take."""
    from dfcil.compute.optim import fill_momentum

    def train(fused):
        torch.manual_seed(0)
        a, b = torch.nn.Linear(3, 3), torch.nn.Linear(3, 1)
        opt = torch.optim.SGD([*a.parameters(), *b.parameters()], lr=0.1, momentum=0.9, weight_decay=5e-4, **fused)
        b.requires_grad_(False)  # phase 1: b frozen
        x = torch.randn(4, 3)
        for frozen_b in (True, False):
            b.requires_grad_(not frozen_b)
            if fused:
                fill_momentum(opt)
            for _ in range(2):
                opt.zero_grad()
                b(a(x)).square().sum().backward()
                opt.step()
        return [p.detach() for p in (*a.parameters(), *b.parameters())]

    for got, want in zip(train({"fused": True}), train({}), strict=True):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("stop", [4, pytest.param(5, marks=pytest.mark.slow)])  # end of task 1; task 2's 1st epoch
def test_abds_persistent_generator_carries_over_tasks_and_resumes_exactly(stop, tmp_path):
    """ABD keeps one generator and its Adam state for the run: task 2 warm-starts from task 1's; a resume at the
    task boundary (the carried state) or inside task 2 (its static state) continues exactly."""
    from dfcil.checkpoint import Checkpointer, loads
    from dfcil.errors import RunInterrupted
    from dfcil.runs.runner import resume, train
    from dfcil.training.state import Interrupt

    extra = [("data.num_tasks", "3"), ("method.inversion.zdim", "32"), ("method.inversion.persistent", "true")]
    cfg = tiny_config("abd", extra)
    assert cfg.method.inversion.persistent
    train(cfg, tmp_path / "a", options=RunOptions(progress=False))
    interrupt = Interrupt()
    with pytest.raises(RunInterrupted):
        train(
            cfg,
            tmp_path / "b",
            options=RunOptions(progress=False, interrupt=interrupt, callbacks=[StopAfterEpochs(interrupt, stop)]),
        )
    payload = Checkpointer(tmp_path / "b").load_latest()
    assert payload["position"]["task"] == stop - 3
    if stop == 4:  # the end of task 1: its trained generator and Adam state travel for task 2's warm start
        assert {"generator", "optimizer"} <= set(payload["static_state"]["replay"])
    resume(tmp_path / "b", options=RunOptions(progress=False))
    a, b = (json.loads((tmp_path / d / "summary.json").read_text()) for d in "ab")
    assert len(a["acc_per_task"]) == 3 and a["correct_matrix"] == b["correct_matrix"]
    wa, wb = (loads((tmp_path / d / "model.pt").read_bytes())["net"] for d in "ab")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_rdfcil_rrl_and_chr_terms_are_the_papers_weighted_losses():
    """Each term against its definition on separately computed outputs (reference: separate real and synthetic
    passes), with the adaptive weights written out for 3 old and 3 new classes: α = log2(3/2 + 1), β = 1."""
    import torch.nn.functional as F

    from dfcil.losses.distillation import rkd_angle

    cfg, method, net, ctx, batches = _task1_setup()
    x, y = next(iter(batches))
    x_syn = torch.randn(len(x), 3, 32, 32, generator=torch.Generator().manual_seed(3))
    method.replay.generate = lambda n: x_syn[:n]
    teacher, b = method.replay.teacher, len(x)
    with torch.no_grad():
        t_real, t_syn = teacher(x), teacher(x_syn)
    w_lce, w_hkd, w_rkd = method.weights.lce, method.weights.hkd, method.weights.rkd
    assert (w_lce, w_hkd, w_rkd) == pytest.approx((0.878235, 0.198289, 0.660964), abs=1e-6)

    student = copy.deepcopy(net)
    real, syn = student(x), student(x_syn)
    rrl = method.training_step(net, Batch(x, y), ctx, Phase("rrl", 1, 0.1))
    want = {
        "lce": w_lce * F.cross_entropy(real.logits[:, 3:], y - 3),  # new classes' logits of real data
        "hkd": w_hkd * (syn.logits[:, :3] - t_syn.logits).abs().mean(),  # old logits of synthetic data
        "rkd": w_rkd * rkd_angle(*method.projector(real.features, t_real.features)),  # real data, projected
    }
    assert set(rrl) == set(want)
    for k in want:
        torch.testing.assert_close(rrl[k], want[k], msg=k)

    net.backbone.eval()  # CHR: backbone frozen in eval mode, as the engine sets it
    method.class_weights.copy_(torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0]))
    chr_ = method.training_step(net, Batch(x, y), ctx, Phase("chr", 1, 0.005, trainable="head"))
    logits = net(torch.cat([x, x_syn])).logits.detach()
    labels = torch.cat([y, t_syn.logits.argmax(dim=1)])
    w = method.class_weights[labels]
    ce = F.cross_entropy(logits, labels, reduction="none")
    want = {
        "gce": 0.5 * (w * ce).sum() / w.sum(),  # λ_ce · CE weighted per class, normalised by the targets' weights
        "hkd": w_hkd * (logits[b:, :3] - t_syn.logits).abs().mean(),  # HKD stays on in CHR (the code)
    }
    assert set(chr_) == set(want)
    for k in want:
        torch.testing.assert_close(chr_[k].detach(), want[k], msg=k)


# one step of each replay baseline with 2 old and 4 new classes: r = n_old / n_seen = 1/3
def _abd_terms(out, t, y, labels, teacher, net):
    import torch.nn.functional as F

    w = torch.where(labels < 2, 1 / 3, 2 / 3)  # old-label samples weigh r, new-label ones 1 − r
    b = len(y)
    head_ce = F.cross_entropy(net.head(out.features.detach()), labels, reduction="none") * w
    kd = ((out.features - t.features) @ teacher.head.weight().T).pow(2).sum(1).mean() / 2  # through the old head
    return {
        "local_ce": (F.cross_entropy(out.logits[:b, 2:], y - 2, reduction="none") * w[:b]).mean(),
        "head_ce": head_ce.mean(),
        "kd": 0.1 * kd,
    }


def _ucir_terms(out, t, y, labels, teacher, net):
    import torch.nn.functional as F

    from dfcil.losses.ucir import margin_ranking

    cosine = net.head.cosine(out.features)
    return {
        "ce": F.cross_entropy(out.logits, labels),
        "less_forget": 5.0 * math.sqrt(2 / 4) * (1 - F.cosine_similarity(out.features, t.features)).mean(),
        "margin": margin_ranking(cosine, labels, 2, 2, 0.5),
    }


def _podnet_terms(out, t, y, labels, teacher, net):
    from dfcil.losses.podnet import nca, pod_flat, pod_spatial

    factor = math.sqrt(6 / 4)  # √(n_seen / n_new)
    return {
        "nca": nca(out.logits, labels),
        "pod_spatial": 3.0 * factor * pod_spatial(out.fmaps, t.fmaps),
        "pod_flat": 1.0 * factor * pod_flat(out.features, t.features),
    }


def _soft_ce(student, target_probs, temperature=2.0):
    """−Σ p · log softmax(s / T), batch mean, no T² (ABD's KD), written out."""
    return -(target_probs * torch.log_softmax(student / temperature, dim=1)).sum(dim=1).mean()


def _deepinversion_terms(out, t, y, labels, teacher, net):
    import torch.nn.functional as F

    b, old = len(y), torch.softmax(t.logits / 2.0, dim=1)
    padded = torch.cat([old[b:], torch.zeros(len(old) - b, 4)], dim=1)  # zero targets for the 4 new classes
    return {
        "ce": F.cross_entropy(out.logits[:b], y),  # real data only
        "kd_real": _soft_ce(out.logits[:b, :2], old[:b]),  # old classes on real data
        "kd_syn": _soft_ce(out.logits[b:], padded),  # every seen class on synthetic data
    }


@pytest.mark.parametrize(
    ("name", "terms"),
    [
        ("abd", _abd_terms),
        ("deepinversion", _deepinversion_terms),
        ("ucir_df", _ucir_terms),
        ("podnet_df", _podnet_terms),
    ],
)
def test_replay_baselines_terms_are_their_weighted_losses(name, terms):
    """One step's terms against the spec's weights on outputs computed apart (one mixed real + synthetic batch)."""
    cfg, method, net, ctx, batches = _task1_setup(name=name, n=48 if name == "podnet_df" else 24, old=2, new=4)
    x, y = next(iter(batches))
    x_syn = torch.randn(len(x), 3, 32, 32, generator=torch.Generator().manual_seed(3))
    method.replay.generate = lambda n: x_syn[:n]
    teacher = method.replay.teacher
    with torch.no_grad():
        t = teacher(torch.cat([x, x_syn]))
    labels = torch.cat([y, t.logits[len(x) :].argmax(dim=1)])
    student = copy.deepcopy(net)
    assert {int(v) for v in labels[: len(x)]} <= {2, 3, 4, 5} and (labels[len(x) :] < 2).all()
    want = terms(student(torch.cat([x, x_syn])), t, y, labels, teacher, student)
    got = method.training_step(net, Batch(x, y), ctx, method.phases(ctx)[0])
    assert set(got) == set(want)
    for k in want:
        torch.testing.assert_close(got[k], want[k], msg=k)


@pytest.mark.parametrize(
    ("switch", "rrl_terms", "chr_terms", "projected"),
    [
        ([("method.new_kd", "none")], {"lce", "hkd"}, {"gce", "hkd"}, False),
        ([("method.old_kd", "none")], {"lce", "rkd"}, {"gce"}, True),
        ([("method.new_kd", "hkd")], {"lce", "hkd", "hkd_new"}, {"gce", "hkd"}, False),  # HKD on new data stops at CHR
        ([("method.old_kd", "rkd")], {"lce", "rkd_syn", "rkd"}, {"gce"}, True),  # both RKD terms: one projector pair
        ([("method.projection", "identity")], {"lce", "hkd", "rkd"}, {"gce", "hkd"}, False),
    ],
)
def test_rdfcil_ablation_switches_change_the_terms(switch, rrl_terms, chr_terms, projected):
    cfg, method, net, ctx, batches = _task1_setup(switch)
    x, y = next(iter(batches))
    terms = method.training_step(net, Batch(x, y), ctx, Phase("rrl", 1, 0.1))
    assert set(terms) == rrl_terms and all(torch.isfinite(v) for v in terms.values())
    assert (method.projector is not None) is projected
    assert len(method.extra_modules(ctx)) == int(projected)
    if ("method.new_kd", "hkd") in switch:  # HKD on new data: real images' old logits against the teacher's
        with torch.no_grad():
            t = method.replay.teacher(x).logits
        assert terms["hkd_new"].item() > 0 and t.shape[1] == 3
    chr_step = method.training_step(net, Batch(x, y), ctx, Phase("chr", 1, 0.005, trainable="head"))
    assert set(chr_step) == chr_terms and all(torch.isfinite(v) for v in chr_step.values())


def _contrast_setup(kind, extra=()):
    """Task 1 of R-DFCIL with new_kd ``kind`` (16 negatives), and one batch with its image rows."""
    overrides = [("method.new_kd", kind), (f"method.{kind}.negatives", "16"), ("method.inversion.steps", "1"), *extra]
    cfg, method, net, ctx, batches = _task1_setup(overrides)
    index = next(batches.indices(batches.permutation()))
    return cfg, method, net, ctx, batches, Batch(*batches.load(index), index)


@pytest.mark.parametrize("kind", ["crd", "crcd"])
def test_rdfcil_crd_and_crcd_replace_rkd_train_their_heads_and_never_the_teacher(kind):
    """new_kd crd / crcd (supplement): the term in RKD's place in RRL, weighted λ·α·β; none in CHR; the gradient
    reaches the network and both embedding heads, never the old model; a batch without its rows is refused."""
    cfg, method, net, ctx, batches, batch = _contrast_setup(kind)
    assert method.projector is None and method.extra_modules(ctx) == [method.contrast]
    assert len(method.contrast.bank_s) == len(batches.x)  # a row per training image of the task
    lam = {"crd": 0.8, "crcd": 1.0}[kind]  # RepDistiller's CRD weight; CRCD's code's
    assert method.term_weights[3].item() == pytest.approx(lam * method.weights.alpha * method.weights.beta)
    terms = method.training_step(net, batch, ctx, Phase("rrl", 1, 0.1))
    assert set(terms) == {"lce", "hkd", kind} and torch.isfinite(terms[kind]) and terms[kind] > 0
    terms[kind].backward()
    assert all(p.grad is not None for p in method.contrast.parameters())
    assert sum(p.grad.abs().sum() for p in net.backbone.parameters() if p.grad is not None) > 0
    assert all(p.grad is None for p in method.replay.teacher.parameters())
    assert (method.contrast.z > 0).all()  # the normalisers, set at the task's first step
    chr_terms = method.training_step(net, batch, ctx, Phase("chr", 1, 0.005, trainable="head"))
    assert set(chr_terms) == {"gce", "hkd"}
    with pytest.raises(ValueError, match="Batch.index"):
        method.training_step(net, Batch(batch.x, batch.y), ctx, Phase("rrl", 1, 0.1))


def test_rdfcil_contrast_state_trains_through_the_engine_and_round_trips(kind="crd"):
    """Through the engine's steps (which give each batch's rows): the bank's rows move and its normalisers are
    set; the method's state holds the heads, banks and normalisers, and a method restored from it computes the same
    loss and update as the one it was saved from (tests/test_resume.py resumes whole runs)."""
    cfg, method, net, ctx, batches, batch = _contrast_setup(kind)
    bank = method.contrast.bank_t.clone()
    fit_phases(cfg, method, ctx, method.phases(ctx)[:1])  # RRL: 3 steps of 8 of the 24 images
    assert not torch.equal(method.contrast.bank_t, bank) and (method.contrast.z > 0).all()
    state, static = copy.deepcopy(method.state_dict()), method.static_state_dict()
    assert set(state["contrast"]) == {"embed_s.weight", "embed_s.bias", "embed_t.weight", "embed_t.bias"} | {
        "bank_s", "bank_t", "z"
    }  # fmt: skip
    restored = build_method(cfg.method, cfg.train)
    restored.load_state_dict(state, ctx, static)
    for a, b in zip(method.contrast.state_dict().values(), restored.contrast.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    f_s, f_t = torch.randn(2, len(batch.x), net.feature_dim)
    want = method.contrast(f_s, f_t, batch.index, torch.Generator().manual_seed(5))
    got = restored.contrast(f_s, f_t, batch.index, torch.Generator().manual_seed(5))
    assert torch.equal(got, want) and torch.equal(restored.contrast.bank_s, method.contrast.bank_s)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["crd", "crcd"])
def test_rdfcil_with_crd_or_crcd_trains_the_smoke_preset_from_the_command_line(kind, tmp_path):
    from dfcil.cli import main

    out = tmp_path / "run"
    args = ["train", "--config", str(smoke_configs("rdfcil")[0]), "--method.new_kd", kind, "--out", str(out)]
    assert main([*args, "--no-progress"]) == 0
    epochs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rrl = [r["loss"] for r in epochs if r["type"] == "epoch" and r["phase"] == "rrl"]
    assert rrl and all(kind in r and math.isfinite(r[kind]) and "rkd" not in r for r in rrl)


def test_ucir_df_imprints_new_weights_and_keeps_old_ones():
    """New class weights = normalised mean of the class's normalised features × the old weights' mean norm
    (UCIR); during training the old weights stay fixed."""
    import torch.nn.functional as F

    cfg, method, net, ctx, batches = _task1_setup(name="ucir_df")
    head = net.head
    old_norm = head.blocks[0].weight.norm(dim=1).mean()
    net.eval()
    with torch.no_grad():
        feats = torch.cat([net(x).features for x, _ in batches.plain()])
        labels = torch.cat([y for _, y in batches.plain()])
    net.train()
    for c in range(3):
        mean = F.normalize(feats[labels == 3 + c], dim=1).mean(dim=0)
        torch.testing.assert_close(head.blocks[1].weight[c], F.normalize(mean, dim=0) * old_norm)
    before = copy.deepcopy(net.state_dict())
    fit_phases(cfg, method, ctx, method.phases(ctx))
    after = net.state_dict()
    assert torch.equal(after["head.blocks.0.weight"], before["head.blocks.0.weight"])
    assert not torch.equal(after["head.blocks.1.weight"], before["head.blocks.1.weight"])
    assert not torch.equal(after["head.sigma"], before["head.sigma"])  # σ is shared and learned


def test_a_methods_gradient_clamp_bounds_every_update():
    """PODNet clamps every gradient to ±5 (grad_clip_value): with momentum and weight decay off, no parameter
    moves by more than lr × the clamp."""
    cfg, method, net, ctx, batches = _task1_setup(name="finetune")
    method.info = dataclasses.replace(method.info, grad_clip_value=1e-4)  # this instance only
    before = [p.detach().clone() for p in net.parameters()]
    fit_phases(cfg, method, ctx, [Phase("a", 1, 0.5, momentum=0.0, weight_decay=0.0)])  # 3 steps
    moved = max((p.detach() - q).abs().max().item() for p, q in zip(net.parameters(), before, strict=True))
    assert 0 < moved <= 3 * 0.5 * 1e-4 + 1e-6  # (float32 rounding of the weights themselves)


def test_a_methods_gradient_norm_clip_bounds_every_update():
    """AdaGauss clips the norm of every step's gradient (grad_clip_norm): with momentum and weight decay off, the
    whole update of 3 steps has norm at most 3 × lr × the clip, and without the clip it is larger."""

    def moved(clip):
        cfg, method, net, ctx, batches = _task1_setup(name="finetune")
        method.info = dataclasses.replace(method.info, grad_clip_norm=clip)  # this instance only
        before = [p.detach().clone() for p in net.parameters()]
        fit_phases(cfg, method, ctx, [Phase("a", 1, 0.5, momentum=0.0, weight_decay=0.0)])  # 3 steps
        return torch.cat([(p.detach() - q).flatten() for p, q in zip(net.parameters(), before, strict=True)]).norm()

    clipped = float(moved(1e-3))
    assert 0 < clipped <= 3 * 0.5 * 1e-3 * (1 + 1e-3) and float(moved(None)) > 10 * clipped


@pytest.mark.parametrize("last_only", [False, True])
def test_joint_trains_on_every_task_so_far(last_only):
    """The upper bound's task 1 trains on the real data of tasks 0 and 1 (twice fine-tuning's), from a
    re-initialised network (ABD's Oracle); with last_only only the last task trains."""
    seen, summaries = {}, {}
    for name, extra in {"finetune": [], "joint": [("method.last_only", str(last_only).lower())]}.items():
        seen[name] = Records()
        summaries[name] = run(tiny_config(name, extra), options=RunOptions(callbacks=[seen[name]]))
    ft, joint = seen["finetune"], seen["joint"]
    # the untrained network's first row is no result: the summary says so for the reports (not fine-tuning's)
    assert summaries["joint"].get("unscored_tasks") == ([0] if last_only else None)
    assert "unscored_tasks" not in summaries["finetune"]
    assert joint.starts[1]["train_images"] == 2 * ft.starts[1]["train_images"] == 2 * joint.starts[0]["train_images"]
    assert [r["task"] for r in joint.epochs] == ([1, 1] if last_only else [0, 0, 1, 1])


def test_lwf_terms_are_ce_and_kd_on_the_new_data():
    import torch.nn.functional as F

    cfg, method, net, ctx, batches = _task1_setup(name="lwf", old=2, new=4)
    x, y = next(iter(batches))
    with torch.no_grad():
        old = torch.softmax(method.teacher(x).logits / 2.0, dim=1)
    logits = copy.deepcopy(net)(x).logits
    got = method.training_step(net, Batch(x, y), ctx, method.phases(ctx)[0])
    want = {"ce": F.cross_entropy(logits, y), "kd": 1.0 * _soft_ce(logits[:, :2], old)}  # seen classes; old ones
    assert set(got) == set(want)
    for k in want:
        torch.testing.assert_close(got[k], want[k], msg=k)


def test_lwf_as_ldc_trains_it_local_ce_on_a_cosine_head():
    """LDC's LwF (PyCIL): CE over the new classes' logits only, of σ·cos logits; KD of the old model's σ·cos."""
    import torch.nn.functional as F

    from dfcil.models.heads import CosineIncremental

    extra = [("method.head", "cosine"), ("method.ce", "local"), ("method.lambda_kd", "10")]
    cfg, method, net, ctx, batches = _task1_setup(extra, name="lwf", old=2, new=4)
    assert isinstance(net.head, CosineIncremental) and isinstance(method.teacher.net.head, CosineIncremental)
    x, y = next(iter(batches))
    with torch.no_grad():
        net.head.sigma.fill_(3.0)  # a learned scale away from 1: the logits carry it, the teacher's keeps its own
        old = torch.softmax(method.teacher(x).logits / 2.0, dim=1)
    out = copy.deepcopy(net)(x)
    cos = F.normalize(out.features, dim=1) @ F.normalize(net.head.weight(), dim=1).T
    torch.testing.assert_close(out.logits, 3.0 * cos)
    got = method.training_step(net, Batch(x, y), ctx, method.phases(ctx)[0])
    want = {"ce": F.cross_entropy(3.0 * cos[:, 2:], y - 2), "kd": 10.0 * _soft_ce(3.0 * cos[:, :2], old)}
    assert set(got) == set(want)
    for k in want:
        torch.testing.assert_close(got[k], want[k], msg=k)


def test_lwf_mc_term_is_bce_against_the_teachers_sigmoids_on_old_classes():
    """ABD's LWF_MC step: target = one-hot label with the old columns set to sigmoid(teacher logits);
    BCELoss(sum) of the student's sigmoids over the seen classes, divided by the batch size."""
    cfg, method, net, ctx, batches = _task1_setup(name="lwf_mc", old=2, new=4)
    x, y = next(iter(batches))
    with torch.no_grad():
        teacher = method.teacher(x).logits
    logits = copy.deepcopy(net)(x).logits
    target = torch.zeros_like(logits)
    target[torch.arange(len(y)), y] = 1.0
    target[:, :2] = torch.sigmoid(teacher)
    want = torch.nn.BCELoss(reduction="sum")(torch.sigmoid(logits), target) / len(y)
    got = method.training_step(net, Batch(x, y), ctx, method.phases(ctx)[0])
    assert set(got) == {"bce"} and logits.shape[1] == 6 and teacher.shape[1] == 2
    torch.testing.assert_close(got["bce"], want)
    method.on_task_end(ctx)  # no teacher (as in task 0): the target is the one-hot label alone
    one_hot = torch.nn.BCELoss(reduction="sum")(torch.sigmoid(logits), (target >= 1).float()) / len(y)
    torch.testing.assert_close(method.training_step(net, Batch(x, y), ctx, method.phases(ctx)[0])["bce"], one_hot)


@pytest.mark.parametrize("from_scratch", [True, False])
def test_joint_from_scratch_reinitialises_the_network_at_each_task(from_scratch):
    cfg, _, net, ctx, _ = _task1_setup(name="finetune")
    joint = build_method(tiny_config("joint", [("method.from_scratch", str(from_scratch).lower())]).method, cfg.train)
    before = copy.deepcopy(net.state_dict())
    joint.on_task_start(ctx)
    after = net.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    if not from_scratch:
        assert not changed
        return
    assert "backbone.conv_1.weight" in changed and "head.blocks.0.weight" in changed
    bn_means = [v for k, v in after.items() if k.endswith("running_mean")]
    assert bn_means and all(torch.equal(v, torch.zeros_like(v)) for v in bn_means)  # running statistics reset too


def test_dgr_terms_are_task_balanced_ce_and_kd_on_replayed_images():
    import torch.nn.functional as F

    cfg, method, net, ctx, batches = _task1_setup([("method.zdim", "32")], name="dgr", old=2, new=4)
    x, y = next(iter(batches))
    old_vae, old_net = method.scholar
    x_rep = torch.randn(len(x), 3, 32, 32, generator=torch.Generator().manual_seed(3))
    old_vae.sample = lambda n, generator: x_rep[:n]
    with torch.no_grad():
        t = old_net(x_rep).logits
    labels = torch.cat([y, t.argmax(dim=1)])
    w = torch.where(labels < 2, 1 / 3, 2 / 3)  # r = n_old / n_seen
    logits = copy.deepcopy(net)(torch.cat([x, x_rep])).logits
    got = method.training_step(net, Batch(x, y), ctx, method.phases(ctx)[0])
    assert set(got) == {"ce", "kd", "vae"} and torch.isfinite(got["vae"])
    torch.testing.assert_close(got["ce"], (F.cross_entropy(logits, labels, reduction="none") * w).mean())
    torch.testing.assert_close(got["kd"], 1.0 * _soft_ce(logits[len(x) :, :2], torch.softmax(t / 2.0, dim=1)))


def test_milestones_given_as_fractions_follow_each_phase():
    from dfcil.config import TrainConfig
    from dfcil.context import milestone_epochs

    assert milestone_epochs((0.5, 0.75), 3) == (2, 2)  # 1.5 rounds up; 2.25 down: two drops at epoch 2
    assert milestone_epochs((0.4, 0.6), 200) == (80, 120) and milestone_epochs((7,), 10) == (7,)
    # R-DFCIL's RRL phase of the paper's schedule (160 of 200 epochs): [0.5, 0.75] are its epochs 80 and 120
    rrl = Phase.from_train("rrl", TrainConfig(epochs=200, milestones=(0.5, 0.75)), epochs=160)
    assert rrl == Phase.from_train("rrl", TrainConfig(epochs=200), epochs=160) and rrl.milestones == (80, 120)
    rec = Records()  # through a run: 4 epochs with [0.25, 0.75] lower the lr at epochs 1 and 3
    run(tiny_config("finetune", [("train.epochs", "4"), ("train.milestones", "[0.25, 0.75]")]),
        options=RunOptions(callbacks=[rec]))  # fmt: skip
    assert [r["lr"] for r in rec.epochs if r["task"] == 0] == pytest.approx([0.1, 0.01, 0.01, 0.001])


@pytest.mark.parametrize("name", METHODS.names())
def test_every_methods_smoke_run_learns_its_first_task_above_chance(name, tmp_path_factory):
    """A new user's first run of a method (its smoke preset, as the README gives it) learns the first task: EFC's
    own Adam rates learnt nothing in three epochs (16 % of 5 classes) before its smoke overlay. The methods whose
    first task is plain CE share it through one task-0 cache."""
    from dfcil.errors import RunInterrupted
    from dfcil.training.state import Interrupt

    cache = tmp_path_factory.getbasetemp() / "smoke-task0-cache"
    cfg, _ = load_config(smoke_configs(name), [("method.name", name), ("task0_cache", json.dumps(str(cache)))])
    interrupt, rec = Interrupt(), Records()
    with pytest.raises(RunInterrupted):
        run(cfg, options=RunOptions(progress=False, interrupt=interrupt, callbacks=[rec, StopAfterTask0(interrupt)]))
    (task0,) = rec.tasks
    chance = 100 / task0["n_seen"]
    assert task0["acc"] > 1.5 * chance, (name, task0["acc"], chance)
