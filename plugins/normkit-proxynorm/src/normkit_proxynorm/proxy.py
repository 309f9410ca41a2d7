"""The proxy-normalized activation step: affine -> activation -> normalize by a proxy's statistics.

Proxy normalization (Labatie et al., 2021) replaces the activation step after a batch-independent
norm. For each channel it pushes a Gaussian proxy `Y_c ~ N(beta~_c, (1 + gamma~_c)^2)`, represented by
`samples` fixed quantiles, through the same affine and activation as the real values, and
normalizes the real post-activations with the proxy's mean and variance. The proxy statistics cost
O(samples * C), depend on no batch or spatial statistics, and are identical in train and eval.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from normkit import SpecError
from normkit.stages import Groups, PostActivationStep

if TYPE_CHECKING:
    from normkit.layer import NormLayer

PROXY_PARAMS = ("proxy_beta", "proxy_gamma")
# The proxy's statistics cost samples x channels per forward; past this the estimate is exact to
# float32 anyway (200 already is), so a larger value is a typo that would allocate gigabytes.
MAX_SAMPLES = 100_000


def proxy_quantiles(samples: int, *, device: torch.device | None = None,
                    dtype: torch.dtype = torch.float32) -> Tensor:
    """`u_i = Phi^-1((i + 0.5) / samples)`: a standard Gaussian "uniformly sampled in probability"."""
    probs = (torch.arange(samples, dtype=torch.float64) + 0.5) / samples
    return torch.special.ndtri(probs).to(device=device, dtype=dtype)


class ProxyNorm(PostActivationStep):
    """`(phi(gamma*y + beta) - mu~) / sqrt(var~ + eps)`, mu~/var~ of `phi(gamma*Y + beta)` for the proxy Y.

    Owns the recovery: the layer hands over the standardized values `y` and this step applies the
    layer's `weight`/`bias` (gamma/beta), then `layer.act` (phi), then the proxy normalization.
    With `scale=False` (the layer just before global pooling) the output is `z - mu~` only.
    """

    name = "pn"
    owns_recovery = True

    def __init__(self, act: str, eps: float, samples: int, proxy_params: bool, scale: bool) -> None:
        if not (eps > 0 and math.isfinite(eps)):
            raise SpecError(f"pn: eps must be a positive finite number (the paper uses 0.03), got {eps}")
        if not 2 <= samples <= MAX_SAMPLES:
            raise SpecError(f"pn: samples must be in [2, {MAX_SAMPLES}] (the paper uses 200; the proxy "
                            f"holds samples x channels values), got {samples}")
        self.act = act
        self.eps = eps
        self.samples = samples
        self.proxy_params = proxy_params
        self.scale = scale
        self._moved: tuple[str, ...] = ()
        self._quantiles: dict[tuple[torch.device, torch.dtype], Tensor] = {}

    def setup(self, layer: NormLayer) -> None:
        if self.proxy_params:
            for name in PROXY_PARAMS:
                layer.register_parameter(name, nn.Parameter(torch.zeros(layer.num_channels)))
        self._moved = tuple(n for n in ("weight", "bias") if getattr(layer, n, None) is not None)

    def _u(self, device: torch.device, dtype: torch.dtype) -> Tensor:
        key = (device, dtype)
        if key not in self._quantiles:
            self._quantiles[key] = proxy_quantiles(self.samples, device=device, dtype=dtype)
        return self._quantiles[key]

    def proxy_statistics(self, layer: NormLayer, device: torch.device,
                         dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """Per-channel mean and biased variance of `phi(gamma*Y + beta)`, differentiable, `(C,)` each."""
        u = self._u(device, dtype).view(1, -1)  # (1, n)
        y = u.expand(layer.num_channels, -1)
        if self.proxy_params:
            y = layer.proxy_beta.to(dtype).view(-1, 1) + (1 + layer.proxy_gamma.to(dtype)).view(-1, 1) * u
        z = layer.act(_affine(y, layer, dtype, (-1, 1)))
        var, mean = torch.var_mean(z, dim=1, unbiased=False)
        return mean, var

    def forward(self, x: Tensor, groups: Groups | None, layer: NormLayer) -> Tensor:  # (N, C, S)
        dtype = torch.promote_types(x.dtype, torch.float32)
        if type(layer.act) is nn.ReLU and not torch.compiler.is_compiling():  # the common case, fused
            weight, bias = _affine_params(layer, dtype)
            beta, gamma = ((layer.proxy_beta.to(dtype), layer.proxy_gamma.to(dtype)) if self.proxy_params
                           else (None, None))
            return ReluProxyNorm.apply(x.to(dtype), weight, bias, beta, gamma, self._u(x.device, dtype), self.eps,
                                       self.scale)
        z = layer.act(_affine(x.to(dtype), layer, dtype, (1, -1, 1)))
        mean, var = self.proxy_statistics(layer, x.device, dtype)
        out = z - mean.view(1, -1, 1)
        if self.scale:
            out = out * torch.rsqrt(var + self.eps).view(1, -1, 1)
        return out

    def describe(self) -> dict[str, Any]:
        moved = "/".join(self._moved) or "none (norm has affine=false)"
        return {
            "act": self.act,
            "eps": self.eps,
            "samples": self.samples,
            "proxy_params": self.proxy_params,
            "scale": self.scale,
            "affine": f"{moved} (gamma/beta) applied inside pn, before {self.act}",
            "proxy": ("proxy_beta/proxy_gamma (beta~/gamma~, init 0: proxy N(0,1))" if self.proxy_params
                      else "fixed N(0,1) (no beta~/gamma~)"),
            "output": "(z - mu~) / sqrt(var~ + eps)" if self.scale else "z - mu~ (scaling off)",
        }

    def decay(self) -> dict[str, bool]:
        """The reference decays beta~/gamma~ (towards the N(0,1) proxy) but not gamma/beta."""
        policy = {name: False for name in self._moved}
        if self.proxy_params:
            policy.update({name: True for name in PROXY_PARAMS})
        return policy


def _affine(y: Tensor, layer: NormLayer, dtype: torch.dtype, shape: tuple[int, ...]) -> Tensor:
    """`gamma * y + beta` with the layer's weight/bias (either may be absent)."""
    return _affine_with(y, *_affine_params(layer, dtype), shape)


