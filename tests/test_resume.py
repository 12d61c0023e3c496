"""Crash safety: kill or interrupt runs anywhere, resume them, and get exactly the uninterrupted result."""

import collections
import hashlib
import io
import json
import logging
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from filelock import FileLock

from conftest import CONFIGS, StopAfterEpochs
from dfcil.checkpoint import FORMAT, MAGIC, Checkpointer, dumps, loads, peek_position, static_parts
from dfcil.cli import main
from dfcil.errors import CheckpointError, RunInterrupted
from dfcil.load import load_config
from dfcil.runs.runner import train
from dfcil.training.callbacks import Callback
from dfcil.training.loop import RunOptions
from dfcil.training.state import Interrupt

SMOKE = str(CONFIGS / "smoke.yaml")
# 15 steps per epoch; task 1: 40 inversion steps (checkpointed every step), 2 RRL and 3 CHR epochs
ARGS = [
    "--train.batch_size", "16", "--train.epochs", "5", "--train.milestones", "[1]", "--method.chr_epochs", "3",
    "--method.inversion.steps", "40", "--method.inversion.zdim", "32", "--checkpoint_interval_s", "0",
]  # fmt: skip
VOLATILE = {"timings", "wall_time_s", "total_time_s", "resumed", "run_id"}  # run_id: each run its own


def _summary(run):
    s = json.loads((run / "summary.json").read_text())
    return {k: v for k, v in s.items() if k not in VOLATILE}


def _weights(run):
    return loads((run / "model.pt").read_bytes())["net"]


