"""Plugins: methods, datasets, backbones and loggers defined outside dfcil, found by every process of a run.

Two ways in (docs/extending.md, "Plugins"):

* **Entry points.** An installed package declares its components under the groups of :data:`GROUPS`, e.g.
  ``[project.entry-points."dfcil.methods"] mymethod = "mypkg.mymethod"``. A registry asked for a name it does not
  hold imports the module of the entry of that name (:func:`load_entry_point`), which registers itself. Only that
  entry is imported: a broken plugin breaks the runs that name it, and no other.
* **The config key** ``plugins`` (``dfcil train --plugin MODULE``): module names or ``.py`` files, imported before
  the config's method is validated (:func:`import_plugins`). It is saved in ``config.yaml``, so ``dfcil resume``,
  every run of a sweep, SLURM jobs, torchrun ranks and ``dfcil eval`` import them again.

A run directory is data that may come from elsewhere, so the code its ``config.yaml`` names is not imported on its
word alone (:func:`check_consent`): a plugin file, or a module that is no installed package's (found in or beside
the run directory, in the current directory, on ``PYTHONPATH``: :func:`found_outside`), is imported only when the
user names it again (``--plugin``) or trusts the run (``--trust-plugins``); installed packages (entry points, and
modules of site-packages or of an editable install) and the standard library load as before. An entry point is an
installed package's only when its package's metadata lies in an installed folder (:func:`installed_folders`), and
its module too: ``importlib.metadata`` reads a ``.dist-info`` folder from every ``sys.path`` entry, the current
directory and ``PYTHONPATH`` included, so a name a run gives could otherwise import a file beside it
(:func:`entry_point_outside`). Such an entry point is imported by no command on a name alone, a run's or the user's:
the user names its module (``--plugin MODULE``, which imports it before any lookup), installs its package, or
trusts the run (``--trust-plugins``).

A plugin that cannot be imported, or that exits while importing, is one :class:`~dfcil.errors.PluginError` naming
it, its package and the error.
This module imports nothing of dfcil but its errors: the registries and the config loader stand above it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import importlib.metadata
import importlib.util
import os
import site
import subprocess
import sys
import traceback
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType
from typing import Any

from dfcil.errors import PluginError

GROUPS = ("dfcil.methods", "dfcil.datasets", "dfcil.backbones", "dfcil.training.loggers")


def entry_points(group: str) -> list[importlib.metadata.EntryPoint]:
    """The entry points of ``group`` that the installed packages (every distribution on ``sys.path``) declare."""
    return list(importlib.metadata.entry_points(group=group))


def package_of(ep: importlib.metadata.EntryPoint) -> str:
    """``"mypkg 0.1"``: the distribution that declares ``ep``."""
    dist = ep.dist
    return f"{dist.name} {dist.version}" if dist is not None else "an unnamed package"


def load_entry_point(group: str, kind: str, name: str) -> str | None:
    """Import the module of the entry point ``name`` of ``group`` (it registers the ``kind`` ``name`` itself).

    An entry point of a package that is not installed (:func:`entry_point_outside`) is refused, unless the command
    trusts every plugin (:func:`check_consent` with ``--trust-plugins``): the lookup cannot tell a name the user
    typed from one a received file gave, nor which code will answer it.

    Returns:
        The entry point in words (for the caller's errors), or None when no package on ``sys.path`` declares ``name``.

    Raises:
        PluginError: several packages declare ``name``, its package is not installed and the command did not trust
            it, or its module fails to import.
    """
    found = {(ep.value, package_of(ep)): ep for ep in entry_points(group) if ep.name == name}
    if not found:
        return None
    if len(found) > 1:
        shown = " and ".join(f"{value} (package {package})" for value, package in sorted(found))
        raise PluginError(f"{kind} {name!r} is declared by several plugins: {shown}; uninstall all but one")
    (value, package), ep = next(iter(found.items()))
    where = f"{kind} plugin {name!r} ({group} entry point {value!r} of package {package})"
    outside = entry_point_outside(ep)
    if outside is not None and not _trusting_every_plugin:
        raise PluginError(
            f"{where} {outside}: dfcil imports it only with your consent. Read it first; then allow it with --plugin "
            f"{ep.module} (its module), install its package (pip install), or pass --trust-plugins (for a run "
            f"directory you trust)"
        )
    try:
        ep.load()
    except (Exception, SystemExit) as err:  # any error of the plugin's own code, or its exit: one line naming it
        raise PluginError(f"{where} {failed(err)}; fix it, or uninstall {package}") from None
    return where


def is_file(spec: str) -> bool:
    """Whether a ``plugins`` entry is a ``.py`` file's path (else a module name)."""
    return spec.endswith(".py") or "/" in spec or os.sep in spec


def normalized(spec: str) -> str:
    """A ``plugins`` entry as a run saves it: a file's path absolute (a relative one means the directory the command
    ran in, which a later ``dfcil resume`` need not share), a module name as given."""
    return str(Path(spec).expanduser().absolute()) if is_file(spec) else spec


def module_name(spec: str) -> str:
    """The module a ``plugins`` entry is imported as: a file's stem, or the module name."""
    return Path(spec).stem if is_file(spec) else spec


# ---------------------------------------------------------------------------------------- a run directory's code


@dataclasses.dataclass(frozen=True)
class Consent:
    """The code named by a run directory that the user allows dfcil to import: the ``plugins`` entries the user
    named again (``named``: ``--plugin`` of the command, files by path, modules by name), or every entry
    (``everything``: ``--trust-plugins``)."""

    named: tuple[str, ...] = ()
    everything: bool = False


# Whether the command trusts every plugin of the run directory it reads (--trust-plugins, seen by check_consent):
# then an entry point of a package that is not installed loads too. Process-wide, because the registries look names
# up far from the command, in any of its modules; a command is one process, and dfcil never turns it back off.
_trusting_every_plugin = False


def saved_entry(spec: str, run_dir: Path) -> str:
    """A ``plugins`` entry of a run directory's ``config.yaml``: a relative file path means the run directory (dfcil
    saves absolute paths, so a relative one was written by hand beside the config), never the directory the command
    runs in; an absolute path or a module name as saved."""
    if is_file(spec) and not Path(spec).expanduser().is_absolute():
        return str((Path(run_dir).absolute() / spec).resolve())
    return spec


def needs_consent(spec: str, run_dir: Path) -> bool:
    """Whether a run directory's ``plugins`` entry is code that may have come with the run rather than with this
    machine's Python: any ``.py`` file, or a module name that is no installed package's (:func:`found_outside`)."""
    return is_file(spec) or found_outside(spec, run_dir) is not None


def found_outside(module: str, run_dir: Path | None = None) -> str | None:
    """Where the module name ``module`` of a run directory's ``plugins`` would be imported from, in words
    (``"/x/mod.py, found in the current directory"``), when that is not this machine's Python: the run directory or
    the folder holding it, the current directory (``python -m dfcil`` puts it on ``sys.path``), a ``PYTHONPATH``
    entry, or any ``sys.path`` folder that is not an installed one (:func:`installed_folders`). None for an
    installed package's module (the user installed it: that is their consent), the standard library, a module found
    by an installed import hook (an editable install's), or a name that cannot be imported (its import fails with an
    error of its own). A folder that is both (a received run unpacked into an installed project's folder) is not
    trusted. Finding a top-level module runs none of its code. Without ``run_dir`` (an entry point's module, which
    no run directory names), the other places alone."""
    try:
        found = importlib.util.find_spec(module.split(".")[0])
    except (ImportError, ValueError):  # not importable, or imported without a spec: nothing of it runs again
        return None
    if found is None or not (found.has_location or found.submodule_search_locations):
        return None  # built into the interpreter, frozen, or not importable
    # the folders it is found in (a package's, or a namespace package's portions', parent; a module's own), where
    # it lies there: a link in the current directory to a file elsewhere is the current directory's
    locations = list(found.submodule_search_locations or [])
    homes = [Path(p).parent.resolve() for p in locations] if locations else [Path(str(found.origin)).parent.resolve()]
    what = found.origin if found.has_location else " and ".join(locations)
    installed = installed_folders()
    for home in homes:
        place = _place(home, run_dir, installed)
        if place is not None:
            return f"{what}, {place}"
        # else installed, or off sys.path: found by an import hook that installed code set up (an editable install)
    return None


def entry_point_outside(ep: importlib.metadata.EntryPoint) -> str | None:
    """Why the entry point ``ep`` is not an installed package's, in words (``"comes from a package that is not
    installed (its metadata in /x, found in the current directory)"``), or None when it is: its distribution's
    metadata lies in an installed folder (:func:`installed_folders`: site-packages, a folder an editable install
    adds; not the current directory nor a ``PYTHONPATH`` entry, even if installed too), and its module is not found
    outside them either (:func:`found_outside`: an installed package's entry point must not import a file of the
    same name that lies in the current directory). Reading where they lie imports nothing."""
    dist = ep.dist
    try:
        home = Path(str(dist.locate_file(""))).resolve() if dist is not None else None
    except (NotImplementedError, OSError, TypeError):  # a distribution that no folder holds
        home = None
    if home is None:
        return "comes from a package that no folder of sys.path holds"
    installed = installed_folders()
    place = _place(home, None, installed) or (None if home in installed else "found outside the installed packages")
    if place is not None:
        return f"comes from a package that is not installed (its metadata in {home}, {place})"
    module = found_outside(ep.module)
    if module is not None:
        return f"comes from an installed package, but its module is {module}"
    return None


def _place(home: Path, run_dir: Path | None, installed: set[Path]) -> str | None:
    """Where the folder ``home``, on ``sys.path``, lies when that is not an installed folder, in words (``"found in
    the current directory"``); None for an installed folder, or one off ``sys.path`` (an import hook's)."""
    cwd = Path.cwd().resolve()
    pythonpath = {(cwd / p).resolve() for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p}
    on_path = {Path(p or ".").resolve() for p in sys.path if isinstance(p, str)}
    if run_dir is not None:
        root = Path(run_dir).resolve()
        if home.is_relative_to(root):
            return "found in the run directory"
        if home == root.parent:
            return "found beside the run directory"
    if home == cwd:
        return "found in the current directory"
    if home in pythonpath:
        return "found on PYTHONPATH"
    if home in on_path and home not in installed:
        return "found outside the installed packages"
    return None


def installed_folders() -> set[Path]:
    """The ``sys.path`` folders of this machine's Python installation: those under its prefixes (the standard
    library, the interpreter's and the virtual environment's site-packages), the user's site-packages, and the
    folders that site-packages' ``.pth`` files add (editable installs), as :mod:`site` reads them."""
    prefixes = [Path(p).resolve() for p in {sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix}]
    sites = [*site.getsitepackages(), *([site.getusersitepackages()] if site.ENABLE_USER_SITE else [])]
    folders = {Path(p).resolve() for p in sites}
    folders |= {
        path
        for path in (Path(p or ".").resolve() for p in sys.path if isinstance(p, str))
        if any(path.is_relative_to(prefix) for prefix in prefixes)
    }
    for folder in sites:
        for pth in sorted(Path(folder).glob("*.pth")):
            try:
                lines = pth.read_text().splitlines()
            except (OSError, UnicodeDecodeError):  # site skips such a file too
                continue
            for line in lines:  # a line is a folder, a comment, or code (`import ...`), which adds no folder here
                if line.strip() and not line.startswith(("#", "import ", "import\t")):
                    folders.add((Path(folder) / line.rstrip()).resolve())
    return folders


def check_consent(specs: Iterable[str], run_dir: Path, consent: Consent, what: str | None = None) -> None:
    """Refuse to go on with a run directory whose ``plugins`` (as :func:`saved_entry` reads them) name code that
    ``consent`` does not allow (:func:`needs_consent`): a run directory from elsewhere must not run its code on its
    word alone, as Hugging Face's ``trust_remote_code`` asks before running a model's code. A consent that trusts
    every plugin (``--trust-plugins``) allows, for the rest of the process, the entry points of packages that are
    not installed too (:func:`load_entry_point`), which the names in the run's config may look up after this check.

    Raises:
        PluginError: one line listing what the run needs and how to allow it (``--plugin``, ``--trust-plugins``).
    """
    if consent.everything:
        global _trusting_every_plugin
        _trusting_every_plugin = True
        return
    files = {Path(s).expanduser().resolve() for s in consent.named if is_file(s)}
    modules = {s for s in consent.named if not is_file(s)}
    shown, missing = [], []
    for spec in specs:
        if is_file(spec):
            if Path(spec).resolve() not in files:
                shown.append(f"the file {spec}")
                missing.append(spec)
        elif spec not in modules:
            where = found_outside(spec, run_dir)
            if where is not None:
                shown.append(f"the module {spec} ({where})")
                missing.append(spec)
    if not missing:
        return
    allow = " ".join(f"--plugin {s}" for s in missing)
    raise PluginError(
        f"{what or f'the run in {run_dir}'} names plugin code that dfcil imports only with your consent: "
        f"{', '.join(shown)}. Read it first; then allow it with {allow} (or --trust-plugins: every plugin the run "
        f"names)"
    )


def import_plugins(specs: Iterable[str]) -> None:
    """Import every ``plugins`` entry (each registers what it defines); an entry imported before is not run again.

    Raises:
        PluginError: an entry cannot be found or fails to import; the message names it and the fix.
    """
    for spec in specs:
        import_plugin(spec)


def import_plugin(spec: str) -> ModuleType:
    """Import one ``plugins`` entry: a module name (from ``sys.path``) or a ``.py`` file."""
    if is_file(spec):
        return _import_file(Path(spec).expanduser().absolute())
    try:
        return importlib.import_module(spec)
    except ModuleNotFoundError as err:
        if err.name is not None and (spec == err.name or spec.startswith(f"{err.name}.")):
            stem = spec.rsplit(".", 1)[-1]
            raise PluginError(
                f"plugin {spec!r}: no module of that name can be imported. Install its package (pip install -e "
                f"DIR), add its folder to PYTHONPATH, or give its file's path (--plugin path/to/{stem}.py)"
            ) from None
        raise PluginError(f"plugin {spec!r} failed to import: {one_line(err)}; install what it needs") from None
    except (Exception, SystemExit) as err:
        raise PluginError(f"plugin {spec!r} {failed(err)}") from None


def _import_file(path: Path) -> ModuleType:
    """Import the file ``path`` as the module named by its stem (which pickling and ``sys.modules`` then know)."""
    if not path.is_file():
        raise PluginError(
            f"plugin file {path} does not exist: give the path of a .py file, or a module name (one on PYTHONPATH or "
            f"in an installed package); a run keeps the path it started with: put the file back there to resume it"
        )
    name = path.stem
    if not name.isidentifier():
        raise PluginError(f"plugin file {path}: {name!r} is not a Python module name; rename the file (letters, _)")
    loaded = sys.modules.get(name)
    if loaded is not None:
        where = getattr(loaded, "__file__", None)
        if where is not None and Path(where).resolve() == path.resolve():
            return loaded
        raise PluginError(
            f"plugin file {path}: a module named {name!r} is already imported (from {where or 'Python itself'}); "
            f"rename the file"
        )
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None  # a .py file always has a source loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as err:
        del sys.modules[name]
        raise PluginError(f"plugin file {path} {failed(err)}") from None
    except BaseException:  # Ctrl-C while it imports: no half-imported module left behind
        del sys.modules[name]
        raise
    return module


def failed(err: BaseException) -> str:
    """``failed to import: ValueError: ...`` or ``exited while importing (sys.exit(5))``: what went wrong in a
    plugin's import, for an error that names the plugin. A ``KeyboardInterrupt`` is no plugin's failure: it is not
    caught, and stops the command as Ctrl-C does anywhere (exit status 130)."""
    if isinstance(err, SystemExit):
        code = err.code
        said = f"sys.exit({code!r})" if code is None or isinstance(code, int) else f"SystemExit({str(code)!r})"
        where = one_line(err).partition(" (at ")[2].rstrip(")")
        return f"exited while importing ({said}{f' at {where}' if where else ''}); a plugin must not exit"
    return f"failed to import: {one_line(err)}"


def one_line(err: BaseException) -> str:
    """``ValueError: bad thing (at /path/mod.py:12)``: an exception in one line, with where its plugin raised it."""
    text = f"{type(err).__name__}: {' '.join(str(err).split())}"
    frames = [f for f in traceback.extract_tb(err.__traceback__) if not f.filename.startswith("<frozen")]
    if frames and not isinstance(err, SyntaxError):  # a SyntaxError's text names its file and line already
        text += f" (at {frames[-1].filename}:{frames[-1].lineno})"
    return text


# ---------------------------------------------------------------------------------------------------- provenance


def provenance(module: str) -> dict[str, Any]:
    """What ``meta.json`` records of a plugin module: its file and the SHA-256 of its content, its package and
    version (or None), and the git SHA of the repository its file lies in (or None)."""
    loaded = sys.modules.get(module)
    file = getattr(loaded, "__file__", None)
    package = _distribution(module)
    version = None
    if package is not None:
        try:
            version = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            version = None
    return {
        "module": module,
        "file": file,
        "sha256": file_sha256(file),
        "package": package,
        "version": version,
        "git_sha": _git_sha(Path(file).parent) if file else None,
    }


def file_sha256(file: str | None) -> str | None:
    """The SHA-256 of a plugin's source file, so that an edited file can be told from the one a run used; None
    where the module has no readable file."""
    if not file:
        return None
    try:
        return hashlib.sha256(Path(file).read_bytes()).hexdigest()
    except OSError:
        return None


def changed_plugins(recorded: object) -> list[str]:
    """The plugin modules of a run's ``meta.json`` record (its ``plugins`` list) whose file, imported now, has
    another SHA-256 than the run recorded: "module (file)" for each. Modules not imported now, and records saved
    before the hash, are not compared."""
    changed = []
    for entry in recorded if isinstance(recorded, list) else []:
        if not isinstance(entry, dict) or not entry.get("sha256") or entry.get("module") not in sys.modules:
            continue
        now = provenance(entry["module"])
        if now["sha256"] is not None and now["sha256"] != entry["sha256"]:
            changed.append(f"{entry['module']} ({now['file']})")
    return changed


def _distribution(module: str) -> str | None:
    """The installed distribution that provides ``module``: from the files it installed, else from the entry points
    of dfcil's groups that name the module (an editable install lists no package files)."""
    top = module.split(".")[0]
    names = importlib.metadata.packages_distributions().get(top)
    if names:
        return names[0]
    for group in GROUPS:
        for ep in entry_points(group):
            if ep.dist is not None and ep.value.split(":")[0].split(".")[0] == top:
                return ep.dist.name
    return None


def _git_sha(folder: Path) -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=folder, capture_output=True, text=True, timeout=10, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None
