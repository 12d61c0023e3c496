"""Networks: CIFAR ResNets, incremental heads, inversion generators.

The built-in backbones are imported here by name, so that each registers itself in
:data:`dfcil.models.backbones.BACKBONES` before anything of this package is used."""

from dfcil.models import bottleneck, resnet, resnet_cifar  # noqa: F401 - imported to register each backbone
