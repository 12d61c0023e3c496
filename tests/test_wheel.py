"""dfcil as an installed package, without the repository: the wheel ships the presets (the repository's configs/,
nothing beside it), and from an empty folder the smoke preset trains and the paper presets' dry runs work, by name."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from test_readme import _fake_cifar_root

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel ``pip wheel .`` builds, from a copy of what it reads (a build writes build/ and an egg-info into
    the source folder, which the test processes share)."""
    src, out = tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("wheel")
    for part in ("pyproject.toml", "README.md", "src", "configs"):
        copy = shutil.copytree if (REPO / part).is_dir() else shutil.copy
        copy(REPO / part, src / part, **({"symlinks": True} if copy is shutil.copytree else {}))
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(src)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=600)
    (found,) = out.glob("dfcil-*.whl")
    return found


def test_the_wheel_ships_every_preset_and_nothing_else_of_configs(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    shipped = sorted(n.removeprefix("dfcil/configs/") for n in names if n.startswith("dfcil/configs/"))
    in_repo = sorted(str(p.relative_to(REPO / "configs")) for p in (REPO / "configs").rglob("*.yaml"))
    assert shipped == in_repo and len(in_repo) > 100  # the yaml files, not make_presets.py
    assert "dfcil/presets.py" in names


def _installed(wheel: Path, where: Path) -> dict[str, str]:
    """An environment in which ``import dfcil`` finds the wheel's files (unpacked into ``where``) before the
    checkout's editable install; the dependencies are this interpreter's."""
    zipfile.ZipFile(wheel).extractall(where)
    return {**os.environ, "PYTHONPATH": str(where), "DFCIL_DATA": str(where / "no-data")}


def test_from_an_empty_folder_the_installed_wheel_trains_the_smoke_preset_by_name(wheel, tmp_path):
    env, empty = _installed(wheel, tmp_path / "site"), tmp_path / "empty"
    empty.mkdir()
    which = subprocess.run([sys.executable, "-c", "import dfcil; print(dfcil.__file__)"], env=env, cwd=empty,
                           capture_output=True, text=True, check=True)  # fmt: skip
    assert which.stdout.startswith(str(tmp_path / "site")), which.stdout
    run = [sys.executable, "-m", "dfcil", "train", "--config", "smoke", "--out", "runs/smoke", "--no-progress"]
    done = subprocess.run(run, env=env, cwd=empty, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((empty / "runs" / "smoke" / "summary.json").read_text())["tasks"]
    listed = subprocess.run([sys.executable, "-m", "dfcil", "presets", "cifar100/rdfcil"], env=env, cwd=empty,
                            capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert "cifar100/rdfcil " in listed and "paper A_N: n5 50.47 ± 0.43" in listed and str(tmp_path / "site") in listed


def test_from_an_empty_folder_the_installed_wheel_dry_runs_a_paper_preset_by_name(wheel, tmp_path):
    env, empty = _installed(wheel, tmp_path / "site"), tmp_path / "empty"
    empty.mkdir()
    data = _fake_cifar_root(tmp_path / "DATA")
    run = [sys.executable, "-m", "dfcil", "train", "--config", "cifar100/n10", "--config", "cifar100/rdfcil",
           "--data.root", str(data), "--dry-run", "--no-estimate"]  # fmt: skip
    done = subprocess.run(run, env=env, cwd=empty, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "dataset:     cifar100 (100 classes, 32x32)" in done.stdout and "task 9:" in done.stdout
    assert not any(empty.iterdir())  # a dry run writes nothing


@pytest.mark.slow
def test_a_fresh_environment_installs_the_wheel_and_runs_the_presets_by_name(wheel, tmp_path):
    """The whole way a user without a clone goes: a new virtual environment, PyTorch, the wheel with its
    dependencies, then from an empty folder the smoke preset and a paper preset's dry run, by name."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = str(venv / "bin" / "python")
    torch_version = __import__("torch").__version__.split("+")[0]  # the one this machine installs from local disk
    for what in ([f"torch=={torch_version}"], [str(wheel)]):
        subprocess.run([python, "-m", "pip", "install", "-q", *what], check=True, timeout=1200)
    empty = tmp_path / "empty"
    empty.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    data = _fake_cifar_root(tmp_path / "DATA")
    for argv in (["train", "--config", "smoke", "--out", "runs/smoke", "--no-progress"],
                 ["train", "--config", "cifar100/b50_n11", "--config", "cifar100/rdfcil", "--data.root", str(data),
                  "--dry-run", "--no-estimate"]):  # fmt: skip
        done = subprocess.run([python, "-m", "dfcil", *argv], env=env, cwd=empty, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-3000:]
    assert (empty / "runs" / "smoke" / "summary.json").exists()
