"""``dfcil inspect RUN [RUN_B] --features``: the final model's features (the pooled backbone output the head
reads) of real test images of the learned classes, coloured by their class, against synthetic ones, coloured by
the class the model that labels them predicts (the generator has no labels of its own), reduced to 2-D by t-SNE
jointly (one t-SNE of both) or independently (one per domain, side by side: :data:`EMBEDDINGS`), with the numbers
of :mod:`dfcil.analysis.separation` under each run's picture and in a JSON file beside it. A second run is drawn
beside the first, for the same real images and as many synthetic ones.

The synthetic images are the run's own where it kept them: a synthetic-replay method's last task inverted a
generator from the model before that task, and ``checkpoints/task<t>-static.pt`` keeps it with that model (the
teacher, whose argmax labels the images, as in training). They cover the classes learned before the last task.
A run without one (no inversion in the method, or a single task) gets a generator inverted from the final model
with a short inversion (``inversion_steps``, the run's inversion settings otherwise), labelled by the final model;
the plot's title says which.
"""

from __future__ import annotations

import dataclasses
import io
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from dfcil.analysis.inversions import inspect_dir
from dfcil.analysis.separation import CV_FOLDS, KNN_NEIGHBOURS, separation_numbers
from dfcil.analysis.tools import FinishedRun
from dfcil.checkpoint import loads
from dfcil.compute.runtime import Runtime, resolve_device
from dfcil.data.device import Normalizer, class_indices, to_device
from dfcil.errors import ConfigError
from dfcil.extras import require, require_all
from dfcil.io import write_atomic, write_json
from dfcil.methods import build_method
from dfcil.models.generator import build_generator
from dfcil.models.network import IncrementalNet, build_network
from dfcil.plugins import Consent
from dfcil.registry import Registry
from dfcil.synthesis.inversion import InversionConfig, ModelInversion
from dfcil.training.grid import sample_images
from dfcil.training.protocol import Protocol


@dataclasses.dataclass(frozen=True)
class Synthetic:
    x: Tensor  # (N, 3, H, W) normalised synthetic images
    y: Tensor  # (N,) labels (order positions) given by the model that labelled them
    source: str  # where they came from, for the plot's title
    labeller: str = "the final model's head"  # the head whose argmax gave ``y``, for the plot's title


def stored_generator(run: FinishedRun, device: torch.device) -> tuple[torch.nn.Module, IncrementalNet, str] | None:
    """The last task's trained generator and teacher from its static checkpoint file, or None if the run's method
    inverts none (:meth:`~dfcil.methods.Method.synthesizer`) or the file is gone."""
    method = build_method(run.cfg.method, run.cfg.train)
    synthesizer = method.synthesizer()
    sizes = list(run.model["head_sizes"])
    path = run.dir / "checkpoints" / f"task{len(sizes) - 1}-static.pt"
    if synthesizer is None or not path.exists():
        return None
    name = next(k for k, part in method.components().items() if part is synthesizer)  # its checkpoint key
    part = loads(path.read_bytes(), str(path)).get(name)
    if not isinstance(part, dict) or not {"generator", "teacher"} <= set(part):
        return None
    teacher = build_network(run.model["backbone"], run.model["head"])
    for n in sizes[:-1]:
        teacher.expand(n)
    teacher.load_state_dict(part["teacher"])
    state = part["generator"]
    generator = build_generator(run.description()["inputs"]["image_size"], zdim=state["fc.weight"].shape[1])
    generator.load_state_dict(state)
    return generator.to(device).eval(), teacher.to(device).eval(), f"the last task's generator ({path.name})"


