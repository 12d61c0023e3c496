# Our wrapper, not EFC's code: efc.sh copies it into the EFC clone as continual_learning/models/resnet32_pycil.py,
# next to cifar_resnet.py, which efc.sh copies from the FeCAM clone (PyCIL's convs/cifar_resnet.py at FeCAM
# d2479b7). efc.patch imports ResNet32 from it for `--backbone resnet32` (EFC's code has only ResNet-18).
from torch import nn

from .cifar_resnet import resnet32 as _pycil_resnet32


class ResNet32(nn.Module):
    """features = the global average pool after the last block's ReLU: (B, 64), as EFC's ResNet-18 gives (B, 512)."""

    def __init__(self):
        super().__init__()
        self.net = _pycil_resnet32()
        self.feature_space_size = self.net.out_dim

    def forward(self, x):
        return self.net(x)["features"]