def _affine_params(layer: NormLayer, dtype: torch.dtype) -> tuple[Tensor | None, Tensor | None]:
    """The layer's weight and bias in `dtype` (None where absent)."""
    return tuple(None if t is None else t.to(dtype) for t in (layer.weight, layer.bias))


class ReluProxyNorm(torch.autograd.Function):
    """`ProxyNorm.forward` for phi = ReLU (the paper's and the common case) with a hand-written backward.

    Why: at small shapes a training call costs its torch ops' host work, and autograd through the
    proxy's statistics made gn+pn about 86 ops per call (GroupNorm: 9). The forward runs the same ops as
    the generic path (the same values, bit for bit); the backward, about 20 ops, is the chain rule
    written out (per channel c, proxy values j of n, r = rsqrt(var~ + eps)):
      dz = g r,  dr_c = sum g (z - mu~),  dvar~_c = -r^3 dr_c / 2,  dmu~_c = -sum dz,
      da = dz [a > 0],  dx = da gamma,  dgamma = sum da x,  dbeta = sum da  (data part),
      dzp_j = dmu~ / n + 2 dvar~ (zp_j - mu~) / n,  dap_j = dzp_j [ap_j > 0],
      dgamma += sum dap yp,  dbeta += sum dap,  dbeta~ = sum dap gamma,  dgamma~ = sum dap gamma u.
    Its gradients agree with autograd's to float rounding, not bit for bit (other summation order).
    """

    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor | None, bias: Tensor | None, beta: Tensor | None,
                gamma: Tensor | None, u: Tensor, eps: float, scale: bool) -> Tensor:
        channels = x.shape[1]
        column = None if weight is None else weight.view(-1, 1)  # per channel against the proxy's (C, n)
        z = torch.relu(_affine_with(x, weight, bias, (1, -1, 1)))
        row = u.view(1, -1)
        yp = row.expand(channels, -1) if beta is None else beta.view(-1, 1) + (1 + gamma).view(-1, 1) * row
        zp = torch.relu(_affine_with(yp, weight, bias, (-1, 1)))
        var, mean = torch.var_mean(zp, dim=1, unbiased=False)
        centred = z - mean.view(1, -1, 1)
        rstd = torch.rsqrt(var + eps).view(1, -1, 1) if scale else None
        ctx.save_for_backward(x, weight, column, z, centred, yp, zp, mean.view(-1, 1), rstd, row)
        ctx.has_bias, ctx.proxy_params = bias is not None, beta is not None
        return centred * rstd if scale else centred

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        x, weight, column, z, centred, yp, zp, mean, rstd, row = ctx.saved_tensors
        n = zp.shape[1]
        dims = (0, 2)
        dz = grad * rstd if rstd is not None else grad
        dmean = dz.sum(dims, keepdim=True).view(-1, 1).mul_(-1 / n)  # dmu~ / n, (C, 1)
        if rstd is not None:  # 2 dvar~ / n = -r^3 sum(g (z - mu~)) / n
            dvar = (grad * centred).sum(dims, keepdim=True).mul_(rstd.pow(3)).view(-1, 1).mul_(-1 / n)
            dzp = torch.addcmul(dmean, zp - mean, dvar)
        else:
            dzp = dmean.expand_as(zp)
        da = torch.ops.aten.threshold_backward(dz, z, 0)
        dap = torch.ops.aten.threshold_backward(dzp, zp, 0)
        wants = ctx.needs_input_grad
        dx = (da * weight.view(1, -1, 1) if weight is not None else da) if wants[0] else None
        dweight = (da * x).sum(dims).add_((dap * yp).sum(1)) if weight is not None and wants[1] else None
        dbias = da.sum(dims).add_(dap.sum(1)) if ctx.has_bias and wants[2] else None
        dbeta = dgamma = None
        if ctx.proxy_params and (wants[3] or wants[4]):
            dyp = dap * column if column is not None else dap
            dbeta = dyp.sum(1) if wants[3] else None
            dgamma = (dyp * row).sum(1) if wants[4] else None
        return dx, dweight, dbias, dbeta, dgamma, None, None, None


def _affine_with(y: Tensor, weight: Tensor | None, bias: Tensor | None, shape: tuple[int, ...]) -> Tensor:
    """`gamma * y + beta` with the weight/bias given (already in y's dtype; either may be None)."""
    if weight is not None:
        y = y * weight.view(shape)
    if bias is not None:
        y = y + bias.view(shape)
    return y
