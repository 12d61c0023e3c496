"""engine.compile_cache: where torch.compile keeps compiled graphs between runs, and that a second process loads
them instead of compiling again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch._inductor.config as inductor

from dfcil.compute.runtime import compile_cache, compile_cache_dir
from dfcil.errors import ConfigError
from dfcil.load import load_config


def test_auto_is_the_users_inductor_dir_else_a_persistent_one_outside_tmp(monkeypatch, tmp_path) -> None:
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert compile_cache_dir("auto") == tmp_path / "xdg" / "dfcil" / "torch-compile"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert compile_cache_dir("auto") == tmp_path / "home" / ".cache" / "dfcil" / "torch-compile"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    assert compile_cache_dir("auto") == tmp_path / "mine"
    assert compile_cache_dir("off") is None
    monkeypatch.chdir(tmp_path)
    assert compile_cache_dir("rel/cc") == tmp_path / "rel" / "cc"  # absolute: children may start elsewhere


def test_the_cache_dir_holds_for_the_block_and_the_process_is_given_back(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/somewhere/else")
    with compile_cache(str(tmp_path / "cc")) as path:
        assert path == tmp_path / "cc" and path.is_dir()
        assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(path)
        assert not inductor.force_disable_caches
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == "/somewhere/else"
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    with compile_cache("off") as path:
        assert path is None and inductor.force_disable_caches
        scratch = Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])
        assert scratch.is_dir()
    assert not scratch.exists() and not inductor.force_disable_caches  # off keeps nothing
    assert "TORCHINDUCTOR_CACHE_DIR" not in os.environ


def test_an_unusable_cache_dir_is_one_clear_error(tmp_path) -> None:
    (tmp_path / "file").write_text("")
    unusable = pytest.raises(ConfigError, match="compile_cache: cannot create .*file/cc.*writable directory, or off")
    with unusable, compile_cache(str(tmp_path / "file" / "cc")):
        pass
    for bad in ('""', "on", "true"):
        with pytest.raises(ConfigError, match="engine.compile_cache: .* is not a setting; use auto .*, off or a dir"):
            load_config([], [("engine.compile_cache", bad)])


def test_off_on_the_command_line_and_in_yaml_is_off(tmp_path) -> None:
    """YAML reads a bare ``off`` as false; the key takes it as the word."""
    (tmp_path / "c.yaml").write_text("engine:\n  compile_cache: off\n")
    assert load_config([tmp_path / "c.yaml"])[0].engine.compile_cache == "off"
    assert load_config([], [("engine.compile_cache", "off")])[0].engine.compile_cache == "off"
    assert load_config([], [("engine.compile_cache", "~/cc")])[0].engine.compile_cache == "~/cc"


def test_an_unusable_cache_dir_is_refused_before_a_run_directory_exists(tmp_path) -> None:
    from conftest import smoke_configs
    from dfcil.training.protocol import prepare

    (tmp_path / "file").write_text("")
    over = [("engine.compile", "default"), ("engine.compile_backend", "eager")]
    cfg = load_config(smoke_configs("finetune"), [*over, ("engine.compile_cache", str(tmp_path / "file"))])[0]
    with pytest.raises(ConfigError, match="engine.compile_cache .*file exists and is not a directory; set it to a"):
        prepare(cfg)
    plain = load_config(smoke_configs("finetune"), [("engine.compile_cache", str(tmp_path / "file"))])[0]
    prepare(plain)  # not compiling: the cache is not used


def test_the_cache_is_a_runtime_key() -> None:
    """Where compiled code lies changes no result: a resume may move it (e.g. to a folder carried between machines)."""
    from dfcil.config import RUNTIME_KEYS

    assert "engine.compile_cache" in RUNTIME_KEYS


@pytest.mark.slow
def test_a_second_process_loads_the_compiled_step_instead_of_compiling_it(tmp_path) -> None:
    """Two processes compile the same ResNet training step with inductor and one cache directory: the first
    compiles and writes, the second loads its forward/backward graphs (AOTAutograd cache hits) with the same loss."""
    script = tmp_path / "step.py"
    script.write_text(
        textwrap.dedent(
            """
            import json, sys
            import torch
            import torch.nn.functional as F
            from dfcil.models.network import build_network
            from dfcil.compute.runtime import StepCompiler, compile_cache

            def loss(net, x, y):
                out = net(x)
                return F.cross_entropy(out.logits, y) + out.features.square().mean()

            torch.manual_seed(0)
            net = build_network("resnet8", capacity=4)
            net.expand(4)
            compiler = StepCompiler("inductor")
            with compile_cache(sys.argv[1]):
                value = compiler(loss)(net, torch.randn(8, 3, 32, 32), torch.arange(8) % 4)
                value.backward()
            print(json.dumps({"compiles": compiler.compiles, "loaded": compiler.loaded, "loss": value.item()}))
            """
        )
    )
    cache = tmp_path / "cc"

    def once() -> dict:
        done = subprocess.run([sys.executable, str(script), str(cache)], capture_output=True, text=True, check=True)
        return json.loads(done.stdout.strip().splitlines()[-1])

    first, second = once(), once()
    assert first["compiles"] >= 1 and first["loaded"] == 0
    assert second["compiles"] == first["compiles"] and second["loaded"] >= 1
    assert second["loss"] == first["loss"]
    assert any(cache.rglob("*.py")), "the generated code is kept in the cache directory"


def test_compile_mode_reaches_inductor_for_compiled_steps_only(monkeypatch) -> None:
    """engine.compile_mode: inductor's mode for the steps; refused for other compile settings, dropped for the
    tracing-only backends (modes are inductor's)."""
    import torch

    from dfcil.compute.runtime import Runtime
    from dfcil.config import EngineConfig

    seen = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: seen.append(kw) or fn)
    step = ("engine.compile", "step")
    cfg = load_config([], [step, ("model.static_head", "true"), ("engine.compile_mode", "max-autotune-no-cudagraphs")])
    Runtime.from_config(cfg[0].engine, torch.device("cpu"), None).compiled(lambda: None)
    assert seen[-1] == {"backend": "inductor", "mode": "max-autotune-no-cudagraphs", "dynamic": False}
    Runtime.from_config(EngineConfig(compile="step"), torch.device("cpu"), None).compiled(lambda: None)
    assert seen[-1]["mode"] is None
    eager = EngineConfig(compile="step", compile_backend="eager", compile_mode="max-autotune-no-cudagraphs")
    Runtime.from_config(eager, torch.device("cpu"), None).compiled(lambda: None)
    assert seen[-1] == {"backend": "eager", "mode": None, "dynamic": False}
    with pytest.raises(ConfigError, match="compile_mode: max-autotune-no-cudagraphs applies to engine.compile: step"):
        load_config([], [("engine.compile", "default"), ("engine.compile_mode", "max-autotune-no-cudagraphs")])
