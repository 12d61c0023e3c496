"""The benchmark scripts that benchmarks/gpu_check.sh runs on a GPU: they must work before they get there."""

import importlib.util
import math
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "benchmarks"


def _load(name: str):
    path = BENCH / f"{name}.py" if (BENCH / f"{name}.py").exists() else BENCH / "archive" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("ab", ["merge", "memory"])
def test_speed_prints_its_ab_table_and_a_profile(ab, capsys):
    speed = _load("speed")
    argv = ["--ab", ab, "--phases", "chr", "--rounds", "1", "--steps", "1", "--batch", "8", "--profile", "1"]
    assert speed.main(argv) == 0
    out = capsys.readouterr().out
    a, b = {"merge": ("reference", "fast-teacher"), "memory": ("nchw", "channels_last")}[ab]
    assert f"| phase | {a} ms/step | {b} ms/step | ratio {a}/{b} |" in out
    assert f"profile of {b}'s settings, eager" in out
    groups = out.split("| group | µs/step | share | calls/step |")[1].split("| top kernel")[0]
    assert "| convolution / matmul |" in groups  # a CHR step is mostly convolutions on any device


def test_profile_groups_kernel_names():
    speed = _load("speed")

    def group(name):
        return next((g for g, rx in speed.KERNEL_GROUPS if speed.re.search(rx, name, speed.re.IGNORECASE)), "other")

    assert group("sm90_xmma_fprop_implicit_gemm_tf32f32") == "convolution / matmul"
    assert group("void cudnn::bn_fw_tr_1C11_kernel_NCHW<float>") == "batch norm"  # before cuDNN's convolutions
    assert group("void at::native::batch_norm_collect_statistics_kernel") == "batch norm"
    assert group("aten::native_batch_norm_backward") == "batch norm"
    assert group("aten::convolution_backward") == "convolution / matmul"
    assert group("void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm>") == "convolution / matmul"
    assert group("void at::native::(anonymous)::multi_tensor_apply_kernel<FusedSgdMathFunctor>") == "optimiser"
    assert group("void at::native::vectorized_elementwise_kernel<4, relu>") == "elementwise"
    assert group("aten::upsample_nearest2d") == "other"


def test_gpu_check_script_parses_and_refuses_an_unknown_stage():
    script = BENCH / "gpu_check.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    done = subprocess.run(["bash", str(script), "nope"], capture_output=True, text=True)
    assert done.returncode == 2
    assert "usage: bash benchmarks/gpu_check.sh prep|stage|full|resume|speed|tests" in done.stderr


def test_speed_steps_share_a_fused_optimiser_across_phases():
    """task0 trains no projector; the RRL step after it must still run with a fused SGD (the crash of
    ``speed.py --profile`` with task0 among the phases: "expected Tensor as element ... but got NoneType")."""
    import torch

    speed = _load("speed")
    method, net, ctx, optimizer, batch = speed.build(torch.device("cpu"), 8, 4, 4, "teacher", "fp32", False)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    fused = torch.optim.SGD(params, lr=0.01, momentum=0.9, weight_decay=5e-4, fused=True)  # as on CUDA
    steps = speed.steps_for((method, net, ctx, fused, batch), hooks=False)
    for phase in ("task0", "rrl", "chr", "task0"):
        steps[phase]()
    assert all(fused.state[p].get("momentum_buffer") is not None for p in params)


