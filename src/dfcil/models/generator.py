"""Image generators for model inversion (DAFL/ABD style, as cl-lite ``deep_inversion/generator``).

z ~ N(0, I) of dimension 1000 → Linear → reshape → BN → [×2 nearest upsample → conv3×3 → BN(eps=0.8) → LeakyReLU]*
→ conv3×3 → Tanh → BN(affine=False). The ``eps=0.8`` is the DCGAN quirk the reference keeps (the positional 0.8 of
``BatchNorm2d(C, 0.8)`` is eps, not momentum). The final affine-free BN standardises each channel, so samples land
roughly in the classifier's normalised input space and are used without augmentation.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor, nn

from dfcil.models.resnet_cifar import memory_format_of
from dfcil.registry import Registry

GENERATORS: Registry = Registry("generator")


class Generator(nn.Module):
    def __init__(
        self, zdim: int, init_size: int, init_channels: int, widths: Sequence[int], out_channels: int = 3
    ) -> None:
        super().__init__()
        self.zdim = zdim
        self.init_size = init_size
        self.init_channels = init_channels
        self.fc = nn.Linear(zdim, init_channels * init_size**2)
        self.bn_0 = nn.BatchNorm2d(init_channels)
        layers: list[nn.Module] = []
        c = init_channels
        for width in widths:
            layers += [
                nn.Upsample(scale_factor=2, mode="nearest"),
                nn.Conv2d(c, width, 3, stride=1, padding=1),
                nn.BatchNorm2d(width, eps=0.8),
                nn.LeakyReLU(0.2),
            ]
            c = width
        self.body = nn.Sequential(*layers)
        self.out = nn.Sequential(
            nn.Conv2d(c, out_channels, 3, stride=1, padding=1), nn.Tanh(), nn.BatchNorm2d(out_channels, affine=False)
        )

    def forward(self, z: Tensor) -> Tensor:
        x = self.fc(z).view(z.shape[0], self.init_channels, self.init_size, self.init_size)
        # in the convolutions' memory format (NHWC when the generator was moved to channels_last): one copy here
        # instead of a conversion in each direction inside the next convolution
        x = x.contiguous(memory_format=memory_format_of(self.out[0].weight))
        return self.out(self.body(self.bn_0(x)))


@GENERATORS.register("32")
def cifar_generator(zdim: int = 1000) -> Generator:
    """32×32: 8 → 16 → 32, widths 128, 64."""
    return Generator(zdim, init_size=8, init_channels=128, widths=(128, 64))


@GENERATORS.register("64")
def tiny_imagenet_generator(zdim: int = 1000) -> Generator:
    """64×64: 8 → 16 → 32 → 64, widths 128, 128, 64."""
    return Generator(zdim, init_size=8, init_channels=128, widths=(128, 128, 64))


@GENERATORS.register("224")
def imagenet_generator(zdim: int = 1000) -> Generator:
    """224×224: 7 → 14 → ... → 224, five upsamplings at width 64."""
    return Generator(zdim, init_size=7, init_channels=64, widths=(64,) * 5)


def generator_layout(image_size: int) -> tuple[int, int]:
    """(starting side, upsamplings) of the generator for ``image_size``: a start of 4 to 8 pixels doubled at least
    twice. Raises ``ValueError`` naming the sizes that work."""
    ups = 0
    while image_size % 2 ** (ups + 1) == 0 and image_size // 2 ** (ups + 1) >= 4:
        ups += 1
    if ups < 2 or image_size // 2**ups > 8:
        raise ValueError(
            f"no generator for {image_size}-pixel images: the size must be a start of 4 to 8 pixels doubled at "
            f"least twice (e.g. 16, 24, 32, 48, 64, 96, 128, 192, 224, 256); set data.image_size to such a size"
        )
    return image_size // 2**ups, ups


def build_generator(image_size: int, zdim: int = 1000) -> Generator:
    """The reference's generator for 32, 64 and 224 pixels; for another size the same design
    (:func:`generator_layout`), widths 128 down to 64."""
    if str(image_size) in GENERATORS:
        return GENERATORS.get(str(image_size))(zdim=zdim)
    start, ups = generator_layout(image_size)
    return Generator(zdim, init_size=start, init_channels=128, widths=(128,) * (ups - 1) + (64,))
