"""The suite's scores across workloads: time to target, performance profiles, ranks with a bootstrap.

Pure functions of numbers, so each is checked against a case worked by hand (tests/test_suite_score.py).

    reach = time_to_target(epoch_rows, metric, target)    # steps and CPU seconds, or None (a miss)
    ratios = performance_ratios({"cnn": {"bn": 300, "gn": 600}, ...})   # t / best t per workload
    rho = profile(ratios, taus)                           # fraction of workloads within tau of the best
    score = profile_score(ratios)                         # area under rho from 1 to R_MAX, over R_MAX - 1
    ranks = mean_ranks(values, norms, sign)               # mean rank and its bootstrap interval over seeds

A miss (a target not reached, a norm a workload cannot host) counts as infinite time, as in MLCommons
AlgoPerf; in the ranks a norm without a value on a workload shares the last places there.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from normkit_lab.metrics import Metric

R_MAX = 4.0  # AlgoPerf's upper end of tau: slower than 4x the best counts as not solving the workload
BOOTSTRAP_DRAWS = 2000
BOOTSTRAP_SEED = 0  # a fixed generator: the same results give the same interval


@dataclass(frozen=True)
class Reached:
    """Where a run first met its target: after `epoch` (0-based), `steps` optimizer steps and
    `cpu_s` seconds of training CPU time (None where the rows do not record them)."""

    epoch: int
    steps: int | None
    cpu_s: float | None


def time_to_target(epochs: Sequence[Mapping[str, Any]], metric: Metric, target: float) -> Reached | None:
    """The first epoch whose validation value (the metric's `select_by` field, in its unit) meets `target`
    (>= when higher is better, else <=), or None when no epoch does. Validation only: the test split never
    decides when a run is done."""
    cpu = 0.0
    for row in epochs:
        spent = row.get("cpu_time_s")
        cpu = cpu + spent if isinstance(spent, (int, float)) and cpu is not None else None
        value = row.get(metric.select_by)
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            continue
        scaled = value * metric.scale
        if (scaled >= target) if metric.higher_is_better else (scaled <= target):
            steps = row.get("steps")
            return Reached(int(row["epoch"]), steps if isinstance(steps, int) else None, cpu)
    return None


def median_time(times: Sequence[float]) -> float:
    """The median over seeds of a time to target, a miss being math.inf (so most seeds must reach it)."""
    return statistics.median(times) if times else math.inf


def performance_ratios(times: Mapping[str, Mapping[str, float]]) -> dict[str, dict[str, float]]:
    """Per workload, each norm's time over the best norm's time there (1 = the fastest; inf = a miss,
    and every norm's ratio is inf on a workload no norm reaches)."""
    out: dict[str, dict[str, float]] = {}
    for workload, by_norm in times.items():
        best = min(by_norm.values(), default=math.inf)
        out[workload] = {norm: (t / best if math.isfinite(best) and best > 0 else
                                1.0 if best == 0 and t == 0 else math.inf) for norm, t in by_norm.items()}
    return out


def profile(ratios: Mapping[str, Mapping[str, float]], taus: Sequence[float]) -> dict[str, list[float]]:
    """rho_norm(tau): the fraction of workloads on which the norm's ratio is at most tau, at each tau."""
    norms = _norms(ratios)
    n = len(ratios)
    return {norm: [sum(r.get(norm, math.inf) <= tau for r in ratios.values()) / n if n else 0.0 for tau in taus]
            for norm in norms}


def profile_score(ratios: Mapping[str, Mapping[str, float]], r_max: float = R_MAX) -> dict[str, float]:
    """The area under rho from 1 to `r_max`, divided by `r_max - 1` (AlgoPerf's benchmark score): 1 when the
    norm is the fastest everywhere, 0 when it is never within `r_max` of the fastest. Exact for the step
    function: a workload at ratio r adds (r_max - r) / (r_max - 1) / workloads when r <= r_max."""
    n = len(ratios)
    return {norm: sum(max(0.0, r_max - max(1.0, r.get(norm, math.inf))) / (r_max - 1) for r in ratios.values()) / n
            if n else 0.0 for norm in _norms(ratios)}


def _norms(table: Mapping[str, Mapping[str, Any]]) -> list[str]:
    seen: dict[str, None] = {}
    for row in table.values():
        seen.update(dict.fromkeys(row))
    return list(seen)


def ranks_of(means: Mapping[str, float | None], norms: Sequence[str], sign: float) -> dict[str, float]:
    """Ranks on one workload (1 = best; ties share the mean of their places); norms without a value
    share the last places."""
    keyed = {norm: (-sign * means[norm] if means.get(norm) is not None else math.inf) for norm in norms}
    out = {}
    for norm, key in keyed.items():
        below = sum(k < key for k in keyed.values())
        tied = sum(k == key for k in keyed.values())
        out[norm] = below + (tied + 1) / 2
    return out


@dataclass(frozen=True)
class MeanRank:
    """A norm's mean rank over workloads and its 95% percentile bootstrap interval over seeds."""

    mean: float
    low: float
    high: float

    def as_dict(self) -> dict[str, float]:
        return {"mean": self.mean, "low": self.low, "high": self.high}


def _means(values: Mapping[str, Mapping[int, float]], norms: Sequence[str],
           seeds: Sequence[int]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for norm in norms:
        mine = [values.get(norm, {})[s] for s in seeds if s in values.get(norm, {})]
        out[norm] = sum(mine) / len(mine) if mine else None
    return out


def mean_ranks(values: Mapping[str, tuple[Mapping[str, Mapping[int, float]], float]], norms: Sequence[str],
               draws: int = BOOTSTRAP_DRAWS) -> dict[str, MeanRank]:
    """Mean rank over workloads of each norm's mean metric, with a percentile bootstrap over seeds.

    `values[workload] = ({norm: {seed: value}}, sign)`, sign +1 when higher is better. Each draw resamples,
    per workload, its seeds with replacement (the same seeds for every norm: runs stay paired), recomputes
    every norm's mean and the ranks. The workloads themselves are fixed: the interval says how much the
    ranking could move with other seeds, not with other workloads.
    """
    if not values:
        return {}
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    seeds = {w: sorted({s for by_seed in v.values() for s in by_seed}) for w, (v, _) in values.items()}

    def ranking(chosen: Mapping[str, Sequence[int]]) -> dict[str, float]:
        per = [ranks_of(_means(v, norms, chosen[w]), norms, sign) for w, (v, sign) in values.items()]
        return {norm: sum(r[norm] for r in per) / len(per) for norm in norms}

    point = ranking(seeds)
    drawn = [ranking({w: list(rng.choice(s, size=len(s), replace=True)) if s else [] for w, s in seeds.items()})
             for _ in range(draws)]
    out = {}
    for norm in norms:
        low, high = np.percentile([d[norm] for d in drawn], [2.5, 97.5])
        out[norm] = MeanRank(point[norm], float(low), float(high))
    return out