def _records(run):
    out = []
    for line in (run / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        out.append((r["type"], r["task"], r.get("phase"), r.get("epoch"), r.get("loss"), r.get("acc")))
    return out


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("ref") / "run"
    assert main(["train", "--config", SMOKE, "--out", str(out), "--no-progress", *ARGS]) == 0
    return out


def assert_same_run(a, b):
    assert _summary(a) == _summary(b)
    wa, wb = _weights(a), _weights(b)
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k
    assert _records(a) == _records(b)


def _work(run):
    """Each task's timed parts and each phase's trained images: what a report reads, however the run was split."""
    timings = json.loads((run / "summary.json").read_text())["timings"]
    return [(sorted(t), {name: p["images"] for name, p in t["phases"].items()}) for t in timings]


def test_reference_run_reports_every_phase_and_its_images(reference):
    # 15 steps of 16 images per epoch: 5 epochs less 3 CHR ones: task 0 trains 2; task 1 2 RRL and 3 CHR epochs
    keys = ["end_units", "eval_s", "peak_memory_mb", "phases", "setup_s", "task"]
    assert _work(reference) == [(keys, {"base": 480}), (keys, {"rrl": 480, "chr": 720})]


def _position(run):
    try:
        return loads(Checkpointer(run).last.read_bytes())["position"]
    except (OSError, CheckpointError):
        return None


def _start(out):
    cmd = [sys.executable, "-m", "dfcil", "train", "--config", SMOKE, "--out", str(out), "--no-progress", *ARGS]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _peek_position(run):
    """The newest checkpoint's position, cheaply: a full ``loads`` at 200 polls a second slowed the watched run
    fivefold."""
    try:
        return peek_position(Checkpointer(run).last.read_bytes())
    except (OSError, CheckpointError):
        return None


def _wait_for(proc, out, predicate, timeout=600):  # a deadline only: a busy machine runs slowly
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pos = _peek_position(out)
        if pos is not None and predicate(pos):
            return pos
        if proc.poll() is not None:
            pytest.fail(f"the run ended before the kill point: {proc.stderr.read()}")
        time.sleep(0.005)
    proc.kill()
    pytest.fail("kill point not reached in time")


@pytest.mark.parametrize(
    "where",
    [
        pytest.param(lambda p: p["task"] == 1 and p["stage"] == "setup", id="inversion", marks=pytest.mark.slow),
        pytest.param(
            lambda p: p["task"] == 1 and p["stage"] == "train" and p["phase"] == 0 and p["epoch"] >= 1, id="rrl"
        ),
        pytest.param(
            lambda p: p["task"] == 1 and p["stage"] == "train" and p["phase"] == 1 and p["epoch"] >= 1,
            id="chr",
            marks=pytest.mark.slow,
        ),
    ],
)
def test_sigkill_anywhere_then_resume_is_exact(reference, tmp_path, where):
    out = tmp_path / "run"
    proc = _start(out)
    _wait_for(proc, out, where)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL
    assert not (out / "summary.json").exists()
    assert main(["resume", str(out), "--no-progress"]) == 0
    assert json.loads((out / "summary.json").read_text())["resumed"] is True
    assert_same_run(reference, out)
    assert _work(out) == _work(reference)  # the killed process's setup and phases are still reported


def _sigterm_in_rrl(tmp_path, attempts=3):
    """A run stopped by SIGTERM in RRL's second epoch: the signal is sent once RRL's first epoch is checkpointed.
    A loaded machine can finish the 15-step epoch before the signal lands (the stop is then at the phase's end):
    that attempt is dropped and a fresh run tried."""
    for attempt in range(attempts):
        out = tmp_path / f"run{attempt}"
        proc = _start(out)
        _wait_for(proc, out, lambda p: p["task"] == 1 and p["stage"] == "train" and p["phase"] == 0 and p["epoch"] >= 1)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 130
        err = proc.stderr.read()
        assert f"Continue with: dfcil resume {out}" in err
        pos = _position(out)
        assert pos["task"] == 1 and pos["stage"] == "train"
        if pos["phase"] == 0 and pos["step"] > 0:  # mid-epoch
            return out
    pytest.fail(f"no SIGTERM of {attempts} landed inside an RRL epoch (the last stopped at {pos})")


def test_sigterm_checkpoints_mid_epoch_and_says_how_to_resume(reference, tmp_path):
    # a checkpoint at the setup's end is also "train" in phase 0: a signal then would stop the run before RRL began
    out = _sigterm_in_rrl(tmp_path)
    payload = loads(Checkpointer(out).last.read_bytes())
    kept, kept_task = payload["elapsed_s"], payload["callbacks"]["timer"]["task"]  # the timer's own state
    assert kept > 0
    assert kept_task["task"] == 1 and kept_task["setup_s"] > 0 and 0 < kept_task["phases"]["rrl"]["images"] < 480
    assert main(["resume", str(out), "--no-progress"]) == 0
    assert_same_run(reference, out)
    summary = json.loads((out / "summary.json").read_text())  # the first process's kept time is counted
    assert summary["total_time_s"] == pytest.approx(kept + summary["wall_time_s"], abs=1.0)
    assert _work(out) == _work(reference)  # the task's setup and its RRL images before the stop are counted
    task1 = summary["timings"][1]
    assert task1["setup_s"] == kept_task["setup_s"]  # the setup ran in the first process only
    assert task1["phases"]["rrl"]["time_s"] > kept_task["phases"]["rrl"]["time_s"]


def _unfinished(tmp_path, epochs=3):
    cfg = load_config([SMOKE], [(ARGS[i][2:], ARGS[i + 1]) for i in range(0, len(ARGS), 2)])[0]
    out = tmp_path / "run"
    interrupt = Interrupt()
    with pytest.raises(RunInterrupted):
        train(
            cfg,
            out,
            options=RunOptions(progress=False, interrupt=interrupt, callbacks=[StopAfterEpochs(interrupt, epochs)]),
        )
    return cfg, out


class _Crash(Exception):
    pass


class _CrashAfterEpochs(Callback):
    """A hard crash after ``n`` epochs: no interrupt, no checkpoint of its own."""

    def __init__(self, n):
        self.n = n

    def on_epoch_end(self, record):
        self.n -= 1
        if self.n == 0:
            raise _Crash


def test_epoch_checkpoints_follow_the_interval_and_a_crash_loses_only_what_followed(reference, tmp_path, monkeypatch):
    overrides = [(ARGS[i][2:], ARGS[i + 1]) for i in range(0, len(ARGS), 2)]
    sparse = [("checkpoint_interval_s", "3600"), ("epoch_checkpoint_interval_s", "3600")]
    cfg = load_config([SMOKE], [*overrides, *sparse])[0]
    saved, save = [], Checkpointer.save
    monkeypatch.setattr(Checkpointer, "save", lambda self, p, *a: (saved.append(p["position"]), save(self, p, *a))[1])
    out = tmp_path / "run"
    with pytest.raises(_Crash):  # task 0: 2 epochs; task 1: 2 RRL epochs, then a crash after the 2nd CHR epoch
        train(cfg, out, options=RunOptions(progress=False, callbacks=[_CrashAfterEpochs(6)]))
    # after each setup, at each phase's end and each task's end; no epoch-end checkpoint inside a phase
    assert [(p["task"], p["stage"], p["phase"], p["epoch"], p["step"]) for p in saved] == [
        (0, "train", 0, 0, 0), (0, "train", 0, 2, 0), (1, "start", 0, 0, 0), (1, "train", 0, 0, 0),
        (1, "train", 0, 2, 0),
    ]  # fmt: skip
    last = loads(Checkpointer(out).last.read_bytes())
    assert (out / "metrics.jsonl").stat().st_size > last["metrics_bytes"]  # CHR records the resume must drop
    monkeypatch.undo()
    assert main(["resume", str(out), "--no-progress"]) == 0
    assert_same_run(reference, out)


def test_checkpoint_holds_everything(tmp_path):
    _, out = _unfinished(tmp_path)
    payload = loads(Checkpointer(out).last.read_bytes())
    assert payload["position"] == {"task": 1, "stage": "train", "phase": 0, "epoch": 1, "step": 0}
    assert {
        "net",
        "optimizer",
        "method",
        "static",
        "acc",
        "rng",
        "head_sizes",
        "config",
        "metrics_bytes",
        "elapsed_s",
    } <= set(payload)
    assert set(payload["rng"]) == {"python", "numpy", "torch", "cuda", "generators"}
    assert {"projector", "class_counts", "class_weights", "task_id"} <= set(payload["method"])
    static = Checkpointer(out).load_static(1, payload["static"]["digest"])
    assert {"teacher", "generator"} <= set(static["replay"])  # the trained generator: inversion is never redone
    assert payload["acc"]["rows_done"] == 1


def test_changed_protocol_is_refused_runtime_keys_are_not(reference, tmp_path, capsys):
    cfg, out = _unfinished(tmp_path)
    args = ["train", "--config", SMOKE, "--out", str(out), "--no-progress", *ARGS]
    assert main([*args, "--data.num_tasks", "5", "--seed", "3"]) == 2
    err = capsys.readouterr().err
    assert "different config (data.num_tasks, seed)" in err and f"dfcil resume {out}" in err
    runtime = ["--device", "cpu", "--checkpoint_interval_s", "5", "--engine.cuda_graphs", "check"]
    orphans = [out / "checkpoints" / ".last.pt.0123456789abcdef.tmp", out / ".metrics.jsonl.fedcba9876543210.tmp"]
    for orphan in orphans:  # what a process killed mid-write leaves
        orphan.write_bytes(b"partial")
    (out / ".notes.tmp").write_text("the user's")
    assert main([*args, *runtime]) == 0  # runtime keys may change
    assert not any(o.exists() for o in orphans) and (out / ".notes.tmp").exists()
    assert_same_run(reference, out)
    meta = json.loads((out / "meta.json").read_text())  # the continuation is on record, with its code
    assert [r["code"] for r in meta["resumes"]] == [meta["code"]] and "--checkpoint_interval_s" in meta["resumes"][0][
        "argv"
    ]


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (("epochs: 5", "epochs: 6"), "train.epochs: 5 in the checkpoint, 6 now"),
        pytest.param(("seed: 1", "seed: 2"), "seed: 1 in the checkpoint, 2 now", marks=pytest.mark.slow),
        pytest.param(
            ("backbone: resnet8", "backbone: resnet20"),
            'model.backbone: "resnet8" in the checkpoint, "resnet20" now',
            marks=pytest.mark.slow,
        ),
        pytest.param(
            ("num_tasks: 2", "num_tasks: 3"), "data.num_tasks: 2 in the checkpoint, 3 now", marks=pytest.mark.slow
        ),
    ],
)
def test_resume_refuses_an_edited_config_yaml_and_leaves_the_run_as_it_was(reference, tmp_path, capsys, edit, message):
    """config.yaml is what resume reads; edited, it would give a mixed run: the checkpoint's own config decides."""
    _, out = _unfinished(tmp_path)
    saved = (out / "config.yaml").read_text()
    assert edit[0] in saved
    (out / "config.yaml").write_text(saved.replace(edit[0], edit[1], 1))
    before = {p.name: p.read_bytes() for p in (out / "checkpoints").iterdir()}
    capsys.readouterr()
    assert main(["resume", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert message in err and "config.yaml edited? Put it back" in err
    assert "Traceback" not in err  # one line on the console; the traceback is in run.log
    assert "Traceback" in (out / "run.log").read_text()
    assert {p.name: p.read_bytes() for p in (out / "checkpoints").iterdir()} == before
    (out / "config.yaml").write_text(saved)
    assert main(["resume", str(out), "--no-progress"]) == 0  # put back, the run continues exactly
    assert_same_run(reference, out)


def test_resume_may_switch_cuda_graphs_and_the_data_root(reference, tmp_path):
    """After a failed capture stopped a run, `dfcil resume DIR --engine.cuda_graphs off` continues it; data moved
    elsewhere is found with --data.root."""
    _, out = _unfinished(tmp_path)
    args = ["resume", str(out), "--no-progress", "--engine.cuda_graphs", "check", "--data.root", str(tmp_path)]
    assert main(args) == 0
    assert_same_run(reference, out)


def test_resume_takes_every_runtime_key_and_refuses_the_others(reference, tmp_path, monkeypatch, capsys):
    """Every key the README calls a runtime key is accepted by `dfcil resume` as --KEY VALUE and reaches the run;
    the rest are refused with one line; a resume with two of them continues the run exactly."""
    from dfcil.config import RUNTIME_KEYS
    from dfcil.runs import runner

    _, out = _unfinished(tmp_path)
    values = {
        "device": "cpu", "checkpoint_interval_s": "30", "epoch_checkpoint_interval_s": "5",
        "task0_cache": str(tmp_path / "t0"), "engine.cuda_graphs": "off", "data.root": str(tmp_path),
        "data.download": "false", "data.cache": str(tmp_path / "cache"), "data.workers": "1", "log": "csv",
        "data.rebuild": "true", "engine.compile_cache": str(tmp_path / "cc"), "train.max_loss": "1000.5",
        "wandb.project": "p", "wandb.entity": "e", "wandb.name": "n", "wandb.group": "g",
    }  # fmt: skip
    assert set(values) == RUNTIME_KEYS
    seen = {}

    def resume(run_dir, overrides, options, consent=None):
        return seen.update(overrides) or {}

    monkeypatch.setattr(runner, "resume", resume)
    for key, value in values.items():
        assert main(["resume", str(out), f"--{key}", value]) == 0, key
    assert seen == {**{k: v for k, v in values.items()}, "checkpoint_interval_s": 30, "epoch_checkpoint_interval_s": 5,
                    "data.download": False, "data.workers": 1, "log": ["csv"], "data.rebuild": True,
                    "train.max_loss": 1000.5}  # fmt: skip
    assert main(["resume", str(out), "--train.epochs", "9"]) == 2
    assert "--train.epochs: dfcil resume may change only the runtime keys" in capsys.readouterr().err
    monkeypatch.undo()
    assert main(["resume", str(out), "--no-progress", "--checkpoint_interval_s", "30", "--data.workers", "1"]) == 0
    assert_same_run(reference, out)


def test_resume_refuses_finished_and_foreign_directories(reference, tmp_path, capsys):
    # a finished run: nothing to resume, and no error, as `dfcil train` of it (a loop `until dfcil resume RUN` ends)
    summary = (reference / "summary.json").read_bytes()
    assert main(["resume", str(reference)]) == 0
    assert "holds this run, finished" in capsys.readouterr().err
    assert (reference / "summary.json").read_bytes() == summary
    assert main(["train", "--config", SMOKE, "--out", str(reference), "--no-progress", *ARGS, "--seed", "5"]) == 2
    err = capsys.readouterr().err  # a finished run is not offered for resuming
    assert "holds a finished run with a different config (seed); choose another --out" in err and "resume" not in err
    assert main(["resume", str(tmp_path)]) == 2
    assert "not a dfcil run directory" in capsys.readouterr().err


def test_truncated_checkpoint_falls_back_to_the_previous_one(reference, tmp_path, caplog):
    _, out = _unfinished(tmp_path)
    last = Checkpointer(out).last
    last.write_bytes(last.read_bytes()[: last.stat().st_size // 2])
    assert main(["resume", str(out), "--no-progress"]) == 0
    assert "trying the previous checkpoint" in (out / "run.log").read_text()
    assert_same_run(reference, out)


def test_tampered_checkpoints_are_rejected(tmp_path):
    _, out = _unfinished(tmp_path)
    ck = Checkpointer(out)
    data = bytearray(ck.last.read_bytes())
    data[-100] ^= 0xFF
    with pytest.raises(CheckpointError, match="checksum mismatch"):
        loads(bytes(data))
    for path in (ck.last, ck.prev):
        path.write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="no usable checkpoint"):
        ck.load_latest()


def _saved(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _crafted(archive, block=b""):
    """Checkpoint bytes around ``archive`` with a valid header and digest: only the loader's own checks stand."""
    rest = len(archive).to_bytes(8, "little") + archive + block
    return MAGIC + hashlib.sha256(rest).digest() + rest


def _equal(a, b):
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return type(a) is type(b) and list(a) == list(b) and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def _mixed_payload():
    g = torch.Generator().manual_seed(0)
    return {
        "format": FORMAT,
        "net": collections.OrderedDict(
            w=torch.randn(4, 3, 3, 3, generator=g), n=torch.tensor(7), half=torch.randn(5, generator=g).bfloat16()
        ),
        "optimizer": {"state": {0: {"momentum_buffer": torch.randn(2, 6, generator=g)[:, ::2]}}, "lr": [0.1]},
        "rng": (torch.get_rng_state(), [torch.ones(3, dtype=torch.bool)], "mt"),
        "empty": torch.empty(0, 4),
        "plain": {"x": None, "y": 1.5, "z": "text", "nested": [[torch.arange(3, dtype=torch.int16)]]},
        "not_a_reference": {"__dfcil_tensor__": "a user's own key", "other": 1},
    }


def test_atomic_writes_get_the_modes_of_ordinary_files(tmp_path):
    """Run files are readable by whoever the umask lets read them (mkstemp alone makes them 0600)."""
    from dfcil.io import write_atomic

    old = os.umask(0o022)
    try:
        write_atomic(tmp_path / "a.json", "{}")
        (tmp_path / "b.log").write_text("")
    finally:
        os.umask(old)
    assert (tmp_path / "a.json").stat().st_mode & 0o777 == (tmp_path / "b.log").stat().st_mode & 0o777 == 0o644


def test_checkpoint_bytes_round_trip_every_dtype_shape_and_container():
    payload = _mixed_payload()
    data = dumps(payload)
    assert data.startswith(MAGIC)
    back = loads(data)
    assert _equal(payload, back)
    assert back["net"]["w"].untyped_storage().data_ptr() != back["net"]["n"].untyped_storage().data_ptr()
    with pytest.raises(ValueError, match="reserved"):  # a dict that would read back as a tensor reference
        dumps({"format": FORMAT, "x": {"__dfcil_tensor__": 0}})


@pytest.mark.parametrize(
    "index, message",
    [
        ([("float32", (2, 2), 10**6)], "outside the block"),
        ([("float32", (-1, 4), 0)], "outside the block"),
        ([("no_such_dtype", (2,), 0)], "malformed tensor index"),
        ([("float32", "2", 0)], "malformed tensor index"),
    ],
)
def test_a_crafted_tensor_index_is_an_error_not_a_crash(index, message):
    archive = _saved({"tensors": index, "payload": {"format": FORMAT, "w": {"__dfcil_tensor__": 0}}})
    with pytest.raises(CheckpointError, match=message):
        loads(_crafted(archive, bytes(16)))
    archive = _saved({"tensors": [], "payload": {"format": FORMAT, "w": {"__dfcil_tensor__": 3}}})
    with pytest.raises(CheckpointError, match="refers to a tensor it does not hold"):
        loads(_crafted(archive))


class _Evil:
    def __reduce__(self):
        return (os.system, ("touch pwned",))


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
@pytest.mark.parametrize("zip_format", [True, False])
def test_a_malicious_pickle_in_a_checkpoint_never_runs(tmp_path, monkeypatch, zip_format):
    import pickle

    monkeypatch.chdir(tmp_path)
    evil = {"format": 1, "net": _Evil()}
    body = _saved(evil) if zip_format else pickle.dumps(evil)
    crafted = _crafted(body)  # the evil object in the archive: only weights_only stops it
    with pytest.raises(CheckpointError, match="not allowed"):
        loads(crafted)
    assert not (tmp_path / "pwned").exists()
    # and through the CLI, in place of a run's checkpoints
    _, out = _unfinished(tmp_path)
    for path in (Checkpointer(out).last, Checkpointer(out).prev):
        path.write_bytes(crafted)
    assert main(["resume", str(out), "--no-progress"]) == 2
    assert not (tmp_path / "pwned").exists() and not (out / "pwned").exists()


def test_two_processes_never_share_a_run_directory(tmp_path, capsys):
    _, out = _unfinished(tmp_path)
    with FileLock(out / ".lock"):
        assert main(["resume", str(out), "--no-progress"]) == 2
    assert "in use by another dfcil process" in capsys.readouterr().err


def test_non_finite_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path, capsys):
    out = tmp_path / "run"
    rc = main(["train", "--config", SMOKE, "--out", str(out), "--no-progress", *ARGS, "--method.lambda_hkd", "1e39"])
    assert rc == 3  # EXIT_DIVERGED: a sweep does not retry it
    err = capsys.readouterr().err
    assert "loss term 'hkd' became non-finite in task 1, phase rrl, epoch 0, step 0" in err
    assert _position(out) == {"task": 1, "stage": "train", "phase": 0, "epoch": 0, "step": 0}
    assert not (out / "summary.json").exists()


def test_a_loss_past_the_limit_stops_as_diverged_and_resumes_with_another_limit(tmp_path, capsys):
    """A loss that explodes while finite (train.max_loss on an epoch's mean) stops like a non-finite one, before
    the epoch's checkpoint; the limit is a runtime key, so the same run continues under another one."""
    out = tmp_path / "run"
    base = ["--config", SMOKE, "--out", str(out), "--no-progress", "--method.name", "finetune", "--train.epochs", "2"]
    base += ["--train.milestones", "[]", "--train.batch_size", "16", "--checkpoint_interval_s", "0"]
    assert main(["train", *base, "--train.max_loss", "1e-6"]) == 3  # task 0's CE is far above it
    err = capsys.readouterr().err
    assert "dfcil: training stopped: loss term 'ce' averaged" in err
    assert "in task 0, phase train, epoch 0, above train.max_loss (1e-06): the training diverged" in err
    assert _position(out) == {"task": 0, "stage": "train", "phase": 0, "epoch": 0, "step": 0}  # not the diverged epoch
    assert not (out / "summary.json").exists()
    assert main(["resume", str(out), "--no-progress", "--train.max_loss", "null"]) == 0
    assert json.loads((out / "summary.json").read_text())["last_acc"] is not None


def test_shared_first_task_model_gives_the_same_run(tmp_path):
    cache = tmp_path / "task0"
    base = ["--config", SMOKE, "--no-progress", "--train.milestones", "[]"]
    # finetune trains 2 epochs of CE in task 0, exactly like rdfcil with 3 epochs of which 1 is CHR
    ft = ["train", *base, "--method.name", "finetune", "--train.epochs", "2", "--task0_cache", str(cache)]
    assert main([*ft, "--out", str(tmp_path / "ft")]) == 0
    assert len(list(cache.glob("task0-*.pt"))) == 1
    stored = next(cache.glob("task0-*.pt"))
    assert main(["train", *base, "--out", str(tmp_path / "plain")]) == 0
    assert main(["train", *base, "--out", str(tmp_path / "shared"), "--task0_cache", str(cache)]) == 0
    first = json.loads((tmp_path / "shared" / "metrics.jsonl").read_text().splitlines()[0])
    assert first["type"] == "task" and "shared_task0" in first  # task 0 was not trained again
    assert not any(json.loads(line).get("task") == 0 and json.loads(line)["type"] == "epoch"
                   for line in (tmp_path / "shared" / "metrics.jsonl").read_text().splitlines())  # fmt: skip
    assert _summary(tmp_path / "plain")["accuracy_matrix"] == _summary(tmp_path / "shared")["accuracy_matrix"]
    wa, wb = _weights(tmp_path / "plain"), _weights(tmp_path / "shared")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    # a different recipe does not match the stored model
    other = ["train", *base, "--train.lr", "0.05", "--task0_cache", str(cache), "--out", str(tmp_path / "o")]
    assert main(other) == 0
    assert len(list(cache.glob("task0-*.pt"))) == 2
    # a shared model that cannot be read is trained again and replaced, not a reason to fail every run using it
    good = stored.read_bytes()
    stored.write_bytes(good[: len(good) // 2])
    assert main(["train", *base, "--out", str(tmp_path / "again"), "--task0_cache", str(cache)]) == 0
    assert _summary(tmp_path / "again")["accuracy_matrix"] == _summary(tmp_path / "plain")["accuracy_matrix"]
    assert "cannot use the shared first-task model" in (tmp_path / "again" / "run.log").read_text()
    assert loads(stored.read_bytes())["position"] == loads(good)["position"]  # replaced by a whole one


def test_a_cut_or_deleted_metrics_log_is_not_padded_on_resume(reference, tmp_path, caplog):
    """metrics.jsonl shorter than at the checkpoint: its complete lines are kept, the next record starts on a line
    of its own (truncate would have padded it with NUL bytes), and the loss is said."""
    _, out = _unfinished(tmp_path)
    metrics = out / "metrics.jsonl"
    whole = metrics.read_bytes()
    metrics.write_bytes(whole[: whole.index(b"\n") + 20])  # the first record and part of the second
    assert main(["resume", str(out), "--no-progress"]) == 0
    lines = metrics.read_bytes().split(b"\n")
    assert lines[-1] == b"" and all(json.loads(line) for line in lines[:-1])  # valid JSON lines, no NUL bytes
    assert lines[0] == whole.split(b"\n")[0]
    assert "fewer than the" in caplog.text and "not restored" in caplog.text
    assert _summary(out) == _summary(reference)  # the accuracies come from the checkpoint


@pytest.mark.parametrize("kernel", ["fused", "foreach"])
def test_optimizer_state_resumes_in_its_parameters_layout_and_kernel(kernel):
    """A channels_last conv's momentum comes back with the conv's strides (a fused kernel needs them and computes
    nonsense without), and the resumed optimiser keeps its own kernel flags, not the saved run's."""
    from dfcil.checkpoint import FORMAT, dumps, loads
    from dfcil.compute.optim import load_optimizer_state

    def conv():
        torch.manual_seed(0)
        return torch.nn.Conv2d(3, 4, 3).to(memory_format=torch.channels_last)

    x = torch.randn(2, 3, 8, 8).contiguous(memory_format=torch.channels_last)

    def step(model, opt):
        opt.zero_grad()
        model(x).square().sum().backward()
        opt.step()

    a, b = conv(), conv()
    opt_a = torch.optim.SGD(a.parameters(), lr=0.1, momentum=0.9, **{kernel: True})
    for _ in range(2):
        step(a, opt_a)
    saved = loads(dumps({"format": FORMAT, "net": a.state_dict(), "opt": opt_a.state_dict()}))
    saved["opt"]["param_groups"][0][kernel] = False  # as if written by a run built differently
    b.load_state_dict(saved["net"])
    opt_b = torch.optim.SGD(b.parameters(), lr=0.1, momentum=0.9, **{kernel: True})
    load_optimizer_state(opt_b, saved["opt"])
    assert opt_b.param_groups[0][kernel] is True
    assert opt_b.state[b.weight]["momentum_buffer"].stride() == b.weight.stride()
    step(a, opt_a)
    step(b, opt_b)
    assert torch.equal(a.weight, b.weight) and torch.equal(a.bias, b.bias)


def test_random_streams_from_another_kind_of_device_are_refused_before_any_is_set():
    from dfcil.training.state import capture_rng, restore_rng

    state = capture_rng({"data": torch.Generator().manual_seed(1)})
    state["generators"]["data"] = torch.zeros(16, dtype=torch.uint8)  # a CUDA generator's state
    before = torch.get_rng_state()
    torch.manual_seed(123)
    mark = torch.get_rng_state()
    with pytest.raises(CheckpointError, match="another kind of device.*cpu <-> cuda"):
        restore_rng(state, {"data": torch.Generator()})
    assert torch.equal(torch.get_rng_state(), mark) and not torch.equal(mark, before)


@pytest.mark.parametrize(
    ("override", "shares"),
    [
        (("engine.precision", "bf16"), False),  # a bf16 first task is another model
        (("engine.channels_last", "true"), False),  # same maths, other rounding
        (("train.lr", "0.05"), False),
        (("data.train_per_class", "30"), False),
        (("seed", "2"), False),
        (("engine.cuda_graphs", "check"), True),  # the same kernels
        (("train.eval_batch_size", "7"), True),
        (("checkpoint_interval_s", "5"), True),
        (("method.name", "finetune"), False),  # smoke: rdfcil's task 0 is epochs - chr_epochs long, finetune's not
        (("method.lambda_hkd", "0.3"), True),  # a later-task weight
        (("data.image_size", "32"), False),  # the same classes at another size
        (("data.mean", "[0.4, 0.4, 0.4]"), False),  # another normalisation
    ],
)
def test_shared_first_task_key_follows_what_shapes_task_0(override, shares):
    from dfcil.training.protocol import prepare
    from dfcil.training.task0 import task0_key

    def key(*overrides):
        cfg = load_config([SMOKE], [(k, v) for k, v in overrides])[0]
        return task0_key(cfg, prepare(cfg))

    assert (key(override) == key()) is shares


def test_shared_first_task_key_follows_the_head_a_method_config_chooses():
    """lwf's head is a config key (LDC's recipe: cosine): another head is another first-task model; its local CE
    is the full CE in task 0, so ``ce`` alone shares."""
    from dfcil.training.protocol import prepare
    from dfcil.training.task0 import task0_key

    def key(*overrides):
        cfg = load_config([SMOKE], [("method.name", "lwf"), *overrides])[0]
        return task0_key(cfg, prepare(cfg))

    assert key() is not None
    assert key(("method.head", "cosine")) != key()
    assert key(("method.ce", "local")) == key()


def test_shared_first_task_key_follows_the_images_and_the_code(monkeypatch):
    """Two datasets with the same classes by number (own data from two folders, or a folder whose images changed)
    train other first-task models, and so does other code: each gives another key."""
    import dataclasses

    import dfcil.training.task0
    from dfcil.data.datasets import ImageArrays
    from dfcil.training.protocol import prepare
    from dfcil.training.task0 import task0_key

    cfg = load_config([SMOKE], [])[0]
    protocol = prepare(cfg)
    key = task0_key(cfg, protocol)
    ds = protocol.dataset
    x = ds.train.x.copy()
    x[:: max(1, len(x) // 8)] ^= 1  # a few pixels of a few images
    changed = dataclasses.replace(protocol, dataset=dataclasses.replace(ds, train=ImageArrays(x, ds.train.y)))
    assert task0_key(cfg, changed) != key
    renamed = dataclasses.replace(
        protocol, dataset=dataclasses.replace(ds, classes=tuple(f"c{i}" for i in range(ds.num_classes)))
    )
    assert task0_key(cfg, renamed) != task0_key(
        cfg,
        dataclasses.replace(
            renamed, dataset=dataclasses.replace(renamed.dataset, classes=tuple(f"d{i}" for i in range(ds.num_classes)))
        ),
    )
    monkeypatch.setattr(dfcil.training.task0, "source_revision", lambda: "0.1.0+another")
    assert task0_key(cfg, protocol) != key


def test_a_missing_or_foreign_static_file_is_reported_and_the_previous_checkpoint_tried(tmp_path):
    _, out = _unfinished(tmp_path)  # stopped inside task 1: last.pt refers to task1-static.pt by digest
    ck = Checkpointer(out)
    static = out / "checkpoints" / "task1-static.pt"
    data = static.read_bytes()
    static.write_bytes(data + b"x")
    with pytest.raises(CheckpointError, match="does not match the checkpoint that refers to it"):
        ck.load_latest()  # prev.pt refers to the same file: no usable checkpoint
    static.unlink()
    with pytest.raises(CheckpointError, match="task1-static.pt is missing"):
        ck.load_latest()
    static.write_bytes(data)
    assert ck.load_latest()["position"]["task"] == 1


def test_a_static_state_written_again_keeps_the_file_the_previous_checkpoint_refers_to(tmp_path):
    """A part's static state can appear after another's (the pseudo-replay's views at a task's start, the
    generator after the inversion): the file is written again, and a checkpoint written before, still referring
    to the older file by its digest, still loads (a crash between the two writes, or prev.pt)."""
    ck = Checkpointer(tmp_path)
    first = ck.save_static(1, {"pseudo": {"index": torch.arange(3)}})
    grown = {"pseudo": {"index": torch.arange(3)}, "replay": {"generator": {"w": torch.ones(2)}}}
    second = ck.save_static(1, grown, referred=first)
    assert first != second and ck.static_prev_path(1).exists()
    assert set(ck.load_static(1, second)) == {"format", "pseudo", "replay"}
    assert set(ck.load_static(1, first)) == {"format", "pseudo"}
    assert ck.static_file(1, first) == ck.static_prev_path(1) and ck.static_file(1, "0" * 64) is None
    with pytest.raises(CheckpointError, match="task1-static.pt does not match the checkpoint that refers to it"):
        ck.load_static(1, "0" * 64)
    assert static_parts(grown) == {"pseudo": ["index"], "replay": ["generator"]}
    # killed between the grown file and the checkpoint that would refer to it: the checkpoints refer to `first`
    # (now .prev); the resumed process writes its grown state again, over the file nothing refers to, and keeps
    # .prev, so that a second kill before its next checkpoint still finds `first` (the review's double crash)
    third = ck.save_static(1, grown | {"replay": {"generator": {"w": torch.zeros(2)}}}, referred=first)
    assert ck.static_file(1, first) == ck.static_prev_path(1) and ck.static_file(1, third) == ck.static_path(1)
    assert ck.static_file(1, second) is None  # the file no checkpoint referred to, replaced


def test_random_streams_of_another_run_are_refused():
    from dfcil.training.state import capture_rng, restore_rng

    state = capture_rng({"data": torch.Generator()})
    with pytest.raises(CheckpointError, match=r"checkpoint has RNG streams \['data'\], run has \['data', 'method'\]"):
        restore_rng(state, {"data": torch.Generator(), "method": torch.Generator()})


def test_a_run_killed_before_its_first_checkpoint_starts_over_in_place(reference, tmp_path):
    """A hard kill (no cleanup) before the first checkpoint leaves config and log; resume starts it afresh."""
    cfg, out = _unfinished(tmp_path)
    for name in ("last.pt", "prev.pt"):
        (out / "checkpoints" / name).unlink()
    assert main(["resume", str(out), "--no-progress"]) == 0
    assert_same_run(reference, out)


def test_a_relative_data_root_is_saved_absolute_and_resumes_from_another_directory(tmp_path, monkeypatch):
    """`--data.root data` means the directory the command ran in; the saved config says which, so `dfcil resume`
    from elsewhere still finds the data (and the task-0 cache)."""
    import numpy as np

    start, elsewhere = tmp_path / "start", tmp_path / "elsewhere"
    (start / "data" / "cifar100").mkdir(parents=True)
    elsewhere.mkdir()
    rng = np.random.default_rng(0)
    for split in ("train", "test"):
        y = np.repeat(np.arange(100), 4)
        x = rng.integers(0, 256, (len(y), 32, 32, 3)).astype(np.uint8)
        np.savez(start / "data" / "cifar100" / f"{split}.npz", x=x, y=y)
    monkeypatch.chdir(start)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # the task-0 cache "~/c" goes there
    overrides = [(ARGS[i][2:], ARGS[i + 1]) for i in range(0, len(ARGS), 2)]
    overrides += [("data.name", "cifar100"), ("data.root", "data"), ("data.num_classes", "10"), ("task0_cache", "~/c")]
    cfg = load_config([SMOKE], overrides)[0]
    out = tmp_path / "run"
    interrupt = Interrupt()
    with pytest.raises(RunInterrupted):
        train(
            cfg, out, options=RunOptions(progress=False, interrupt=interrupt, callbacks=[StopAfterEpochs(interrupt, 2)])
        )
    saved = load_config([out / "config.yaml"])[0]
    assert saved.data.root == str(start / "data")
    assert saved.task0_cache == str(tmp_path / "home" / "c")
    monkeypatch.chdir(elsewhere)
    assert main(["resume", str(out), "--no-progress"]) == 0
    assert len(json.loads((out / "summary.json").read_text())["accuracy_matrix"]) == 2
    assert any((tmp_path / "home" / "c").iterdir())  # the finished task 0 went to the saved cache


def test_peek_position_reads_what_loads_reads_without_the_tensors():
    payload = {"format": FORMAT, "position": {"task": 2, "stage": "train"}, "net": {"w": torch.randn(3, 4)}}
    data = dumps(payload)
    assert peek_position(data) == loads(data)["position"] == {"task": 2, "stage": "train"}


def test_a_checkpoint_written_before_a_config_key_existed_resumes(tmp_path):
    """Keys a later dfcil adds (``plugins``, ``method.ldc``, ``method.drift``) are absent from the config inside an
    older checkpoint: with their defaults they are the same run, not an edited config."""
    from conftest import StopAfterEpochs
    from dfcil.checkpoint import dumps, loads
    from dfcil.errors import ConfigError, RunInterrupted
    from dfcil.load import load_config
    from dfcil.runs.runner import resume, train
    from dfcil.training.loop import RunOptions
    from dfcil.training.state import Interrupt

    cfg, _ = load_config([CONFIGS / "smoke.yaml"], [("train.epochs", "2"), ("train.milestones", "[]")])
    interrupt = Interrupt()
    with pytest.raises(RunInterrupted):
        train(cfg, tmp_path / "run", options=RunOptions(progress=False, interrupt=interrupt,
                                                        callbacks=[StopAfterEpochs(interrupt, 1)]))  # fmt: skip
    last = tmp_path / "run" / "checkpoints" / "last.pt"
    payload = loads(last.read_bytes())
    old = dict(payload["config"])
    del old["plugins"]
    old["method"] = {k: v for k, v in old["method"].items() if k not in ("ldc", "drift")}
    last.write_bytes(dumps(payload | {"config": old}))
    (tmp_path / "run" / "checkpoints" / "prev.pt").unlink(missing_ok=True)
    assert len(resume(tmp_path / "run", options=RunOptions(progress=False))["acc_per_task"]) == 2
    # a value that differs is still refused
    edited = dict(old, seed=old["seed"] + 1)
    with pytest.raises(ConfigError, match="seed: 2 in the checkpoint, 1 now|another config"):
        from dfcil.config import config_to_dict
        from dfcil.training.callbacks import Checkpointing

        (tmp_path / "b" / "checkpoints").mkdir(parents=True)
        (tmp_path / "b" / "checkpoints" / "last.pt").write_bytes(dumps(payload | {"config": edited}))
        Checkpointing(tmp_path / "b", config_to_dict(cfg)).load()


def test_a_run_is_not_resumed_on_other_data_than_it_started_on(tmp_path, caplog):
    """data.root may change on resume (the data moved); the data may not. meta.json records what the run trains on
    (class names, image size, normalisation, image count, a digest of sampled images); a resume that finds other
    data is refused before anything is written."""
    import json as _json

    from dfcil.errors import ConfigError
    from dfcil.runs.runner import check_same_data, resume
    from dfcil.training.protocol import prepare

    cfg, out = _unfinished(tmp_path, epochs=1)
    meta = _json.loads((out / "meta.json").read_text())
    assert set(meta["data"]) == {"classes", "image_size", "mean", "std", "train_images", "images"}
    last = (out / "checkpoints" / "last.pt").read_bytes()
    saved = dict(meta["data"])
    meta["data"]["train_images"] += 1  # as if the folder held another dataset now
    (out / "meta.json").write_text(_json.dumps(meta))
    with pytest.raises(
        ConfigError, match=r"trained on other data than .* holds \(its train_images differ\): resume it"
    ):
        resume(out, options=RunOptions(progress=False))
    assert (out / "checkpoints" / "last.pt").read_bytes() == last and not (out / "summary.json").exists()
    protocol = prepare(cfg)
    meta["data"] = saved | {"images": "0" * 64}  # the same classes and count, other pixels (another decoder?)
    (out / "meta.json").write_text(_json.dumps(meta))
    assert check_same_data(out, cfg, protocol) == ["images"]  # allowed
    del meta["data"]  # a run recorded before meta.json held its data: not checked
    (out / "meta.json").write_text(_json.dumps(meta))
    assert check_same_data(out, cfg, protocol) == []


def test_a_resume_on_changed_images_says_so_in_run_log_and_meta_json(tmp_path, caplog):
    """Before, the warning went to the console only: a run directory read later did not say that its run continued
    on other pixels."""
    import json as _json

    from dfcil.runs.runner import resume

    _, out = _unfinished(tmp_path, epochs=1)
    meta = _json.loads((out / "meta.json").read_text())
    meta["data"]["images"] = "0" * 64
    (out / "meta.json").write_text(_json.dumps(meta))
    with caplog.at_level(logging.WARNING, logger="dfcil"):
        resume(out, options=RunOptions(progress=False))
    said = "the data's images differ from what the run started on"
    assert caplog.text.count(said) == 1  # once on the console
    assert said in (out / "run.log").read_text()
    assert _json.loads((out / "meta.json").read_text())["resumes"][-1]["data_changed"] == ["images"]


class EpochCounter(Callback):
    """A callback with state of its own: the epochs trained over every process of a run."""

    state_key = "epoch_counter"

    def __init__(self):
        self.epochs = 0

    def state_dict(self):
        return {"epochs": self.epochs}

    def load_state_dict(self, state):
        self.epochs = state.get("epochs", 0)

    def on_epoch_end(self, record):
        self.epochs += 1

    def task_fields(self, task):
        return {"epochs_so_far": self.epochs}

    def summary_fields(self):
        return {"epochs_trained": self.epochs}


def test_a_callback_keeps_its_own_state_under_its_key_across_a_resume(tmp_path):
    """Lightning's Callback.state_dict: a callback's state goes into every checkpoint under its key and comes back
    in the resumed process; it adds to each task's record and to the summary. The timer and the diagnostics do
    the same (no field of the run state is theirs)."""
    from dfcil.runs.runner import resume

    cfg, _ = load_config([CONFIGS / "smoke.yaml"])
    interrupt = Interrupt()
    first = EpochCounter()
    with pytest.raises(RunInterrupted):
        train(cfg, tmp_path / "run", RunOptions(progress=False, interrupt=interrupt,
                                                 callbacks=[first, StopAfterEpochs(interrupt, 3)]))  # fmt: skip
    payload = loads(Checkpointer(tmp_path / "run").last.read_bytes())
    assert payload["callbacks"]["epoch_counter"] == {"epochs": 3}
    assert set(payload["callbacks"]) == {"timer", "diagnostics", "epoch_counter"}
    assert not {"timings", "task_timing", "diagnostics", "task_diagnostics"} & set(payload)
    second = EpochCounter()
    summary = resume(tmp_path / "run", options=RunOptions(progress=False, callbacks=[second]))
    epochs = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    trained = sum(r["type"] == "epoch" for r in epochs)
    assert second.epochs == trained and summary["epochs_trained"] == trained
    assert [r["epochs_so_far"] for r in epochs if r["type"] == "task"] == [2, trained]


class _StopAfterSteps(Callback):
    """Ask a run to stop (as Ctrl-C would) after ``n`` training steps: a checkpoint mid-epoch."""

    def __init__(self, interrupt, n):
        self.interrupt, self.n = interrupt, n

    def on_step_end(self):
        self.n -= 1
        if self.n == 0:
            self.interrupt.requested = True


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["crd", "crcd"])
def test_rdfcil_with_a_contrast_bank_resumes_mid_epoch_exactly(tmp_path, kind):
    """new_kd crd / crcd keeps per-step state (the bank's rows, the normalisers, the heads): stopped in the middle
    of task 1's second RRL epoch and resumed, the run equals the uninterrupted one bit for bit."""
    overrides = [("method.new_kd", kind), (f"method.{kind}.negatives", "64"), ("checkpoint_interval_s", "0")]
    cfg = load_config([SMOKE], overrides)[0]  # 7 steps per epoch; task 0: 2 epochs; task 1: 2 RRL, 1 CHR
    train(cfg, tmp_path / "straight", options=RunOptions(progress=False))
    out, interrupt = tmp_path / "run", Interrupt()
    stop = _StopAfterSteps(interrupt, 24)
    with pytest.raises(RunInterrupted):
        train(cfg, out, options=RunOptions(progress=False, interrupt=interrupt, callbacks=[stop]))
    assert _position(out) == {"task": 1, "stage": "train", "phase": 0, "epoch": 1, "step": 3}
    assert main(["resume", str(out), "--no-progress"]) == 0
    assert_same_run(tmp_path / "straight", out)


def test_a_task0_cache_the_method_cannot_share_is_said_once_not_ignored_silently(tmp_path, caplog):
    """A sweep over several methods with one --task0_cache: the methods that do not share their first task train
    as usual, and the log says that the cache is not used for them."""
    from conftest import smoke_configs
    from dfcil.methods import build_method
    from dfcil.training.task0 import Task0Cache

    overrides = [("method.name", "dgr"), ("task0_cache", json.dumps(str(tmp_path / "t0")))]
    cfg, _ = load_config(smoke_configs("dgr"), overrides)
    method = build_method(cfg.method, cfg.train)
    assert method.task0_signature() is None
    logger, handlers = logging.getLogger("dfcil"), [caplog.handler]
    handlers *= not logger.propagate  # a command's console setup stops its lines from reaching the root logger's
    for handler in handlers:
        logger.addHandler(handler)
    try:
        cache = Task0Cache(cfg, None, method)
    finally:
        for handler in handlers:
            logger.removeHandler(handler)
    assert cache.path is None
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warned) == 1 and "task0_cache" in warned[0] and "dgr does not share its first task" in warned[0]


def test_a_refused_checkpoint_does_not_pass_on_the_advice_to_load_it_unsafely(tmp_path):
    """torch.load's refusal advises re-running with weights_only=False, which would run a received file's code:
    the error says instead that dfcil refuses the file, and why."""
    import fractions

    for obj in (fractions.Fraction(1, 3), os.getcwd):  # an object of a class outside the allowed ones; a function
        buf = io.BytesIO()
        torch.save({"payload": {"format": FORMAT, "x": obj}}, buf)
        rest = len(buf.getvalue()).to_bytes(8, "little") + buf.getvalue()
        data = MAGIC + hashlib.sha256(rest).digest() + rest  # a valid checksum: the archive itself is refused
        with pytest.raises(CheckpointError) as err:
            loads(data, "received.pt")
        text = str(err.value)
        assert text.startswith("received.pt is refused: it holds code or objects that dfcil does not load ("), text
        assert "weights_only" not in text and "trust" not in text and "add_safe_globals" not in text, text
        path = tmp_path / "model.pt"
        path.write_bytes(data)
        from dfcil.model_file import load_model

        with pytest.raises(CheckpointError, match="is refused: it holds code or objects"):
            load_model(path)
