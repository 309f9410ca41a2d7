"""scorecard.json: what a suite directory's comparisons say, per workload and across workloads.

Read from the task directories alone (config.yaml, runs.jsonl, summary.json, tuning.json), so a
scorecard can be rebuilt at any time (`normkit suite --resume DIR` rewrites it) and always matches the runs.
Per workload: each norm's metric, paired verdict against the baseline (the first suite norm the
workload hosts), the tuned values, and its time to the workload's target (median over comparison
seeds of the optimizer steps and training CPU seconds at the first epoch whose validation value meets
it). Across workloads, separately for the visible workloads and the held-out variants: the
performance profile of the steps to target, its score, and each norm's mean rank with a bootstrap
interval over seeds. With sequential seeds a workload's norms end with different seeds (a decided
comparison gets no more), so times and ranks use the first look's seeds, which every norm has; each
verdict records its look and why it stopped (the workload's looks.json), and `decided` counts the
non-baseline cells whose verdict is decided.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from normkit_lab.analysis.looks import read_looks
from normkit_lab.analysis.summary import runs_from_rows
from normkit_lab.analysis.verdicts import BETTER, EQUIVALENT, WORSE
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


_INFERENCE = ("verdict", "diff_mean", "diff_ci95_low", "diff_ci95_high", "diff_adj_low", "diff_adj_high", "p_holm",
              "mde", "seeds_needed", "diff_n", "look", "stop")
DECIDED = (BETTER, WORSE, EQUIVALENT)
SMOKE_TEST = ("a smoke test (--quick), not a result: tiny forms of the workloads check that the suite runs, so it "
              "gives no verdicts, ranks or profile scores")


def task_card(suite: Suite, task: Task) -> dict[str, Any] | None:
    """One workload's part of the scorecard (None when its directory does not exist yet, unless no norm
    given can run the task: then a card whose every norm is excluded)."""
    where = suite.task_dir(task)
    excluded = suite.plan.excluded.get(task.name, {})
    if not (where / "config.yaml").is_file() and not (excluded and set(suite.plan.norms) <= set(excluded)):
        return None
    config, runs, summary, chosen = {}, [], {}, {}
    if (where / "config.yaml").is_file():
        store = ResultsDir.open(where)
        config = load_yaml(store.config_path, saved=True)
        summary = {row["norm"]: row for row in _load(where / SUMMARY_JSON)}
        chosen = {row["norm"]: row["values"] for row in _load(where / TUNING_FILE) if row.get("chosen")}
        runs = runs_from_rows(store.rows())
    metric = metric_named(config["metric"]) if config else task.workload.metric
    _, tune, target = task.workload.resolved(suite.plan.scale, task.variant)
    seeds = config.get("seeds", suite.plan.seeds)
    looks = config.get("looks")
    record = read_looks(where) if config and looks else None
    rank_seeds = seeds[:looks[0]] if looks else seeds  # the first look's: every norm has them
    smoke = suite.plan.scale == "quick"
    norms = []
    for norm in suite.plan.norms:
        mine = [r for r in runs if r.norm == norm and r.phase == "compare"]
        done = [r for r in mine if r.status != "failed"]
        reached = [time_to_target(r.epochs, metric, target) if r.status == "ok" else None for r in done
                   if r.seed in rank_seeds]
        values = {r.seed: v for r in done if r.status == "ok"
                  and (v := run_value(r.epochs, metric, config.get("select", "final"))) is not None}
        row = summary.get(norm, {})
        tuning = [r for r in runs if r.norm == norm and r.phase == "tune"]
        norms.append({
            "norm": norm, "runs": len(done), "failed": len(mine) - len(done),
            "tuning_runs": sum(r.status != "failed" for r in tuning),
            "tuning_failed": sum(r.status == "failed" for r in tuning),
            "error": next((r.error for r in mine + tuning if r.status == "failed"), None),
            "tuned": chosen.get(norm), "tuned_at_edge": at_edge(chosen.get(norm) or {}, tune),
            "excluded": excluded.get(norm),
            "values": {str(s): v for s, v in sorted(values.items())},
            "metric_mean": row.get("metric_mean"), "metric_sem": row.get("metric_sem"),
            **{key: None if smoke else row.get(key) for key in _INFERENCE},
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
            "seeds": seeds, "rank_seeds": rank_seeds, "tune_seeds": config.get("tune_seeds"),
            "dir": task.name if config else None,
            "sequential": None if not looks else {"looks": looks, "max_cpu_minutes": config.get("max_cpu_minutes"),
                                                  "looks_run": len((record or {}).get("looks", [])),
                                                  "stopped": (record or {}).get("stopped")},
            "complete": all((n["runs"] >= len(rank_seeds) if looks else n["runs"] == len(seeds)) and not n["failed"]
                            and not n["tuning_failed"] for n in norms if n["excluded"] is None)
            and (not looks or bool((record or {}).get("stopped"))),
            "norms": norms}


def _unranked(cards: list[dict[str, Any]], norms: list[str]) -> dict[str, str]:
    """Norms that cannot be ranked across `cards`: a run of theirs failed or is missing on a workload they
    can run, so a rank would count runs that did not happen."""
    out: dict[str, str] = {}
    for card in cards:
        for n in card["norms"]:
            if n["norm"] in out or n["excluded"] is not None:
                continue
            if n["failed"] or n["tuning_failed"]:
                out[n["norm"]] = f"{n['failed'] + n['tuning_failed']} failed runs on {card['task']}"
            elif n["runs"] < len(card["rank_seeds"]):
                out[n["norm"]] = f"{len(card['rank_seeds']) - n['runs']} runs missing on {card['task']}"
    return {norm: out[norm] for norm in norms if norm in out}


def aggregate(cards: list[dict[str, Any]], norms: list[str]) -> dict[str, Any]:
    """Profiles, profile scores and mean ranks across `cards` (one kind: visible or held out), over the
    norms whose every run there succeeded (a norm that cannot run a workload counts as a miss there); the
    others are listed under `unranked` with the reason."""
    unranked = _unranked(cards, norms)
    ranked = [n for n in norms if n not in unranked]
    times = {c["task"]: {n["norm"]: n["steps_to_target"] if n["steps_to_target"] is not None else math.inf
                         for n in c["norms"] if n["norm"] in ranked} for c in cards}
    ratios = performance_ratios(times)
    values = {c["task"]: ({n["norm"]: {int(s): v for s, v in n["values"].items() if int(s) in c["rank_seeds"]}
                           for n in c["norms"] if n["norm"] in ranked}, 1.0 if c["higher_is_better"] else -1.0)
              for c in cards}
    ranks = mean_ranks(values, ranked) if ranked else {}
    return {"workloads": [c["task"] for c in cards], "norms": ranked, "unranked": unranked, "taus": TAUS,
            "profile": profile(ratios, TAUS), "profile_score": profile_score(ratios), "r_max": R_MAX,
            "ratios": {w: {n: _finite(r) for n, r in by.items()} for w, by in ratios.items()},
            "mean_rank": {n: r.as_dict() for n, r in ranks.items()}}


def failed_runs(cards: list[dict[str, Any]]) -> dict[str, int]:
    """Failed runs (tuning and comparison) per norm over every workload; norms without any are left out."""
    out: dict[str, int] = {}
    for card in cards:
        for n in card["norms"]:
            if n["failed"] or n["tuning_failed"]:
                out[n["norm"]] = out.get(n["norm"], 0) + n["failed"] + n["tuning_failed"]
    return out


def decided(cards: list[dict[str, Any]]) -> dict[str, int]:
    """How many non-baseline cells (a norm on a workload it can run, against that workload's baseline) have a
    decided verdict (better, worse or equivalent), of how many; `left_out`: the cells of norms a workload
    cannot host, which have no verdict to decide."""
    cells = [n for c in cards for n in c["norms"] if n["norm"] != c["baseline"] and n["excluded"] is None]
    return {"decided": sum(str(n["verdict"] or "").split(" (")[0] in DECIDED for n in cells), "cells": len(cells),
            "left_out": sum(n["excluded"] is not None for c in cards for n in c["norms"])}


def scorecard(suite: Suite, environment: dict[str, Any] | None = None, command: str = "") -> dict[str, Any]:
    """The whole scorecard of `suite`. `missing`: tasks not complete (not started, runs missing or failed);
    `failed_runs`: failed runs per norm. A quick suite is a smoke test: no verdicts, ranks or profiles."""
    cards, missing = [], []
    for task in suite.plan.tasks():
        card = task_card(suite, task)
        if card is not None:
            cards.append(card)
        if card is None or not card["complete"]:
            missing.append(task.name)
    norms = suite.plan.norms
    smoke = suite.plan.scale == "quick"
    visible = [c for c in cards if not c["held_out"]]
    held = [c for c in cards if c["held_out"]]
    return {"format": 1, "norms": norms, "seeds": suite.plan.seeds, "looks": suite.plan.looks,
            "max_cpu_minutes": suite.plan.max_cpu_minutes, "scale": suite.plan.scale, "holdout": suite.plan.holdout,
            "decided": None if smoke else decided(cards),
            "smoke_test": smoke, **({"note": SMOKE_TEST} if smoke else {}),
            "command": command, "environment": environment or {}, "complete": not missing,
            "missing": missing, "failed_runs": failed_runs(cards), "workloads": cards,
            "visible": aggregate(visible, norms) if visible and not smoke else None,
            "held_out": aggregate(held, norms) if held and not smoke else None}


def write_scorecard(suite: Suite, environment: dict[str, Any] | None = None, command: str = "") -> dict[str, Any]:
    """Write scorecard.json, profile.png and report.html into the suite directory; return the scorecard."""
    card = scorecard(suite, environment, command)
    atomic_write_text(suite.path / SCORECARD_JSON, json_text(card))
    figure = profile_png(card)
    if figure is not None:
        (suite.path / PROFILE_PNG).write_bytes(figure)
    atomic_write_text(suite.path / REPORT_HTML, render(card, figure))
    return card
