"""The baselines' loss functions and heads against hand-computed values."""

import math

import pytest
import torch
import torch.nn.functional as F

from dfcil.losses.classification import task_balance_weights
from dfcil.losses.distillation import head_feature_kd, kd_soft_ce, sigmoid_bce_kd
from dfcil.losses.podnet import nca, pod_flat, pod_spatial
from dfcil.losses.ucir import less_forget, margin_ranking
from dfcil.methods.podnet_df import kmeans
from dfcil.models.heads import CosineIncremental, IncrementalLinear, LocalSimilarity


def test_kd_soft_ce():
    s = torch.tensor([[math.log(3.0), 0.0]])
    # target = student = [3/4, 1/4]: the loss is the entropy
    assert kd_soft_ce(s, s, temperature=1.0).item() == pytest.approx(-(0.75 * math.log(0.75) + 0.25 * math.log(0.25)))
    assert kd_soft_ce(torch.zeros(1, 2), s, temperature=2.0).item() == pytest.approx(math.log(2))  # no T² factor
    # DeepInversion's synthetic-data KD: the target is padded with zeros for the student's new classes
    assert kd_soft_ce(torch.zeros(1, 3), torch.zeros(1, 2), temperature=2.0).item() == pytest.approx(math.log(3))


def test_sigmoid_bce_kd():
    """LwF.MC: BCE summed over classes, averaged over samples; old-class targets are the teacher's sigmoids."""
    ln2, h = math.log(2), -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))  # h: binary entropy of 3/4
    zeros, y = torch.zeros(1, 3), torch.tensor([2])
    assert sigmoid_bce_kd(zeros, y).item() == pytest.approx(3 * ln2)  # sigma = 1/2 against 0, 0, 1
    s = torch.tensor([[math.log(3.0), 0.0, 0.0]])
    # class 0: sigma(ln 3) = 3/4 against 0 -> -ln(1/4); classes 1, 2 -> ln 2 each
    assert sigmoid_bce_kd(s, y).item() == pytest.approx(math.log(4) + 2 * ln2)
    # teacher logit ln 3 for the one old class: target 3/4 = the student's sigma, so class 0 costs h
    assert sigmoid_bce_kd(s, y, torch.tensor([[math.log(3.0)]])).item() == pytest.approx(h + 2 * ln2)
    # two samples (labels 2 and 1, teacher logits ln 3 and 0): the mean of their sums; the second's targets are
    # 1/2, 1, 0 against sigma = 1/2, ln 2 each
    two = sigmoid_bce_kd(torch.cat((s, zeros)), torch.tensor([2, 1]), torch.tensor([[math.log(3.0)], [0.0]]))
    assert two.item() == pytest.approx(((h + 2 * ln2) + 3 * ln2) / 2)
    # against ABD's own expression: BCELoss(sum)(sigmoid(s), target) / B
    g = torch.Generator().manual_seed(0)
    logits, teacher, labels = (
        torch.randn(5, 6, generator=g),
        torch.randn(5, 4, generator=g),
        torch.tensor([4, 5, 4, 5, 5]),
    )
    target = F.one_hot(labels, 6).float()
    target[:, :4] = torch.sigmoid(teacher)
    want = torch.nn.BCELoss(reduction="sum")(torch.sigmoid(logits), target) / 5
    torch.testing.assert_close(sigmoid_bce_kd(logits, labels, teacher), want)
    # where ABD's fp32 BCELoss(sigmoid) saturates (a wrong logit of 20: clamped at 100, no gradient) ours is exact
    wrong = torch.tensor([[20.0, 0.0]], requires_grad=True)
    loss = sigmoid_bce_kd(wrong, torch.tensor([1]))
    assert loss.item() == pytest.approx(20.0 + math.log(1 + math.exp(-20.0)) + ln2)
    torch.testing.assert_close(torch.autograd.grad(loss, wrong)[0], torch.tensor([[1.0, -0.5]]))


