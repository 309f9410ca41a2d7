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
from normkit.autograd import once_differentiable
from normkit.stages import Groups, PostActivationStep, Standardize

if TYPE_CHECKING:
    from normkit.layer import NormLayer

PROXY_PARAMS = ("proxy_beta", "proxy_gamma")
# The proxy's statistics cost samples x channels per forward; past this the estimate is exact to
# float32 anyway (200 already is), so a larger value is a typo that would allocate gigabytes.
MAX_SAMPLES = 100_000
_FLOAT32_OR_WIDER = (torch.float32, torch.float64)  # computed in as they are (torch.promote_types is an aten op)


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
        self._quantiles: dict[tuple[torch.device, torch.dtype], tuple[Tensor, Tensor]] = {}

    def __getstate__(self) -> dict[str, Any]:
        """Pickled without the per-device quantile cache (rebuilt on first use, whatever form it had)."""
        return {**self.__dict__, "_quantiles": {}}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _quantiles={})

    def setup(self, layer: NormLayer) -> None:
        if self.proxy_params:
            for name in PROXY_PARAMS:
                layer.register_parameter(name, nn.Parameter(torch.zeros(layer.num_channels)))
        self._moved = tuple(n for n in ("weight", "bias") if getattr(layer, n, None) is not None)

    def _proxy(self, device: torch.device, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """The quantiles u as `(1, 1, samples)` and the `(samples, 2)` basis of columns 1 and u, made once per
        device and dtype (ReluProxyNorm's backward sums against both columns in one matmul)."""
        key = (device, dtype)
        if key not in self._quantiles:
            u = proxy_quantiles(self.samples, device=device, dtype=dtype)
            self._quantiles[key] = (u.view(1, 1, -1), torch.stack([torch.ones_like(u), u], 1))
        return self._quantiles[key]

    def proxy_statistics(self, layer: NormLayer, device: torch.device,
                         dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """Per-channel mean and biased variance of `phi(gamma*Y + beta)`, differentiable, `(C,)` each."""
        u = self._proxy(device, dtype)[0].view(1, -1)  # (1, n)
        y = u.expand(layer.num_channels, -1)
        if self.proxy_params:
            y = layer.proxy_beta.to(dtype).view(-1, 1) + (1 + layer.proxy_gamma.to(dtype)).view(-1, 1) * u
        z = layer.act(_affine(y, layer, dtype, (-1, 1)))
        var, mean = torch.var_mean(z, dim=1, unbiased=False)
        return mean, var

    def fused_forward(self, x: Tensor, layer: NormLayer) -> Tensor | None:
        """The whole layer (standardize, affine, ReLU, proxy) as one autograd Function, for a plain
        group/layer/instance standardization before pn with ReLU on `N, C, *`; None (the step-by-step path)
        otherwise."""
        if (type(layer.act) is not nn.ReLU or layer.tokens or len(layer.steps) != 1
                or type(layer.steps[0]) is not Standardize or layer.partition.kind == "batch"
                or torch.compiler.is_compiling()):
            return None
        n, c = x.shape[0], layer.num_channels
        s = math.prod(x.shape[2:])
        partition = layer.partition
        if n * s == 0 or partition.values_per_group(x.shape, c, tokens=False) < 2:  # nothing to normalize, or
            return None  # one value per group: the generic path
        standardize = (partition.groups_per_sample(c), layer.steps[0].eps)
        return self._relu_proxy(x.reshape(n, c, s), layer, standardize).reshape(x.shape)

    def _relu_proxy(self, x3: Tensor, layer: NormLayer, standardize: tuple[int, float] | None) -> Tensor:
        dtype = x3.dtype if x3.dtype in _FLOAT32_OR_WIDER else torch.promote_types(x3.dtype, torch.float32)
        weight, bias = _affine_params(layer, dtype)
        beta, gamma = ((_as(t, dtype) for t in layer.registered(*PROXY_PARAMS)) if self.proxy_params
                       else (None, None))
        return ReluProxyNorm.apply(_as(x3, dtype), weight, bias, beta, gamma, self._proxy(x3.device, dtype), self.eps,
                                   self.scale, standardize)

    def forward(self, x: Tensor, groups: Groups | None, layer: NormLayer) -> Tensor:  # (N, C, S)
        if type(layer.act) is nn.ReLU and not torch.compiler.is_compiling():  # the common case, fused
            return self._relu_proxy(x, layer, None)
        dtype = torch.promote_types(x.dtype, torch.float32)
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
    """The layer's weight and bias in `dtype` (None where absent), read through `registered()` (the module's
    dicts, not nn.Module's `__getattr__` fallback)."""
    weight, bias = layer.registered("weight", "bias")
    return _as(weight, dtype), _as(bias, dtype)


def _as(t: Tensor | None, dtype: torch.dtype) -> Tensor | None:
    """`t` in `dtype`, without a dispatch when it already is (every call's case)."""
    return t if t is None or t.dtype == dtype else t.to(dtype)


class ReluProxyNorm(torch.autograd.Function):
    """`ProxyNorm.forward` for phi = ReLU (the paper's and the common case) with a hand-written backward;
    with `standardize` = (groups, eps) also the group/layer/instance standardization before it (the whole gn+pn
    layer, one autograd node).

    Why: at small shapes a training call costs its torch ops' host work, and autograd through the proxy's
    statistics made gn+pn about 86 ops per call (GroupNorm: 9). The forward runs the generic path's ops
    (`native_group_norm` as `F.group_norm` runs it, the affine, ReLU, the proxy: the same values, bit for bit);
    the backward is the chain rule written out (per channel c, proxy values j of n, r = rsqrt(var~ + eps)):
      dz = g r,  dr_c = sum g (z - mu~),  dvar~_c = -r^3 dr_c / 2,  dmu~_c = -sum dz,  da = dz [a > 0],
      dzp_j = dmu~ / n + 2 dvar~ (zp_j - mu~) / n,  dap_j = dzp_j [ap_j > 0],  S0 = sum dap,  S1 = sum dap u,
      dgamma = sum da y + beta~ S0 + (1 + gamma~) S1,  dbeta = sum da + S0,  dbeta~ = gamma S0,  dgamma~ = gamma S1
    (the proxy is yp = beta~ + (1 + gamma~) u, so its four (C, n) reductions are S0 and S1: one matmul with the
    `proxy` basis columns (1, u)). dx, sum da y and sum da are one `native_group_norm_backward` call when the
    standardization is inside (else dx = da gamma). Gradients agree with autograd's to float rounding, not bit
    for bit (other summation order).
    """

    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor | None, bias: Tensor | None, beta: Tensor | None,
                gamma: Tensor | None, proxy: tuple[Tensor, Tensor], eps: float, scale: bool,
                standardize: tuple[int, float] | None = None) -> Tensor:
        channels = x.shape[1]
        stats: tuple[Tensor, ...] = ()
        y = x
        if standardize is not None:  # x is (N, C, S), the values before the norm
            y, *stats = torch.native_group_norm(x, None, None, x.shape[0], channels, x.shape[2], *standardize)
        shape = (1, -1, 1)  # per channel; the proxy is laid out (1, C, n) so that every per-channel view is shared
        w, b = (None if weight is None else weight.view(shape)), (None if bias is None else bias.view(shape))
        z = torch.relu(_affine_with(y, w, b, None))
        row, basis = proxy  # u as (1, 1, n); columns 1 and u, (n, 2)
        slope = None if beta is None else (1 + gamma).view(shape)
        yp = row.expand(1, channels, -1) if beta is None else beta.view(shape) + slope * row
        zp = torch.relu(_affine_with(yp, w, b, None))
        var, mean = torch.var_mean(zp, dim=2, unbiased=False, keepdim=True)  # (1, C, 1) each
        centred = z - mean
        rstd = torch.rsqrt(var + eps) if scale else None
        ctx.save_for_backward(x, weight, w, beta, slope, basis, z, centred, zp, mean, rstd, *stats)
        ctx.standardize, ctx.has_bias = standardize, bias is not None
        return centred * rstd if scale else centred

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        x, weight, w, beta, slope, basis, z, centred, zp, mean, rstd, *stats = ctx.saved_tensors
        n = zp.shape[2]
        dims = (0, 2)
        dz = grad * rstd if rstd is not None else grad
        dmean = dz.sum(dims, keepdim=True).mul_(-1 / n)  # dmu~ / n, (1, C, 1)
        if rstd is not None:  # 2 dvar~ / n = -r^3 sum(g (z - mu~)) / n
            dvar = (grad * centred).sum(dims, keepdim=True).mul_(rstd.pow(3)).mul_(-1 / n)
            dzp = torch.addcmul(dmean, zp - mean, dvar)
        else:
            dzp = dmean.expand_as(zp)
        da = torch.ops.aten.threshold_backward(dz, z, 0)
        dap = torch.ops.aten.threshold_backward(dzp, zp, 0)
        wants = ctx.needs_input_grad
        want_w, want_b = weight is not None and wants[1], ctx.has_bias and wants[2]
        if ctx.standardize is not None:  # dx, sum da y, sum da: one call
            dx, dweight, dbias = torch.ops.aten.native_group_norm_backward(
                da, x, *stats, weight, x.shape[0], x.shape[1], x.shape[2], ctx.standardize[0],
                [wants[0], want_w, want_b])
        else:
            dx = (da * w if w is not None else da) if wants[0] else None
            dweight = (da * x).sum(dims) if want_w else None
            dbias = da.sum(dims) if want_b else None
        s0, s1 = (dap[0] @ basis).unbind(1)  # sum dap, sum dap u: (C,) each
        if want_w:
            dweight.add_(s1 if beta is None else torch.addcmul(beta * s0, slope.view(-1), s1))
        if want_b:
            dbias.add_(s0)
        dbeta = dgamma = None
        if beta is not None and (wants[3] or wants[4]):
            dbeta = (s0 * weight if weight is not None else s0) if wants[3] else None
            dgamma = (s1 * weight if weight is not None else s1) if wants[4] else None
        return dx, dweight, dbias, dbeta, dgamma, None, None, None, None


def _affine_with(y: Tensor, weight: Tensor | None, bias: Tensor | None, shape: tuple[int, ...] | None) -> Tensor:
    """`gamma * y + beta` with the weight/bias given (already in y's dtype; either may be None), viewed as
    `shape` (None: already broadcastable to y)."""
    if weight is not None:
        y = y * (weight if shape is None else weight.view(shape))
    if bias is not None:
        y = y + (bias if shape is None else bias.view(shape))
    return y