def fresh_generator(
    run: FinishedRun, net: IncrementalNet, steps: int, seed: int, device: torch.device
) -> tuple[torch.nn.Module, IncrementalNet, str]:
    """A generator inverted from the final network ``net`` in ``steps`` Adam steps, with the run's inversion
    settings where its method has them (the defaults otherwise)."""
    synthesizer = build_method(run.cfg.method, run.cfg.train).synthesizer()
    cfg = dataclasses.replace(synthesizer.cfg if synthesizer is not None else InversionConfig(), steps=steps)
    cfg = dataclasses.replace(cfg, persistent=False)
    # minutes on a CPU at the default 200 steps: said before it starts
    print(f"dfcil inspect: {run.dir} kept no generator; inverting its final model ({steps} steps, --inversion-steps "
          f"to change)", file=sys.stderr, flush=True)  # fmt: skip
    teacher = net.frozen_copy()
    rng = torch.Generator(device=device).manual_seed(seed)
    size = run.description()["inputs"]["image_size"]
    synth = ModelInversion(teacher, cfg, size, cfg.batch_size or run.cfg.train.batch_size, rng, Runtime(device=device))
    synth.fit()
    return synth.generator, teacher, f"a generator inverted from the final model ({steps} steps)"


def synthetic_images(run: FinishedRun, net: IncrementalNet, n: int, steps: int, seed: int) -> Synthetic:
    """``n`` synthetic images: from the run's stored generator, else from a freshly inverted one."""
    device = next(net.parameters()).device
    stored = stored_generator(run, device)
    generator, teacher, source = stored or fresh_generator(run, net, steps, seed, device)
    x = sample_images(generator, n, seed)
    with torch.no_grad():
        y = teacher(x).logits.argmax(dim=1)
    return Synthetic(x, y, source, "the head of the model before the last task" if stored else "the final model's head")