def test_sigmoid_bce_kd_on_a_static_head_equals_it_on_the_seen_columns():
    """A static head (capacity 7, classes 0-3 old, 4-5 new, column 6 unseen and masked): the teacher's logits cover
    every column, and the old-class mask picks its targets; the masked column adds exactly 0, so the loss and its
    gradient are those of the growing head's 6 columns. Fails where the teacher's full width is taken as old."""
    from dfcil.models.heads import MASKED_LOGIT

    g = torch.Generator().manual_seed(1)
    logits, teacher = torch.randn(5, 6, generator=g), torch.randn(5, 4, generator=g)
    labels = torch.tensor([4, 5, 4, 5, 5])
    pad = torch.full((5, 1), MASKED_LOGIT)
    wide = torch.cat((logits, pad), dim=1).requires_grad_()
    wide_teacher = torch.cat((teacher, torch.full((5, 3), MASKED_LOGIT)), dim=1)  # the old head masks 4, 5 and 6
    old = torch.tensor([True] * 4 + [False] * 3)
    growing = logits.clone().requires_grad_()
    want = sigmoid_bce_kd(growing, labels, teacher)
    got = sigmoid_bce_kd(wide, labels, wide_teacher, old)
    torch.testing.assert_close(got, want)
    (g_want,), (g_got,) = torch.autograd.grad(want, growing), torch.autograd.grad(got, wide)
    torch.testing.assert_close(g_got[:, :6], g_want)
    assert (g_got[:, 6] == 0).all()
    # an int (a growing head's old-column count) keeps the teacher's own width, as before
    torch.testing.assert_close(sigmoid_bce_kd(logits, labels, teacher, 4), want.detach())


def test_head_feature_kd():
    w = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    # d = W (f_s - f_t) = [1, 2]: mean of squares over the 2 old classes = 2.5
    assert head_feature_kd(torch.tensor([[1.0, 1.0]]), torch.zeros(1, 2), w).item() == pytest.approx(2.5)


def test_less_forget_and_pod_flat():
    a, b = torch.tensor([[1.0, 0.0], [1.0, 1.0]]), torch.tensor([[0.0, 1.0], [2.0, 2.0]])
    assert less_forget(a, b).item() == pytest.approx(0.5)  # (1 - 0 + 1 - 1) / 2
    assert pod_flat(a, b).item() == pytest.approx(0.5)


def test_margin_ranking_on_old_class_samples_only():
    cosine = torch.tensor([[0.9, 0.1, 0.8, 0.3], [0.2, 0.5, 0.9, 0.95]])
    y = torch.tensor([0, 2])  # sample 1 has a new label: no ranking term
    # sample 0: gt 0.9, hard new scores 0.8 and 0.3 -> hinges 0.4 and 0 over 2 pairs
    assert margin_ranking(cosine, y, n_old=2, k=2, margin=0.5).item() == pytest.approx(0.2)
    assert margin_ranking(cosine, torch.tensor([2, 3]), n_old=2).item() == 0


def test_pod_spatial():
    a = torch.tensor([[[[1.0, 2.0], [3.0, 4.0]]]])  # (1, 1, 2, 2)
    b = torch.tensor([[[[1.0, 0.0], [0.0, 0.0]]]])
    va = torch.tensor([5.0, 25.0, 10.0, 20.0])  # squares summed over width (rows), then over height (columns)
    vb = torch.tensor([1.0, 0.0, 1.0, 0.0])
    expected = (va / va.norm() - vb / vb.norm()).norm().item()
    assert pod_spatial([a, a], [b, a]).item() == pytest.approx(expected / 2)  # mean over the two stages
    assert pod_spatial([a], [2 * a]).item() == pytest.approx(0, abs=1e-6)


def test_nca_reproduces_the_reference_code():
    s, y = torch.tensor([[1.0, 2.0, 0.0]]), torch.tensor([1])
    # scale·(s − margin), shifted by the max: [-1, 0, -2]; positive 0; denominator keeps exp(0) for the positive
    expected = math.log(math.exp(-1) + 1 + math.exp(-2))
    assert nca(s, y, margin=0.6).item() == pytest.approx(expected)
    assert nca(s, y, margin=0.0).item() == pytest.approx(expected)  # the margin has no effect, as in the code
    # a positive that is not the largest logit: shifted [0, -1, -2], positive -1, and the positive's place in the
    # denominator taken by exp(0): 1 + ln(1 + 1 + e⁻²) (plain CE would give 1.407606, NCA without it 1.126928)
    assert nca(torch.tensor([[2.0, 1.0, 0.0]]), y).item() == pytest.approx(1 + math.log(2 + math.exp(-2)))
    assert nca(torch.tensor([[2.0, 1.0, 0.0]]), y).item() == pytest.approx(1.758624, abs=1e-6)
    w = torch.tensor([1.0, 3.0, 1.0])
    two = torch.tensor([[1.0, 2.0, 0.0], [0.0, 0.0, 5.0]])
    per = torch.stack([nca(two[:1], torch.tensor([1])), nca(two[1:], torch.tensor([0]))])
    weighted = nca(two, torch.tensor([1, 0]), class_weight=w)
    # PODNet-DF's own choice (docs/baselines.md): normalised by the summed weights, Σ w·ℓ / Σ w
    assert weighted.item() == pytest.approx(((3 * per[0] + 1 * per[1]) / 4).item())


