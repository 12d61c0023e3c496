"""``dfcil inspect RUN --features``: a 2-D t-SNE of the final model's features (the pooled backbone output the
head reads), real test images of the learned classes, coloured by their class, against synthetic ones, coloured by
the class the model that labels them predicts (the generator has no labels of its own).

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
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from dfcil.analysis.tools import FinishedRun
from dfcil.checkpoint import loads
from dfcil.compute.runtime import Runtime, resolve_device
from dfcil.data.device import Normalizer, class_indices, to_device
from dfcil.extras import require
from dfcil.io import write_atomic
from dfcil.methods import build_method
from dfcil.models.generator import build_generator
from dfcil.models.network import IncrementalNet, build_network
from dfcil.plugins import Consent
from dfcil.synthesis.inversion import InversionConfig, ModelInversion
from dfcil.training.grid import sample_images
from dfcil.training.protocol import Protocol


@dataclasses.dataclass(frozen=True)
class Synthetic:
    x: Tensor  # (N, 3, H, W) normalised synthetic images
    y: Tensor  # (N,) labels (order positions) given by the model that labelled them
    source: str  # where they came from, for the plot's title
    labeller: str = "the final model"  # the model whose argmax gave ``y``, for the plot's title


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
    return Synthetic(x, y, source, "the model before the last task" if stored else "the final model")


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


def tsne_2d(points: np.ndarray, seed: int = 0) -> np.ndarray:
    """(N, 2) t-SNE embedding of (N, d) points (scikit-learn; PCA initialisation, perplexity ≤ 30)."""
    manifold = require("sklearn.manifold", "plot", "dfcil inspect --features", "scikit-learn")
    from threadpoolctl import threadpool_limits  # a dependency of scikit-learn

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
    colormaps = require("matplotlib", "plot", "dfcil inspect --features").colormaps
    if n <= len(TAB20_NO_GREY):
        cmap = colormaps["tab20"]
        return np.array([cmap(k) for k in TAB20_NO_GREY[:n]])
    return colormaps["turbo"](np.linspace(0.05, 0.95, n))


def plot_embedding(
    points: np.ndarray, labels: np.ndarray, synthetic: np.ndarray, names: Sequence[str], title: str
) -> Any:
    """A figure of 2-D ``points`` coloured by ``labels`` (order positions, named ``names``: a real image's class,
    a synthetic one's predicted class), circles for real images and triangles for ``synthetic`` ones (a boolean
    mask). The legend's marker shapes are hollow and black (:data:`NEUTRAL`), a colour no class has."""
    require("matplotlib", "plot", "dfcil inspect --features")
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    colours = class_colours(len(names))
    fig = Figure(figsize=(8.5, 6.5), layout="constrained")
    ax = fig.add_subplot()
    for mask, marker, size, edge in ((~synthetic, "o", 14, "none"), (synthetic, "^", 30, "black")):
        ax.scatter(*points[mask].T, c=colours[labels[mask]], marker=marker, s=size, edgecolors=edge, linewidths=0.4)
    hollow = {"ls": "", "mfc": "none", "mec": NEUTRAL}
    handles = [Line2D([], [], marker="o", label="real test image (colour: its class)", **hollow)]
    handles += [Line2D([], [], marker="^", label="synthetic (colour: predicted class)", **hollow)]
    if len(names) <= 20:
        handles += [Line2D([], [], ls="", marker="s", color=colours[k], label=name) for k, name in enumerate(names)]
    ax.legend(handles=handles, loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=8, frameon=False)
    fig.suptitle(title, fontsize=10)
    ax.set_xticks([])
    ax.set_yticks([])
    return fig


def inspect_features(
    run_dir: str | os.PathLike,
    out_dir: str | os.PathLike | None = None,
    data_root: str | None = None,
    device: str | None = None,
    per_class: int = 30,
    synthetic: int = 200,
    inversion_steps: int = 200,
    seed: int = 0,
    consent: Consent = Consent(),  # noqa: B008 - frozen
) -> list[Path]:
    """Write ``features_tsne.png`` and ``.pdf`` (default in ``<run>/inspect``): the t-SNE of the final model's
    features of ``per_class`` real test images per class and ``synthetic`` synthetic images. Returns the paths.
    ``consent``: plugin code the run names that may be imported."""
    run = FinishedRun.open(run_dir, consent, **{"data.root": data_root, "device": device})
    protocol = run.protocol()
    device_ = resolve_device(run.cfg.device)
    net = run.network(device_)
    x_real, y_real = real_images(protocol, per_class, device_)
    syn = synthetic_images(run, net, synthetic, inversion_steps, seed)
    points = tsne_2d(np.concatenate([features(net, x_real), features(net, syn.x)]), seed)
    labels = torch.cat([y_real, syn.y]).cpu().numpy()
    is_synthetic = np.arange(len(labels)) >= len(y_real)
    split = protocol.split
    names = [protocol.dataset.class_label(c) for c in split.class_order]  # n01443537 (goldfish), class 7
    names = [f"{name}, task {t}" for name, t in zip(names, split.task_of_label(), strict=True)]
    title = (
        f"{run.cfg.method.name} on {protocol.dataset.name}: the final model's features (t-SNE)\n"
        f"{len(y_real)} real test images, coloured by their class\n"
        f"{len(syn.y)} synthetic images from {syn.source},\ncoloured by the class {syn.labeller} predicts"
    )
    fig = plot_embedding(points, labels, is_synthetic, names, title)
    out = Path(out_dir) if out_dir is not None else run.dir / "inspect"
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "features_tsne.png", out / "features_tsne.pdf"]
    for path in paths:
        buf = io.BytesIO()
        fig.savefig(buf, format=path.suffix[1:], dpi=150)
        write_atomic(path, buf.getvalue())
    return paths
