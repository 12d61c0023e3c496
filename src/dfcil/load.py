"""Loading a run's config: YAML files merged in order, then command-line overrides, validated into a
:class:`~dfcil.config.RunConfig`; the ``method`` section by the registered method's own ``Config``.

This is where the config layer meets the methods: it looks them up in :data:`dfcil.methods.METHODS`, the one table
of registered methods, so it stands above them, and the methods (which declare their configs with
:mod:`dfcil.config`) never import it. The config's ``plugins`` are imported here, before any method is looked up,
so that a method a plugin defines can be named (:mod:`dfcil.plugins`); a run directory's config names code that
is imported only with the user's consent (:func:`load_run_config`).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from dfcil import presets
from dfcil.config import (
    SECTIONS,
    TOP_LEVEL_SCALARS,
    MethodConfig,
    RunConfig,
    deep_merge,
    field_default,
    parse_value,
    quoted,
    read_yaml,
    set_dotted,
    validate_section,
)
from dfcil.errors import ConfigError, RegistryError
from dfcil.methods import METHODS
from dfcil.plugins import Consent, check_consent, import_plugins, normalized, saved_entry

DEFAULT_METHOD = "rdfcil"  # the method of a config that names none


def method_config(name: Any) -> type[MethodConfig]:
    """The ``Config`` class of the registered method ``name``.

    Raises:
        ConfigError: ``name`` is not a registered method's name (the message lists them).
    """
    if not isinstance(name, str):
        raise ConfigError(f"method.name must be a method's name (a string), got {quoted(name)}; see `dfcil methods`")
    try:
        return METHODS.get(name).Config
    except RegistryError as err:
        raise ConfigError(f"method.name: {err}. List them with `dfcil methods`.") from None


def plugin_specs(value: Any) -> tuple[str, ...]:
    """A config's ``plugins`` (None or a list of module names and ``.py`` files) validated, files' paths absolute,
    repeats dropped."""
    if value is None:
        return ()
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) and v.strip() for v in value):
        raise ConfigError(
            f"plugins must be a list of module names or .py files, e.g. [mypkg.mymethod, my_method.py]; got "
            f"{quoted(value)}"
        )
    return tuple(dict.fromkeys(normalized(v.strip()) for v in value))


def build_config(raw: Mapping[str, Any]) -> RunConfig:
    """Validate a raw config mapping (merged YAML + overrides) into a :class:`RunConfig`, after importing its
    ``plugins`` (which may define the method, dataset or backbone it names)."""
    allowed = {"method", *SECTIONS, *TOP_LEVEL_SCALARS}
    for key in raw:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ConfigError(
                f"unknown config key {quoted(key)}.{hint} Valid top-level keys: {', '.join(sorted(allowed))}"
            )
    plugins = plugin_specs(raw.get("plugins"))
    import_plugins(plugins)
    method_raw = dict(raw.get("method") or {})
    method_raw["name"] = method_raw.get("name", DEFAULT_METHOD)
    method_cfg = validate_section(method_config(method_raw["name"]), method_raw, "method")
    kwargs: dict[str, Any] = {name: validate_section(cls, raw.get(name), name) for name, cls in SECTIONS.items()}
    for key, typ in TOP_LEVEL_SCALARS.items():
        if key in raw:
            try:
                kwargs[key] = TypeAdapter(typ).validate_python(raw[key])
            except ValidationError as err:
                raise ConfigError(f"{key}: {err.errors()[0]['msg']} (got {quoted(raw[key])})") from None
    if isinstance(kwargs.get("task0_cache"), str) and not kwargs["task0_cache"].strip():
        raise ConfigError(
            "task0_cache: an empty path; give a directory, or leave it unset (null): no shared first task"
        )
    kwargs["plugins"] = plugins
    return RunConfig(method=method_cfg, **kwargs)


def _comparable(value: Any) -> Any:
    """``value`` as JSON data (a dataclass as its fields, tuples as lists, other objects as text), and a number that
    YAML left as text (``1e-3``) as the number: so that equal settings compare equal."""
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    plain = json.loads(json.dumps(dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value, default=str))
    return {k: _comparable(v) for k, v in plain.items()} if isinstance(plain, dict) else plain


def _kept(section: Mapping[str, Any], defaults: Mapping[str, Any], prefix: str) -> list[tuple[str, Any, Any]]:
    """(key, value, default) of each key of ``section`` whose value is not the new method's default."""
    out = []
    for key, value in section.items():
        default = defaults.get(key)
        if isinstance(value, Mapping) and isinstance(default, Mapping):
            out += _kept(value, default, f"{prefix}{key}.")
        elif _comparable(value) != default:
            out.append((f"{prefix}{key}", value, default))
    return out