def test_abd_task_balance_weights():
    assert task_balance_weights(torch.tensor([0, 3]), n_old=1, n_seen=4).tolist() == [0.25, 0.75]


def test_kmeans_finds_two_clusters():
    x = torch.cat([torch.randn(20, 2) * 0.05 + 3, torch.randn(20, 2) * 0.05 - 3])
    c = kmeans(x, 2, torch.Generator().manual_seed(0))
    assert sorted(c[:, 0].round().tolist()) == [-3.0, 3.0]
    assert kmeans(x[:3], 10, torch.Generator().manual_seed(0)).shape == (10, 2)  # fewer rows than k


def test_cosine_and_lsc_heads():
    f = torch.tensor([[2.0, 0.0]])
    head = CosineIncremental(2)
    head.expand(2)
    with torch.no_grad():
        head.blocks[0].weight.copy_(torch.tensor([[3.0, 0.0], [0.0, 1.0]]))
        head.sigma.fill_(2.0)
    assert head(f).tolist() == [[2.0, 0.0]] and head.cosine(f).tolist() == [[1.0, 0.0]]
    lsc = LocalSimilarity(2)
    lsc.expand(2)
    assert lsc.blocks[0].weight.shape == (20, 2) and lsc.sizes == [2]
    with torch.no_grad():
        lsc.blocks[0].weight.copy_(torch.tensor([[1.0, 0.0]] * 10 + [[0.0, 1.0]] * 10))
        lsc.eta.fill_(3.0)
    assert lsc(f)[0].tolist() == pytest.approx([0.0, -6.0])  # η · (2cos − 2) with identical proxies
    with torch.no_grad():  # class 0: five proxies at cos 1 (similarity 0), five at cos 0 (similarity −2)
        lsc.blocks[0].weight[:10].copy_(torch.tensor([[1.0, 0.0]] * 5 + [[0.0, 1.0]] * 5))
    # softmax-weighted over the proxies: η · (−2e⁻²) / (1 + e⁻²); a plain mean would give −3
    assert lsc(f)[0, 0].item() == pytest.approx(3 * -2 * math.exp(-2) / (1 + math.exp(-2)))
    assert lsc(f)[0, 0].item() == pytest.approx(-0.715218, abs=1e-6)
    lsc.expand(1)
    lsc.truncate(2)
    assert lsc.sizes == [2]
    linear = IncrementalLinear(2)
    linear.expand(3)
    assert linear(f).shape == (1, 3)


def test_dgr_vae_is_abds_cifar_autoencoder():
    from dfcil.methods.dgr import VAE

    vae = VAE(zdim=16)
    kinds = [type(m).__name__ for m in vae.decoder]
    assert kinds == ["ConvTranspose2d", "ReLU", "ConvTranspose2d", "ReLU", "ConvTranspose2d"]  # ReLU except last
    assert [m.out_channels for m in vae.encoder if isinstance(m, torch.nn.Conv2d)] == [64, 128, 512]
    # the projection feeds the first transposed conv without an activation: negative values must matter
    z = torch.zeros(2, 16)
    with torch.no_grad():
        vae.decoder_fc.weight.zero_()
        vae.decoder_fc.bias.fill_(-1.0)
        negative = vae.decode(z)
        vae.decoder_fc.bias.zero_()
        zero = vae.decode(z)
    assert negative.shape == (2, 3, 32, 32) and not torch.allclose(negative, zero)


def test_dgr_vae_loss_against_hand_values():
    """With zero weights μ and log σ² are the heads' biases and the reconstruction is the last layer's bias, so
    the weighted reconstruction error and the KL (batch mean, ÷ 3072 pixel values, as ABD) follow by hand."""
    from dfcil.methods.dgr import VAE

    vae = VAE(zdim=4)
    mu, logvar = torch.tensor([0.5, -1.0, 0.0, 2.0]), torch.tensor([0.0, 0.2, -0.3, 1.0])
    out_bias = torch.tensor([0.1, 0.2, 0.3])
    with torch.no_grad():
        for p in vae.parameters():
            p.zero_()
        vae.mu.bias.copy_(mu)
        vae.logvar.bias.copy_(logvar)
        vae.decoder[-1].bias.copy_(out_bias)
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    weight = torch.tensor([1.0, 3.0])
    recon = ((out_bias[None, :, None, None] - x) ** 2).flatten(1).mean(dim=1)
    kl = -0.5 * (1 + logvar - mu**2 - logvar.exp()).sum() / 3072
    got = vae.loss(x, weight, torch.Generator().manual_seed(1))
    assert got.item() == pytest.approx(((recon * weight).mean() + kl).item(), rel=1e-6)
