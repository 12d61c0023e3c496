"""The presets: the YAML configs that ship with dfcil, found by name from any install.

The repository's ``configs/`` folder is the one source: the package holds it as ``dfcil/configs`` (a link in the
checkout, the files themselves in a wheel), so ``--config smoke``, ``--config cifar100/n10 --config cifar100/rdfcil``
and ``--config cifar100-mini`` work from a clone and from ``pip install dfcil`` alike. A path that exists always wins
over a name. ``dfcil presets`` lists them, ``dfcil presets copy NAME DIR`` starts one's own from one.

Reading a preset's header needs nothing but the file: no torch, no registry."""

from __future__ import annotations

import importlib.resources
import os
import re
import shutil
from pathlib import Path

SUFFIX = ".yaml"


def root() -> Path:
    """The folder that holds the presets (``dfcil/configs`` in the installed package)."""
    return Path(str(importlib.resources.files("dfcil") / "configs"))


def preset_file(name: str) -> Path | None:
    """The file of the preset ``name`` (``smoke``, ``cifar100/n10``, with or without ``.yaml``), or None."""
    rel = name.removesuffix(SUFFIX).strip("/")
    if not rel or rel.startswith(".") or ".." in Path(rel).parts or os.path.isabs(rel):
        return None
    path = root() / f"{rel}{SUFFIX}"
    return path if path.is_file() else None


def resolve(spec: str | os.PathLike) -> Path:
    """A ``--config`` value as a file: the path itself where it exists (a path always wins), else the preset of
    that name, else the path unchanged (whose reader then says it does not exist, naming ``dfcil presets``)."""
    path = Path(spec)
    if path.exists():
        return path
    found = preset_file(str(spec))
    return found if found is not None else path


def names() -> list[str]:
    """Every preset's name, sorted: ``cifar100/n10``, ``smoke``, ``smoke/adagauss``, ..."""
    base = root()
    return sorted(str(p.relative_to(base).with_suffix("")) for p in base.rglob(f"*{SUFFIX}") if p.is_file())


def header(path: Path) -> list[str]:
    """The comment lines at the top of a preset file, without their ``#``."""
    lines = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        lines.append(line[1:].strip())
    return lines


def summary(path: Path, width: int = 100) -> str:
    """A preset's one-line summary: the first sentence of its header; where that is longer than ``width``, what
    comes before its first colon outside parentheses (``R-DFCIL (Tables 1 and 2) on CIFAR-100``) if that says
    enough, else the sentence cut at a word."""
    text = re.split(r"(?<=[a-z0-9)])\.(?:\s|$)", " ".join(h for h in header(path)[:4] if h))[0]
    if len(text) <= width:
        return text
    head = _before_colon(text)
    if 25 <= len(head) <= width:
        return head
    return text[: text.rfind(" ", 0, width - 3)] + "..."


def _before_colon(text: str) -> str:
    """``text`` up to its first ``": "`` outside parentheses (all of it where there is none)."""
    depth = 0
    for i, c in enumerate(text):
        depth += (c == "(") - (c == ")")
        if c == ":" and depth == 0 and text[i + 1 : i + 2] == " ":
            return text[:i]
    return text


# a header line of a method file's paper block: "  n10 (10 equal tasks of 10 classes): A_N = 42.37 ± 0.72, ..."
PAPER_LINE = re.compile(r"^(\w+) \([^)]*\): A_N = (\d+(?:\.\d+)?(?: ± \d+(?:\.\d+)?)?)")  # not a full stop after


def paper_numbers(path: Path) -> dict[str, str]:
    """The paper's A_N per setting, as the method file's header gives it (``{"n10": "42.37 ± 0.72"}``); empty for a
    file without one."""
    found = {}
    for line in header(path):
        match = PAPER_LINE.match(line)
        if match:
            found[match[1]] = match[2]
    return found


def copy(name: str, dest: str | os.PathLike) -> list[Path]:
    """Copy the preset ``name`` (a file, or a folder of them: ``cifar100``) into the folder ``dest``, keeping their
    relative paths; a file already there is not overwritten. Returns the files written.

    Raises:
        FileNotFoundError: no preset or folder of presets is named so.
        FileExistsError: naming the first file ``dest`` already holds (nothing is written).
    """
    rel = name.removesuffix(SUFFIX).strip("/")
    single, folder = preset_file(name), root() / rel
    if single is not None:
        sources = [(single, Path(single.name))]
    elif rel and ".." not in Path(rel).parts and folder.is_dir():
        sources = [(p, p.relative_to(folder.parent)) for p in sorted(folder.rglob(f"*{SUFFIX}"))]
    else:
        raise FileNotFoundError(name)
    dest = Path(dest)
    targets = [(src, dest / rel_path) for src, rel_path in sources]
    for _, target in targets:
        if target.exists():
            raise FileExistsError(str(target))
    for src, target in targets:
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, target)
    return [target for _, target in targets]