def test_startup_times_a_command_beside_another_revision_and_removes_its_checkout(capsys):
    startup = _load("startup")
    worktrees = ["git", "-C", str(BENCH.parent), "worktree", "list"]
    before = subprocess.run(worktrees, capture_output=True, text=True, check=True).stdout
    assert startup.main(["--before", "HEAD", "--runs", "1", "--warmup", "0", "--commands", "help"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "| command | HEAD (before) median s | HEAD (before) min s | working tree median s |" in lines[2]
    assert lines[4].startswith("| `dfcil --help` |") and lines[4].endswith("| < 1.5 s |") and len(lines) == 5
    assert subprocess.run(worktrees, capture_output=True, text=True, check=True).stdout == before


@pytest.mark.slow  # trains a 2-task R-DFCIL run (about 25 s on 2 cores): a benchmark's guard, not the core
def test_drift_benchmark_prints_the_error_of_each_compensation():
    done = subprocess.run(
        [sys.executable, str(BENCH / "archive" / "drift.py"), "--config", str(BENCH.parent / "configs" / "smoke.yaml"),
         "--ldc-passes", "2", "--train.epochs", "2", "--train.milestones", "[]", "--data.num_classes", "6"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    rows = {line.split("|")[1].strip(): line for line in done.stdout.splitlines() if line.startswith("| ")}
    assert set(rows) >= {"none", "lstsq", "ldc, 1 pass", "ldc, 2 passes"}
    assert rows["none"].split("|")[2].strip() == "1.000"  # not moving the means: the reference error


def _checkpoint(path, task, stage, static=None):
    """A checkpoint file holding only what a pack reads of it: its position and its static state's reference."""
    from dfcil.checkpoint import FORMAT, dumps

    position = {"task": task, "stage": stage, "phase": 0, "epoch": 0, "step": 0}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(dumps({"format": FORMAT, "position": position, "static": static, "net": {"w": torch.zeros(64)}}))


def test_gpu_check_cell_dry_run_plans_three_orders_and_carries_a_cell_between_machines(tmp_path):
    """``gpu_check.sh cell`` with DRY_RUN=1 on a CPU: the 3-order sweep's plan (packed, compiled steps, the cell's
    own compile cache, the budget given to the sweep), then the cell packed into $OUT/cell.tgz by benchmarks/pack.py
    (the newest checkpoint and the static state it refers to, records; not the older checkpoint, other tasks' static
    states or finished weights), in pieces where it is larger than CELL_PIECE, and unpacked on a "new machine" from
    the repository root's cell.tgz."""
    script = BENCH / "gpu_check.sh"
    machine1, machine2 = tmp_path / "m1", tmp_path / "m2"
    cell = machine1 / "runs" / "cell"
    run = cell / "order0"
    _checkpoint(run / "checkpoints" / "last.pt", 10, "train", {"task": 10, "digest": "d"})
    _checkpoint(run / "checkpoints" / "prev.pt", 10, "train", {"task": 10, "digest": "d"})
    for name in ("run.log", "model.pt", *(f"checkpoints/task{t}-static.pt" for t in (1, 2, 10))):
        (run / name).write_text(name)
    for name in ("checkpoints/last.pt", "checkpoints/task3-static.pt", "summary.json"):  # a finished run
        (cell / "order1" / name).parent.mkdir(parents=True, exist_ok=True)
        (cell / "order1" / name).write_text(name * 40)
    (cell / ".compile-cache" / "fx").mkdir(parents=True)
    (cell / ".compile-cache" / "fx" / "graph.py").write_text("kernel")
    (cell / "sweep.json").write_text("{}")

    def cell_check(machine, cwd):
        env = {**os.environ, "DRY_RUN": "1", "OUT": str(machine / "out"), "RUNS": str(machine / "runs")}
        env["CELL_FROM"] = str(cwd / "cell.tgz")
        env["CELL_PIECE"] = "300"  # bytes: the packed cell comes back in pieces, as a large one must
        done = subprocess.run(["bash", str(script), "cell"], capture_output=True, text=True, env=env, cwd=REPO)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    out = cell_check(machine1, tmp_path)
    assert "--grid data.class_order_seed=0,1,2 --jobs 3" in out and "--engine.compile step" in out
    assert f"--engine.compile_cache {cell}/.compile-cache" in out and "--budget-s 540" in out
    assert out.count("[new]") == 2 and "order1 [done]" in out and "sweep of 3 runs" in out  # order 1 finished
    assert "order0: its newest checkpoint, task 10 train" in out and "order1: finished" in out
    assert "compile cache .compile-cache: left behind" in out  # 300 bytes: no room for it
    pieces = sorted((machine1 / "out").glob("cell.tgz.*"))
    assert len(pieces) >= 2 and not (machine1 / "out" / "cell.tgz").exists() and "pieces (cell.tgz.00" in out
    (tmp_path / "joined.tgz").write_bytes(b"".join(p.read_bytes() for p in pieces))
    with tarfile.open(tmp_path / "joined.tgz") as tar:
        names = {n.removeprefix("./") for n in tar.getnames() if not tar.getmember(n).isdir()}
    # the newest checkpoint and the current task's static state of the unfinished run; the finished run's records
    assert names == {"order0/checkpoints/last.pt", "order0/checkpoints/task10-static.pt", "order0/run.log",
                     "order1/summary.json", "sweep.json"}  # fmt: skip
    for p in pieces:
        shutil.copy(p, tmp_path / p.name)
    out = cell_check(machine2, tmp_path)
    assert "continuing the runs carried in" in out
    moved = machine2 / "runs" / "cell"
    assert (moved / "order0" / "checkpoints" / "last.pt").read_bytes() == (run / "checkpoints" / "last.pt").read_bytes()
    assert (moved / "order0" / "checkpoints" / "task10-static.pt").exists()


def test_gpu_check_cell_runs_several_rows_on_chosen_orders_and_stage_keeps_data_parts(tmp_path):
    """``CELL_CONFIG`` with two rows and ``CELL_ORDERS=0``: one sweep of both rows on order 0, both at once, eager
    head without compiling under ``CELL_COMPILE=none``; ``stage`` keeps a call's data parts for the next call."""
    env = {**os.environ, "DRY_RUN": "1", "OUT": str(tmp_path / "out"), "RUNS": str(tmp_path / "runs"),
           "CELL_ORDERS": "0", "CELL_COMPILE": "none",
           "CELL_CONFIG": "configs/cifar100/n10.yaml+configs/cifar100/rdfcil_plus.yaml "
                          "configs/cifar100/n10.yaml+configs/cifar100/dpcr.yaml"}  # fmt: skip
    done = subprocess.run(["bash", str(BENCH / "gpu_check.sh"), "cell"], capture_output=True, text=True, env=env,
                          cwd=REPO)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "--grid data.class_order_seed=0 --jobs 2" in out and "sweep of 2 runs" in out
    assert "--engine.compile" not in out.split("sweep of")[0].replace("--engine.compile_cache", "")
    assert "rdfcil_plus [new]" in out and "dpcr [new]" in out
    # CELL_ARGS: a grid over the backbone for every row (the comparison at equal backbone), CELL_JOBS at once
    env |= {"CELL_CONFIG": "configs/cifar100/n10.yaml+configs/cifar100/dpcr.yaml", "CELL_JOBS": "2",
            "CELL_ARGS": "--grid model.backbone=resnet32,resnet18_cifar"}  # fmt: skip
    done = subprocess.run(["bash", str(BENCH / "gpu_check.sh"), "cell"], capture_output=True, text=True, env=env,
                          cwd=REPO)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "--jobs 2" in done.stdout and "sweep of 2 runs" in done.stdout
    assert "--model.backbone resnet18_cifar --out" in done.stdout and "--model.backbone resnet32 --out" in done.stdout

    root = tmp_path / "root" / "cifar100"
    root.mkdir(parents=True)
    rng = np.random.default_rng(0)
    arrays = {s: {"x": rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8), "y": np.arange(n) % 4}
              for s, n in (("train", 16), ("test", 8))}  # fmt: skip
    for split, a in arrays.items():
        np.savez(root / f"{split}.npz", **a)
    _load("pack_cifar").main(["pack", str(root.parent), str(tmp_path / "packed"), "--parts", "2"])
    for i in (0, 1):  # two calls, each bringing one part (and the index)
        (tmp_path / f"call{i}").mkdir()
        for f in (f"part{i}", "index.json"):
            shutil.copy(tmp_path / "packed" / f, tmp_path / f"call{i}" / f)
    env = {**os.environ, "OUT": str(tmp_path / "out"), "RUNS": str(tmp_path / "runs"),
           "STAGE": str(tmp_path / "stage"), "DATA": str(tmp_path / "data")}  # fmt: skip
    outs = []
    for i in (0, 1):
        done = subprocess.run(["bash", str(BENCH / "gpu_check.sh"), "stage"], capture_output=True, text=True,
                              env={**env, "DEVDATA": str(tmp_path / f"call{i}")}, cwd=REPO)  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        outs.append(done.stdout)
        assert (tmp_path / "data" / "cifar100" / "train.npz").exists() == (i == 1)
    assert "1 of 2 parts kept" in outs[0]
    assert "unpacked to" in outs[1]
    for split, a in arrays.items():
        with np.load(tmp_path / "data" / "cifar100" / f"{split}.npz") as got:
            assert np.array_equal(got["x"], a["x"]) and np.array_equal(got["y"], a["y"])


def test_concurrency_benchmarks_own_run_passes_the_schedule_checks():
    """The card's workload (concurrency.SHORT, which the CPU test replaces by the smoke preset) is a valid run: its
    milestone [2] was refused on the card (the base phase lasts 2 epochs)."""
    short = _load("concurrency").SHORT
    i = short.index("--config")
    args = [*short[:i], *(x for f in short[i + 1].split("+") for x in ("--config", f)), *short[i + 2 :]]
    command = [sys.executable, "-m", "dfcil", "train", *args, "--device", "cpu", "--dry-run", "--no-estimate"]
    done = subprocess.run([*command, "--out", "unused"], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr[-1000:]


@pytest.mark.slow
def test_concurrency_benchmark_prints_a_row_per_sweep(capsys):
    """The throughput table's plan on a CPU (two smoke sweeps, MPS off): the rows a card fills with 1, 3, 6 runs."""
    mod = _load("concurrency")
    mod.main(["--device", "cpu", "--jobs", "1,2", "--mps", "off", "--", "--config", "configs/smoke.yaml"])
    rows = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("| 1 |") or ln.startswith("| 2 |")]
    assert len(rows) == 2 and rows[0].split("|")[5].strip() == "1.00x"


def test_batched_orders_grouped_step_equals_separate_steps_and_is_timed(capsys):
    bench = _load("batched_orders")
    assert bench.main(["--check", "--backbone", "resnet8", "--models", "2", "--batch", "4", "--classes", "5"]) == 0
    assert "(equal)" in capsys.readouterr().out
    argv = ["--backbone", "resnet8", "--models", "2", "--batch", "4", "--classes", "5", "--rounds", "1", "--steps", "1"]
    assert bench.main([*argv, "--warmup", "1"]) == 0
    out = capsys.readouterr().out
    for side in ("one", "sequential", "grouped"):
        assert f"| {side} | " in out


def test_batched_orders_check_fails_when_the_groups_mix(monkeypatch, capsys):
    bench = _load("batched_orders")

    def mixed(self, x):  # option A padded across the groups instead of within each: model 1 sees model 0's channels
        y = bench.F.relu(self.bn_a(self.conv_a(x)))
        y = self.bn_b(self.conv_b(y))
        if self.increase_dim:
            sub = x[..., ::2, ::2]
            x = bench.torch.cat((sub, bench.torch.zeros_like(sub)), dim=1)
        return x + y

    monkeypatch.setattr(bench.GroupedBlock, "forward", mixed)
    assert bench.main(["--check", "--backbone", "resnet8", "--models", "2", "--batch", "4", "--classes", "5"]) == 1
    assert "(DIFFERENT)" in capsys.readouterr().out


def test_collect_reads_facils_accuracy_matrix_by_training_task_rows(tmp_path):
    """FACIL's acc_tag[t][u] is test task u after training task t: A_t is row t's mean over u <= t, old is the
    mean over u < t and new is u = t (the authors' AdaGauss log prints the same Avg. per row)."""
    collect = _load("authors/collect")
    (tmp_path / "exp" / "results").mkdir(parents=True)
    rows = ["0.716 0 0 0", "0.646 0.282 0 0", "0.616 0.250 0.140 0", "0.572 0.244 0.132 0.140"]
    (tmp_path / "exp" / "results" / "acc_tag-1.txt").write_text("\n".join(rows) + "\n")
    assert collect.facil_rows(str(tmp_path)) == [71.6, 46.4, 33.53, 27.2]
    assert collect.facil_old_new(str(tmp_path))[1:] == [(64.6, 28.2), (43.3, 14.0), (31.6, 14.0)]


def _queue():
    """benchmarks/gpu_queue.py, registered as a module (its dataclasses need it)."""
    if "gpu_queue" not in sys.modules:
        spec = importlib.util.spec_from_file_location("gpu_queue", BENCH / "gpu_queue.py")
        sys.modules["gpu_queue"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules["gpu_queue"])
    return sys.modules["gpu_queue"]


def _queue_file(tmp_path, **item):
    """A queue of one item: R-DFCIL on CIFAR-100 N=10, class order 0, with ``item``'s fields on top."""
    entry = {"id": "t", "title": "test item", "rows": ["configs/cifar100/n10.yaml+configs/cifar100/rdfcil.yaml"],
             "orders": [0], "compile": "none"} | item  # fmt: skip
    path = tmp_path / "queue.yaml"
    path.write_text(__import__("yaml").safe_dump({"items": [entry]}))
    return path


def test_queue_table_is_the_one_in_docs_gpu_md(capsys):
    """docs/gpu.md's queue is what `python benchmarks/gpu_queue.py table` prints from benchmarks/queue.yaml."""
    assert _queue().main(["table"]) == 0
    printed = capsys.readouterr().out.strip()
    docs = (REPO / "docs" / "gpu.md").read_text()
    start, end = "<!-- the queue: python benchmarks/gpu_queue.py table -->\n", "\n<!-- end of the queue -->"
    assert docs[docs.index(start) + len(start) : docs.index(end)] == printed, "run the command, paste its table"


def test_queue_estimates_count_each_presets_steps_at_the_measured_step_times():
    """A run's seconds task by task, by hand from the step times (ms) and each preset's schedule: 500 images a class,
    drop_last batches; the queue never plans a done order again."""
    q = _queue()
    ms, extra = q.STEP_MS["graphs"], q.TASK_EXTRA_S
    n5 = q.run_costs("configs/cifar100/n5.yaml+configs/cifar100/rdfcil.yaml", {}, 1, compiled=False)
    later = extra + (5000 * ms["inversion"] + 160 * 78 * ms["rrl"] + 40 * 78 * ms["chr"]) / 1e3  # 78 = 10000 // 128
    assert n5.name == "rdfcil-order1" and len(n5.tasks) == 5 and not n5.upper_bound
    assert n5.tasks == pytest.approx([extra + 160 * 78 * ms["base"] / 1e3] + [later] * 4)
    assert n5.tasks[1] == pytest.approx(158.2, abs=0.1)  # measured on the H200: 155-159 s (docs/notes/measurements.md)
    r18 = {"model.backbone": "resnet18_cifar"}
    dpcr = q.run_costs("configs/cifar100/n10.yaml+configs/cifar100/dpcr.yaml", r18, 0, compiled=False)
    cost = q.BACKBONE_COST["resnet18_cifar"]
    assert dpcr.upper_bound and dpcr.tasks[0] == pytest.approx(extra + 200 * 39 * ms["base"] * cost / 1e3)
    assert dpcr.tasks[1] == pytest.approx(extra + 100 * 39 * ms["base"] * (1 + q.FORWARD_SHARE) * cost / 1e3)
    ada = q.run_costs("configs/cifar100/n10.yaml+configs/cifar100/adagauss.yaml", {}, 0, compiled=False)
    assert ada.tasks[0] == pytest.approx(extra + 200 * 78 * ms["base"] * (64 * 4 / 128) / 1e3)  # 5000 // 64, rotations
    items = {i.id: i for i in q.load_queue()}
    assert [r.name for r in items["3a"].runs()] == ["rdfcil-order1", "rdfcil-order2"]  # order 0 is done
    assert items["3a"].cell_env()["CELL_ORDERS"] == "1,2"
    assert q.plan(list(items.values()), 540, wanted="3b")[1] is False  # covered by items 1 and 2: never run itself


def test_queue_window_shares_the_card_and_stops_at_task_boundaries():
    """Two runs at once each go share(2) times slower; the one left alone goes at full speed; a run that has timed
    a later task does not start one it would not finish."""
    q = _queue()
    a, b = q.Run("a", (10.0, 10.0, 10.0), False, False), q.Run("b", (10.0,), False, False)
    first = (q.PROCESS_START_S + 10) * q.share(2)
    assert q.window([a, b], {}, math.inf).used == pytest.approx(first + 20)
    w = q.window([a, b], {}, first + 15)  # a: task 1 ends at first + 10; task 2 would end at first + 20
    assert w.after == {"a": 2, "b": 1} and w.stopped == {"a": "paused"} and w.used == pytest.approx(first + 10)
    w = q.window([a, b], {}, first - 1)
    assert w.after == {"a": 0, "b": 0} and w.stopped == {"a": "deadline", "b": "deadline"}


def test_queue_model_is_calibrated_as_its_docstring_says():
    """SHARE_2 is the fitted one, every measured task time within 25 %, the ResNet-18 cost its MAC ratio."""
    from torch.utils.flop_counter import FlopCounterMode

    from dfcil.models.resnet import BACKBONES

    q = _queue()
    assert q.fitted_share() == pytest.approx(q.SHARE_2, abs=0.005)
    for m in q.MEASURED:
        model = q.modelled_alone(m) * q.share(m.at_once)
        assert m.seconds[0] * 0.75 <= model <= m.seconds[1] * 1.25, m.what
    macs = {}
    for name in ("resnet32", "resnet18_cifar", "resnet18_cifar_b64"):
        with FlopCounterMode(display=False) as count:
            BACKBONES.get(name)().eval()(torch.zeros(1, 3, 32, 32))
        macs[name] = count.get_total_flops()
    for name in ("resnet18_cifar", "resnet18_cifar_b64"):
        assert macs[name] / macs["resnet32"] == pytest.approx(q.BACKBONE_COST[name], abs=0.01)


def test_queue_plan_refuses_reaches_a_boundary_or_runs_to_the_end(tmp_path, capsys):
    """`plan --left`: too little time for any task boundary is refused (exit 3); more reaches boundaries, then
    packs; enough runs the item to its end. A partial item continues from its pack, and is refused without it."""
    q = _queue()
    queue = _queue_file(tmp_path)

    def plan(*args):
        code = q.main(["--queue", str(queue), "plan", *args])
        return code, capsys.readouterr().out

    code, out = plan("--left", "20")
    assert code == 3 and "# refused: cannot reach a resumable point" in out and "CELL_CONFIG" not in out
    code, out = plan("--left", "20", "--force")
    assert code == 0 and "# forced (QUEUE_FORCE=1)" in out
    code, out = plan("--left", "100")
    assert code == 0 and "# verdict: reaches task boundary 1 of run rdfcil-order0, then packs" in out
    assert "reaches task boundary 1 of 10 (task 0), then stops inside task 1" in out  # no later task timed: it goes on
    assert "CELL_CONFIG=configs/cifar100/n10.yaml+configs/cifar100/rdfcil.yaml\nCELL_ORDERS=0\n" in out
    assert "CELL_COMPILE=none" in out and "CELL_BUDGET=100" in out and "CELL_FROM" not in out
    assert "a model from step times measured on an H200, not a measurement" in out
    code, out = plan("--left", "3000")
    assert code == 0 and "# verdict: runs to the end" in out
    pack = tmp_path / "packs" / "t" / "cell.tgz"
    queue = _queue_file(tmp_path, state="partial", pack=str(pack), progress={"rdfcil-order0": 9})
    code, out = plan("--left", "20")
    assert code == 3 and "pack" in out and "is not here" in out
    pack.parent.mkdir(parents=True)
    pack.write_bytes(b"")
    code, out = plan("--left", "200")  # task 9 of 10 only: its last task ends in 200 s
    assert code == 0 and "run rdfcil-order0: task 9 of 10, runs to the end" in out and f"CELL_FROM={pack}" in out


def test_gpu_check_queue_dry_run_prints_the_plan_and_the_cells_dry_run(tmp_path):
    """`DRY_RUN=1 bash benchmarks/gpu_check.sh queue` on a CPU: the plan of the queue's first item not done, then
    the cell stage's dry run with the item's settings in $RUNS/queue-<id>; a partial item is unpacked from its pack;
    a refused item runs nothing."""
    env = {**os.environ, "DRY_RUN": "1", "OUT": str(tmp_path / "out"), "RUNS": str(tmp_path / "runs")}

    def queue(**more):
        done = subprocess.run(["bash", str(BENCH / "gpu_check.sh"), "queue"], capture_output=True, text=True,
                              env=env | more, cwd=REPO)  # fmt: skip
        return done.returncode, done.stdout + done.stderr

    code, out = queue()  # benchmarks/queue.yaml itself
    assert code == 0, out
    first = next(i for i in _queue().load_queue() if not i.covered_by and i.state != "done")
    assert f"# queue item {first.id}: " in out and "# verdict: " in out
    assert f"cell: would run (for 540 s at most): python3 -m dfcil sweep --config {first.rows[0]}" in out
    assert f"--out {tmp_path}/runs/queue-{first.id} --budget-s 540" in out
    assert (tmp_path / "out" / "queue-plan.txt").read_text().startswith(f"# queue item {first.id}: ")

    pack = tmp_path / "packs" / "t" / "cell.tgz"  # a partial item: three orders, order 0 done elsewhere
    (tmp_path / "cell" / "rdfcil-order1").mkdir(parents=True)
    (tmp_path / "cell" / "rdfcil-order1" / "run.log").write_text("task 0 done\n")
    (tmp_path / "cell" / "sweep.json").write_text("{}")
    pack.parent.mkdir(parents=True)
    with tarfile.open(pack, "w:gz") as tar:
        tar.add(tmp_path / "cell", arcname=".")
    path = _queue_file(tmp_path, id="7", orders=[0, 1, 2], done_orders=[0], state="partial", pack=str(pack),
                       progress={"rdfcil-order1": 1}, overrides={"model.backbone": "resnet32"})  # fmt: skip
    code, out = queue(QUEUE_FILE=str(path), QUEUE_LEFT="300")
    assert code == 0, out
    assert "# queue item 7: test item (partial)" in out and "run rdfcil-order2: reaches task boundary" in out
    assert "--grid data.class_order_seed=1,2 --jobs 2" in out and "--model.backbone resnet32" in out
    assert f"cell: continuing the runs carried in {pack}" in out and "--budget-s 300" in out
    assert (tmp_path / "runs" / "queue-7" / "rdfcil-order1" / "run.log").exists()
    code, out = queue(QUEUE_FILE=str(path), QUEUE_LEFT="10")
    assert code == 3 and "# refused: " in out and "queue: nothing run" in out and "cell: would run" not in out


def test_fingerprint_runs_a_mini_overlay_as_a_variant_of_the_method_it_names(tmp_path):
    """`fingerprint.py --methods lwf_ldc`: LwF + LDC is a switch of LwF, not a registered method; its overlay's method
    section runs on LwF's smoke preset (so the pairing of its rows across commits is checked too); a name that is
    neither is refused, naming it."""
    import yaml

    fingerprint = _load("fingerprint")
    method, configs = fingerprint.variant("lwf_ldc", tmp_path)
    assert method == "lwf" and configs[0] == REPO / "configs" / "smoke.yaml"
    assert yaml.safe_load(configs[-1].read_text())["method"] == {
        "name": "lwf", "lambda_kd": 10.0, "temperature": 2.0, "head": "cosine", "ce": "local", "ldc": True
    }  # fmt: skip
    from dfcil.load import load_config

    cfg, _ = load_config(configs, [("method.name", method)])
    assert cfg.method.ldc is True and cfg.data.name == "fake"
    method, configs = fingerprint.variant("rdfcil_plus_cycle", tmp_path)  # the protocol's 80 inversion steps left out
    cfg, _ = load_config(configs, [("method.name", method)])
    assert method == "rdfcil_plus" and cfg.method.cycle is True
    assert cfg.method.inversion.steps == load_config(fingerprint.smoke_configs(method))[0].method.inversion.steps
    with pytest.raises(SystemExit, match="--methods nonesuch: neither a registered method nor an overlay"):
        fingerprint.variant("nonesuch", tmp_path)
