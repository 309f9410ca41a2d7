"""Power decomposition of post-norm values (proxy-normalization paper, section 3, Eq. 5).

For channel c of y (shape N, C, S), with mu_a, sigma_a the spatial mean and std of one input,
    E[y^2] = (mean_x mu_a)^2 + var_x(mu_a) + (mean_x sigma_a)^2 + var_x(sigma_a)
             dataset scale     instance scale  pixel scale (mean)   pixel scale (variance)
Averaged over channels and divided by their sum the four terms are shares that sum to 1.
A dataset-scale share near 1 means channel-wise collapse (LN's failure mode in deep nets);
instance-scale and pixel-variance shares near 0 mean no variability of instance statistics
(IN's failure mode).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor

TERMS = ("dataset", "instance", "pixel_mean", "pixel_var")


@dataclass
class PowerAccumulator:
    """Sums of per-input spatial moments, so the decomposition spans many batches exactly."""

    count: int = 0
    sums: dict[str, Tensor] = field(default_factory=dict)

    def add(self, y3: Tensor) -> None:
        """Add a batch of post-norm values `(N, C, S)`."""
        y = y3.detach().float()
        mu = y.mean(dim=2)
        sigma = y.var(dim=2, unbiased=False).clamp_min(0).sqrt()
        moments = {"mu": mu.sum(0), "mu2": (mu * mu).sum(0), "sigma": sigma.sum(0),
                   "sigma2": (sigma * sigma).sum(0)}
        for key, value in moments.items():
            self.sums[key] = self.sums[key] + value if key in self.sums else value
        self.count += y.shape[0]

    def terms(self) -> dict[str, float]:
        """The four terms, averaged over channels (their sum is E[y^2])."""
        if not self.count:
            raise ValueError("power decomposition of no values")
        n = float(self.count)
        mean_mu, mean_sigma = self.sums["mu"] / n, self.sums["sigma"] / n
        var_mu = (self.sums["mu2"] / n - mean_mu**2).clamp_min(0)
        var_sigma = (self.sums["sigma2"] / n - mean_sigma**2).clamp_min(0)
        per_channel = (mean_mu**2, var_mu, mean_sigma**2, var_sigma)
        return {name: float(t.mean()) for name, t in zip(TERMS, per_channel, strict=True)}

    def shares(self) -> dict[str, float]:
        """The terms divided by their sum; all zeros for an all-zero input (no power to share)."""
        terms = self.terms()
        total = sum(terms.values())
        if not total > 0:
            return dict.fromkeys(TERMS, 0.0)
        return {name: value / total for name, value in terms.items()}


def power_shares(y3: Tensor) -> dict[str, float]:
    """The four power shares of one tensor `(N, C, S)` (or `(N, C, *)`)."""
    acc = PowerAccumulator()
    acc.add(y3.reshape(y3.shape[0], y3.shape[1], -1))
    return acc.shares()
