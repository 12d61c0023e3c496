"""StepGraph: the eager step and its graph-safety check on the CPU; every method's step passes the check.

The CUDA capture itself runs in tests/test_cuda.py (GPU only)."""

import contextlib
import copy

import pytest
import torch
from torch import nn

from dfcil.compute.graphs import StepGraph
from dfcil.compute.runtime import Runtime
from dfcil.errors import GraphCaptureError, GraphSafetyError
from dfcil.methods import METHODS
from dfcil.synthesis.inversion import InversionConfig, ModelInversion
from dfcil.training.engine import run
from dfcil.training.loop import RunOptions
from test_methods import tiny_config


class Toy:
    """A linear model, an SGD optimiser and a step function that can be made to break each graph rule."""

    def __init__(self, seed: int = 0) -> None:
        torch.manual_seed(seed)
        self.net = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))
        self.opt = torch.optim.SGD(self.net.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
        self.weight = torch.ones(3)  # state the step reads, like R-DFCIL's class weights
        self.rng = torch.Generator().manual_seed(1)
        self.scale = 1.0
        self.sync = self.from_python = self.noise = False

    def compute(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if self.noise:
            x = x + 0.1 * torch.randn(x.shape, generator=self.rng, device=x.device)
        logits = self.net(x)
        ce = nn.functional.cross_entropy(logits, y, weight=self.weight)
        if self.sync and ce.item() > 0:  # a host sync deciding control flow
            ce = ce * 1.0
        if self.from_python:
            ce = ce * torch.tensor([1.0, 1.0]).sum()
        return torch.stack([ce, self.scale * logits.pow(2).mean()])

    def step(self, *inputs: torch.Tensor) -> torch.Tensor:
        """One optimisation step, as the engine's: zero_grad, loss terms, backward, the optimiser's step."""
        self.opt.zero_grad(set_to_none=True)
        values = self.compute(*inputs)
        values.sum().backward()
        self.opt.step()
        return values.detach()


def batches(n: int, seed: int = 5):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(16, 4, generator=g), torch.randint(0, 3, (16,), generator=g)) for _ in range(n)]


def train(toy: Toy, mode: str, data, generators=()) -> list[torch.Tensor]:
    step = StepGraph(toy.step, toy.opt, mode, warmup=1, generators=generators)
    return [step(("phase", 0.1), x, y).clone() for x, y in data]


def test_check_mode_trains_exactly_like_the_eager_step():
    eager, checked = Toy(), Toy()
    a, b = train(eager, "off", batches(6)), train(checked, "check", batches(6))
    for u, v in zip(a, b, strict=True):
        torch.testing.assert_close(u, v, rtol=0, atol=0)
    for p, q in zip(eager.net.state_dict().values(), checked.net.state_dict().values(), strict=True):
        torch.testing.assert_close(p, q, rtol=0, atol=0)  # weights, momentum-driven updates, BN running stats


def test_a_step_without_inputs_is_recorded_once():
    toy = Toy()
    x, y = batches(1)[0]
    step = StepGraph(lambda: toy.step(x, y), toy.opt, "check", warmup=1)
    for _ in range(5):
        step("inversion")
    assert step.captures == 1 and step.calls == 5


def test_a_graph_that_cannot_be_set_up_falls_back_to_eager_steps(caplog):
    """If a graph cannot even be set up (nothing captured yet), the run goes on eagerly, says so, and trains
    exactly as the eager engine."""
    eager, graphed = Toy(), Toy()
    step = StepGraph(graphed.step, graphed.opt, "check", warmup=0)
    step.mode = "on"  # as on a GPU, with a PyTorch whose graphs cannot register generators

    def refuse():
        raise AttributeError("'CUDAGraph' object has no attribute 'register_generator_state'")

    step._new_graph = refuse
    with caplog.at_level("WARNING", logger="dfcil"):
        got = [step("k", x, y).clone() for x, y in batches(4)]
    assert step.mode == "off" and "register_generator_state" in step.failure and "runs eagerly" in caplog.text
    want = train(eager, "off", batches(4))
    for u, v in zip(want, got, strict=True):
        torch.testing.assert_close(u, v, rtol=0, atol=0)


