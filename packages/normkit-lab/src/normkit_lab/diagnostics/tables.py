"""Markdown tables of aggregated diagnostics (diagnostics.md, and what `normkit diagnose` prints)."""

from __future__ import annotations

from typing import Any

from normkit_lab.diagnostics.power import TERMS


def _fmt(value: float | None, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def normality_table(norms: dict[str, Any], stage: str) -> str | None:
    """Mean Q-Q R^2 per depth (rows) and norm (columns) at `stage` ("init" or "final")."""
    cols = {n: r[stage] for n, r in norms.items() if r.get(stage)}
    if not cols:
        return None
    depth = max(len(v) for v in cols.values())
    rows = [[str(d + 1)] + [_fmt(v[d]["qq_r2"]) if d < len(v) else "" for v in cols.values()]
            for d in range(depth)]
    return _table(["depth", *cols], rows)


def power_table(norm: str, layers: list[dict[str, Any]]) -> str:
    """The four power shares per depth for one norm."""
    rows = [[str(r["depth"]), r["layer"]] + [_fmt(r["power"].get(t)) for t in TERMS] for r in layers]
    return _table(["depth", "layer", *(f"{t} share" for t in TERMS)], rows)


def lambda_table(norms: dict[str, Any]) -> str | None:
    """Channel-mean running lambda per layer at initialization and after the last epoch."""
    rows = []
    for norm, record in norms.items():
        epochs = record.get("lambda") or []
        if not epochs:
            continue
        first, last = epochs[0], epochs[-1]
        for a, b in zip(first["layers"], last["layers"], strict=True):
            rows.append([norm, a["layer"], _fmt(a["mean"]), _fmt(b["mean"]), str(last["epoch"])])
    return _table(["norm", "layer", "lambda at init", "lambda at end", "epochs"], rows) if rows else None


def robustness_table(norm: str, record: dict[str, Any]) -> str:
    """zeta_{k,l}: rows are the noisy layer k, columns the later layer l."""
    ks = sorted({c["k"] for c in record["table"]})
    ls = sorted({c["l"] for c in record["table"]})
    cell = {(c["k"], c["l"]): c["zeta"] for c in record["table"]}
    rows = [[f"k={k}"] + [_fmt(cell.get((k, dst))) if (k, dst) in cell else "" for dst in ls] for k in ks]
    return _table([f"{norm}: k \\ l", *(f"l={dst}" for dst in ls)], rows)


def markdown(diag: dict[str, Any]) -> str:
    """All tables of a comparison's diagnostics, as one markdown document."""
    norms = diag["norms"]
    parts = ["# Representation diagnostics", "",
             "See docs/diagnostics.md for what each measure means and how to read it.", ""]
    stages = (("init", "at initialization (batch statistics)"), ("final", "after training (eval)"))
    for stage, title in stages:
        table = normality_table(norms, stage)
        if table:
            parts += [f"## Q-Q normality R^2 {title}", "", table, ""]
    for stage, title in (("init", "at initialization"), ("final", "after training")):
        for norm, record in norms.items():
            if record.get(stage):
                parts += [f"## Power shares, {norm}, {title}", "", power_table(norm, record[stage]), ""]
    table = lambda_table(norms)
    if table:
        parts += ["## Running lambda (normality-norm layers)", "", table, ""]
    for norm, record in norms.items():
        rob = record.get("noise_robustness")
        if rob and rob["table"]:
            title = f"## Noise robustness zeta_(k,l), {norm}, delta={rob['delta']} (lower is more robust)"
            parts += [title, "", robustness_table(norm, rob), ""]
    return "\n".join(parts)


def random_net_table(result: dict[str, list[dict[str, float]]], every: int = 1,
                     spread: dict[str, list[dict[str, Any]]] | None = None) -> str:
    """Dataset-scale share per depth (rows) and norm (columns) of the random-net experiment; with
    `spread` (random_net.spread_over_nets), each mean is followed by its 95% interval over nets."""
    depth = max(len(v) for v in result.values())
    picks = sorted({*range(0, depth, every), depth - 1})

    def text(norm: str, d: int) -> str:
        if d >= len(result[norm]):
            return ""
        row = (spread or {}).get(norm, [])[d] if spread and d < len(spread.get(norm, [])) else None
        if row is None or row.get("ci95_low") is None:
            return _fmt(result[norm][d]["dataset"])
        return f"{_fmt(result[norm][d]['dataset'])} [{_fmt(row['ci95_low'])}, {_fmt(row['ci95_high'])}]"

    rows = [[str(d + 1)] + [text(norm, d) for norm in result] for d in picks]
    intervals = any(r.get("ci95_low") is not None for rows_ in (spread or {}).values() for r in rows_)
    suffix = " [95% CI over nets]" if intervals else ""
    return _table(["depth", *(f"{n} dataset share{suffix}" for n in result)], rows)
