from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from dfcil.training.callbacks import Callback

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"


def smoke_configs(method: str) -> list[Path]:
    """The smoke preset for ``method``: configs/smoke.yaml, plus configs/smoke/<method>.yaml where the method needs
    one (a schedule split that does not fit the smoke run's epochs, a smaller model)."""
    overlay = CONFIGS / "smoke" / f"{method}.yaml"
    return [CONFIGS / "smoke.yaml", *([overlay] if overlay.exists() else [])]


SHARED_DATA = REPO.parent / "shared" / "data"  # where the developers keep the real data, beside the repository


def shared_cifar_root() -> Path | None:
    """A data root holding the real CIFAR-100 arrays: $DFCIL_CIFAR_ROOT, else the developers' shared data."""
    candidates = [os.environ.get("DFCIL_CIFAR_ROOT"), SHARED_DATA]
    for c in candidates:
        if c and (Path(c) / "cifar100" / "train.npz").is_file():
            return Path(c)
    return None


def shared_tiny_subset() -> Path:
    """The real Tiny-ImageNet subset's zip (tiny-imagenet-200-sub100.zip: the release's layout, the first 100
    training images of each class, the whole validation set): $DFCIL_TINY_SUBSET, else the developers' shared data.
    It may not exist: the tests that need it skip, saying how to provide it."""
    given = os.environ.get("DFCIL_TINY_SUBSET")
    return Path(given) if given else SHARED_DATA / "tiny-imagenet-200" / "tiny-imagenet-200-sub100.zip"


MAX_WORKERS = 4  # -n auto: one test process per core up to this many (each trains with one compute thread)


def pytest_xdist_auto_num_workers(config) -> int:
    """``-n auto``: one worker per core, at most MAX_WORKERS (every worker holds its own trained session runs)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(MAX_WORKERS, cores))


def pytest_configure(config):
    """Under pytest-xdist the workers share the cores: each computes on one thread (set before they start, so that
    their torch and the processes the tests start read it), rather than each on all of them."""
    if getattr(config.option, "numprocesses", None) and "PYTEST_XDIST_WORKER" not in os.environ:
        os.environ["OMP_NUM_THREADS"] = "1"


@pytest.fixture(autouse=True, scope="session")
def _decoded_images_in_a_temporary_cache(tmp_path_factory):
    """Datasets decoded without a data.cache go to a temporary directory, not the user's cache."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DFCIL_CACHE", str(tmp_path_factory.mktemp("dfcil-cache")))
        yield


@pytest.fixture(autouse=True)
def _deterministic_threads():
    torch.manual_seed(0)
    yield


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory) -> Path:
    """One finished run of the smoke preset (with the csv and tensorboard logs), trained once for the whole session
    and shared: read it, or copy it (``shutil.copytree``) before changing anything in it."""
    from dfcil.cli import main

    out = tmp_path_factory.mktemp("smoke-run") / "run"
    argv = ["train", "--config", str(CONFIGS / "smoke.yaml"), "--out", str(out), "--no-progress"]
    assert main([*argv, "--log", "csv", "--log", "tensorboard"]) == 0
    return out


@pytest.fixture
def cifar_root() -> Path:
    root = shared_cifar_root()
    if root is None:
        pytest.skip("real CIFAR-100 arrays not found: set DFCIL_CIFAR_ROOT to a folder holding cifar100/train.npz")
    return root


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (on a GPU machine: bash benchmarks/gpu_check.sh tests)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


class StopAfterEpochs(Callback):
    """Ask a run to stop (as Ctrl-C would) after ``n`` epochs."""

    def __init__(self, interrupt, n):
        self.interrupt, self.n = interrupt, n

    def on_epoch_end(self, record):
        self.n -= 1
        if self.n == 0:
            self.interrupt.requested = True


class StopInSetup(Callback):
    """Ask the run to stop after ``n`` steps of a task's setup (the inversion)."""

    def __init__(self, interrupt, n):
        self.interrupt, self.n = interrupt, n

    def on_setup_step(self):
        self.n -= 1
        if self.n == 0:
            self.interrupt.requested = True