def test_a_capture_that_fails_once_begun_stops_with_the_way_to_go_on(monkeypatch):
    """A failed capture can leave generators and streams in capture state: no eager fallback, a clear error."""
    toy = Toy()
    step = StepGraph(toy.step, toy.opt, "check", warmup=0)
    step.mode = "on"
    step._new_graph = object

    class FailingCapture:  # torch.cuda.graph, failing as CUDA does on an operation a capture forbids
        def __init__(self, graph):
            pass

        def __enter__(self):
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing")

        def __exit__(self, *exc):
            return False

    current = []
    monkeypatch.setattr(torch.cuda, "graph", FailingCapture)
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: "the stream before the capture")
    monkeypatch.setattr(torch.cuda, "set_stream", current.append)
    with pytest.raises(GraphCaptureError, match=r"not permitted.*dfcil resume <run dir> --engine.cuda_graphs off"):
        step("k", *batches(1)[0])
    assert current == ["the stream before the capture"]  # the capture stream is not left current


def test_on_mode_is_eager_off_cuda():
    toy = Toy()
    step = StepGraph(toy.step, toy.opt, "on", device=torch.device("cpu"))
    assert step.mode == "off"


def test_the_returned_terms_are_overwritten_by_the_next_step_as_a_replay_would():
    toy = Toy()
    step = StepGraph(toy.step, toy.opt, "check", warmup=1)
    data = batches(4)
    step("k", *data[0])  # warm-up: eager
    first = step("k", *data[1])
    kept = first.clone()
    second = step("k", *data[2])
    assert second is first and not torch.equal(first, kept)


def recorded(toy: Toy, n: int, key: str = "k"):
    """A checked step after its warm-up, its recorded step and one compared step; the batches for ``n`` steps."""
    step = StepGraph(toy.step, toy.opt, "check", warmup=1)
    data = batches(n)
    for x, y in data[:3]:
        step(key, x, y)
    return step, data


def test_rebinding_state_between_steps_is_caught():
    toy = Toy()
    step, data = recorded(toy, 4)
    toy.weight = torch.full((3,), 2.0)  # rebound: a graph would keep reading the old tensor
    with pytest.raises(GraphSafetyError, match="replaced, not updated in place"):
        step("k", *data[3])


def test_updating_state_in_place_is_fine():
    toy = Toy()
    step = StepGraph(toy.step, toy.opt, "check", warmup=1)
    for i, (x, y) in enumerate(batches(5)):
        toy.weight.fill_(1.0 + i)
        step("k", x, y)


def test_a_changed_python_number_is_caught_and_a_new_key_starts_afresh():
    toy = Toy()
    step, data = recorded(toy, 6, "lr 0.1")
    toy.scale = 2.0
    with pytest.raises(GraphSafetyError, match="Python argument changed from 1.0 to 2.0"):
        step("lr 0.1", *data[3])
    for x, y in data[3:]:  # under a new key the step is warmed up and recorded again
        step("lr 0.01", x, y)
    assert step.captures == 2


def test_host_syncs_and_tensors_from_python_data_are_caught():
    for flag, message in [("sync", "synchronises with the host"), ("from_python", "from Python data")]:
        toy = Toy()
        setattr(toy, flag, True)
        step = StepGraph(toy.step, toy.opt, "check", warmup=0)
        with pytest.raises(GraphSafetyError, match=message) as err:
            step("k", *batches(1)[0])
        assert "test_graphs.py" in str(err.value)  # names the offending line


def test_random_streams_must_be_declared():
    toy = Toy()
    toy.noise = True
    with pytest.raises(GraphSafetyError, match="did not declare"):
        train(toy, "check", batches(3))
    toy = Toy()
    toy.noise = True
    train(toy, "check", batches(3), generators=(toy.rng,))


def test_a_batch_of_another_shape_under_one_key_is_an_error():
    toy = Toy()
    step = StepGraph(toy.step, toy.opt, "check", warmup=0)
    step("k", *batches(1)[0])
    with pytest.raises(GraphSafetyError, match=r"\(16, 4\).*\(8, 4\)"):
        step("k", torch.randn(8, 4), torch.randint(0, 3, (8,)))


