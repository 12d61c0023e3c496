"""AutoAugment (Cubuk et al., CVPR 2019) per image, in batched tensor ops on the training device.

The learned CIFAR-10 and ImageNet policies, read as the codes of APR-EFCIL and PyCIL read them (their
``autoaugment.py``, after DeepVoltaire's): each image draws one of the 25 sub-policies uniformly, then applies its two
operations in order, each with its own probability; an operation with a direction takes a random sign per image.
Magnitude bins ``m`` = 0..9 mean:

====================================  ======================================================  =========
operation                             parameter                                               direction
====================================  ======================================================  =========
shear_x, shear_y                      shear factor 0.3·m/9 (about the top-left corner)        ±
translate_x, translate_y              (150/331)·m/9 of the image side, in pixels              ±
rotate                                30·m/9 degrees about the centre                         ±
color, contrast, brightness,          enhance factor 1 ± 0.9·m/9 (PIL's ``ImageEnhance``:     ±
sharpness                             a blend with grey, the mean grey, black, a blur)
posterize                             keep round(8 − 4·m/9) bits
solarize                              invert the levels ≥ 256·(1 − m/9)
auto_contrast, equalize, invert       none
====================================  ======================================================  =========

Each operation computes what PIL computes on the reference's 8-bit images: levels truncated to whole numbers after
every operation, PIL's luminance, its 3×3 smoothing for sharpness, its bicubic (a = −1, along the sheared axis) for
shears and the nearest pixel for rotations and translations, uncovered pixels grey 128 (tests/test_augment.py holds
them against PIL). Images are float (B, C, H, W) on the 0..255 scale. Every operation the policy can draw at a
position is computed for the whole batch and kept where an image drew it (``torch.where``), so no shape depends on a
draw: no host sync, and a CUDA graph captures it. All draws come from the generator given, a fixed number per batch.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

FILL = 128.0  # grey: the reference's fill colour for pixels a geometric operation uncovers
JITTER = 63 / 255  # the brightness range of the reference's ColorJitter(brightness=63/255): factor 1 ± JITTER

SubPolicy = tuple[tuple[str, float, int], tuple[str, float, int]]  # two (operation, probability, magnitude bin)

# The paper's policies (appendix A), in the order its tables and the reference codes list them; a bin of an
# operation without a magnitude is ignored.
CIFAR10: tuple[SubPolicy, ...] = (
    (("invert", 0.1, 7), ("contrast", 0.2, 6)),
    (("rotate", 0.7, 2), ("translate_x", 0.3, 9)),
    (("sharpness", 0.8, 1), ("sharpness", 0.9, 3)),
    (("shear_y", 0.5, 8), ("translate_y", 0.7, 9)),
    (("auto_contrast", 0.5, 8), ("equalize", 0.9, 2)),
    (("shear_y", 0.2, 7), ("posterize", 0.3, 7)),
    (("color", 0.4, 3), ("brightness", 0.6, 7)),
    (("sharpness", 0.3, 9), ("brightness", 0.7, 9)),
    (("equalize", 0.6, 5), ("equalize", 0.5, 1)),
    (("contrast", 0.6, 7), ("sharpness", 0.6, 5)),
    (("color", 0.7, 7), ("translate_x", 0.5, 8)),
    (("equalize", 0.3, 7), ("auto_contrast", 0.4, 8)),
    (("translate_y", 0.4, 3), ("sharpness", 0.2, 6)),
    (("brightness", 0.9, 6), ("color", 0.2, 8)),
    (("solarize", 0.5, 2), ("invert", 0.0, 3)),
    (("equalize", 0.2, 0), ("auto_contrast", 0.6, 0)),
    (("equalize", 0.2, 8), ("equalize", 0.6, 4)),
    (("color", 0.9, 9), ("equalize", 0.6, 6)),
    (("auto_contrast", 0.8, 4), ("solarize", 0.2, 8)),
    (("brightness", 0.1, 3), ("color", 0.7, 0)),
    (("solarize", 0.4, 5), ("auto_contrast", 0.9, 3)),
    (("translate_y", 0.9, 9), ("translate_y", 0.7, 9)),
    (("auto_contrast", 0.9, 2), ("solarize", 0.8, 3)),
    (("equalize", 0.8, 8), ("invert", 0.1, 3)),
    (("translate_y", 0.7, 9), ("auto_contrast", 0.9, 1)),
)
IMAGENET: tuple[SubPolicy, ...] = (
    (("posterize", 0.4, 8), ("rotate", 0.6, 9)),
    (("solarize", 0.6, 5), ("auto_contrast", 0.6, 5)),
    (("equalize", 0.8, 8), ("equalize", 0.6, 3)),
    (("posterize", 0.6, 7), ("posterize", 0.6, 6)),
    (("equalize", 0.4, 7), ("solarize", 0.2, 4)),
    (("equalize", 0.4, 4), ("rotate", 0.8, 8)),
    (("solarize", 0.6, 3), ("equalize", 0.6, 7)),
    (("posterize", 0.8, 5), ("equalize", 1.0, 2)),
    (("rotate", 0.2, 3), ("solarize", 0.6, 8)),
    (("equalize", 0.6, 8), ("posterize", 0.4, 6)),
    (("rotate", 0.8, 8), ("color", 0.4, 0)),
    (("rotate", 0.4, 9), ("equalize", 0.6, 2)),
    (("equalize", 0.0, 7), ("equalize", 0.8, 8)),
    (("invert", 0.6, 4), ("equalize", 1.0, 8)),
    (("color", 0.6, 4), ("contrast", 1.0, 8)),
    (("rotate", 0.8, 8), ("color", 1.0, 2)),
    (("color", 0.8, 8), ("solarize", 0.8, 7)),
    (("sharpness", 0.4, 7), ("invert", 0.6, 8)),
    (("shear_x", 0.6, 5), ("equalize", 1.0, 9)),
    (("color", 0.4, 0), ("equalize", 0.6, 3)),
    (("equalize", 0.4, 7), ("solarize", 0.2, 4)),
    (("solarize", 0.6, 5), ("auto_contrast", 0.6, 5)),
    (("invert", 0.6, 4), ("equalize", 1.0, 8)),
    (("color", 0.6, 4), ("contrast", 1.0, 8)),
    (("equalize", 0.8, 8), ("equalize", 0.6, 3)),
)


def policy_for(image_size: int) -> tuple[SubPolicy, ...]:
    """The CIFAR-10 policy for CIFAR-sized images (up to 32 px), the ImageNet policy for larger ones."""
    return CIFAR10 if image_size <= 32 else IMAGENET


def _rows(v: Tensor) -> Tensor:
    return v.view(-1, 1, 1, 1)


def _level(x: Tensor) -> Tensor:
    """Back to whole levels in 0..255, truncated as PIL stores a computed value in an 8-bit image."""
    return x.clamp_(0.0, 255.0).floor_()


def _blend(degenerate: Tensor, x: Tensor, factor: Tensor) -> Tensor:
    """PIL's ``ImageEnhance``: ``degenerate + factor·(x − degenerate)`` (factor 0 gives the degenerate image, 1 the
    image, above 1 extrapolates away from the degenerate one)."""
    return _level(degenerate + _rows(factor) * (x - degenerate))


def grey(x: Tensor) -> Tensor:
    """(B, 1, H, W) PIL's luminance ``L`` of whole levels: ``(19595 R + 38470 G + 7471 B + 2¹⁵) >> 16``, i.e.
    0.299 R + 0.587 G + 0.114 B rounded (every term exact in float32: the sum stays below 2²⁴)."""
    return torch.floor((19595 * x[:, 0:1] + 38470 * x[:, 1:2] + 7471 * x[:, 2:3] + 32768) / 65536)


def brightness(x: Tensor, factor: Tensor) -> Tensor:
    """Blend with black: ``factor·x``."""
    return _level(x * _rows(factor))


def color(x: Tensor, factor: Tensor) -> Tensor:
    """Blend with the image's own grey (saturation)."""
    return _blend(grey(x), x, factor)


