"""Phase options methods use beyond the default SGD phase: Adam with its own weight decay, a backbone with frozen
BN layers, and the method's hook at the end of each phase."""

import pytest
import torch
import torch.nn.functional as F

from dfcil.compute.optim import phase_optimizer
from dfcil.methods import Method, Phase, register_method, unregister_method
from dfcil.models.batchnorm import BatchNorm2d
from dfcil.models.network import build_network
from dfcil.training.engine import run
from dfcil.training.loop import RunOptions
from test_methods import tiny_config


def test_phase_optimizer_builds_sgd_or_adam_with_the_weight_decay_asked_for():
    p = [torch.nn.Parameter(torch.zeros(3))]
    sgd = phase_optimizer("sgd", p, 0.1, 0.9, 5e-4, fused=False)
    adam = phase_optimizer("adam", p, 1e-3, 0.9, 2e-4, fused=False)
    assert isinstance(sgd, torch.optim.SGD) and sgd.param_groups[0]["momentum"] == 0.9
    assert isinstance(adam, torch.optim.Adam) and adam.param_groups[0]["weight_decay"] == 2e-4
    # coupled decay: the first step of Adam moves by lr·sign(g + wd·w) whatever the scale
    p[0].data.fill_(1.0)
    p[0].grad = torch.zeros(3)
    adam.step()
    assert torch.allclose(p[0].data, torch.full((3,), 1.0 - 1e-3))
    with pytest.raises(ValueError, match="unknown optimiser 'rmsprop'"):
        phase_optimizer("rmsprop", p, 0.1, 0.9, 0.0, fused=False)


def test_frozen_bn_trains_the_rest_and_keeps_bn_statistics_and_affine_parameters():
    net = build_network("resnet32")
    net.expand(3)
    net.set_trainable("frozen_bn")
    bns = [m for m in net.backbone.modules() if isinstance(m, BatchNorm2d)]
    assert bns and all(not m.training and not m.weight.requires_grad for m in bns)
    before = {k: v.clone() for k, v in net.state_dict().items()}
    opt = torch.optim.SGD([p for p in net.parameters() if p.requires_grad], lr=0.1)
    F.cross_entropy(net(torch.randn(8, 3, 32, 32)).logits, torch.randint(0, 3, (8,))).backward()
    opt.step()
    after = net.state_dict()
    bn_keys = {k for k in before if any(k.startswith(name + ".") for name, m in net.named_modules() if m in bns)}
    assert bn_keys and all(torch.equal(before[k], after[k]) for k in bn_keys)  # statistics and affine kept
    assert any(not torch.equal(before[k], after[k]) for k in before if k not in bn_keys)  # the rest trained
    net.set_trainable("all")
    assert all(m.training and m.weight.requires_grad for m in bns)


PHASE_END = []


class PhaseEnds(Method):
    """Two phases per task (the second Adam, BN frozen); records the hook's calls."""

    def phases(self, task):
        return [Phase("a", 1, 0.1), Phase("b", 1, 1e-3, trainable="frozen_bn", optimizer="adam", weight_decay=0.0)]

    def training_step(self, net, batch, ctx, phase):
        return {"ce": F.cross_entropy(net(batch.x).logits, batch.y)}

    def on_phase_end(self, ctx, phase):
        PHASE_END.append((ctx.task_id, phase.name))


def test_on_phase_end_is_called_after_each_phase_in_order(monkeypatch):
    from dfcil.training import engine

    seen = []
    real = engine.phase_optimizer
    monkeypatch.setattr(engine, "phase_optimizer", lambda kind, *a: seen.append(kind) or real(kind, *a))
    register_method("phase_ends")(PhaseEnds)
    try:
        PHASE_END.clear()
        run(tiny_config("finetune", [("method.name", "phase_ends")]), options=RunOptions(progress=False))
    finally:
        unregister_method("phase_ends")
    assert PHASE_END == [(0, "a"), (0, "b"), (1, "a"), (1, "b")]
    assert seen == ["sgd", "adam", "sgd", "adam"]  # a phase asking for another optimiser gets a new one


# ------------------------------------------------------------------------------ a phase owns its whole schedule


