"""DIAGNOSTIC plugin for the dfcil copy at 912541e (`dfcil train --plugin`; not part of dfcil): registers PyCIL's CIFAR
ResNet-32 as dfcil backbone "pycil_resnet32": ReLU after every residual addition, post-ReLU 64-d features, PyCIL's
initialisation and plain BatchNorm2d. The network is imported from $PYCIL_CONVS (common.sh: the FeCAM clone's
convs/, PyCIL's cifar_resnet.py); nothing of it is copied here."""

import os
import sys

from torch import nn

sys.path.insert(0, os.environ["PYCIL_CONVS"])
from cifar_resnet import resnet32 as _pycil_resnet32  # noqa: E402

from dfcil.models.resnet_cifar import BACKBONES  # noqa: E402


class PyCILResNet32(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = _pycil_resnet32()
        self.out_dim = self.net.out_dim

    def forward(self, x, bn=None):  # dfcil's backbone interface: (last feature map, stage outputs)
        n = self.net
        x = nn.functional.relu(n.bn_1(n.conv_1_3x3(x)), inplace=True)
        x1 = n.stage_1(x)
        x2 = n.stage_2(x1)
        x3 = n.stage_3(x2)
        return x3, (x1, x2, x3)


BACKBONES.register("pycil_resnet32")(PyCILResNet32)
