"""What dfcil writes stays inside the directory it is given, and a target it cannot write is refused before the work:
a received run directory's links to elsewhere are not written through, a read-only run or output directory is
one clear error, and a file past the size limit is one clear line with the way on, not a traceback."""

import json
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import CONFIGS
from dfcil.cli import main

SMOKE = str(CONFIGS / "smoke.yaml")


def _snapshot(folder):
    """Every entry under ``folder`` (links not followed) with its bytes, for files: what a refused command must
    leave as it was."""
    found = {}
    for top, dirs, files in os.walk(folder):
        for name in (*dirs, *files):
            path = Path(top) / name
            rel = str(path.relative_to(folder))
            found[rel] = os.readlink(path) if path.is_symlink() else path.read_bytes() if path.is_file() else None
    return found


@pytest.fixture
def unfinished(smoke_run, tmp_path):
    """A copy of the smoke run without its summary: `dfcil resume` would finish it from its last checkpoint."""
    run = tmp_path / "run"
    shutil.copytree(smoke_run, run)
    (run / "summary.json").unlink()
    return run


def _link_out(run, name, outside):
    """Replace ``run/name`` with a link to ``outside`` (a copy of what was there)."""
    target = run / name
    if target.is_dir():
        shutil.copytree(target, outside)
        shutil.rmtree(target)
    elif target.exists():
        shutil.copyfile(target, outside)
        target.unlink()
    else:
        outside.write_text("someone else's file\n")
    target.symlink_to(outside)