def _dotted(tree: Mapping[str, Any], prefix: str = "") -> set[str]:
    out = set()
    for key, value in tree.items():
        out |= _dotted(value, f"{prefix}{key}.") if isinstance(value, Mapping) else {f"{prefix}{key}"}
    return out


def _switch_method(raw: dict[str, Any], name: Any, given: set[str] = frozenset()) -> list[str]:
    """Set ``method.name``; if that switches to another method, drop the method keys it does not have. Returns what
    the switch did to the keys gathered so far, as notes for the user: each key dropped, and each key kept at a
    value other than the new method's default (a preset's ``lambda_kd: 10`` stays 10 for the method switched to,
    which may not be what a user switching methods expects); keys that the switching source sets itself
    (``given``, dotted) are its own choice and not noted."""
    if not isinstance(name, str):
        raise ConfigError(f"method.name must be a method's name (a string), got {quoted(name)}; see `dfcil methods`")
    section = raw.setdefault("method", {})
    if not isinstance(section, dict):
        raise ConfigError(
            f"method must be a section (a mapping with a name and the method's keys), got {quoted(section)}"
        )
    old = section.get("name", DEFAULT_METHOD)
    section["name"] = name
    if name == old or name not in METHODS:
        return []
    fields = {f.name: f for f in dataclasses.fields(METHODS.get(name).Config)}
    dropped = sorted(k for k in section if k not in fields)
    for key in dropped:
        del section[key]
    defaults = {k: _comparable(field_default(f)) for k, f in fields.items()}
    kept = [
        k
        for k in _kept({k: v for k, v in section.items() if k != "name"}, defaults, "method.")
        if not any(k[0] == g or k[0].startswith(f"{g}.") for g in given)
    ]
    return [f"method.{k} dropped (not a key of {name})" for k in dropped] + [
        f"{k} kept at {quoted(v)} ({name}'s default: {quoted(d)})" for k, v, d in kept
    ]


