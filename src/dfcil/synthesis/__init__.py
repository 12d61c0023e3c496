"""Synthetic replay: model inversion of the frozen old model into a generator."""
