"""PNG figures of the diagnostics (optional: need matplotlib, `pip install matplotlib`).

    diagnostics_normality.png  mean Q-Q R^2 vs depth, one line per norm (init and after training)
    diagnostics_power.png      the four power shares vs depth, stacked, one column per norm
    diagnostics_lambda.png     channel-mean running lambda per layer vs epoch (normality norms)
    diagnostics_noise.png      zeta_(k,l) heatmaps per norm (noise added at k, measured at l)
    random_net_power.png       the random-net experiment: dataset-scale share vs depth per norm
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from normkit_lab.diagnostics.power import TERMS
from normkit_lab.store.atomic import atomic_replace_from

SHARE_LABELS = {"dataset": "dataset scale", "instance": "instance scale", "pixel_mean": "pixel scale (mean)",
                "pixel_var": "pixel scale (variance)"}
SHARE_COLORS = {"dataset": "tab:red", "instance": "tab:orange", "pixel_mean": "tab:blue",
                "pixel_var": "tab:cyan"}


STAGE_TITLES = {"init": "at initialization", "final": "after training"}


def available() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _integer_ticks(ax: Any, y: bool = False) -> None:
    """Depths and epochs are whole numbers: no 1.5 ticks."""
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if y:
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))


def _save(fig: Any, path: Path) -> Path:
    if fig.get_layout_engine() is None:
        fig.tight_layout()
    with atomic_replace_from(path) as tmp:
        fig.savefig(tmp, dpi=100, format="png")
    _pyplot().close(fig)
    return path


def normality_figure(norms: dict[str, Any], path: Path) -> Path | None:
    stages = [s for s in ("init", "final") if any(r.get(s) for r in norms.values())]
    if not stages:
        return None
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(stages), figsize=(5.2 * len(stages), 3.8), sharey=True, squeeze=False)
    for ax, stage in zip(axes[0], stages, strict=True):
        for norm, record in norms.items():
            rows = [r for r in record.get(stage) or [] if r["qq_r2"] is not None]
            if rows:
                ax.plot([r["depth"] for r in rows], [r["qq_r2"] for r in rows], marker="o", markersize=3,
                        label=norm)
        ax.set(xlabel="norm layer depth", title=STAGE_TITLES[stage])
        ax.grid(alpha=0.3)
        _integer_ticks(ax)
    axes[0][0].set_ylabel("mean Q-Q R^2 (1 = normal)")
    axes[0][-1].legend()
    return _save(fig, path)


def power_figure(norms: dict[str, Any], path: Path, stage_titles: dict[str, str] | None = None) -> Path | None:
    """Stacked power shares vs depth; rows are stages (init, final), columns norms."""
    stage_titles = stage_titles or {"init": "init", "final": "trained"}
    stages = [s for s in ("init", "final") if any(r.get(s) for r in norms.values())]
    names = [n for n, r in norms.items() if any(r.get(s) for s in stages)]
    if not names:
        return None
    plt = _pyplot()
    fig, axes = plt.subplots(len(stages), len(names), figsize=(3.2 * len(names) + 1, 2.8 * len(stages)),
                             sharey=True, squeeze=False)
    for i, stage in enumerate(stages):
        for j, norm in enumerate(names):
            ax, rows = axes[i][j], norms[norm].get(stage) or []
            if rows:
                depths = [r["depth"] for r in rows]
                stacks = [[r["power"][t] or 0.0 for r in rows] for t in TERMS]
                ax.stackplot(depths, *stacks, labels=[SHARE_LABELS[t] for t in TERMS],
                             colors=[SHARE_COLORS[t] for t in TERMS], alpha=0.85)
            ax.set(ylim=(0, 1), title=f"{norm}, {stage_titles[stage]}", xlabel="depth")
            _integer_ticks(ax)
    for i in range(len(stages)):
        axes[i][0].set_ylabel("power share")
    handles, labels = axes[0][0].get_legend_handles_labels()
    if handles:
        fig.tight_layout(rect=(0, 0.08, 1, 1))
        fig.legend(handles, labels, loc="lower center", ncol=4, fontsize="small")
    return _save(fig, path)


def lambda_figure(norms: dict[str, Any], path: Path) -> Path | None:
    names = [n for n, r in norms.items() if r.get("lambda")]
    if not names:
        return None
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(names), figsize=(5 * len(names), 3.6), squeeze=False)
    for ax, norm in zip(axes[0], names, strict=True):
        epochs = norms[norm]["lambda"]
        for i, layer in enumerate(epochs[0]["layers"]):
            ys = [e["layers"][i]["mean"] for e in epochs]
            ax.plot([e["epoch"] for e in epochs], ys, marker=".", label=f"{i + 1}: {layer['layer']}")
        ax.axhline(1.0, color="gray", linewidth=0.8, linestyle="--")
        ax.set(xlabel="epoch (0 = init)", ylabel="lambda (mean)", title=norm)
        _integer_ticks(ax)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="x-small")
    return _save(fig, path)


def noise_figure(norms: dict[str, Any], path: Path) -> Path | None:
    names = [n for n, r in norms.items() if r.get("noise_robustness") and r["noise_robustness"]["table"]]
    if not names:
        return None
    import numpy as np

    plt = _pyplot()
    grids, top = {}, 0.0
    for norm in names:
        rob = norms[norm]["noise_robustness"]
        n = len(rob["layers"])
        grid = np.full((n - 1, n - 1), np.nan)  # rows k = 1..n-1, columns l = 2..n
        for c in rob["table"]:
            if c["zeta"] is not None:
                grid[c["k"] - 1, c["l"] - 2] = c["zeta"]
                top = max(top, c["zeta"])
        grids[norm] = grid
    fig, axes = plt.subplots(1, len(names), figsize=(3.6 * len(names) + 1, 3.4), squeeze=False,
                             layout="constrained")
    image = None
    for ax, norm in zip(axes[0], names, strict=True):
        grid = grids[norm]
        image = ax.imshow(grid, vmin=0, vmax=top or 1, cmap="viridis", origin="upper",
                          extent=(1.5, grid.shape[1] + 1.5, grid.shape[0] + 0.5, 0.5))
        ax.set(title=norm, xlabel="measured at layer l", ylabel="noise at layer k")
        _integer_ticks(ax, y=True)
        if grid.size <= 64:
            for (i, j), value in np.ndenumerate(grid):
                if not np.isnan(value):
                    ax.text(j + 2, i + 1, f"{value:.2f}", ha="center", va="center", fontsize="small",
                            color="white" if value < 0.6 * (top or 1) else "black")
    fig.colorbar(image, ax=axes[0].tolist(), label="zeta (relative L1 change)")
    delta = norms[names[0]]["noise_robustness"]["delta"]
    fig.suptitle(f"noise robustness, delta={delta} (lower is more robust)")
    return _save(fig, path)


def random_net_figure(result: dict[str, list[dict[str, float]]], path: Path, title: str) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.6, 3.8))
    for norm, rows in result.items():
        ax.plot(range(1, len(rows) + 1), [r["dataset"] for r in rows], marker="o", markersize=3, label=norm)
    ax.set(xlabel="depth", ylabel="dataset-scale power share", ylim=(-0.02, 1.02), title=title)
    ax.grid(alpha=0.3)
    _integer_ticks(ax)
    ax.legend()
    return _save(fig, path)