def load_config(
    paths: Sequence[str | Path] = (),
    overrides: Iterable[tuple[str, str]] = (),
    base: Mapping[str, Any] | None = None,
    plugins: Sequence[str] = (),
) -> tuple[RunConfig, list[str]]:
    """Merge YAML files, then ``key=value`` overrides (command-line strings), into a validated config.

    Sources apply in order. When one switches ``method.name`` (a later file, or ``--method.name``), the method
    keys gathered so far that the new method does not accept are dropped, so ``--config rdfcil.yaml --method.name
    finetune`` and ``--config cifar100-mini.yaml --config cifar100-mini/lwf.yaml`` work. What a switch did is
    returned so the caller can say so: each key dropped, and each key kept at a value other than the new method's
    default. Keys given by the switching source itself are never dropped.

    ``plugins`` (``--plugin``) add to the ``plugins`` the sources list; all of them are imported first, so that a
    method they define can be switched to.

    Returns:
        The config and the notes on method switches (``"method.chr_epochs dropped (not a key of finetune)"``,
        ``"method.lambda_kd kept at 10.0 (lwf's default: 1.0)"``).
    """
    if isinstance(paths, str | os.PathLike):  # one file given alone, not a list of its characters
        paths = [paths]
    raw: dict[str, Any] = deep_merge({}, base or {})
    dropped: list[str] = []
    files = [(path, _with_saved_entries(path, read_yaml(path))) for path in paths]
    overrides = list(overrides)
    wanted = _plugins_of(raw, [data for _, data in files], overrides, plugins)
    import_plugins(wanted)
    for path, data in files:
        method = data.get("method") or {}
        if not isinstance(method, dict):
            raise ConfigError(
                f"{path}: method must be a section (e.g. method: {{name: {method}}}), got {type(method).__name__}"
            )
        name = method.get("name")
        if name is not None:
            dropped += _switch_method(raw, name, _dotted(method, "method."))
        deep_merge(raw, data)
    section = raw.get("method")
    files_method = section.get("name", DEFAULT_METHOD) if isinstance(section, dict) else DEFAULT_METHOD
    for key, text in overrides:  # a method switch first, so that the other overrides land in the new method
        if key == "method.name":
            dropped += _switch_method(raw, parse_value(text), {k for k, _ in overrides})
    for key, text in overrides:
        if key != "method.name":
            set_dotted(raw, key, parse_value(text))
    _refuse_keys_of_the_method_left(raw, files_method)
    raw["plugins"] = list(wanted)
    return build_config(raw), dropped


def protocol_without_method(paths: Sequence[str | Path], overrides: Iterable[tuple[str, str]] = ()) -> str:
    """A note for a run whose config files name no method and whose ``--config`` includes a protocol file of a
    folder that holds method files (``cifar100/n10``, whose header asks for a method file after it): the default
    method's defaults would train, not a recipe, and their schedule may not fit the protocol's. Empty otherwise (a
    file or ``--method.name`` names the method)."""
    if any(key == "method.name" for key, _ in overrides):
        return ""
    found = [(str(spec), presets.resolve(spec)) for spec in paths]
    if any("method" in read_yaml(path) for _, path in found):
        return ""
    for given, path in found:
        methods = sorted(p.stem for p in path.parent.glob(f"*{presets.SUFFIX}") if p != path and _names_method(p))
        if not methods:
            continue
        name = "rdfcil" if "rdfcil" in methods else methods[0]
        head, sep, _ = given.rpartition("/")
        example = f"{head}{sep}{name}" + (presets.SUFFIX if given.endswith(presets.SUFFIX) else "")
        return (
            f"{given} is a protocol and names no method: {DEFAULT_METHOD}'s defaults would train it, not a paper's "
            f"recipe. Give a method file after it (--config {given} --config {example}; the files beside it: "
            f"{', '.join(methods)}), or --method.name NAME to train a method's defaults"
        )
    return ""


def _names_method(path: Path) -> bool:
    """Whether a YAML file beside a protocol file has a method section (one that does not parse does not count)."""
    try:
        return "method" in read_yaml(path)
    except ConfigError:
        return False


RUN_FILES = ("meta.json", "checkpoints", "model.pt", "summary.json", "metrics.jsonl")  # what a run writes beside it


def is_run_record(path: str | Path) -> bool:
    """Whether a config file is a run directory's own ``config.yaml`` (beside what a run writes), given as
    ``--config`` to repeat the run: then its plugins are the run's, read as :func:`load_run_config` reads them."""
    path = Path(path)
    return path.name == "config.yaml" and any((path.parent / name).exists() for name in RUN_FILES)


def check_run_records(paths: Iterable[str | Path], consent: Consent) -> None:
    """Refuse config files among ``paths`` that are run directories' records naming plugin code ``consent`` does not
    allow (:func:`dfcil.plugins.check_consent`): ``dfcil train --config RECEIVED/config.yaml`` repeats a run from
    elsewhere, and the run's word alone imports none of its code."""
    for path in map(Path, paths):
        if is_run_record(path):
            value = read_yaml(path).get("plugins")
            if isinstance(value, list | tuple):
                specs = [saved_entry(s, path.parent) for s in value if isinstance(s, str) and s.strip()]
                check_consent(specs, path.parent, consent, what=f"the run record {path}")


