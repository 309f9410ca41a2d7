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
    if layer.weight is not None:
        y = y * layer.weight.to(dtype).view(shape)
    if layer.bias is not None:
        y = y + layer.bias.to(dtype).view(shape)
    return y