@pytest.mark.parametrize("name", ["metrics.jsonl", "run.log", "checkpoints", ".lock", "metrics.csv"])
def test_a_received_runs_links_out_of_it_are_refused_before_anything_is_written(unfinished, tmp_path, capsys, name):
    """Before: `dfcil resume` truncated and appended to the file metrics.jsonl linked to, wrote run.log's lines
    into the file it linked to, and checkpoints into the folder a `checkpoints` link named."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    outside = elsewhere / name.lstrip(".")
    _link_out(unfinished, name, outside)
    before_run, before_outside = _snapshot(unfinished), _snapshot(elsewhere)
    capsys.readouterr()
    assert main(["resume", str(unfinished), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"dfcil: error: run directory {unfinished} holds symbolic links that lead outside it")
    assert f"{name} → {outside}" in err and "cp -rL" in err and err.count("\n") == 1
    assert _snapshot(unfinished) == before_run and _snapshot(elsewhere) == before_outside
    # the same run, trained again into its own directory (`dfcil train` on an unfinished run resumes it)
    argv = ["train", "--config", str(unfinished / "config.yaml"), "--out", str(unfinished), "--no-progress"]
    assert main(argv) == 2
    assert "holds symbolic links that lead outside it" in capsys.readouterr().err
    assert _snapshot(unfinished) == before_run and _snapshot(elsewhere) == before_outside


def test_links_that_stay_inside_the_run_directory_are_followed(unfinished, capsys):
    """wandb keeps a `latest-run` link in its folder; a user may link a file to another inside the run: both stay
    in the run directory, so the run resumes."""
    (unfinished / "wandb").mkdir()
    (unfinished / "wandb" / "run-1").mkdir()
    (unfinished / "wandb" / "latest-run").symlink_to("run-1")
    (unfinished / "notes.txt").write_text("mine\n")
    (unfinished / "notes-link.txt").symlink_to(unfinished / "notes.txt")
    assert main(["resume", str(unfinished), "--no-progress"]) == 0
    assert (unfinished / "summary.json").exists()


def test_a_loop_of_links_is_refused(unfinished, capsys):
    (unfinished / "a").symlink_to(unfinished / "b")
    (unfinished / "b").symlink_to(unfinished / "a")
    assert main(["resume", str(unfinished), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "holds symbolic links that lead outside it (" in err and ", a loop" in err


def _read_only(monkeypatch, *paths):
    """os.access says ``paths`` are not writable (the tests may run as root, whom it lets write anywhere)."""
    import dfcil.io

    real, denied = dfcil.io.os.access, {Path(p).resolve() for p in paths}
    monkeypatch.setattr(
        dfcil.io.os, "access", lambda p, mode: not (Path(p).resolve() in denied and mode & os.W_OK) and real(p, mode)
    )


@pytest.mark.parametrize("part", ["", "checkpoints", "metrics.jsonl", "run.log"])
def test_resuming_an_unwritable_run_directory_is_refused_before_the_work(unfinished, monkeypatch, capsys, part):
    """Before: an OSError traceback from the lock file, after the data was prepared."""
    _read_only(monkeypatch, unfinished / part)
    before = _snapshot(unfinished)
    capsys.readouterr()
    assert main(["resume", str(unfinished), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"dfcil: error: run directory {unfinished}") and "is not writable; make it writable" in err
    assert (part == "") or f"(its {'folder' if part == 'checkpoints' else 'file'} {part})" in err
    assert err.count("\n") == 1 and _snapshot(unfinished) == before


def _unshare_works():
    try:
        probe = subprocess.run(["unshare", "-m", "true"], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0


@pytest.mark.skipif(not sys.platform.startswith("linux") or not _unshare_works(), reason="needs `unshare -m`")
def test_resuming_a_run_on_a_read_only_mount_is_one_clear_error(unfinished):
    """The real thing: a read-only bind mount of the run directory (where the permission bits would let root
    write anyway)."""
    run = str(unfinished)
    script = (
        f"mount --bind {run} {run} && mount -o remount,ro,bind {run} && "
        f"{sys.executable} -m dfcil resume {run} --no-progress"
    )
    proc = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, timeout=300)
    if "mount:" in proc.stderr:
        pytest.skip(f"no bind mounts here: {proc.stderr.strip()}")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == f"dfcil: error: run directory {run} is not writable; make it writable, or copy the run " + (
        f"elsewhere (`cp -rL {run} NEW` copies what links point to) and resume the copy\n"
    )


def test_a_file_past_the_size_limit_is_one_clear_line_and_the_run_goes_on_afterwards(tmp_path):
    """`ulimit -f`: the first checkpoint fits, a later one does not (EFBIG). Before: an OSError traceback."""
    out = tmp_path / "run"
    limit = 1_000_000  # bytes: task 0's checkpoint (~0.8 MB) fits, task 1's (~1.3 MB) does not

    def limited():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

    argv = [sys.executable, "-m", "dfcil", "train", "--config", SMOKE, "--out", str(out), "--no-progress"]
    proc = subprocess.run(argv, capture_output=True, text=True, preexec_fn=limited, timeout=300)
    assert proc.returncode == 2, proc.stderr
    last = proc.stderr.splitlines()[-1]
    assert last.startswith("dfcil: error: a file would grow past the largest size allowed") and "ulimit -f" in last
    assert f" writing {out}" in last and "run the same command again" in last and "Traceback" not in proc.stderr
    assert not list(out.rglob(".*.tmp")) and not (out / "summary.json").exists()
    assert main(argv[3:]) == 0  # the same command, without the limit: the run continues and finishes
    assert json.loads((out / "summary.json").read_text())["resumed"] is True


def test_a_sweep_into_an_unwritable_or_linked_directory_is_refused_before_any_run(tmp_path, monkeypatch, capsys):
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    argv = ["sweep", "--config", SMOKE, "--grid", "seed=1,2", "--out", str(sweep), "--jobs", "1"]
    _read_only(monkeypatch, sweep)
    assert main(argv) == 2
    assert (
        f"sweep directory {sweep} is not writable; make it writable, or give another --out" in capsys.readouterr().err
    )
    assert main([*argv, "--dry-run"]) == 2  # a dry run refuses what the sweep would
    monkeypatch.undo()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (sweep / "logs").symlink_to(elsewhere)
    assert main(argv) == 2
    assert f"holds symbolic links that lead outside it (logs → {elsewhere})" in capsys.readouterr().err
    assert sorted(p.name for p in sweep.iterdir()) == ["logs"] and not any(elsewhere.iterdir())


def test_export_into_an_unwritable_directory_is_refused_before_writing(smoke_run, tmp_path, monkeypatch, capsys):
    pytest.importorskip("safetensors")
    target = tmp_path / "exports"
    target.mkdir()
    _read_only(monkeypatch, target)
    assert main(["export", str(smoke_run), "--out", str(target / "m.safetensors")]) == 2
    err = capsys.readouterr().err
    assert f"the directory {target} is not writable; choose another --out" in err and err.count("\n") == 1
    assert not any(target.iterdir())


def test_inspect_refuses_an_unwritable_or_linked_output_before_computing(smoke_run, tmp_path, monkeypatch, capsys):
    """Before: the inversion and the t-SNE ran, then an OSError traceback."""
    pytest.importorskip("matplotlib")
    pytest.importorskip("sklearn")
    import dfcil.analysis.features as features

    def never(*args, **kwargs):
        raise AssertionError("the features were computed before the output was checked")

    monkeypatch.setattr(features, "real_images", never)
    target = tmp_path / "figures"
    target.mkdir()
    _read_only(monkeypatch, target)
    assert main(["inspect", str(smoke_run), "--out", str(target)]) == 2
    assert f"--out {target} is not writable" in capsys.readouterr().err
    run = tmp_path / "run"
    shutil.copytree(smoke_run, run)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (run / "inspect").symlink_to(elsewhere)  # the default output, a link out of the run
    for mode in ([], ["--synthetic"]):
        assert main(["inspect", str(run), *mode]) == 2
        assert f"inspect folder {run / 'inspect'} leads outside {run}" in capsys.readouterr().err
    assert not any(elsewhere.iterdir())


def test_wandbs_own_links_out_of_its_folder_do_not_block_a_resume_but_a_linked_wandb_folder_does(unfinished, tmp_path):
    """wandb links each of its runs' debug logs to its cache (`wandb/<run>/logs/debug-core.log` → ~/.cache/wandb/...):
    wandb's files, which a resumed wandb run never writes (it adds a folder). The `wandb` folder itself linked
    elsewhere would put the new one there."""
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "core-debug.log").write_text("wandb's\n")
    logs = unfinished / "wandb" / "offline-run-1" / "logs"
    logs.mkdir(parents=True)
    (logs / "debug-core.log").symlink_to(cache / "core-debug.log")
    assert main(["resume", str(unfinished), "--no-progress"]) == 0
    other = tmp_path / "other"
    shutil.copytree(unfinished, other)
    (other / "summary.json").unlink()
    shutil.move(other / "wandb", tmp_path / "elsewhere")
    (other / "wandb").symlink_to(tmp_path / "elsewhere")
    assert main(["resume", str(other), "--no-progress"]) == 2


def test_wandbs_folders_are_skipped_at_any_depth_but_every_other_link_out_is_found(tmp_path):
    """A sweep directory holds runs, each with its own wandb folder: what wandb keeps there is wandb's."""
    from dfcil.io import FOREIGN_DIRS, links_leaving

    sweep, elsewhere = tmp_path / "sweep", tmp_path / "elsewhere"
    elsewhere.mkdir()
    for run in ("a", "b"):
        (sweep / run / "wandb" / "offline-run-1" / "logs").mkdir(parents=True)
        (sweep / run / "wandb" / "offline-run-1" / "logs" / "debug-core.log").symlink_to(elsewhere)
    (sweep / "b" / "checkpoints").symlink_to(elsewhere)
    found = links_leaving(sweep, FOREIGN_DIRS)
    assert found == [(sweep / "b" / "checkpoints", str(elsewhere))]
    assert len(links_leaving(sweep)) == 3


