"""Data: datasets (registry), class-incremental splits, device-resident batches.

The built-in datasets are imported here by name, so that each registers itself in
:data:`dfcil.data.datasets.DATASETS` before anything of this package is used."""

from dfcil.data import datasets, folder, imagenet, tiny_imagenet  # noqa: F401 - imported to register each dataset