def contrast(x: Tensor, factor: Tensor) -> Tensor:
    """Blend with a flat image of the mean grey level (rounded)."""
    mean = torch.floor(grey(x).mean(dim=(1, 2, 3), keepdim=True) + 0.5)
    return _blend(mean, x, factor)


def sharpness(x: Tensor, factor: Tensor) -> Tensor:
    """Blend with PIL's ``SMOOTH`` blur (3×3 kernel 1 1 1 / 1 5 1 / 1 1 1, divided by 13, rounded) of the interior;
    the 1-pixel border is its own degenerate, so stays as it is."""
    h, w = x.shape[2:]
    p = F.pad(x, (1, 1, 1, 1))
    total = 4 * x + sum(p[:, :, i : i + h, j : j + w] for i in range(3) for j in range(3))  # exact sums of levels
    degenerate = x.clone()
    degenerate[:, :, 1:-1, 1:-1] = (total[:, :, 1:-1, 1:-1] / 13).round()
    return _blend(degenerate, x, factor)


def posterize(x: Tensor, bits: Tensor) -> Tensor:
    """Keep the ``bits`` high bits of each level."""
    step = _rows(torch.exp2(8 - bits))
    return torch.floor(x / step) * step


def solarize(x: Tensor, threshold: Tensor) -> Tensor:
    """Invert the levels at or above ``threshold``."""
    return torch.where(x >= _rows(threshold), 255 - x, x)


