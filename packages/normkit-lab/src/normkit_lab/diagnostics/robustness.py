"""Noise robustness (normality-normalization paper, Definition 5.1 and Table 3).

Noise is added to the post-norm values x of layer k, `y = x + z * delta * s_c` with z ~ N(0, 1)
and s_c the mean absolute deviation of channel c at layer k (estimated on separate batches, the
training set in the paper). zeta_{k,l} is the relative L1 change of the post-norm values at a
later layer l, `||phi(x) - phi(y)||_1 / ||phi(x)||_1`, per input and channel (L1 over positions),
averaged over inputs, channels of layer l and noise draws. Lower is more robust.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from normkit.layer import NormLayer
from normkit_lab.diagnostics.layers import Mode, attached, execution_order, forward_all, measuring

DELTA = 0.5  # the paper's Table 3
DRAWS = 3


def channel_mad(model: nn.Module, layers: list[NormLayer], batches: list[Tensor]) -> dict[NormLayer, Tensor]:
    """Per layer, the per-channel mean absolute deviation of post-norm values over `batches`.

    Two passes (channel means, then deviations), so memory does not grow with the batches.
    """
    sums: dict[NormLayer, Tensor] = {}
    counts: dict[NormLayer, int] = {}

    def add_sum(layer: NormLayer, y3: Tensor) -> None:
        total = y3.detach().float().sum(dim=(0, 2))
        sums[layer] = sums[layer] + total if layer in sums else total
        counts[layer] = counts.get(layer, 0) + y3.shape[0] * y3.shape[2]

    with attached({layer: add_sum for layer in layers}):
        forward_all(model, batches)
    means = {layer: sums[layer] / counts[layer] for layer in sums}
    deviations: dict[NormLayer, Tensor] = {}

    def add_deviation(layer: NormLayer, y3: Tensor) -> None:
        total = (y3.detach().float() - means[layer].view(1, -1, 1)).abs().sum(dim=(0, 2))
        deviations[layer] = deviations[layer] + total if layer in deviations else total

    with attached({layer: add_deviation for layer in layers}):
        forward_all(model, batches)
    return {layer: deviations[layer] / counts[layer] for layer in deviations}


def relative_l1(clean: Tensor, noisy: Tensor) -> tuple[float, int]:
    """Sum over (input, channel) of ||clean - noisy||_1 / ||clean||_1 (L1 over positions), and the count.

    Inputs and channels whose clean values are all zero carry no signal to compare and are skipped.
    """
    num = (clean - noisy).abs().sum(dim=2)
    den = clean.abs().sum(dim=2)
    keep = den > 1e-12
    return float((num[keep] / den[keep]).sum()), int(keep.sum())


def noise_robustness(model: nn.Module, batches: list[Tensor], *, scale_batches: list[Tensor] | None = None,
                     delta: float = DELTA, draws: int = DRAWS, sources: int | None = None,
                     seed: int = 0, mode: Mode = "eval") -> dict[str, Any]:
    """zeta_{k,l} for noise added at layer k (each of `sources` evenly spaced layers, default all
    but the last) and every later layer l; `model` is left unchanged. `mode` as in `layers.measuring`:
    eval (running statistics, after training) or batch (batch statistics, at initialization).

    Returns {"delta", "draws", "layers": [names in depth order], "table": [{"k", "l", "zeta"}]}
    with 1-based depths k < l.
    """
    if delta < 0 or draws < 1:
        raise ValueError(f"noise robustness needs delta >= 0 and draws >= 1, got {delta}, {draws}")
    with measuring(model, mode) as target:
        order = execution_order(target, batches[0])
        layers = [layer for _, layer in order]
        mads = channel_mad(target, layers, scale_batches or batches)
        ks = _sources(len(layers), sources)
        totals = {(k, dst): [0.0, 0] for k in ks for dst in range(k + 1, len(layers))}
        for b, batch in enumerate(batches):
            clean = _capture(target, layers, batch)
            for k in ks:
                for draw in range(draws):
                    generator = torch.Generator().manual_seed(_draw_seed(seed, b, k, draw))
                    noisy = _capture(target, layers, batch, noise_at=(layers[k], delta * mads[layers[k]],
                                                                      generator))
                    for dst in range(k + 1, len(layers)):
                        s, n = relative_l1(clean[layers[dst]], noisy[layers[dst]])
                        totals[(k, dst)][0] += s
                        totals[(k, dst)][1] += n
    table = [{"k": k + 1, "l": dst + 1, "zeta": total / count if count else None}
             for (k, dst), (total, count) in totals.items()]
    return {"delta": delta, "draws": draws, "layers": [name for name, _ in order], "table": table}


def _draw_seed(seed: int, batch: int, source: int, draw: int) -> int:
    """A distinct, reproducible seed per (run seed, batch, source layer, draw)."""
    return ((seed * 1009 + batch) * 1009 + source) * 1009 + draw


def _sources(num_layers: int, sources: int | None) -> list[int]:
    candidates = list(range(num_layers - 1))
    if sources is None or sources >= len(candidates):
        return candidates
    if sources < 1:
        return []
    step = (len(candidates) - 1) / max(sources - 1, 1)
    return sorted({candidates[round(i * step)] for i in range(sources)})


def _capture(model: nn.Module, layers: list[NormLayer], batch: Tensor,
             noise_at: tuple[NormLayer, Tensor, torch.Generator] | None = None) -> dict[NormLayer, Tensor]:
    """Post-norm values of every layer for one batch, optionally with noise injected at one layer."""
    seen: dict[NormLayer, Tensor] = {}

    def observe(layer: NormLayer, y3: Tensor) -> Tensor | None:
        if noise_at is not None and layer is noise_at[0]:
            _, scale, generator = noise_at
            z = torch.randn(y3.shape, generator=generator).to(y3.device, y3.dtype)
            y3 = y3 + z * scale.to(y3).view(1, -1, 1)
            seen[layer] = y3.detach()
            return y3
        seen[layer] = y3.detach()
        return None

    with attached({layer: observe for layer in layers}), torch.no_grad():
        model(batch)
    return seen