def load_run_config(
    run_dir: str | Path,
    overrides: Iterable[tuple[str, str]] = (),
    consent: Consent = Consent(),  # noqa: B008 - frozen
) -> RunConfig:
    """The config a run directory saved (``RUN/config.yaml``), with ``overrides`` (runtime keys, as command-line
    strings), for every command that reads a run it did not just start: ``resume``, ``eval``, ``export``,
    ``inspect``, ``train`` on an existing ``--out``, a sweep's own runs.

    A run directory may come from elsewhere: the plugin files (and modules of no installed package) its
    ``plugins`` name are imported only with ``consent`` (:func:`dfcil.plugins.check_consent`), and a relative file
    path means the run directory, not the current one. What ``consent`` names beyond the run's own entries is
    imported too (e.g. a logger's plugin for ``resume --log``), without becoming part of the run's config.

    Raises:
        PluginError: the run names code the user did not allow (the message says how to allow it).
        ConfigError: the saved config cannot be read or is not valid.
    """
    run_dir = Path(run_dir)
    raw = read_yaml(run_dir / "config.yaml")
    value = raw.get("plugins")
    if isinstance(value, list | tuple):
        value = [saved_entry(s, run_dir) if isinstance(s, str) and s.strip() else s for s in value]
    listed = plugin_specs(value)
    check_consent(listed, run_dir, consent)
    raw["plugins"] = list(listed)
    extra = [s for s in plugin_specs(consent.named) if s not in listed]
    import_plugins(extra)
    return load_config([], overrides, base=raw)[0]


def _with_saved_entries(path: str | Path, data: dict[str, Any]) -> dict[str, Any]:
    """A config file's data, with the relative plugin files of a run directory's record (:func:`is_run_record`)
    meaning that run directory (as :func:`load_run_config` reads them), not the current one."""
    value = data.get("plugins")
    if is_run_record(path) and isinstance(value, list | tuple):
        data["plugins"] = [saved_entry(s, Path(path).parent) if isinstance(s, str) and s.strip() else s for s in value]
    return data


def _plugins_of(
    base: Mapping[str, Any],
    files: Sequence[Mapping[str, Any]],
    overrides: Sequence[tuple[str, str]],
    added: Sequence[str],
) -> tuple[str, ...]:
    """The ``plugins`` that the merged sources will hold (a later source's list replaces an earlier one's, as for any
    key), then ``added``."""
    listed = base.get("plugins")
    for data in files:
        listed = data.get("plugins", listed)
    for key, text in overrides:
        if key == "plugins":
            listed = parse_value(text)
    return plugin_specs([*plugin_specs(listed), *added])


def _refuse_keys_of_the_method_left(raw: dict[str, Any], files_method: str) -> None:
    """After ``--method.name NEW`` switched from the config files' method, an override of a key that only the files'
    method has is a leftover of it: say so, rather than call the key unknown."""
    section = raw.get("method")
    new = section.get("name") if isinstance(section, dict) else None
    if not isinstance(new, str) or new == files_method or new not in METHODS or files_method not in METHODS:
        return
    fields = {f.name for f in dataclasses.fields(METHODS.get(new).Config)}
    old_fields = {f.name for f in dataclasses.fields(METHODS.get(files_method).Config)}
    leftover = sorted(k for k in section if k not in fields and k in old_fields)
    if leftover:
        keys = ", ".join(f"--method.{k}" for k in leftover)
        raise ConfigError(
            f"{keys}: {'a setting' if len(leftover) == 1 else 'settings'} of {files_method}, the method of the "
            f"config files, which --method.name {new} replaces; {new} has no such key: drop {keys} (`--print-config` "
            f"shows {new}'s keys)"
        )
