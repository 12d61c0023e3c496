"""The README's commands run as written, in order, in a fresh directory, so the README cannot drift from the code.

Every command of the README's ``bash`` blocks is accounted for: run as written; or, where it names the placeholder
``DATA`` or the own-data example's ``data`` folder, run on a generated stand-in of a few images, with ``--dry-run``
added to the commands that would train for hours on real data; or skipped for a stated reason (installing, the
test command itself, a server, a GPU on a machine without one). A command that matches no rule fails the test, so
a new README command must be given one. The Python block (loading an exported model) runs too, with a batch of
zeros as its ``x``.
"""

from __future__ import annotations

import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from dfcil.cli import main

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"

# what the README's commands need that the test does not run: installing, the test command, a server
SKIPPED = {
    "python3 -m venv": "creates the environment these tests run in",
    ". .venv/bin/activate": "the environment these tests run in",
    "pip install": "installs what these tests run on (CI runs the install line)",
    "python -m pytest": "the test command itself",
    "tensorboard --logdir": "starts a server; the test checks that its log directory exists",
}
INTERRUPTED = "stop it with Ctrl-C"  # a README command that the reader is told to interrupt


def readme_blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README.read_text(), flags=re.S)


def readme_commands() -> list[tuple[str, str]]:
    """(command, trailing comment) for every command of the README's bash blocks, in order; a line continued with
    a backslash is joined, and ``a && b`` are two commands."""
    commands = []
    for block in readme_blocks("bash"):
        for line in block.replace("\\\n", " ").splitlines():
            code, _, comment = line.partition("  #")
            if line.lstrip().startswith("#") or not code.strip():
                continue
            commands += [(part.strip(), comment.strip()) for part in code.split("&&")]
    return commands


def _fake_cifar_root(root: Path) -> Path:
    """A data root shaped as CIFAR-100's arrays (100 classes of 32×32 images), few images per class."""
    rng = np.random.default_rng(0)
    (root / "cifar100").mkdir(parents=True)
    for split, per_class in (("train", 30), ("test", 4)):
        y = np.repeat(np.arange(100), per_class).astype(np.int64)
        x = rng.integers(0, 256, size=(len(y), 32, 32, 3), dtype=np.uint8)
        np.savez(root / "cifar100" / f"{split}.npz", x=x, y=y)
    return root


def _own_data(root: Path) -> None:
    """The README's own-data layouts in one folder: class folders of 32×32 PNGs and the two .npz files."""
    rng = np.random.default_rng(1)
    for split, per_class in (("train", 70), ("test", 4)):  # 5 tasks of 2 classes: ≥ one batch of 128
        for c in range(10):
            folder = root / split / f"class{c}"
            folder.mkdir(parents=True)
            for i in range(per_class):
                Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(folder / f"{i}.png")
        y = np.repeat(np.arange(10), per_class)
        np.savez(root / f"{split}.npz", x=rng.integers(0, 256, (len(y), 32, 32, 3), dtype=np.uint8), y=y)


def _interrupted(argv: list[str], cwd: Path) -> None:
    """Run ``dfcil ARGV`` in its own process and stop it with Ctrl-C (SIGINT) once it wrote a checkpoint."""
    out = Path(cwd, argv[argv.index("--out") + 1])
    proc = subprocess.Popen([sys.executable, "-m", "dfcil", *argv, "--no-progress"], cwd=cwd)
    try:
        deadline = time.monotonic() + 300
        while not (out / "checkpoints" / "last.pt").exists() and proc.poll() is None:
            assert time.monotonic() < deadline, "no checkpoint within 300 s"
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=300) == 130, "the run finished before it could be interrupted"
    finally:
        proc.kill()
        proc.wait()