def test_a_hard_linked_copy_of_a_run_resumes_without_writing_into_the_original(unfinished, tmp_path, capsys):
    """`cp -al RUN COPY` makes every file of COPY a second name of RUN's: before, resuming COPY appended its log
    lines and records to RUN's run.log and metrics.jsonl (one inode under two names)."""
    copy = tmp_path / "copy"
    shutil.copytree(unfinished, copy, copy_function=os.link)
    assert (copy / "run.log").stat().st_nlink == 2
    before = _snapshot(unfinished)
    assert main(["resume", str(copy), "--no-progress"]) == 0
    assert _snapshot(unfinished) == before  # the original, every byte
    assert (copy / "summary.json").exists() and (copy / "run.log").stat().st_nlink == 1
    assert (copy / "run.log").read_bytes() != before["run.log"]  # the copy's log goes on, in a file of its own
    note = "metrics.jsonl, run.log, metrics.csv, tasks.csv had other names (hard links, as `cp -al` makes)"
    assert note in (copy / "run.log").read_text()


def test_own_copies_gives_a_shared_file_its_own_inode_with_its_bytes_and_modes(tmp_path):
    from dfcil.io import own_copies

    a, b, lone = tmp_path / "a.log", tmp_path / "b.log", tmp_path / "lone.log"
    a.write_text("kept\n")
    os.chmod(a, 0o640)
    os.link(a, b)
    lone.write_text("alone\n")
    inode = lone.stat().st_ino
    assert own_copies(tmp_path, ("b.log", "lone.log", "missing.log")) == ["b.log"]
    with open(b, "a") as f:
        f.write("more\n")
    assert a.read_text() == "kept\n" and b.read_text() == "kept\nmore\n"
    assert (a.stat().st_nlink, b.stat().st_nlink) == (1, 1) and oct(b.stat().st_mode & 0o777) == "0o640"
    assert lone.stat().st_ino == inode  # a file with one name is left as it is
    # a link inside the folder to a shared file: the file it names gets its own inode, the link stays
    os.link(a, tmp_path / "c.log")
    (tmp_path / "link.log").symlink_to("c.log")
    assert own_copies(tmp_path, ("link.log",)) == ["link.log"]
    assert (tmp_path / "link.log").is_symlink() and (tmp_path / "c.log").stat().st_nlink == 1
    with open(tmp_path / "link.log", "a") as f:
        f.write("more\n")
    assert a.read_text() == "kept\n"


def test_a_hard_linked_copy_locked_out_by_its_running_original_is_told_to_delete_its_lock(unfinished, tmp_path, capsys):
    from filelock import FileLock

    copy = tmp_path / "copy"
    (unfinished / ".lock").touch()
    shutil.copytree(unfinished, copy, copy_function=os.link)
    with FileLock(unfinished / ".lock"):  # a process working in the original holds the one lock file of both
        assert main(["resume", str(copy), "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert "is also another file's name (a hard link, as `cp -al` makes)" in err
        assert f"delete {copy / '.lock'} here and run the command again" in err and err.count("\n") == 1
        (copy / ".lock").unlink()  # as told
        assert main(["resume", str(copy), "--no-progress"]) == 0
    assert (copy / "summary.json").exists() and not (unfinished / "summary.json").exists()
