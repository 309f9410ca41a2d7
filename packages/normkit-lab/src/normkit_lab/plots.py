"""PNG plots of a comparison (optional: needs matplotlib, `pip install normkit-lab[plots]`).

    val_acc_curves.png  validation accuracy per epoch: mean over finished seeds, band = +- 1 s.e.
    final_acc.png       final validation accuracy per norm: mean with its 95% t interval, and
                        every seed as a dot (lines join the same seed across norms: the pairing)
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path

from normkit_lab.results import atomic_replace_from
from normkit_lab.stats import mean_sem, t_interval
from normkit_lab.summary import final_acc
from normkit_lab.training import RunResult

PLOTS_HINT = "install normkit-lab[plots] for plots"


def available() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def _curves(runs: Sequence[RunResult], norm: str) -> tuple[list[int], list[float], list[float]]:
    """Epochs, mean accuracy (%) and s.e. over this norm's finished runs, epoch by epoch."""
    ok = [r for r in runs if r.norm == norm and r.status == "ok"]
    epochs = sorted({e.epoch for r in ok for e in r.epochs})
    xs, means, sems = [], [], []
    for epoch in epochs:
        ms = mean_sem([100 * e.val_acc for r in ok for e in r.epochs
                       if e.epoch == epoch and e.val_acc is not None])
        if ms.mean is not None:
            xs.append(epoch + 1)
            means.append(ms.mean)
            sems.append(ms.sem or 0.0)
    return xs, means, sems


def write_plots(out_dir: Path, runs: Sequence[RunResult], norms: Sequence[str]) -> list[Path]:
    """Write the PNGs into `out_dir` (atomically) and return their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    written = []
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for norm in norms:
        xs, means, sems = _curves(runs, norm)
        if not xs:
            continue
        (line,) = ax.plot(xs, means, marker="o", markersize=3, label=norm)
        low = [m - s for m, s in zip(means, sems, strict=True)]
        high = [m + s for m, s in zip(means, sems, strict=True)]
        ax.fill_between(xs, low, high, color=line.get_color(), alpha=0.2)
    ax.set(xlabel="epoch", ylabel="validation accuracy (%)",
           title="Validation accuracy (mean over seeds, band = +-1 s.e.)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend()
    written.append(_save(fig, out_dir / "val_acc_curves.png"))

    fig, ax = plt.subplots(figsize=(max(4.0, 1.3 * len(norms) + 2), 4.2))
    per_seed: dict[int, list[tuple[int, float]]] = {}
    for i, norm in enumerate(norms):
        accs = {r.seed: final_acc(r) for r in runs if r.norm == norm and r.status == "ok"}
        values = [a for a in accs.values() if a is not None]
        for seed, acc in accs.items():
            if acc is not None:
                per_seed.setdefault(seed, []).append((i, acc))
        ms = mean_sem(values)
        if ms.mean is None:
            continue
        interval = t_interval(values)
        yerr = [[ms.mean - interval[0]], [interval[1] - ms.mean]] if interval else None
        ax.errorbar([i], [ms.mean], yerr=yerr, fmt="s", color="black", capsize=6, markersize=7, zorder=3)
    for points in per_seed.values():
        ax.plot([p[0] for p in points], [p[1] for p in points], color="tab:blue", alpha=0.35, marker=".",
                linewidth=0.8)
    ax.set_xticks(range(len(norms)), list(norms))
    ax.set(ylabel="final validation accuracy (%)",
           title="Final accuracy: mean, 95% t interval\n(thin lines join runs of the same seed)")
    ax.grid(axis="y", alpha=0.3)
    written.append(_save(fig, out_dir / "final_acc.png"))
    return written


def _save(fig: object, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()  # type: ignore[attr-defined]
    with atomic_replace_from(path) as tmp:
        fig.savefig(tmp, dpi=120, format="png")  # type: ignore[attr-defined]
    plt.close(fig)  # type: ignore[arg-type]
    return path
