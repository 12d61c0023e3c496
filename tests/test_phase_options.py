"""Phase options methods use beyond the default SGD phase: Adam with its own weight decay, a backbone with frozen
BN layers, and the method's hook at the end of each phase."""

import pytest
import torch
import torch.nn.functional as F

from dfcil.engine import run
from dfcil.loop import RunOptions
from dfcil.methods import Method, Phase, register_method, unregister_method
from dfcil.models.batchnorm import BatchNorm2d
from dfcil.models.network import build_network
from dfcil.optim import phase_optimizer
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
    from dfcil import engine

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
