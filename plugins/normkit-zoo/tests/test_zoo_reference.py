"""Each zoo norm against an independent float64 implementation of its paper's formula.

The references work on (N, C, H, W) float64 tensors with explicit loops over the paper's
quantities; batch-dependent norms are followed over several training steps (outputs and
running statistics) and then in eval.
"""

from __future__ import annotations

import torch

import normkit

C = 8
EPS = 1e-5


def _inputs(steps: int = 4, shape: tuple[int, ...] = (6, C, 3, 4)) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randn(shape, generator=g, dtype=torch.float64) * (1 + i) + 0.5 * i for i in range(steps)]


def _layer(spec: str, **kw) -> torch.nn.Module:
    torch.manual_seed(0)
    layer = normkit.build(spec, C, **kw).double()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in layer.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g, dtype=torch.float64))
    return layer


def _affine(y: torch.Tensor, layer: torch.nn.Module) -> torch.Tensor:
    return y * layer.weight.detach().view(1, -1, 1, 1) + layer.bias.detach().view(1, -1, 1, 1)


def _close(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a.detach(), b.detach(), rtol=1e-9, atol=1e-9)


def test_brn_matches_the_paper_over_steps_then_eval() -> None:
    layer = _layer("brn(r_max=1.5,d_max=0.5,momentum=0.2)")
    mu, var = torch.zeros(C, dtype=torch.float64), torch.ones(C, dtype=torch.float64)
    for x in _inputs():
        m = x.mean(dim=(0, 2, 3))
        v = ((x - m.view(1, -1, 1, 1)) ** 2).mean(dim=(0, 2, 3))
        sigma_b, sigma = (v + EPS).sqrt(), (var + EPS).sqrt()
        r = (sigma_b / sigma).clamp(1 / 1.5, 1.5)
        d = ((m - mu) / sigma).clamp(-0.5, 0.5)
        xhat = (x - m.view(1, -1, 1, 1)) / sigma_b.view(1, -1, 1, 1) * r.view(1, -1, 1, 1) + d.view(1, -1, 1, 1)
        _close(layer(x), _affine(xhat, layer))
        n = x.numel() / C
        mu, var = mu + 0.2 * (m - mu), var + 0.2 * (v * n / (n - 1) - var)
    _close(layer.running_mean, mu)
    _close(layer.running_var, var)
    layer.eval()
    x = _inputs(1)[0]
    _close(layer(x), _affine((x - mu.view(1, -1, 1, 1)) / (var.view(1, -1, 1, 1) + EPS).sqrt(), layer))


def test_brn_r_and_d_carry_no_gradient() -> None:
    layer = _layer("brn")
    x = (_inputs(1)[0] * 3 + 2).requires_grad_(True)
    y = layer(x)
    g = torch.randn_like(y)
    (y * g).sum().backward()
    # Reference: r, d constants; gradient only through (x - mu_B) / sigma_B.
    x2 = x.detach().clone().requires_grad_(True)
    m = x2.mean(dim=(0, 2, 3), keepdim=True)
    s = (((x2 - m) ** 2).mean(dim=(0, 2, 3), keepdim=True) + EPS).sqrt()
    with torch.no_grad():
        r = (s / (1 + EPS) ** 0.5).clamp(1 / 3, 3)  # running var starts at 1, running mean at 0
        d = (m / (1 + EPS) ** 0.5).clamp(-5, 5)
    w = layer.weight.detach().view(1, -1, 1, 1)
    (((x2 - m) / s * r + d) * w * g).sum().backward()
    _close(x.grad, x2.grad)


def test_brn_warmup_starts_as_batch_norm() -> None:
    layer, bn = _layer("brn(warmup=3)"), _layer("bn")
    bn.load_state_dict(layer.state_dict())
    x = _inputs(1)[0] * 4 + 3  # far from the initial running stats: r, d would clip hard
    _close(layer(x), bn(x))


def test_bgn_matches_the_paper_over_steps_then_eval() -> None:
    layer = _layer("bgn(groups=2)")
    mu, var = torch.zeros(2, dtype=torch.float64), torch.ones(2, dtype=torch.float64)
    for x in _inputs():
        out = torch.empty_like(x)
        for k in range(2):
            chunk = x[:, k * 4:(k + 1) * 4]
            m, v = chunk.mean(), ((chunk - chunk.mean()) ** 2).mean()
            out[:, k * 4:(k + 1) * 4] = (chunk - m) / (v + EPS).sqrt()
            cnt = chunk.numel()
            mu[k] += 0.1 * (m - mu[k])
            var[k] += 0.1 * (v * cnt / (cnt - 1) - var[k])
        _close(layer(x), _affine(out, layer))
    _close(layer.running_mean, mu)
    _close(layer.running_var, var)
    layer.eval()
    x = _inputs(1)[0]
    ref = (x - mu.repeat_interleave(4).view(1, -1, 1, 1)) / (var.repeat_interleave(4).view(1, -1, 1, 1) + EPS).sqrt()
    _close(layer(x), _affine(ref, layer))


