"""Deep generative replay (Shin et al., NeurIPS 2017) as ABD's code runs it. NOT data-free: it keeps a
generative model of the past data (a VAE trained alongside the classifier), which the DFCIL setting forbids;
it is here as the baseline the R-DFCIL and ABD papers report."""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dfcil.config import MethodConfig, NonNegativeFloat, PositiveFloat, PositiveInt, configclass
from dfcil.losses.classification import task_balance_weights
from dfcil.losses.distillation import kd_soft_ce
from dfcil.methods.base import Batch, Method, Phase, TaskContext, register_method
from dfcil.models.network import IncrementalNet
from dfcil.synthesis.replay import ReplayBN, student_pass


@configclass
class DGRConfig(MethodConfig):
    name: str = "dgr"
    lambda_kd: NonNegativeFloat = 1.0  # μ of the KD on replayed samples
    temperature: PositiveFloat = 2.0
    zdim: PositiveInt = 1024  # VAE latent size (ABD: 1024)
    # BN statistics of the student's real + replayed batch: "mixed" (one batch, shared statistics: ABD's DGR) or
    # "separate" (each part its own, as R-DFCIL's code; docs/reference.md, Replay BN statistics)
    replay_bn: ReplayBN = "mixed"


class VAE(nn.Module):
    """ABD's CIFAR autoencoder: 4×4 stride-2 convs 3→64→128→512 (ReLU, no BN), linear μ and log σ² heads, and
    the mirrored decoder: a linear projection (no activation), then 4×4 stride-2 transposed convs 512→256→64→3
    with a ReLU after all but the last. It models the normalised images with a Gaussian likelihood (ABD: [0, 1]
    pixels and BCE through a sigmoid), so no output activation."""

    def __init__(self, zdim: int = 1024) -> None:
        super().__init__()
        self.zdim = zdim
        self.encoder = nn.Sequential(
            nn.Conv2d(3, 64, 4, 2, 1), nn.ReLU(), nn.Conv2d(64, 128, 4, 2, 1), nn.ReLU(),
            nn.Conv2d(128, 512, 4, 2, 1), nn.ReLU(), nn.Flatten(),
        )  # fmt: skip
        self.mu, self.logvar = nn.Linear(512 * 16, zdim), nn.Linear(512 * 16, zdim)
        self.decoder_fc = nn.Linear(zdim, 512 * 16)
        self.decoder = nn.Sequential(
            nn.ConvTranspose2d(512, 256, 4, 2, 1), nn.ReLU(), nn.ConvTranspose2d(256, 64, 4, 2, 1), nn.ReLU(),
            nn.ConvTranspose2d(64, 3, 4, 2, 1),
        )  # fmt: skip

    def decode(self, z: Tensor) -> Tensor:
        return self.decoder(self.decoder_fc(z).view(-1, 512, 4, 4))

    def loss(self, x: Tensor, weight: Tensor, generator: torch.Generator) -> Tensor:
        """Per-sample mean reconstruction error weighted by ``weight`` and averaged, plus the KL term averaged over
        the batch and divided by the number of pixel values (as ABD)."""
        h = self.encoder(x)
        mu, logvar = self.mu(h), self.logvar(h)
        z = mu + torch.randn(mu.shape, generator=generator, device=mu.device) * (0.5 * logvar).exp()
        recon = (self.decode(z) - x).pow(2).flatten(1).mean(dim=1)
        kl = -0.5 * (1 + logvar - mu.pow(2) - logvar.exp()).sum(dim=1).mean() / x[0].numel()
        return (recon * weight).mean() + kl

    @torch.no_grad()
    def sample(self, n: int, generator: torch.Generator) -> Tensor:
        z = torch.randn(n, self.zdim, generator=generator, device=self.decoder_fc.weight.device)
        return self.decode(z)


@register_method(
    "dgr",
    graph_safe=True,  # its step replays as a CUDA graph (checked by tests/test_graphs.py)
    stores="generator",
)
class DGR(Method):
    """DGR (Shin et al., 2017): replay from a VAE trained alongside the classifier."""

    Config = DGRConfig

    def __init__(self, cfg: DGRConfig, train) -> None:
        super().__init__(cfg, train)
        self.vae: VAE | None = None
        self.scholar: tuple[VAE, IncrementalNet] | None = None  # frozen generator + classifier of the last task

    def check_image_size(self, size: int) -> None:
        if size != 32:
            raise ValueError(
                f"dgr's VAE is defined for 32×32 images, not {size}×{size}: use a 32-pixel dataset "
                f"(--data.image_size 32 for the generated one)"
            )

    def on_task_start(self, ctx: TaskContext) -> None:
        self.check_image_size(ctx.image_size)
        if self.vae is None:  # one VAE for the whole run, trained in every task
            self.vae = VAE(self.cfg.zdim).to(ctx.device)
        if ctx.task_id > 0:
            old = copy.deepcopy(self.vae).eval().requires_grad_(False)
            self.scholar = (old, ctx.net.frozen_copy(n_classes=ctx.n_old))

    def on_task_end(self, ctx: TaskContext) -> None:
        self.scholar = None

    def extra_modules(self, ctx: TaskContext) -> list[nn.Module]:
        return [self.vae]  # trained by the engine's optimiser with the classifier; its loss never reaches the net

    def training_step(self, net: IncrementalNet, batch: Batch, ctx: TaskContext, phase: Phase) -> dict[str, Tensor]:
        if self.scholar is None:
            ce = F.cross_entropy(net(batch.x).logits, batch.y)
            return {"ce": ce, "vae": self.vae.loss(batch.x, torch.ones(len(batch.x), device=ctx.device), ctx.rng)}
        b, n_old, (old_vae, old_net) = len(batch.x), ctx.n_old, self.scholar
        x_rep = old_vae.sample(b, ctx.rng)
        with torch.no_grad():
            t_logits = old_net(x_rep).logits
        x, y = torch.cat([batch.x, x_rep]), torch.cat([batch.y, t_logits.argmax(dim=1)])
        w = task_balance_weights(y, n_old, ctx.n_seen)
        logits = student_pass(net, batch.x, x_rep, self.cfg.replay_bn, ctx.runtime.merge_student).logits
        ce = (F.cross_entropy(logits.float(), y, reduction="none") * w).mean()
        kd = self.cfg.lambda_kd * kd_soft_ce(logits[b:, :n_old], t_logits, self.cfg.temperature)
        return {"ce": ce, "kd": kd, "vae": self.vae.loss(x, w, ctx.rng)}

    def state_dict(self) -> dict[str, Any]:
        return {"vae": self.vae.state_dict()} if self.vae is not None else {}

    def static_state_dict(self) -> dict[str, Any]:
        if self.scholar is None:
            return {}
        return {"vae": self.scholar[0].state_dict(), "net": self.scholar[1].state_dict()}

    def load_state_dict(self, state: dict[str, Any], ctx: TaskContext, static: dict[str, Any] | None = None) -> None:
        self.vae = self.scholar = None
        if state:
            self.vae = VAE(self.cfg.zdim).to(ctx.device)
            self.vae.load_state_dict(state["vae"])
        if static:
            old = VAE(self.cfg.zdim).to(ctx.device)
            old.load_state_dict(static["vae"])
            teacher = ctx.net.frozen_copy(n_classes=ctx.n_old)
            teacher.load_state_dict(static["net"])
            self.scholar = (old.eval().requires_grad_(False), teacher)

    def task0_signature(self) -> str | None:
        return None  # the VAE trained alongside task 0 is part of the state
