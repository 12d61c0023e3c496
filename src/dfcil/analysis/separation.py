"""How well features separate classes and domains: the numbers ``dfcil inspect --features`` writes beside its
t-SNE pictures, computed on the features themselves (never on the 2-D embedding, whose distances t-SNE does not
keep). numpy and scikit-learn only.

R-DFCIL's supplement (Gao et al., ECCV 2022, "Feature Analysis and Bottlenecks in Prior Approaches") reads two
things off its t-SNE figures: how well the real images of a class cluster, and how much the real and synthetic
images of a class overlap (ABD's more than R-DFCIL's). :func:`real_silhouette` and :func:`domain_overlap` put a
number on each.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from dfcil.extras import require

KNN_NEIGHBOURS = 5  # k of the real-vs-synthetic k-NN: odd, so two domains never tie
CV_FOLDS = 5  # stratified folds of its cross-validation; a class needs this many images of each domain


def l2_normalise(x: np.ndarray) -> np.ndarray:
    """(N, d) rows scaled to unit length (a zero row stays zero): Euclidean distances between them are those of
    the directions, 2 − 2 cos, and a feature's length (larger for images the model is sure of, and for one
    domain than the other) no longer counts."""
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.where(norms > 0, norms, 1.0)


def _finite(x: np.ndarray, what: str) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2 or not np.isfinite(x).all():
        raise ValueError(f"the {what} must be a finite (N, d) array, got shape {x.shape}")
    return x


def real_silhouette(features: np.ndarray, labels: np.ndarray) -> float:
    """Mean silhouette of ``features`` (N, d) grouped by ``labels`` (N,), Euclidean (scikit-learn's
    ``silhouette_score``): per point s = (b − a) / max(a, b), a its mean distance to the other points of its
    class, b its smallest mean distance to another class's points. 1: tight classes far apart; 0: classes that
    touch; below 0: points nearer another class. NaN with fewer than two classes, or no class of two points or
    more (nothing to compare)."""
    metrics = require("sklearn.metrics", "plot", "dfcil inspect --features", "scikit-learn")
    x, y = _finite(features, "features"), np.asarray(labels)
    n_labels = len(np.unique(y))
    if not 2 <= n_labels <= len(x) - 1:
        return float("nan")
    return float(metrics.silhouette_score(x, y, metric="euclidean"))


@dataclasses.dataclass(frozen=True)
class ClassOverlap:
    label: int  # the class (order position)
    real: int  # real images of the class
    synthetic: int  # synthetic images labelled with it
    accuracy: float | None  # cross-validated real-vs-synthetic k-NN accuracy; None: too few of either to test


def domain_overlap(
    real: np.ndarray,
    real_labels: np.ndarray,
    synthetic: np.ndarray,
    synthetic_labels: np.ndarray,
    k: int = KNN_NEIGHBOURS,
    folds: int = CV_FOLDS,
    seed: int = 0,
) -> list[ClassOverlap]:
    """Per class, how well a k-NN tells the class's real images from its synthetic ones.

    For class c, with R_c its real and S_c its synthetic features, the first m = min(|R_c|, |S_c|) of each are
    kept (equal numbers, so that guessing the larger domain scores no more than chance), labelled real or
    synthetic, and a ``k``-nearest-neighbour classifier (Euclidean) predicts each point's domain from the others
    in ``folds``-fold stratified cross-validation (shuffled with ``seed``). The accuracy over the 2m points is
    0.5 when the two domains are mixed, 1.0 when every point's neighbours are of its own domain. A class with
    m < ``folds`` (and every class without synthetic images) gets None.

    Args:
        real: (N, d) real features; ``real_labels`` (N,) their classes.
        synthetic: (M, d) synthetic features; ``synthetic_labels`` (M,) the classes they were labelled with.
        k: neighbours of the k-NN (odd: two domains never tie).

    Returns:
        One :class:`ClassOverlap` per class that has real images, in label order.
    """
    neighbors = require("sklearn.neighbors", "plot", "dfcil inspect --features", "scikit-learn")
    selection = require("sklearn.model_selection", "plot", "dfcil inspect --features", "scikit-learn")
    if k < 1 or k % 2 == 0 or folds < 2:
        raise ValueError(f"k must be odd and positive and folds at least 2, got k={k}, folds={folds}")
    real, synthetic = _finite(real, "real features"), _finite(synthetic, "synthetic features")
    real_labels, synthetic_labels = np.asarray(real_labels), np.asarray(synthetic_labels)
    out = []
    for c in np.unique(real_labels):
        r, s = real[real_labels == c], synthetic[synthetic_labels == c]
        m = min(len(r), len(s))
        accuracy = None
        # a training fold holds (folds − 1) / folds of the 2m points: k of them at least
        if m >= folds and 2 * m * (folds - 1) // folds >= k:
            x = np.concatenate([r[:m], s[:m]])
            domain = np.repeat([0, 1], m)
            cv = selection.StratifiedKFold(folds, shuffle=True, random_state=seed)
            predicted = selection.cross_val_predict(neighbors.KNeighborsClassifier(k), x, domain, cv=cv)
            accuracy = float((predicted == domain).mean())
        out.append(ClassOverlap(int(c), len(r), len(s), accuracy))
    return out


def mean_overlap(per_class: list[ClassOverlap]) -> float:
    """Mean k-NN accuracy over the classes that were tested (NaN if none was)."""
    tested = [c.accuracy for c in per_class if c.accuracy is not None]
    return float(np.mean(tested)) if tested else float("nan")


def separation_numbers(
    real: np.ndarray,
    real_labels: np.ndarray,
    synthetic: np.ndarray,
    synthetic_labels: np.ndarray,
    seed: int = 0,
) -> dict:
    """The numbers beside a feature picture, on L2-normalised features (:func:`l2_normalise`): the real classes'
    silhouette, and the real-vs-synthetic k-NN accuracy per class and its mean over the tested classes."""
    from threadpoolctl import threadpool_limits  # a dependency of scikit-learn

    real = l2_normalise(_finite(real, "real features"))
    synthetic = l2_normalise(_finite(synthetic, "synthetic features"))
    with threadpool_limits(1 if len(real) + len(synthetic) < 5000 else None):  # small: threads cost more than they save
        silhouette = real_silhouette(real, real_labels)
        per_class = domain_overlap(real, real_labels, synthetic, synthetic_labels, seed=seed)
    return {
        "silhouette": silhouette,
        "overlap": mean_overlap(per_class),
        "overlap_classes": sum(c.accuracy is not None for c in per_class),
        "per_class": [dataclasses.asdict(c) for c in per_class],
    }