def invert(x: Tensor, _: Tensor) -> Tensor:
    return 255 - x


def auto_contrast(x: Tensor, _: Tensor) -> Tensor:
    """Stretch each channel's levels to 0..255 (PIL's ``autocontrast``, no cut-off): ``⌊x·s − lo·s⌋`` with
    ``s = 255 / (hi − lo)``, in double precision as PIL computes it (so its roundings too); a flat channel stays."""
    lo, hi = x.amin(dim=(2, 3), keepdim=True).double(), x.amax(dim=(2, 3), keepdim=True).double()
    scale = torch.full_like(lo, 255.0) / (hi - lo).clamp(min=1)  # a true division (a scalar's is a reciprocal's)
    stretched = torch.floor(x.double() * scale - lo * scale).clamp_(0, 255).to(x.dtype)
    return torch.where(hi > lo, stretched, x)


def equalize(x: Tensor, _: Tensor) -> Tensor:
    """Histogram equalisation of each channel (PIL's ``equalize``): with ``step = (N − n_top) // 255`` (N pixels,
    n_top those at the highest level present), level ``v`` becomes ``min(255, (step // 2 + #{pixels < v}) // step)``;
    a channel with ``step`` 0 (one level, or nearly) stays as it is."""
    b, c, h, w = x.shape
    levels = x.reshape(b * c, h * w).long()
    hist = torch.zeros(b * c, 256, dtype=torch.long, device=x.device).scatter_add_(1, levels, torch.ones_like(levels))
    top = hist.gather(1, levels.amax(dim=1, keepdim=True))  # (B·C, 1) pixels at the highest level present
    step = (h * w - top) // 255
    below = hist.cumsum(dim=1) - hist  # pixels under each level
    lut = ((step // 2 + below) // step.clamp(min=1)).clamp_(max=255)
    out = torch.where(step > 0, lut.gather(1, levels), levels)
    return out.to(x.dtype).view(b, c, h, w)


def _warp(x: Tensor, matrix: list[list[Tensor]]) -> Tensor:
    """The nearest pixel where ``matrix`` (two rows of three (B,) tensors, per image) sends each output pixel, in
    PIL's convention: pixel coordinates with centres at i + 0.5, ``(x_in, y_in) = matrix·(x_out, y_out, 1)``;
    pixels sent outside the image are :data:`FILL`."""
    h, w = x.shape[2:]
    (a, b, c), (d, e, f) = matrix
    # the same map in grid_sample's coordinates (−1..1 across the image, align_corners=False): no host copies, so a
    # CUDA graph captures it
    theta = torch.stack([
        torch.stack([a, b * h / w, a + b * h / w + 2 * c / w - 1], dim=1),
        torch.stack([d * w / h, e, d * w / h + e + 2 * f / h - 1], dim=1),
    ], dim=1)  # fmt: skip
    grid = F.affine_grid(theta, list(x.shape), align_corners=False)
    # shifted so that the zero padding of grid_sample is the fill colour (exact: whole levels)
    return F.grid_sample(x - FILL, grid, mode="nearest", padding_mode="zeros", align_corners=False) + FILL


def _affine(rows: list[list[Tensor | float]], like: Tensor) -> list[list[Tensor]]:
    """Two rows of per-image (B,) values from values and constants."""
    return [[v if isinstance(v, Tensor) else like.new_full(like.shape, v) for v in row] for row in rows]


def shear_x(x: Tensor, s: Tensor) -> Tensor:
    """``x_in = x_out + s·y_out``, about the top-left corner: each row moves along x, so PIL's bicubic is one-
    dimensional there (a = −1, its four taps clamped to the row's ends); pixels sent outside the row are
    :data:`FILL`."""
    _, _, h, w = x.shape
    u = torch.arange(w, device=x.device, dtype=x.dtype) + 0.5
    v = torch.arange(h, device=x.device, dtype=x.dtype) + 0.5
    x_in = u + _rows(s)[:, 0] * v[:, None]  # (B, H, W) source x of each output pixel
    start = torch.floor(x_in - 0.5)
    t = (x_in - 0.5 - start).unsqueeze(1)  # (B, 1, H, W) position between taps 2 and 3
    idx = start.long().unsqueeze(1).expand_as(x)
    v1, v2, v3, v4 = (x.gather(3, (idx + k).clamp(0, w - 1)) for k in (-1, 0, 1, 2))
    out = v2 + t * ((v3 - v1) + t * ((2 * (v1 - v2) + v3 - v4) + t * (v2 - v1 + v4 - v3)))  # PIL's BICUBIC
    return torch.where(((x_in < 0) | (x_in >= w)).unsqueeze(1), FILL, _level(out))


def shear_y(x: Tensor, s: Tensor) -> Tensor:
    """``y_in = s·x_out + y_out``: :func:`shear_x` of the transposed image."""
    return shear_x(x.transpose(2, 3), s).transpose(2, 3)


def translate_x(x: Tensor, fraction: Tensor) -> Tensor:
    """``x_in = x_out + fraction·W``: the content moves left by that many pixels for a positive fraction."""
    return _warp(x, _affine([[1.0, 0.0, fraction * x.shape[3]], [0.0, 1.0, 0.0]], fraction))


def translate_y(x: Tensor, fraction: Tensor) -> Tensor:
    """``y_in = y_out + fraction·H``."""
    return _warp(x, _affine([[1.0, 0.0, 0.0], [0.0, 1.0, fraction * x.shape[2]]], fraction))


def rotate(x: Tensor, degrees: Tensor) -> Tensor:
    """Counter-clockwise (as seen) by ``degrees`` about the image centre, as PIL's ``Image.rotate``."""
    h, w = x.shape[2:]
    a = torch.deg2rad(degrees)
    cos, sin = torch.cos(a), torch.sin(a)
    cx, cy = w / 2, h / 2
    rows = [[cos, -sin, cx - cos * cx + sin * cy], [sin, cos, cy - sin * cx - cos * cy]]
    return _warp(x, _affine(rows, degrees))


Op = Callable[[Tensor, Tensor], Tensor]
# operation → (function, magnitude of bin m, takes a random sign, neutral parameter: what the parameter is for the
# images that did not draw it, so that the batch-wide computation stays finite and cheap)
OPS: dict[str, tuple[Op, Callable[[int], float], bool, float]] = {
    "shear_x": (shear_x, lambda m: 0.3 * m / 9, True, 0.0),
    "shear_y": (shear_y, lambda m: 0.3 * m / 9, True, 0.0),
    "translate_x": (translate_x, lambda m: 150 / 331 * m / 9, True, 0.0),
    "translate_y": (translate_y, lambda m: 150 / 331 * m / 9, True, 0.0),
    "rotate": (rotate, lambda m: 30 * m / 9, True, 0.0),
    "color": (color, lambda m: 0.9 * m / 9, True, 1.0),
    "contrast": (contrast, lambda m: 0.9 * m / 9, True, 1.0),
    "brightness": (brightness, lambda m: 0.9 * m / 9, True, 1.0),
    "sharpness": (sharpness, lambda m: 0.9 * m / 9, True, 1.0),
    "posterize": (posterize, lambda m: float(round(8 - 4 * m / 9)), False, 8.0),
    "solarize": (solarize, lambda m: 256 - 256 * m / 9, False, 256.0),
    "auto_contrast": (auto_contrast, lambda m: 0.0, False, 0.0),
    "equalize": (equalize, lambda m: 0.0, False, 0.0),
    "invert": (invert, lambda m: 0.0, False, 0.0),
}
ENHANCE = frozenset({"color", "contrast", "brightness", "sharpness"})  # factor 1 ± magnitude


class AutoAugment:
    """A policy's sub-policies as tables on the device, applied per image (module docstring).

    Args:
        policy: the sub-policies (:data:`CIFAR10`, :data:`IMAGENET`).
        device: where the batches are.
    """

    def __init__(self, policy: tuple[SubPolicy, ...], device: torch.device) -> None:
        self.names = sorted({name for sub in policy for name, _, _ in sub})
        table = [[(self.names.index(n), p, *self._magnitude(n, m)) for n, p, m in sub] for sub in policy]
        t = torch.tensor(table, dtype=torch.float64, device=device)  # (S, 2, 5): op, p, base, magnitude, signed
        self.op, self.p = t[..., 0].long(), t[..., 1].float()
        self.base, self.magnitude, self.signed = t[..., 2].float(), t[..., 3].float(), t[..., 4].bool()
        # per position, the operations that policy has there: only those are computed
        self.at = [sorted({self.names.index(sub[k][0]) for sub in policy}) for k in range(2)]

    @staticmethod
    def _magnitude(name: str, m: int) -> tuple[float, float, float]:
        """(base, magnitude, signed): the parameter is ``base + sign·magnitude``."""
        _, of_bin, signed, _ = OPS[name]
        return (1.0 if name in ENHANCE else 0.0), of_bin(m), float(signed)

    def __call__(self, x: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """``x`` (B, C, H, W) float levels 0..255, each image through its own sub-policy; draws 5 numbers per image from
        ``generator``: the sub-policy, two gates and two signs."""
        b, dev = x.shape[0], x.device
        which = torch.randint(0, len(self.op), (b,), generator=generator, device=dev)
        gate = torch.rand((b, 2), generator=generator, device=dev)
        sign = torch.where(torch.rand((b, 2), generator=generator, device=dev) < 0.5, -1.0, 1.0)
        for k in range(2):
            op, on = self.op[which, k], gate[:, k] < self.p[which, k]
            param = self.base[which, k] + torch.where(self.signed[which, k], sign[:, k], 1.0) * self.magnitude[which, k]
            for i in self.at[k]:
                fn, _, _, neutral = OPS[self.names[i]]
                drew = op == i
                x = torch.where(_rows(drew & on), fn(x, torch.where(drew, param, neutral)), x)
        return x


def brightness_jitter(x: Tensor, generator: torch.Generator | None = None, strength: float = JITTER) -> Tensor:
    """The reference's ``ColorJitter(brightness=strength)``: each image times a factor uniform in
    ``[max(0, 1 − strength), 1 + strength]`` (one number per image from ``generator``), at whole levels."""
    u = torch.rand(x.shape[0], generator=generator, device=x.device)
    low = max(0.0, 1 - strength)
    return brightness(x, low + u * (1 + strength - low))