def test_sn_matches_the_paper_over_steps_then_eval() -> None:
    layer = _layer("sn")
    wm = torch.softmax(layer.mean_weight.detach(), 0)
    wv = torch.softmax(layer.var_weight.detach(), 0)
    mu, var = torch.zeros(C, dtype=torch.float64), torch.ones(C, dtype=torch.float64)

    def mixed(x, bn_mean, bn_var):
        in_m = x.mean(dim=(2, 3), keepdim=True)
        in_v = ((x - in_m) ** 2).mean(dim=(2, 3), keepdim=True)
        ln_m = x.mean(dim=(1, 2, 3), keepdim=True)
        ln_v = ((x - ln_m) ** 2).mean(dim=(1, 2, 3), keepdim=True)
        m = wm[0] * in_m + wm[1] * ln_m + wm[2] * bn_mean.view(1, -1, 1, 1)
        v = wv[0] * in_v + wv[1] * ln_v + wv[2] * bn_var.view(1, -1, 1, 1)
        return (x - m) / (v + EPS).sqrt()

    for x in _inputs():
        bm = x.mean(dim=(0, 2, 3))
        bv = ((x - bm.view(1, -1, 1, 1)) ** 2).mean(dim=(0, 2, 3))
        _close(layer(x), _affine(mixed(x, bm, bv), layer))
        n = x.numel() / C
        mu, var = mu + 0.1 * (bm - mu), var + 0.1 * (bv * n / (n - 1) - var)
    _close(layer.running_mean, mu)
    _close(layer.running_var, var)
    layer.eval()
    x = _inputs(1)[0]
    _close(layer(x), _affine(mixed(x, mu, var), layer))


def test_evonorm_s0_matches_the_paper() -> None:
    layer = _layer("evonorm-s0(groups=2)")
    x = _inputs(1)[0]
    n, c, h, w = x.shape
    v = layer.v.detach().view(1, -1, 1, 1)
    grouped = x.reshape(n, 2, c // 2, h, w)
    gm = grouped.mean(dim=(2, 3, 4), keepdim=True)
    std = (((grouped - gm) ** 2).mean(dim=(2, 3, 4), keepdim=True) + EPS).sqrt()
    ref = x * torch.sigmoid(v * x) / std.expand_as(grouped).reshape(x.shape)
    for mode in (True, False):
        layer.train(mode)
        _close(layer(x), _affine(ref, layer))


def test_evonorm_b0_matches_the_paper_over_steps_then_eval() -> None:
    layer, eps = _layer("evonorm-b0"), 1e-3
    v = layer.v.detach().view(1, -1, 1, 1)
    running = torch.ones(C, dtype=torch.float64)

    def ref(x, batch_var):
        im = x.mean(dim=(2, 3), keepdim=True)
        inst_std = (((x - im) ** 2).mean(dim=(2, 3), keepdim=True) + eps).sqrt()
        return x / torch.maximum((batch_var.view(1, -1, 1, 1) + eps).sqrt(), v * x + inst_std)

    for x in _inputs():
        bm = x.mean(dim=(0, 2, 3), keepdim=True)
        bv = ((x - bm) ** 2).mean(dim=(0, 2, 3))
        _close(layer(x), _affine(ref(x, bv), layer))
        n = x.numel() / C
        running = running + 0.1 * (bv * n / (n - 1) - running)
    _close(layer.running_var, running)
    layer.eval()
    x = _inputs(1)[0]
    _close(layer(x), _affine(ref(x, running), layer))


def test_frn_matches_the_paper() -> None:
    layer = _layer("frn")
    x = _inputs(1)[0]
    nu2 = (x * x).mean(dim=(2, 3), keepdim=True)
    y = _affine(x / (nu2 + 1e-6).sqrt(), layer)
    ref = torch.maximum(y, layer.act.tau.detach().view(1, -1, 1, 1))
    for mode in (True, False):
        layer.train(mode)
        _close(layer(x), ref)


def test_dyt_matches_the_paper() -> None:
    layer = _layer("dyt(alpha=0.7)")
    assert abs(normkit.build("dyt", C).alpha.item() - 0.5) < 1e-12
    x = _inputs(1)[0]
    ref = _affine(torch.tanh(layer.alpha.detach() * x), layer)
    _close(layer(x), ref)
    tokens = _layer("dyt", channel_dim=-1)
    xt = x.flatten(2).transpose(1, 2)
    _close(tokens(xt), tokens.weight * torch.tanh(tokens.alpha * xt) + tokens.bias)


def test_derf_matches_the_reference_code() -> None:
    """Derf (zlab-princeton/Derf): weight * erf(alpha * x + shift) + bias, alpha 0.5 and shift 0 at init,
    both learned scalars; float32 inside for half inputs."""
    fresh = normkit.build("derf", C)
    assert (fresh.alpha.item(), fresh.shift.item()) == (0.5, 0.0)
    assert {n for n, _ in fresh.named_parameters()} == {"alpha", "shift", "weight", "bias"}
    layer = _layer("derf(alpha=0.3,shift=0.2)")
    x = _inputs(1)[0]
    ref = _affine(torch.erf(layer.alpha.detach() * x + layer.shift.detach()), layer)
    _close(layer(x), ref)
    tokens = _layer("derf", channel_dim=-1)
    xt = x.flatten(2).transpose(1, 2)
    _close(tokens(xt), tokens.weight * torch.erf(tokens.alpha * xt + tokens.shift) + tokens.bias)
    half = tokens(xt.bfloat16())
    assert half.dtype == torch.bfloat16
    _close(half.float(), tokens(xt.bfloat16().float()).bfloat16().float())
    x.requires_grad_(True)
    layer(x).sum().backward()
    assert layer.shift.grad is not None and layer.alpha.grad is not None


def test_ln2d_matches_timm_definition() -> None:
    layer = _layer("ln2d")
    x = _inputs(1)[0]
    m = x.mean(dim=1, keepdim=True)
    v = ((x - m) ** 2).mean(dim=1, keepdim=True)
    _close(layer(x), _affine((x - m) / (v + 1e-6).sqrt(), layer))
