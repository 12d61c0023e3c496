"""Data: datasets (registry), class-incremental splits, device-resident batches."""
