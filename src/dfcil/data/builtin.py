"""The built-in datasets: importing this module registers each of them (the dataset registry imports it on its
first lookup)."""

from dfcil.data import datasets, folder, imagenet, tiny_imagenet  # noqa: F401
