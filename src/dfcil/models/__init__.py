"""Networks: CIFAR ResNets, incremental heads, inversion generators."""
