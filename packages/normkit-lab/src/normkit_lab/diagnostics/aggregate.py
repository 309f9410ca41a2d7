"""Averaging the diagnostics of several runs (seeds) of each norm into one record per norm."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from normkit_lab.diagnostics.power import TERMS


def _mean(values: Sequence[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return sum(kept) / len(kept) if kept else None


def _layers(runs: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per depth: the mean Q-Q R^2 and power shares over runs (runs of one norm share the model)."""
    depth = min(len(r) for r in runs)
    rows = []
    for i in range(depth):
        rows_i = [r[i] for r in runs]
        rows.append({
            "depth": i + 1, "layer": rows_i[0]["layer"],
            "qq_r2": _mean([r["qq_r2"] for r in rows_i]),
            "power": {t: _mean([(r.get("power") or {}).get(t) for r in rows_i]) for t in TERMS},
        })
    return rows


def _lambdas(runs: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per epoch present in every run: each layer's channel-mean running lambda, averaged over runs."""
    epochs = sorted(set.intersection(*({e["epoch"] for e in r} for r in runs))) if runs else []
    out = []
    for epoch in epochs:
        entries = [next(e for e in r if e["epoch"] == epoch) for r in runs]
        names = [row["layer"] for row in entries[0]["layers"]]
        out.append({"epoch": epoch, "layers": [
            {"layer": name, "mean": _mean([row["mean"] for e in entries for row in e["layers"]
                                           if row["layer"] == name])} for name in names]})
    return out


def _robustness(runs: list[dict[str, Any]]) -> dict[str, Any]:
    cells: dict[tuple[int, int], list[float | None]] = {}
    for r in runs:
        for cell in r["table"]:
            cells.setdefault((cell["k"], cell["l"]), []).append(cell["zeta"])
    return {"delta": runs[0]["delta"], "draws": runs[0]["draws"], "layers": runs[0]["layers"],
            "table": [{"k": k, "l": dst, "zeta": _mean(v)} for (k, dst), v in sorted(cells.items())]}


def aggregate(norm_runs: dict[str, list[tuple[int, dict[str, Any]]]]) -> dict[str, Any]:
    """{norm: [(seed, diagnostics extras), ...]} -> {"norms": {norm: averaged record}}."""
    norms = {}
    for norm, seeded in norm_runs.items():
        extras = [d for _, d in seeded]
        record: dict[str, Any] = {"seeds": [s for s, _ in seeded]}
        for key in ("init", "final"):
            runs = [d[key] for d in extras if d.get(key)]
            record[key] = _layers(runs) if runs else None
        lam = [d["lambda"] for d in extras if d.get("lambda")]
        record["lambda"] = _lambdas(lam) if lam else None
        rob = [d["noise_robustness"] for d in extras if d.get("noise_robustness")]
        record["noise_robustness"] = _robustness(rob) if rob else None
        norms[norm] = record
    return {"norms": norms}