@pytest.mark.parametrize("name", METHODS.names())
def test_every_method_keeps_its_graph_promise(name, caplog):
    """What the README promises. A graph-safe method: a 2-task run with engine.cuda_graphs=check records and
    compares every training step (and the inversion), and on the CPU equals the eager run bit for bit. A method not
    marked graph-safe: with engine.cuda_graphs=on the engine runs its steps eagerly, says so once, and the run
    equals the eager one."""
    extra = [("train.epochs", "3"), ("train.milestones", "[1]")]
    eager = run(tiny_config(name, extra), options=RunOptions(progress=False))
    assert all("cuda_graphs" not in p for t in eager["timings"] for p in t["phases"].values())
    if METHODS.get(name).info.graph_safe:
        checked = run(tiny_config(name, [*extra, ("engine.cuda_graphs", "check")]), options=RunOptions(progress=False))
        assert checked["accuracy_matrix"] == eager["accuracy_matrix"]
        phases = [p for t in checked["timings"] for p in t["phases"].values()]
        assert phases and all(
            p["cuda_graphs"] == "check" and p["captures"] >= 1 and "capture_s" not in p for p in phases
        )
        return
    caplog.clear()
    with caplog.at_level("WARNING", logger="dfcil"):
        on = run(tiny_config(name, [*extra, ("engine.cuda_graphs", "on")]), options=RunOptions(progress=False))
    assert caplog.text.count("not marked graph_safe") == 1
    assert on["accuracy_matrix"] == eager["accuracy_matrix"]
    assert all(p["cuda_graphs"] == "off" for t in on["timings"] for p in t["phases"].values())


def test_rdfcil_class_weights_rebound_at_epoch_end_would_be_caught():
    """The check sees the bug a graph would hide: R-DFCIL's class weights replaced instead of updated in place."""
    from dfcil.losses.classification import balanced_class_weights
    from dfcil.methods.rdfcil import RDFCIL

    class Rebinding(RDFCIL):
        def on_epoch_end(self, ctx, phase):
            if ctx.task_id > 0:
                self.class_weights = balanced_class_weights(self.class_counts)

    extra = [("train.epochs", "4"), ("method.chr_epochs", "2"), ("engine.cuda_graphs", "check")]
    cfg = tiny_config("rdfcil", extra)  # two CHR epochs, the phase that reads the weights
    with METHODS.replaced("rdfcil", Rebinding), pytest.raises(GraphSafetyError, match="replaced"):
        run(cfg, options=RunOptions(progress=False))


def test_inversion_under_check_equals_the_eager_inversion():
    from dfcil.models.network import build_network

    torch.manual_seed(0)
    teacher = build_network("resnet8")
    teacher.expand(4)
    teacher = teacher.frozen_copy()
    cfg = InversionConfig(steps=4, zdim=16)

    def fit(mode):
        generator = torch.Generator().manual_seed(3)
        inv = ModelInversion(copy.deepcopy(teacher), cfg, 32, 8, generator, Runtime(graphs=mode))
        torch.manual_seed(1)
        inv.generator.load_state_dict(reference_init)
        seen = []
        inv.fit(lambda step, values: seen.append(values.clone()))
        return inv, seen

    reference_init = ModelInversion(teacher, cfg, 32, 8, torch.Generator()).generator.state_dict()
    (a, la), (b, lb) = fit("off"), fit("check")
    assert b.names == ["content", "diversity", "bn", "prior"]
    for u, v in zip(la, lb, strict=True):
        torch.testing.assert_close(u, v, rtol=0, atol=0)
    for p, q in zip(a.generator.state_dict().values(), b.generator.state_dict().values(), strict=True):
        torch.testing.assert_close(p, q, rtol=0, atol=0)


def test_a_method_not_marked_graph_safe_runs_eagerly_with_one_warning(caplog):
    import dataclasses

    from dfcil.methods.finetune import Finetune

    class Unmarked(Finetune):
        info = dataclasses.replace(Finetune.info, graph_safe=False)

    with METHODS.replaced("finetune", Unmarked):
        test_every_method_keeps_its_graph_promise("finetune", caplog)


def test_a_phase_record_explains_the_mode_of_the_last_process():
    """A resumed phase's record gives the graph mode its last process ran in; a ``graph_failure`` that an earlier
    process recorded goes once this one runs its steps as graphs, and comes back if this one fails too."""
    from dfcil.training.callbacks import PhaseClock

    toy = Toy()
    earlier = {"time_s": 2.0, "images": 64, "cuda_graphs": "off", "captures": 0, "graph_failure": "no graphs"}
    step = StepGraph(toy.step, toy.opt, "check", warmup=0)
    clock = PhaseClock(earlier)
    for x, y in batches(2):
        step("k", x, y)
    clock.update(64 + 16, step, "check")  # the phase's images so far: 16 more in this process
    assert earlier["cuda_graphs"] == "check" and earlier["captures"] == 1 and "graph_failure" not in earlier
    assert earlier["images"] == 80 and earlier["time_s"] >= 2.0
    step.failure = "refused"
    clock.update(80, step, "check")
    assert earlier["graph_failure"] == "refused"