def test_every_readme_command_runs_as_written(tmp_path, monkeypatch):
    work = tmp_path / "clone"  # an empty folder: the presets are found by name, as from an installed dfcil
    work.mkdir()
    data = _fake_cifar_root(tmp_path / "DATA")
    _own_data(work / "data")
    monkeypatch.chdir(work)
    monkeypatch.setenv("DFCIL_DATA", str(tmp_path / "no-data"))  # the user's data root must not be found instead

    ran, dry_runs = [], set()  # dry_runs: the --out of commands that ran with --dry-run
    for command, comment in readme_commands():
        if reason := next((why for start, why in SKIPPED.items() if command.startswith(start)), None):
            if command.startswith("tensorboard"):
                assert Path(shlex.split(command)[-1]).is_dir(), command
            ran.append(f"skipped ({reason}): {command}")
            continue
        assert command.startswith("dfcil "), f"a README command without a rule in tests/test_readme.py: {command}"
        argv = shlex.split(command)[1:]
        if "cuda" in argv and not torch.cuda.is_available():
            ran.append(f"skipped (needs a CUDA device): {command}")
            continue
        if argv[0] == "report" and set(argv[1:]) & dry_runs:
            ran.append(f"skipped (reports runs that ran as a dry run here): {command}")
            continue
        if {"DATA", "data"} & set(argv):  # the data root (or the own-data folder): a stand-in of a few images,
            argv = [str(data) if a == "DATA" else a for a in argv]  # and only the protocol of what would train
            if argv[0] in ("train", "sweep") and "--dry-run" not in argv:  # for hours on the real data
                argv.append("--dry-run")
                if "--out" in argv:
                    dry_runs.add(argv[argv.index("--out") + 1])
            if argv[0] == "train":  # a stand-in's steps say nothing of the run's time: not timed
                argv.append("--no-estimate")
        if INTERRUPTED in comment:
            _interrupted(argv, work)
        else:
            assert main([*argv, "--no-progress"] if argv[0] in ("train", "resume") else argv) == 0, command
        ran.append(command)
    assert any(c.startswith("dfcil train --config smoke --out runs/smoke") for c in ran), ran
    assert (work / "runs" / "smoke" / "summary.json").is_file()
    assert (work / "runs" / "smoke-resume" / "summary.json").is_file()  # the interrupted run, resumed

    # the Python block: the exported model loads, and gives one logit per class it learned
    (block,) = readme_blocks("python")
    card = __import__("json").loads((work / "smoke.json").read_text())
    size = card["inputs"]["image_size"]
    scope = {"x": torch.zeros(2, 3, size, size)}
    exec(compile(block, "README.md", "exec"), scope)
    assert scope["logits"].shape == (2, card["num_classes"])


def test_readme_commands_are_found():
    """The parser sees the README's commands (the test above would pass vacuously on none)."""
    commands = [c for c, _ in readme_commands()]
    assert len(commands) >= 20
    assert "dfcil train --config smoke --out runs/smoke" in commands
    assert all("\\" not in c for c in commands)


@pytest.mark.parametrize("placeholder", ["DATA"])
def test_the_readme_names_one_placeholder_for_the_data_root(placeholder):
    """Every command that needs real data names it the same way, and the README says what it stands for."""
    text = README.read_text()
    assert f"`{placeholder}` stands for your data root" in text
    roots = {a for c, _ in readme_commands() for a in re.findall(r"--data\.root (\S+)", c)}
    assert roots <= {placeholder, "data"}, roots  # data: the own-data example's folder, described beside it


def test_the_readme_table_of_what_each_method_keeps_matches_the_methods():
    """Each row of 'What each method keeps' lists exactly the built-in methods whose ``stores`` it names, and says
    data-free as :mod:`dfcil.stores` does."""
    from dfcil.catalogue import builtin_entries, switch_entries
    from dfcil.stores import STORES, is_data_free

    section = README.read_text().split("### What each method keeps", 1)[1].split("\n#", 1)[0]
    rows = [r.split("|")[1:4] for r in section.splitlines() if r.startswith("| ") and not r.startswith("| keeps")]
    table = {kept.split(":")[0].strip(): (methods, free.strip()) for kept, methods, free in rows}
    assert set(table) == set(STORES)
    for stores, (methods, free) in table.items():
        methods, _, switched = methods.partition(";")  # the methods, then those that keep it with a switch
        assert set(re.findall(r"`(\w+)`", methods)) == {e.name for e in builtin_entries() if e.stores == stores}
        switches = {(m, s.key) for s in switch_entries(builtin_entries()) if s.stores == stores for m in s.methods}
        assert {(m, k) for m in re.findall(r"`(\w+)`", switched) for k in re.findall(r"--method\.(\w+)", switched)} == (
            switches
        ), stores
        assert free == ("yes" if is_data_free(stores) else "no"), stores
