"""Commands on a finished run directory: evaluate its final model (``dfcil eval``) and export it (``dfcil export``).

Both read what the run saved (``config.yaml``, ``model.pt``, ``summary.json``); neither imports the engine.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from dfcil.checkpoint import loads
from dfcil.compute.runtime import Runtime, resolve_device
from dfcil.config import RunConfig, with_absolute_paths
from dfcil.data.device import Normalizer
from dfcil.data.splits import ClassIncrementalSplit
from dfcil.errors import CheckpointError, ConfigError
from dfcil.extras import require
from dfcil.io import check_creatable_dir, read_regular_text, write_atomic, write_json
from dfcil.load import load_run_config
from dfcil.methods import build_method
from dfcil.model_file import check_model, network_from
from dfcil.models.network import IncrementalNet, NetOutput
from dfcil.plugins import Consent
from dfcil.progress import make_progress
from dfcil.registry import Registry
from dfcil.training.protocol import IDENTITY_KEYS, Protocol, TestSet, load_protocol, validate
from dfcil.version import __version__

CARD_FORMAT = 2  # the exported JSON's layout; raise it when a key changes (2: class_names by raw id, output_names)


@dataclasses.dataclass(frozen=True)
class FinishedRun:
    """What a finished run directory holds: its config (with runtime overrides), ``model.pt``'s payload and
    ``summary.json``."""

    dir: Path
    cfg: RunConfig
    model: dict[str, Any]
    summary: dict[str, Any] | None

    @classmethod
    def open(
        cls,
        run_dir: str | os.PathLike,
        consent: Consent = Consent(),  # noqa: B008 - frozen
        **overrides: Any,
    ) -> FinishedRun:
        """Read ``run_dir``; ``overrides``: runtime keys (``data.root``, ``device``), None for the saved value;
        ``consent``: the plugin code the run names that may be imported (:func:`dfcil.load.load_run_config`)."""
        run_dir = Path(run_dir)
        if not (run_dir / "config.yaml").exists():
            raise ConfigError(f"{run_dir} is not a dfcil run directory (no config.yaml)")
        path = run_dir / "model.pt"
        if not path.exists() and not (run_dir / "summary.json").exists():
            raise ConfigError(
                f"{run_dir} has no model.pt: the final model is written when the run's last task ends; finish the "
                f"run first (`dfcil resume {run_dir}`)"
            )
        if not path.exists():  # a finished run whose model file was deleted, or not copied with it
            again = (
                f"; its last checkpoint can write it again: `mv {run_dir}/summary.json {run_dir}/summary.old.json && "
                f"dfcil resume {run_dir}`"
                if (run_dir / "checkpoints" / "last.pt").exists()
                else ": copy it from where the run was trained"
            )
            raise ConfigError(f"{run_dir} has no model.pt, though the run finished (summary.json exists){again}")
        given = [(key, json.dumps(value)) for key, value in overrides.items() if value is not None]
        cfg = with_absolute_paths(load_run_config(run_dir, given, consent))
        summary_path = run_dir / "summary.json"
        summary = None
        if summary_path.exists():
            try:
                summary = json.loads(read_regular_text(summary_path))
            except (OSError, ValueError) as err:
                raise ConfigError(
                    f"{summary_path} cannot be read ({err}); the run's summary is damaged: restore it, or delete it "
                    f"and finish the run again with `dfcil resume {run_dir}`"
                ) from None
            if not isinstance(summary, dict):
                raise ConfigError(f"{summary_path} is not a dfcil summary (a {type(summary).__name__}); restore it")
        model = loads(path.read_bytes(), str(path))
        check_own_model(model, run_dir, cfg, summary)
        check_model(model, str(path))  # weights that fit what the file says of them, before anything uses them
        return cls(run_dir, cfg, model, summary)

    def network(self, device: torch.device) -> IncrementalNet:
        """The final network on ``device``, in eval mode (channels-last if the run trained so)."""
        net = network_from(self.model).to(device)
        return net.to(memory_format=torch.channels_last) if self.cfg.engine.channels_last else net

    def protocol(self) -> Protocol:
        """The run's dataset and tasks, read from its data root; refused if the class order is not the run's."""
        validate(self.cfg)  # what training writes beside the run (task0_cache, compile_cache) is not needed here
        protocol = load_protocol(self.cfg, make_progress(False))
        order = list(protocol.split.class_order)
        saved = self.model.get("class_order") or (self.summary or {}).get("class_order")
        if saved is not None and order != saved:
            raise ConfigError(
                f"the data ({protocol.dataset.source}) gives the class order {order}, the run was trained on "
                f"{saved}: point --data.root at the data the run was trained on"
            )
        self.check_data(protocol)
        return protocol

    def check_data(self, protocol: Protocol) -> None:
        """Refuse data other than the run was trained on (its classes, image size or image count differ from
        ``meta.json``'s record, as ``dfcil resume`` refuses them); say on stderr where only the pixels or the
        normalisation do (images changed in place, or decoded by another Pillow). A run without the record (from a
        dfcil before it) is not checked."""
        try:
            saved = json.loads(read_regular_text(self.dir / "meta.json")).get("data")
        except (OSError, ValueError, AttributeError):
            return
        if not saved:
            return
        now = protocol.data_identity(self.cfg.data.train_per_class)
        differ = [key for key in now if now[key] != saved.get(key)]
        if any(key in IDENTITY_KEYS for key in differ):
            raise ConfigError(
                f"{self.dir} was trained on other data than {protocol.dataset.source} holds (its "
                f"{', '.join(differ)} differ): point --data.root at the data the run was trained on"
            )
        if differ:
            print(
                f"dfcil: warning: the data's {', '.join(differ)} differ from what {self.dir} was trained on (the "
                f"same classes and image count: images changed in place, or decoded by another version of Pillow?)",
                file=sys.stderr,
            )

    def description(self) -> dict[str, Any]:
        """What the final model's inputs and outputs are: image size, normalisation, the raw class of each output
        (``class_order``) and its name (``class_names``, by output as in ``model.pt``; empty where the dataset
        names no classes). Runs saved before ``model.pt`` held it read the dataset."""
        if "inputs" in self.model:
            keys = ("inputs", "class_order", "task_sizes", "class_names")
            return {k: self.model[k] for k in keys}
        dataset, split = (p := self.protocol()).dataset, p.split
        names = [dataset.classes[c] for c in split.class_order] if dataset.classes else []
        inputs = {"image_size": dataset.image_size, "mean": list(dataset.mean), "std": list(dataset.std)}
        return {"inputs": inputs, "class_order": list(split.class_order), "task_sizes": list(split.task_sizes),
                "class_names": names}  # fmt: skip


def _run_id(run_dir: Path, summary: dict[str, Any] | None) -> str | None:
    """The run's id: from its summary, else from ``meta.json`` (a run that wrote its model but not yet its summary);
    None for a run of a dfcil before run ids."""
    if summary is not None and isinstance(summary.get("run_id"), str):
        return summary["run_id"]
    try:
        meta = json.loads(read_regular_text(run_dir / "meta.json"))
    except (OSError, ValueError):
        return None
    return meta.get("run_id") if isinstance(meta, dict) and isinstance(meta.get("run_id"), str) else None


def check_own_model(model: dict[str, Any], run_dir: Path, cfg: RunConfig, summary: dict[str, Any] | None) -> None:
    """Refuse a ``model.pt`` that another run wrote (copied over this one's, of the same shape or not): its run id
    (``model.pt``'s ``run``) must be the run's own (``summary.json``, ``meta.json``). For runs of a dfcil before
    run ids, what both files record must agree: the class order, and the method where the model names one."""
    mine = _run_id(run_dir, summary)
    theirs = model.get("run") if isinstance(model.get("run"), dict) else {}
    fix = f"put back {run_dir}'s own model.pt, or evaluate the run that wrote this one in its own directory"
    if mine is not None and theirs.get("id") != mine:
        where = f"{theirs.get('method')} on {theirs.get('dataset')}, trained in {theirs.get('dir')}"
        who = f"run {theirs['id']} ({where})" if theirs.get("id") else "a run of a dfcil before run ids"
        raise CheckpointError(f"{run_dir / 'model.pt'} was written by {who}, not by run {mine} of {run_dir}: {fix}")
    if theirs.get("method") not in (None, cfg.method.name):
        raise CheckpointError(
            f"{run_dir / 'model.pt'} is a {theirs['method']} model, and {run_dir} a {cfg.method.name} run: {fix}"
        )
    order = (summary or {}).get("class_order")
    if order is not None and model.get("class_order") is not None and list(model["class_order"]) != list(order):
        raise CheckpointError(
            f"{run_dir / 'model.pt'} was trained on another class order ({list(model['class_order'])[:6]}...) than "
            f"{run_dir}'s summary.json records ({list(order)[:6]}...): {fix}"
        )


# ------------------------------------------------------------------------------------------------------ eval


def selected_labels(
    split: ClassIncrementalSplit,
    names: Sequence[str],
    classes: Sequence[str] | None = None,
    tasks: Sequence[int] | None = None,
) -> list[int]:
    """The order positions (labels) to evaluate: every class of the protocol by default, the raw class ids or names
    in ``classes`` (``names``: the dataset's class names by raw id), or the classes of ``tasks``.

    Raises:
        ConfigError: naming a class or task the run does not have.
    """
    order = list(split.class_order)
    if (tasks is not None and not tasks) or (classes is not None and not classes):  # would evaluate no image
        raise ConfigError("an empty selection: give at least one class or task, or neither (every class)")
    if tasks is not None:
        bad = [t for t in tasks if not 0 <= t < split.num_tasks]
        if bad:
            raise ConfigError(f"task {bad[0]} is not a task of this run (it has tasks 0..{split.num_tasks - 1})")
        return sorted({label for t in tasks for label in range(split.offsets[t], split.offsets[t + 1])})
    if classes is None:
        return list(range(len(order)))
    labels = []
    for token in classes:
        raw = int(token) if str(token).lstrip("-").isdigit() else (names.index(token) if token in names else None)
        if raw is None or raw not in order:
            ours = [names[c] for c in sorted(order) if c < len(names)]
            close = difflib.get_close_matches(str(token), ours, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            shown = ", ".join(ours[:10]) + (f" and {len(ours) - 10} more" if len(ours) > 10 else "")
            known = f"raw class ids {sorted(order)}" + (f", or their names: {shown}" if ours else "")
            raise ConfigError(f"class {token!r} is not one of this run's classes ({known}).{hint}")
        labels.append(order.index(raw))
    return sorted(set(labels))


@torch.no_grad()
def predict(
    net: IncrementalNet,
    test: TestSet,
    batch_size: int,
    runtime: Runtime,
    scores: Callable[[NetOutput], Tensor] | None = None,
) -> tuple[Tensor, Tensor]:
    """The network's class (order position) for every test image of the seen classes, in the engine's batches
    (:meth:`TestSet.evaluate`), so that the engine's counts are reproduced exactly; and its class among the classes
    of the image's own task only (task-aware). ``scores``: the method's :meth:`~dfcil.methods.Method.eval_logits`,
    None for the logits."""
    n, preds, within = int(test.seen[-1]), [], []
    with runtime.autocast():
        for i in range(0, n, batch_size):
            out = net(test.normalizer(test.x[i : min(i + batch_size, n)]))
            s = (out.logits if scores is None else scores(out)).float()
            preds.append(s.argmax(dim=1))
            own = test.task_of_label[: s.shape[1]][None, :] == test.task_of_label[test.y[i : i + len(s)]][:, None]
            within.append(s.masked_fill(~own, float("-inf")).argmax(dim=1))
    return torch.cat(preds), torch.cat(within)


def method_scores(run: FinishedRun) -> Callable[[NetOutput], Tensor] | None:
    """How the run's method scores classes when ``model.pt`` holds its evaluation state (FeCAM: class statistics),
    else None (the network's logits)."""
    state = run.model.get("method_state")
    if not state:
        return None
    method = build_method(run.cfg.method, run.cfg.train)
    method.load_eval_state(state)
    return method.eval_logits


def _accuracy(hit: Tensor, mask: Tensor) -> dict[str, Any] | None:
    count = int(mask.sum())
    if count == 0:
        return None
    correct = int((hit & mask).sum())
    return {"acc": round(100.0 * correct / count, 4), "correct": correct, "count": count}


def confusion(pred: Tensor, within: Tensor, y: Tensor, task_of_label: Tensor, mask: Tensor) -> dict[str, float]:
    """Where the images of ``mask`` (one task's) go: ``within``, the accuracy when only their own task's classes
    compete (task-aware: how well the representation and head separate the task's classes among themselves), and
    the share (percent) predicted into a class of an earlier task, of their own, or of a later one. A task well
    separated ``within`` but with a low accuracy is learned, and lost to the competition with the others."""
    count = int(mask.sum())
    own, predicted = task_of_label[y[mask]], task_of_label[pred[mask]]
    return {
        "within": round(100.0 * int((within[mask] == y[mask]).sum()) / count, 4),
        "to_old": round(100.0 * int((predicted < own).sum()) / count, 4),
        "to_own": round(100.0 * int((predicted == own).sum()) / count, 4),
        "to_later": round(100.0 * int((predicted > own).sum()) / count, 4),
    }


def accuracy_report(
    pred: Tensor, y: Tensor, task_of_label: Tensor, labels: Sequence[int], within: Tensor | None = None
) -> dict[str, Any]:
    """Top-1 accuracy (percent) on the test images whose label is in ``labels``: overall, on the old classes (tasks
    before the last), on the new ones (the last task) and per task, each with its correct and total counts; with
    ``within`` (the task-aware predictions), each task's :func:`confusion` too."""
    chosen = torch.isin(y, torch.as_tensor(list(labels), device=y.device))
    hit, task = pred == y, task_of_label[y]
    last = int(task_of_label.max())
    per_task = [dict(task=t, **a) for t in range(last + 1) if (a := _accuracy(hit, chosen & (task == t)))]
    if within is not None:
        for entry in per_task:
            entry |= confusion(pred, within, y, task_of_label, chosen & (task == entry["task"]))
    return {
        **_accuracy(hit, chosen), "old": _accuracy(hit, chosen & (task < last)),
        "new": _accuracy(hit, chosen & (task == last)), "tasks": per_task,
    }  # fmt: skip


def evaluate_run(
    run_dir: str | os.PathLike,
    data_root: str | None = None,
    classes: Sequence[str] | None = None,
    tasks: Sequence[int] | None = None,
    device: str | None = None,
    consent: Consent = Consent(),  # noqa: B008 - frozen
    with_confusion: bool = False,
) -> dict[str, Any]:
    """Evaluate a finished run's final model on the test images of every class it learned (or of ``classes``, raw
    ids or names, or of the classes of ``tasks``), with the run's test set, batches and precision: the default
    reproduces the last row of the run's accuracy matrix. ``consent``: plugin code the run names that may be
    imported; ``with_confusion``: where each task's images go (:func:`confusion`)."""
    if classes is not None and tasks is not None:
        raise ConfigError("give classes or tasks, not both")
    run = FinishedRun.open(run_dir, consent, **{"data.root": data_root, "device": device})
    protocol, cfg = run.protocol(), run.cfg
    ds = protocol.dataset  # classes by name: the dataset's names, else what its classes are (CIFAR-100's)
    labels = selected_labels(protocol.split, ds.classes or ds.words, classes, tasks)
    device_ = resolve_device(cfg.device)
    runtime = Runtime.from_config(cfg.engine, device_, make_progress(False))
    normalizer = Normalizer(protocol.dataset.mean, protocol.dataset.std, device_, cfg.engine.channels_last)
    test = TestSet.build(protocol, cfg.data.test_per_class, normalizer, device_)
    pred, within = predict(run.network(device_), test, cfg.train.eval_batch_size, runtime, method_scores(run))
    order = protocol.split.class_order
    y = test.y[: len(pred)]
    report = accuracy_report(pred, y, test.task_of_label, labels, within if with_confusion else None)
    return {"run": str(run.dir), "classes": [order[k] for k in labels], **report}


def format_report(report: dict[str, Any]) -> str:
    """The lines ``dfcil eval`` prints."""

    def part(name: str, a: dict[str, Any] | None) -> str:
        return f"{name:9s}{a['acc']:6.2f}%  ({a['correct']}/{a['count']})" if a else f"{name:9s}   n/a"

    def spread(a: dict[str, Any]) -> str:
        if "within" not in a:
            return ""
        return (
            f"  within {a['within']:6.2f}%; to old {a['to_old']:5.1f}%, own {a['to_own']:5.1f}%, "
            f"later {a['to_later']:5.1f}%"
        )

    n, images = len(report["classes"]), report["count"]
    lines = [f"{report['run']}: {n} class{'es' * (n != 1)}, {images} test image{'s' * (images != 1)}"]
    lines += [part("accuracy", report), part("old", report["old"]), part("new", report["new"])]
    lines += [part(f"task {a['task']}", a) + spread(a) for a in report["tasks"]]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------- export


def names_by_raw_id(output_names: Sequence[str], class_order: Sequence[int]) -> list[str | None]:
    """Class names by raw class id from names by output (``output_names[k]`` names raw class ``class_order[k]``);
    None at a raw id the run did not learn (a class order over some of the dataset's classes)."""
    if not output_names:
        return []
    names: list[str | None] = [None] * (max(class_order) + 1)
    for name, raw in zip(output_names, class_order, strict=True):
        names[raw] = name
    return names


def model_card(run: FinishedRun, weights: str) -> dict[str, Any]:
    """The JSON beside exported weights: what builds the network and what its inputs and outputs mean.

    ``class_names`` is indexed by raw class id, as in ``summary.json`` (the dataset's every name, from the
    summary where it has them), and ``output_names`` by output: ``output_names[k] == class_names[class_order[k]]``.
    """
    about, model = run.description(), run.model
    outputs = about["class_names"]
    names = (run.summary or {}).get("class_names") or names_by_raw_id(outputs, about["class_order"])
    return {
        "format": CARD_FORMAT, "dfcil": __version__, "weights": weights, "method": run.cfg.method.name,
        "dataset": run.cfg.data.name, "backbone": model["backbone"], "head": model["head"],
        "head_sizes": list(model["head_sizes"]), "num_classes": sum(model["head_sizes"]), **about,
        "class_names": names, "output_names": outputs,
        "input": "float (B, 3, image_size, image_size) RGB, normalised as (x / 255 - mean) / std",
        "output": "logits (B, num_classes); output k is raw class class_order[k], named output_names[k] "
        "(= class_names[class_order[k]])",
        "build": "net = dfcil.models.network.build_network(backbone, head); net.expand(n) for n in head_sizes; "
        "state = safetensors.torch.load_file(weights); "
        "net.load_state_dict({k: v for k, v in state.items() if not k.startswith('method.')}); net(x).logits",
        "last_acc": (run.summary or {}).get("last_acc"), "run_id": _run_id(run.dir, run.summary),
        **method_card(run),
    }  # fmt: skip


def check_not_another_export(out: Path, card: Path, run: FinishedRun) -> None:
    """Refuse an ``--out`` outside the run directory where a file already is, unless it is this run's own earlier
    export (weights and a card naming this run's id), which an export writes again: two runs exported to one name,
    or a user's own file there, would be lost without a word."""
    if out.resolve().parent == run.dir.resolve() or not (out.exists() or card.exists()):
        return  # the run's own export, or nothing to replace
    try:
        earlier = json.loads(read_regular_text(card)).get("run_id") if out.exists() else None
    except (OSError, ValueError, AttributeError):
        earlier = None
    mine = _run_id(run.dir, run.summary)
    if earlier is None or earlier != mine:
        whose = f"an export of another run ({earlier})" if earlier else "not an export of this run"
        there = " and ".join(str(p) for p in (out, card) if p.exists())
        raise ConfigError(f"--out {out}: {there} already exists, {whose}; remove it or choose another --out")


def method_card(run: FinishedRun) -> dict[str, Any]:
    """For a method that classifies with state of its own (FeCAM's class statistics, LDC's class means): the
    tensors the weights file holds as ``method.<key>``, its other values, and how to classify with them."""
    state = run.model.get("method_state") or {}
    if not state:
        return {}
    method = build_method(run.cfg.method, run.cfg.train)
    method.load_eval_state(state)
    tensors = {f"method.{k}": list(v.shape) for k, v in state.items() if isinstance(v, Tensor)}
    values = {k: v for k, v in state.items() if not isinstance(v, Tensor)}
    return {
        "output": "class scores from the network's features and the method's state (classify), not its logits",
        "method_state": tensors, "method_values": values, "classify": method.eval_recipe(),
    }  # fmt: skip


def to_safetensors(run: FinishedRun, out: Path) -> None:
    st = require("safetensors.torch", "export", "dfcil export --format safetensors", "safetensors")
    tensors = {k: v.detach().clone().contiguous() for k, v in run.model["net"].items()}  # no shared storage
    state = run.model.get("method_state") or {}  # what the method classifies with besides the network
    tensors |= {f"method.{k}": v.detach().clone().contiguous() for k, v in state.items() if isinstance(v, Tensor)}
    write_atomic(out, st.save(tensors, metadata={"dfcil": __version__, "backbone": run.model["backbone"]}))


@dataclasses.dataclass(frozen=True)
class ExportFormat:
    suffix: str
    write: Callable[[FinishedRun, Path], None]


EXPORT_FORMATS: Registry[ExportFormat] = Registry("export format")
EXPORT_FORMATS.register("safetensors")(ExportFormat(".safetensors", to_safetensors))


def export_run(
    run_dir: str | os.PathLike,
    fmt: str = "safetensors",
    out: str | os.PathLike | None = None,
    data_root: str | None = None,
    consent: Consent = Consent(),  # noqa: B008 - frozen
) -> tuple[Path, Path]:
    """Write the final network's weights in format ``fmt`` (default ``<run>/model.<fmt>``) and its model card
    (:func:`model_card`) beside them, as ``.json``. Returns both paths. ``consent``: plugin code the run names that
    may be imported."""
    exporter = EXPORT_FORMATS.get(fmt)
    run = FinishedRun.open(run_dir, consent, **{"data.root": data_root})
    default = f"model{exporter.suffix}"
    if out is not None and str(out).endswith(("/", os.sep)):  # a folder meant, which Path() would make a file name
        raise ConfigError(f"--out {out}: give the weights' file name, e.g. {Path(out) / default}")
    out = Path(out) if out is not None else run.dir / default
    card = out.with_suffix(".json")
    if card == out:
        raise ConfigError(f"--out {out}: the model card goes beside the weights as .json; give another suffix")
    for path in (out, card):
        if path.is_dir():
            raise ConfigError(f"--out {out}: {path} is a directory; give a file name, e.g. {path / default}")
    if not out.parent.is_dir():
        raise ConfigError(f"--out {out}: the directory {out.parent} does not exist; create it first or choose another")
    try:
        check_creatable_dir(out.parent, f"--out {out}: the directory", "choose another --out")
    except ValueError as err:
        raise ConfigError(str(err)) from None
    own = {f"model{exporter.suffix}", "model.json"}  # inside the run directory only the default export may be written
    for path in (out, card):
        where, home = path.resolve(), run.dir.resolve()
        if (where.parent == home and path.name not in own) or home in where.parents[1:]:
            raise ConfigError(
                f"--out {out}: {path} would replace or add to the run's own files; write the export outside {run.dir} "
                f"(or leave --out unset for {run.dir / default})"
            )
    check_not_another_export(out, card, run)
    about = model_card(run, out.name)  # before anything is written: an error here leaves no weights without a card
    exporter.write(run, out)
    write_json(card, about)
    return out, card
