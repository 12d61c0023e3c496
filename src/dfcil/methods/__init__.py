"""The registered methods: the method contract (:mod:`dfcil.methods.base`) and every built-in method, each imported
here by name so that it registers itself (``@register_method``). Python runs this file before any module of the
package, so :data:`METHODS` holds every built-in method as soon as anything of ``dfcil.methods`` is imported.
A new built-in method is its file and its name in the import below: :mod:`dfcil.catalogue` reads the same list
(and the method files' source) to print ``dfcil methods`` without importing torch."""

from dfcil.methods import (  # noqa: F401 - imported to register each method
    abd,
    adagauss,
    apr,
    deepinversion,
    dgr,
    dpcr,
    efc,
    fecam,
    finetune,
    joint,
    lwf,
    lwf_mc,
    podnet_df,
    rdfcil,
    rdfcil_plus,
    ucir_df,
)
from dfcil.methods.base import (
    METHODS,
    Batch,
    Method,
    Phase,
    Task,
    TaskContext,
    build_method,
    loss_terms,
    register_method,
    unregister_method,
)

__all__ = [
    "METHODS",
    "Batch",
    "Method",
    "Phase",
    "Task",
    "TaskContext",
    "build_method",
    "loss_terms",
    "register_method",
    "unregister_method",
]
