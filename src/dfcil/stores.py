"""What a method keeps from one task to the next (``Method.stores``), and which of it dfcil calls data-free.

dfcil calls a method data-free when nothing it carries from one task to the next holds or generates earlier tasks'
images: it may keep the model (every method does), train a fresh synthesizer from the frozen old model at each
task and discard it after the task (model inversion: the generator is a function of the model, not of the data),
or keep per-class feature statistics (means and covariances of the backbone's features, a few kilobytes per
class, from which no image can be drawn). A method that keeps images, or a generative model trained on them and
carried across tasks, is not data-free. This module imports nothing, so ``dfcil methods`` reads it without torch.
"""

from __future__ import annotations

# what a method may keep between tasks besides its model, and what that means, in the order of dfcil methods
STORES: dict[str, str] = {
    "nothing": "the model only",
    "synthesizer per task": "a generator inverted from the old model at each task, dropped after it",
    "class statistics": "per-class feature statistics (means, covariances), no images",
    "generator": "a generative model trained on the data and kept across tasks",
    "all data": "every earlier task's images",
}
DATA_FREE = frozenset({"nothing", "synthesizer per task", "class statistics"})

# the config switches that change what a method keeps (each method declares which it has, and what it then keeps:
# ``@register_method(..., switches={"ldc": "class statistics"})``), and what each does, for ``dfcil methods``
SWITCHES: dict[str, str] = {
    "ldc": "LDC (Gomez-Villa et al., 2024): class means moved by a learned projector after each task; nearest-mean "
    "classifier",
}


def is_data_free(stores: str) -> bool:
    """Whether a method that keeps ``stores`` between tasks is data-free (module docstring)."""
    return stores in DATA_FREE


def check_stores(stores: object, method: str) -> str:
    """``stores`` if it is one of :data:`STORES`, else a ValueError naming the method and the valid values."""
    if stores not in STORES:
        raise ValueError(f"method {method!r}: stores = {stores!r} is not one of {', '.join(map(repr, STORES))}")
    return stores
