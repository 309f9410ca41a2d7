"""scorecard.json: what a suite directory's comparisons say, per workload and across workloads.

Read from the task directories alone (config.yaml, runs.jsonl, summary.json, tuning.json), so a
scorecard can be rebuilt at any time (`normkit suite --resume DIR` rewrites it) and always matches the runs.
Per workload: each norm's metric, paired verdict against the baseline (the first suite norm the
workload hosts), the tuned values, and its time to the workload's target (median over comparison
seeds of the optimizer steps and training CPU seconds at the first epoch whose validation value meets
it). Across workloads, separately for the visible workloads and the held-out variants: the
performance profile of the steps to target, its score, and each norm's mean rank with a bootstrap
interval over seeds.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from normkit_lab.analysis.summary import runs_from_rows
from normkit_lab.metrics import metric_named, run_value
from normkit_lab.store.results import SUMMARY_JSON, TUNING_FILE, ResultsDir, atomic_write_text, json_text
from normkit_lab.study.config import load_yaml
from normkit_lab.suite.page import PROFILE_PNG, profile_png, render
from normkit_lab.suite.run import Suite, Task
from normkit_lab.suite.score import (
    R_MAX,
    mean_ranks,
    median_time,
    performance_ratios,
    profile,
    profile_score,
    time_to_target,
)

SCORECARD_JSON = "scorecard.json"
REPORT_HTML = "report.html"
TAUS = [round(1 + i * (R_MAX - 1) / 60, 4) for i in range(61)]  # the profile's x axis, 1 to R_MAX


def _load(path: Path) -> list[dict[str, Any]]:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else []


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def at_edge(tuned: dict[str, Any], tune: dict[str, list[Any]]) -> list[str]:
    """The tuned keys whose chosen value is the smallest or largest candidate: the best value may lie
    beyond the grid, so the norm may be handicapped there."""
    return [key for key, value in tuned.items() if len(tune.get(key, [])) > 1 and value in (min(tune[key]),
                                                                                              max(tune[key]))]


def task_card(suite: Suite, task: Task) -> dict[str, Any] | None:
    """One workload's part of the scorecard (None when its directory does not exist yet)."""
    where = suite.task_dir(task)
    if not (where / "config.yaml").is_file():
        return None
    store = ResultsDir.open(where)
    config = load_yaml(store.config_path, saved=True)
    metric = metric_named(config["metric"])
    _, tune, target = task.workload.resolved(suite.plan.scale, task.variant)
    summary = {row["norm"]: row for row in _load(where / SUMMARY_JSON)}
    chosen = {row["norm"]: row["values"] for row in _load(where / TUNING_FILE) if row.get("chosen")}
    runs = runs_from_rows(store.rows())
    norms = []
    for norm in suite.plan.norms:
        mine = [r for r in runs if r.norm == norm and r.phase == "compare"]
        reached = [time_to_target(r.epochs, metric, target) if r.status == "ok" else None for r in mine]
        values = {r.seed: v for r in mine if r.status == "ok"
                  and (v := run_value(r.epochs, metric, config.get("select", "final"))) is not None}
        row = summary.get(norm, {})
        norms.append({
            "norm": norm, "runs": len(mine),
            "tuning_runs": sum(r.norm == norm and r.phase == "tune" for r in runs), "tuned": chosen.get(norm),
            "tuned_at_edge": at_edge(chosen.get(norm) or {}, tune),
            "excluded": suite.plan.excluded.get(task.name, {}).get(norm),
            "values": {str(s): v for s, v in sorted(values.items())},
            "metric_mean": row.get("metric_mean"), "metric_sem": row.get("metric_sem"),
            "verdict": row.get("verdict"), "diff_mean": row.get("diff_mean"),
            "diff_ci95_low": row.get("diff_ci95_low"), "diff_ci95_high": row.get("diff_ci95_high"),
            "p_holm": row.get("p_holm"), "mde": row.get("mde"), "seeds_needed": row.get("seeds_needed"),
            "reached": sum(x is not None for x in reached),
            "steps_to_target": _finite(median_time([x.steps if x and x.steps is not None else math.inf
                                                    for x in reached])),
            "cpu_s_to_target": _finite(median_time([x.cpu_s if x and x.cpu_s is not None else math.inf
                                                    for x in reached])),
        })
    return {"task": task.name, "workload": task.workload.name, "variant": task.variant,
            "held_out": task.variant is not None, "plugin": task.workload.plugin, "question": task.workload.question,
            "recipe": task.workload.recipe(suite.plan.scale, task.variant),
            "budget": task.workload.budget_text(suite.plan.scale, task.variant), "metric": metric.field,
            "metric_label": metric.label, "unit": metric.unit, "higher_is_better": metric.higher_is_better,
            "target_field": metric.select_by, "target": target, "baseline": config.get("baseline"),
            "seeds": config.get("seeds"), "tune_seeds": config.get("tune_seeds"), "dir": task.name,
            "complete": all(n["runs"] == len(config.get("seeds", [])) for n in norms if n["excluded"] is None),
            "norms": norms}


def aggregate(cards: list[dict[str, Any]], norms: list[str]) -> dict[str, Any]:
    """Profiles, profile scores and mean ranks across `cards` (one kind: visible or held out)."""
    times = {c["task"]: {n["norm"]: n["steps_to_target"] if n["steps_to_target"] is not None else math.inf
                         for n in c["norms"]} for c in cards}
    ratios = performance_ratios(times)
    values = {c["task"]: ({n["norm"]: {int(s): v for s, v in n["values"].items()} for n in c["norms"]},
                          1.0 if c["higher_is_better"] else -1.0) for c in cards}
    ranks = mean_ranks(values, norms)
    return {"workloads": [c["task"] for c in cards], "taus": TAUS, "profile": profile(ratios, TAUS),
            "profile_score": profile_score(ratios), "r_max": R_MAX,
            "ratios": {w: {n: _finite(r) for n, r in by.items()} for w, by in ratios.items()},
            "mean_rank": {n: r.as_dict() for n, r in ranks.items()}}


def scorecard(suite: Suite, environment: dict[str, Any] | None = None, command: str = "") -> dict[str, Any]:
    """The whole scorecard of `suite` (tasks not run yet are listed under `missing`)."""
    cards, missing = [], []
    for task in suite.plan.tasks():
        card = task_card(suite, task)
        (cards.append(card) if card is not None else missing.append(task.name))
    norms = suite.plan.norms
    visible = [c for c in cards if not c["held_out"]]
    held = [c for c in cards if c["held_out"]]
    return {"format": 1, "norms": norms, "seeds": suite.plan.seeds, "scale": suite.plan.scale,
            "holdout": suite.plan.holdout, "command": command, "environment": environment or {},
            "missing": missing, "workloads": cards,
            "visible": aggregate(visible, norms) if visible else None,
            "held_out": aggregate(held, norms) if held else None}


def write_scorecard(suite: Suite, environment: dict[str, Any] | None = None, command: str = "") -> dict[str, Any]:
    """Write scorecard.json, profile.png and report.html into the suite directory; return the scorecard."""
    card = scorecard(suite, environment, command)
    atomic_write_text(suite.path / SCORECARD_JSON, json_text(card))
    figure = profile_png(card)
    if figure is not None:
        (suite.path / PROFILE_PNG).write_bytes(figure)
    atomic_write_text(suite.path / REPORT_HTML, render(card, figure))
    return card