def test_from_train_takes_the_whole_schedule_and_a_method_changes_what_it_does_otherwise():
    from dfcil.config import TrainConfig

    train = TrainConfig(epochs=10, lr=0.2, milestones=(4, 8), gamma=0.5, momentum=0.7, weight_decay=1e-3)
    phase = Phase.from_train("rrl", train)
    assert (phase.epochs, phase.lr, phase.milestones, phase.gamma) == (10, 0.2, (4, 8), 0.5)
    assert (phase.optimizer, phase.momentum, phase.weight_decay) == ("sgd", 0.7, 1e-3)
    chr_ = Phase.from_train("chr", train, epochs=2, lr=0.005, milestones=(), trainable="head")
    assert (chr_.epochs, chr_.lr, chr_.milestones, chr_.momentum, chr_.trainable) == (2, 0.005, (), 0.7, "head")
    assert [phase.lr_at(e) for e in (0, 3, 4, 8)] == [0.2, 0.2, 0.1, 0.05]
    assert phase.describe() == "rrl 10 ep, lr 0.2 ×0.5 at epochs 4, 8, sgd momentum 0.7, wd 0.001"
    assert Phase("x", 1, 0.1, optimizer="adam").describe() == "x 1 ep, lr 0.1 constant, adam, wd 0.0005"
    defaults = TrainConfig()  # a phase's own defaults are the train section's
    assert (Phase("x", 1, 0.1).gamma, Phase("x", 1, 0.1).momentum) == (defaults.gamma, defaults.momentum)
    assert Phase("x", 1, 0.1).weight_decay == defaults.weight_decay


class OwnSchedules(Method):
    """Two phases with their own gamma, momentum and weight decay; records what the optimiser held."""

    seen: list = []

    def phases(self, task):
        a = Phase.from_train("a", self.train, epochs=2, milestones=(1,), gamma=0.25, momentum=0.5, weight_decay=0.0)
        return [a, Phase.from_train("b", self.train, epochs=1, lr=0.01, momentum=0.8, weight_decay=1e-2)]

    def training_step(self, net, batch, ctx, phase):
        return {"ce": F.cross_entropy(net(batch.x).logits, batch.y)}

    def on_epoch_end(self, ctx, phase):
        group = self.optimizer_group
        OwnSchedules.seen.append((ctx.task_id, phase.name, group["lr"], group["momentum"], group["weight_decay"]))


def test_the_engine_trains_each_phase_with_its_own_gamma_momentum_and_weight_decay(monkeypatch):
    """Before, gamma, momentum and weight decay came from the train section whatever a phase said."""
    from dfcil.training import engine

    real = engine.train_epoch

    def spy(loop, ctx, phase, step, bar=None):
        loop.method.optimizer_group = loop.state.optimizer.param_groups[0]
        return real(loop, ctx, phase, step, bar)

    monkeypatch.setattr(engine, "train_epoch", spy)
    OwnSchedules.seen = []
    register_method("own_schedules")(OwnSchedules)
    try:
        run(tiny_config("finetune", [("method.name", "own_schedules")]), options=RunOptions(progress=False))
    finally:
        unregister_method("own_schedules")
    assert OwnSchedules.seen[:3] == [(0, "a", 0.1, 0.5, 0.0), (0, "a", 0.025, 0.5, 0.0), (0, "b", 0.01, 0.8, 1e-2)]


@pytest.mark.parametrize(
    ("method", "key", "value", "refused"),
    [("efc", "lr", "0.05", True), ("efc", "momentum", "0.5", True), ("efc", "weight_decay", "0.001", True),
     ("efc", "lr", "0.001", False),  # the first task's own lr, repeated: accepted (it changes nothing, says no lie)
     ("efc", "gamma", "0.5", False),  # EFC's first task lowers its lr by train.gamma at train.milestones
     ("fecam", "lr", "0.05", False), ("rdfcil", "momentum", "0.5", False)],
)  # fmt: skip
def test_a_schedule_key_no_phase_reads_is_refused_in_one_place_for_every_method(capsys, method, key, value, refused):
    from conftest import CONFIGS
    from dfcil.cli import main
    from test_methods import TINY

    tiny = [arg for k, v in TINY for arg in (f"--{k}", v)]
    args = ["train", "--config", str(CONFIGS / "smoke.yaml"), "--method.name", method, *tiny, f"--train.{key}", value]
    assert main([*args, "--dry-run"]) == (2 if refused else 0)
    err = capsys.readouterr().err
    if refused:
        assert f"train.{key} ({value}) changes nothing: no phase of {method} reads it (its phases: base" in err, err
        assert "adam" in err and err.count("dfcil: error:") == 1
