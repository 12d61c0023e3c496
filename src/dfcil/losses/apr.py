"""The maths of APR (Honda, WACV 2026, "Adversarial Pseudo-replay for Exemplar-free Class-incremental Learning") and
of the adversarial drift compensation it runs after each task (ADC, Goswami et al., CVPR 2024): images moved toward a
class prototype by normalised gradient steps through a frozen model, the noise radius of the prototype targets, the
mean shift of a prototype, and the affine map whose linear part carries a covariance into the new feature space.
Pure functions of tensors; features are rows, (N, d); images (B, C, H, W) (docs/baselines.md, APR).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor


def normalised_step(x: Tensor, grad: Tensor, size: float) -> Tensor:
    """x − size·g/‖g‖, with ‖g‖ the L2 norm of the **whole batch's** gradient, not each image's (the authors'
    ``torch.norm(grad, keepdim=True)``): the batch moves a total distance ``size`` in input space, each image by its
    share of the gradient. Any shape; a zero gradient leaves x where it is."""
    norm = grad.norm()
    return x - size * grad / torch.where(norm > 0, norm, torch.ones_like(norm))


def perturb(
    features: Callable[[Tensor], Tensor],
    x: Tensor,
    targets: Tensor,
    steps: int,
    size: float,
    low: float | Tensor | None = None,
    high: float | Tensor | None = None,
) -> Tensor:
    """``steps`` normalised gradient steps of the images ``x`` (B, C, H, W) toward feature ``targets`` (B, d): each
    takes the gradient of MSE(features(x), targets) (mean over B·d) with respect to x only and moves x by
    :func:`normalised_step`, clamped to [``low``, ``high``] where given (ADC: the task images' value range). APR's
    online pseudo-replay (the authors' ``_perturb``) and ADC's attack (their ``Attack._train_one_epoch``).

    ``features`` maps images to (B, d) features (the frozen old model, in eval mode); its parameters get no gradient.
    Returns the moved images, detached.
    """
    x = x.detach()
    for _ in range(steps):
        with torch.enable_grad():
            x.requires_grad_(True)
            loss = F.mse_loss(features(x).float(), targets.float())
            (grad,) = torch.autograd.grad(loss, x)
        x = normalised_step(x.detach(), grad, size)
        if low is not None or high is not None:
            x = x.clamp(low, high)
    return x.detach()


def nearest(features: Tensor, centre: Tensor, k: int) -> Tensor:
    """Indices of the ``k`` rows of ``features`` (N, d) nearest to ``centre`` (d,) in Euclidean distance, nearest
    first (all N where k ≥ N): the new task's images the authors start from for one old class's prototype."""
    distances = torch.cdist(features.float(), centre.float()[None])[:, 0]  # (N,)
    return torch.argsort(distances, stable=True)[: min(k, len(features))]


def nearest_class(features: Tensor, means: Tensor) -> Tensor:
    """(B,) the class of the nearest mean (Euclidean) of each feature: ADC's test of a successful attack (the image's
    old-model feature is nearer the target prototype than any other old class's)."""
    return torch.cdist(features.float(), means.float()).argmin(dim=1)


def noise_radius(covs: Tensor) -> Tensor:
    """r = √(mean_c tr(Σ_c)/d) over the classes' covariances (C, d, d): the radius of the Gaussian noise APR adds to
    each prototype target (the authors' ``_add_proto_noise``, after PASS): the root of the mean per-dimension
    variance. A scalar tensor."""
    d = covs.shape[-1]
    return (covs.diagonal(dim1=-2, dim2=-1).sum(-1) / d).mean().sqrt()


def adc_step_size(alpha: float, batch_size: int) -> float:
    """ADC's step size α·√(B/1000) for attack batches of B images (the authors' "scale alpha with adc batchsize"):
    the whole batch moves α·√(B/1000), so each image about α/√1000, whatever the batch size."""
    return alpha * (batch_size / 1000) ** 0.5


def mean_shift(mean: Tensor, old: Tensor, new: Tensor) -> Tensor:
    """ADC's moved prototype μ + mean_i(f_new,i − f_old,i): the mean drift of the features of the same images
    (attacked toward the class) under the old model (``old``, (N, d)) and the new one (``new``, (N, d))."""
    return mean + (new.float() - old.float()).mean(dim=0)


def affine_fit_loss(predicted: Tensor, target: Tensor) -> Tensor:
    """mean_i ‖p_i − t_i‖₂: the mean Euclidean distance (not squared) between mapped old features and new ones (the
    authors' ``_trans_loss``). (N, d), (N, d) → a scalar."""
    # vector_norm's gradient at a zero difference is 0 (a square root's would be infinite)
    return torch.linalg.vector_norm(predicted - target, dim=-1).mean()


def fit_affine(
    old: Tensor, new: Tensor, epochs: int, lr: float, batch_size: int, generator: torch.Generator | None
) -> tuple[Tensor, Tensor]:
    """The affine map f ↦ W·f + b with W·f_old + b ≈ f_new (APR's "transfer layer" of the covariances), fitted by
    Adam (default betas, no weight decay) on :func:`affine_fit_loss` from W = I, b = 0, ``epochs`` passes over the
    pairs in shuffled batches of ``batch_size`` (the last one smaller), the order drawn from ``generator``.

    Returns (W (d, d), b (d,)), detached; the covariance moves by W alone (:func:`dfcil.losses.prototypes.
    map_covariances`).
    """
    d, device = old.shape[1], old.device
    weight = torch.eye(d, device=device).requires_grad_(True)
    bias = torch.zeros(d, device=device).requires_grad_(True)
    opt = torch.optim.Adam([weight, bias], lr=lr)
    fo, fn = old.float(), new.float()
    with torch.enable_grad():
        for _ in range(epochs):
            order = torch.randperm(len(fo), generator=generator, device=device)
            for idx in order.split(batch_size):
                loss = affine_fit_loss(fo[idx] @ weight.T + bias, fn[idx])
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
    return weight.detach(), bias.detach()