def real_images(protocol: Protocol, per_class: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """The first ``per_class`` test images of every class of the protocol, normalised, and their labels."""
    dataset, split = protocol.dataset, protocol.split
    lut = split.label_map(dataset.num_classes)
    idx = class_indices(dataset.test, lut, range(split.num_classes), per_class)
    x, y = to_device(dataset.test, lut, idx, device)
    return Normalizer(dataset.mean, dataset.std, device)(x), y


@torch.no_grad()
def features(net: IncrementalNet, x: Tensor, batch_size: int = 500) -> np.ndarray:
    """(N, d) penultimate features (``NetOutput.features``) of normalised images ``x``."""
    return torch.cat([net(x[i : i + batch_size]).features.float() for i in range(0, len(x), batch_size)]).cpu().numpy()


FEATURE = "dfcil inspect --features"
# Every module the features' figure and numbers import, module → the package that installs it (the plot extra):
# checked before any work (require_all), so that a missing one is said in one line, not as a traceback at the end
NEEDS = {
    "matplotlib.figure": "matplotlib", "matplotlib.lines": "matplotlib",
    "sklearn.manifold": "scikit-learn", "sklearn.metrics": "scikit-learn", "sklearn.neighbors": "scikit-learn",
    "sklearn.model_selection": "scikit-learn",
    "threadpoolctl": "threadpoolctl",  # scikit-learn's dependency, which tsne_2d uses itself
}  # fmt: skip


def tsne_2d(points: np.ndarray, seed: int = 0) -> np.ndarray:
    """(N, 2) t-SNE embedding of (N, d) points (scikit-learn; PCA initialisation, perplexity ≤ 30)."""
    manifold = require("sklearn.manifold", "plot", FEATURE, "scikit-learn")
    threadpool_limits = require("threadpoolctl", "plot", FEATURE).threadpool_limits

    perplexity = float(min(30.0, max(2.0, (len(points) - 1) / 3)))
    tsne = manifold.TSNE(2, perplexity=perplexity, init="pca", random_state=seed)
    # a few hundred points: OpenMP threads cost more than they save (84 points on a busy 2-core CPU: 0.3 s on one
    # thread, 20 s on two)
    with threadpool_limits(1 if len(points) < 1000 else None):
        return tsne.fit_transform(points)


NEUTRAL = (0.0, 0.0, 0.0, 1.0)  # RGBA: the outline of the legend's hollow real/synthetic markers, no class's colour
# tab20 without its two greys (14, 15), whose grey read as the legend's neutral marker: tab10's hues first (tab20's
# even entries, the same colours), then their light shades
TAB20_NO_GREY = (0, 2, 4, 6, 8, 10, 12, 16, 18, 1, 3, 5, 7, 9, 11, 13, 17, 19)


def class_colours(n: int) -> np.ndarray:
    """(n, 4) RGBA colours for n classes: tab10's nine hues without its grey, then their light shades (tab20) up
    to 18 classes; evenly spaced on turbo beyond, without its near-black ends. No class is grey or black, so none
    looks like :data:`NEUTRAL`, the legend's marker for "real" and "synthetic" whatever the class."""
    colormaps = require("matplotlib", "plot", FEATURE).colormaps
    if n <= len(TAB20_NO_GREY):
        cmap = colormaps["tab20"]
        return np.array([cmap(k) for k in TAB20_NO_GREY[:n]])
    return colormaps["turbo"](np.linspace(0.05, 0.95, n))


@dataclasses.dataclass(frozen=True)
class Panel:
    """One 2-D scatter: ``points`` (n, 2) coloured by ``labels`` (n,) (order positions), triangles where
    ``synthetic`` (n,) is true, circles elsewhere."""

    points: np.ndarray
    labels: np.ndarray
    synthetic: np.ndarray
    title: str = ""


@dataclasses.dataclass(frozen=True)
class Picture:
    """One run's panels, side by side, under ``heading`` and above ``numbers`` (text)."""

    heading: str
    panels: Sequence[Panel]
    numbers: str = ""


def plot_pictures(pictures: Sequence[Picture], names: Sequence[str], title: str) -> Any:
    """A figure of ``pictures`` side by side (one subfigure each, its panels in a row), coloured by class
    (``names``: the order positions' names, shared by every picture: the same classes), with one legend at the
    right of the last panel. The legend's marker shapes are hollow and black (:data:`NEUTRAL`), a colour no
    class has."""
    require("matplotlib", "plot", FEATURE)
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    colours = class_colours(len(names))
    n_panels = sum(len(p.panels) for p in pictures)
    fig = Figure(figsize=(3.0 + 5.0 * n_panels, 7.0), layout="constrained")
    subfigs = fig.subfigures(1, len(pictures), squeeze=False)[0]
    for subfig, picture in zip(subfigs, pictures, strict=True):
        for ax, panel in zip(subfig.subplots(1, len(picture.panels), squeeze=False)[0], picture.panels, strict=True):
            real, syn = ~panel.synthetic, panel.synthetic
            for mask, marker, size, edge in ((real, "o", 14, "none"), (syn, "^", 30, "black")):
                points, labels = panel.points[mask], panel.labels[mask]
                ax.scatter(*points.T, c=colours[labels], marker=marker, s=size, edgecolors=edge, linewidths=0.4)
            ax.set_title(panel.title, fontsize=9)
            ax.set_xticks([])
            ax.set_yticks([])
        if picture.heading:
            subfig.suptitle(picture.heading, fontsize=9)
        if picture.numbers:
            subfig.supxlabel(picture.numbers, fontsize=9)
    hollow = {"ls": "", "mfc": "none", "mec": NEUTRAL}
    handles = [Line2D([], [], marker="o", label="real test image (colour: its class)", **hollow)]
    handles += [Line2D([], [], marker="^", label="synthetic (colour: predicted class)", **hollow)]
    if len(names) <= 20:
        handles += [Line2D([], [], ls="", marker="s", color=colours[k], label=name) for k, name in enumerate(names)]
    fig.axes[-1].legend(handles=handles, loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=8, frameon=False)
    fig.suptitle(title, fontsize=10)
    return fig


def plot_embedding(
    points: np.ndarray, labels: np.ndarray, synthetic: np.ndarray, names: Sequence[str], title: str
) -> Any:
    """A figure of one panel of 2-D ``points`` (:class:`Panel`, :func:`plot_pictures`)."""
    return plot_pictures([Picture("", [Panel(points, labels, synthetic)])], names, title)


# ------------------------------------------------------------------------------------------- embeddings


@dataclasses.dataclass(frozen=True)
class Embedding:
    """How a run's features become 2-D: one t-SNE per panel, each of the points it names (``both``, ``real`` or
    ``synthetic``)."""

    panels: tuple[tuple[str, str], ...]  # (which points, the panel's title)
    description: str  # for the figure's title


EMBEDDINGS: Registry[Embedding] = Registry("feature embedding")
# R-DFCIL's supplement, Fig. (a): semantic features dominate, a class's real and synthetic images cluster together
EMBEDDINGS.register("joint")(Embedding((("both", ""),), "one t-SNE of real and synthetic features together"))
# Fig. (b): each domain on its own. Two t-SNEs' coordinates have nothing in common (each is its own arbitrary
# rotation and scale), so they are drawn side by side, not overlaid: overlaid, the distances between a real and a
# synthetic point would look meaningful and be noise.
EMBEDDINGS.register("independent")(
    Embedding(
        (("real", "real images: their own t-SNE"), ("synthetic", "synthetic images: their own t-SNE")),
        "one t-SNE of the real features, another of the synthetic",
    )
)


def embed(
    embedding: Embedding, real: np.ndarray, y_real: np.ndarray, syn: np.ndarray, y_syn: np.ndarray, seed: int
) -> list[Panel]:
    """The panels of ``embedding`` for real features (N, d) and synthetic ones (M, d) and their labels."""
    points, labels = np.concatenate([real, syn]), np.concatenate([y_real, y_syn])
    synthetic = np.arange(len(points)) >= len(real)
    masks = {"both": np.ones_like(synthetic), "real": ~synthetic, "synthetic": synthetic}
    panels = []
    for which, title in embedding.panels:
        mask = masks[which]
        if mask.sum() < 3:  # t-SNE's perplexity must be below the number of points, and at least 2 here
            raise ConfigError(
                f"a t-SNE of the {which} images needs at least 3 of them, got {int(mask.sum())}: raise --per-class "
                f"or --synthetic-images"
            )
        panels.append(Panel(tsne_2d(points[mask], seed), labels[mask], synthetic[mask], title))
    return panels


# ------------------------------------------------------------------------------------------- two runs


def protocol_of(run: FinishedRun) -> dict[str, Any]:
    """What two runs must share for their features to be compared on the same images: the dataset, the raw class
    of each output, the tasks' sizes, and the images' size and normalisation."""
    d = run.description()
    return {"dataset": run.cfg.data.name, "class_order": list(d["class_order"]), "task_sizes": list(d["task_sizes"]),
            "inputs": dict(d["inputs"])}  # fmt: skip


PROTOCOL_FIELDS = {  # protocol_of's keys, as a person reads them
    "dataset": "dataset",
    "class_order": "classes (the raw class of each output)",
    "task_sizes": "tasks (classes per task)",
    "inputs": "inputs (image size and normalisation)",
}


def protocol_mismatch(a: dict[str, Any], b: dict[str, Any]) -> str | None:
    """The first field of :func:`protocol_of` in which ``a`` and ``b`` differ, in words with both values
    (long lists cut), or None if they agree."""

    def shown(value: Any) -> str:
        return f"{value[:8]}..." if isinstance(value, list) and len(value) > 8 else str(value)

    for key, what in PROTOCOL_FIELDS.items():
        if a[key] != b[key]:
            return f"{what}: {shown(a[key])} against {shown(b[key])}"
    return None


# ------------------------------------------------------------------------------------------- the command


@dataclasses.dataclass(frozen=True)
class FeatureOptions:
    """What ``dfcil inspect --features`` draws (its command-line options in brackets)."""

    per_class: int = 30  # real test images per class, the first of the test set (--per-class)
    synthetic: int = 200  # synthetic images per run (--synthetic-images)
    inversion_steps: int = 200  # Adam steps of the inversion for a run that kept no generator (--inversion-steps)
    seed: int = 0  # the synthetic latents, the t-SNEs and the k-NN's folds
    embedding: str = "joint"  # a name in EMBEDDINGS (--embedding)

    def __post_init__(self) -> None:
        for n, name in ((self.per_class, "--per-class"), (self.synthetic, "--synthetic-images")):
            if n < 1:
                raise ConfigError(f"{name} must be at least 1, got {n}")
        EMBEDDINGS.get(self.embedding)  # an unknown name: refused before any work, with the valid ones


@dataclasses.dataclass(frozen=True)
class RunFeatures:
    """One run's part of the figure and of its JSON file."""

    run: FinishedRun
    synthetic: Synthetic
    numbers: dict[str, Any]  # separation_numbers
    panels: list[Panel]


def run_features(
    run: FinishedRun, x_real: Tensor, y_real: Tensor, device: torch.device, options: FeatureOptions
) -> RunFeatures:
    """The final model of ``run``: its features of the real images ``x_real`` and of ``options.synthetic``
    synthetic ones, their numbers and their panels."""
    net = run.network(device)
    syn = synthetic_images(run, net, options.synthetic, options.inversion_steps, options.seed)
    real, fake = features(net, x_real), features(net, syn.x)
    y_r, y_s = y_real.cpu().numpy(), syn.y.cpu().numpy()
    numbers = separation_numbers(real, y_r, fake, y_s, options.seed)
    panels = embed(EMBEDDINGS.get(options.embedding), real, y_r, fake, y_s, options.seed)
    return RunFeatures(run, syn, numbers, panels)


def format_numbers(numbers: dict[str, Any]) -> str:
    """The numbers under a run's picture."""
    tested, total = numbers["overlap_classes"], len(numbers["per_class"])
    return (
        f"silhouette of the real classes: {numbers['silhouette']:.3f} (1: tight, apart; 0: touching)\n"
        f"real vs synthetic {KNN_NEIGHBOURS}-NN accuracy: {numbers['overlap']:.3f} (0.5: mixed; 1: apart),\n"
        f"mean of {tested} classes ({total - tested} with too few images to test)"
    )


def format_table(parts: Sequence[RunFeatures]) -> str:
    """One row per run: its silhouette and real-vs-synthetic overlap."""
    rows = [("run", "method", "silhouette", "real/syn k-NN", "classes tested")]
    for p in parts:
        n = p.numbers
        rows.append((str(p.run.dir), p.run.cfg.method.name, f"{n['silhouette']:.3f}", f"{n['overlap']:.3f}",
                     f"{n['overlap_classes']}/{len(n['per_class'])}"))  # fmt: skip
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def _finite_or_none(x: Any) -> Any:
    """JSON has no NaN: None for it."""
    return None if isinstance(x, float) and not np.isfinite(x) else x


def features_record(parts: Sequence[RunFeatures], names: Sequence[str], options: FeatureOptions) -> dict[str, Any]:
    """The JSON file beside the figure: the settings and, per run, its numbers (per class with the class's name)."""
    runs = []
    for p in parts:
        n = p.numbers
        per = [{**c, "class": names[c["label"]], "accuracy": _finite_or_none(c["accuracy"])} for c in n["per_class"]]
        runs.append({"run": str(p.run.dir), "method": p.run.cfg.method.name, "synthetic_source": p.synthetic.source,
                     "labelled_by": p.synthetic.labeller, "synthetic_images": len(p.synthetic.y),
                     "silhouette": _finite_or_none(n["silhouette"]), "overlap": _finite_or_none(n["overlap"]),
                     "overlap_classes": n["overlap_classes"], "per_class": per})  # fmt: skip
    settings = {**dataclasses.asdict(options), "features": "penultimate, L2-normalised",
                "silhouette_metric": "euclidean", "knn_k": KNN_NEIGHBOURS, "cv_folds": CV_FOLDS}  # fmt: skip
    return {"settings": settings, "runs": runs}


def inspect_features(
    run_dir: str | os.PathLike,
    out_dir: str | os.PathLike | None = None,
    data_root: str | None = None,
    device: str | None = None,
    options: FeatureOptions = FeatureOptions(),  # noqa: B008 - frozen
    consent: Consent = Consent(),  # noqa: B008 - frozen
    against: str | os.PathLike | None = None,
) -> tuple[str, list[Path]]:
    """Draw the final model's features of ``options.per_class`` real test images per class and
    ``options.synthetic`` synthetic images, reduced to 2-D as ``options.embedding`` says (:data:`EMBEDDINGS`),
    with their numbers (:func:`~dfcil.analysis.separation.separation_numbers`); with ``against``, a second run
    beside the first, on the same real images and as many synthetic ones (refused unless both runs share
    :func:`protocol_of`). Writes ``<stem>.png``, ``.pdf`` and ``.json`` (default in ``<run>/inspect``; stem
    ``features_tsne``, with ``_independent`` and ``_vs_<other run's folder>`` where they apply). Returns the
    numbers as a table and the paths. ``consent``: plugin code the runs name that may be imported."""
    require_all(NEEDS, "plot", FEATURE)  # before any work
    chosen, per_class = EMBEDDINGS.get(options.embedding), options.per_class
    dirs = [run_dir] if against is None else [run_dir, against]
    runs = [FinishedRun.open(d, consent, **{"data.root": data_root, "device": device}) for d in dirs]
    if len(runs) == 2 and (diff := protocol_mismatch(protocol_of(runs[0]), protocol_of(runs[1]))):
        raise ConfigError(
            f"{runs[0].dir} and {runs[1].dir} cannot be compared: their {diff}. Their features are drawn for the "
            f"same real test images and synthetic images of the same classes, so compare two runs of one protocol "
            f"(the same data.name, class order, data.num_classes, data.num_tasks and data.base_classes, image size "
            f"and normalisation), e.g. two methods of one sweep at one class order"
        )
    out = inspect_dir(runs[0].dir, out_dir)  # refused before the features are computed, not after
    protocol = runs[0].protocol()
    for other in runs[1:]:  # the second run is drawn on the first's data: which must be the data it trained on
        other.check_data(protocol)
    device_ = resolve_device(runs[0].cfg.device)
    x_real, y_real = real_images(protocol, per_class, device_)
    parts = [run_features(r, x_real, y_real, device_, options) for r in runs]
    if len({p.synthetic.labeller for p in parts}) > 1:
        print(f"dfcil inspect: note: the runs' synthetic images differ in kind ({parts[0].synthetic.source}; "
              f"{parts[1].synthetic.source}): compare their overlaps with care", file=sys.stderr)  # fmt: skip
    split = protocol.split
    names = [protocol.dataset.class_label(c) for c in split.class_order]  # n01443537 (goldfish), class 7
    names = [f"{name}, task {t}" for name, t in zip(names, split.task_of_label(), strict=True)]
    pictures = [
        Picture(f"{p.run.cfg.method.name}: {p.run.dir.name}\n{len(p.synthetic.y)} synthetic images from "
                f"{p.synthetic.source},\ncoloured by the class {p.synthetic.labeller} predicts", p.panels,
                format_numbers(p.numbers))
        for p in parts
    ]  # fmt: skip
    title = (
        f"the final model's features on {protocol.dataset.name}: {chosen.description}\n"
        f"{len(y_real)} real test images ({per_class} per class at most), coloured by their class"
    )
    stem = "features_tsne" + ("" if options.embedding == "joint" else f"_{options.embedding}")
    stem += "" if against is None else "_vs_" + re.sub(r"[^A-Za-z0-9._-]+", "_", runs[1].dir.resolve().name)
    paths = write_figure(plot_pictures(pictures, names, title), features_record(parts, names, options), out / stem)
    return format_table(parts), paths


def write_figure(fig: Any, record: dict[str, Any], stem: Path) -> list[Path]:
    """``fig`` as ``<stem>.png`` and ``.pdf``, and ``record`` (with the figure's file names) as ``<stem>.json``;
    returns the three paths."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = [stem.with_name(f"{stem.name}.{ext}") for ext in ("png", "pdf", "json")]
    for path in paths[:2]:
        buf = io.BytesIO()
        fig.savefig(buf, format=path.suffix[1:], dpi=150)
        write_atomic(path, buf.getvalue())
    write_json(paths[2], record | {"figure": [p.name for p in paths[:2]]})
    return paths
