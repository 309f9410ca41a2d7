"""The suite's scores against cases worked by hand: time to target, performance profiles, ranks."""

from __future__ import annotations

import math

import pytest

from normkit_lab.metrics import metric_named
from normkit_lab.suite.score import (
    Reached,
    mean_ranks,
    median_time,
    performance_ratios,
    profile,
    profile_score,
    ranks_of,
    time_to_target,
)

INF = math.inf


def test_time_to_target_is_the_first_validation_epoch_that_meets_it() -> None:
    rows = [{"epoch": 0, "val_acc": 0.50, "test_acc": 0.99, "steps": 10, "cpu_time_s": 1.0},
            {"epoch": 1, "val_acc": 0.91, "test_acc": 0.10, "steps": 20, "cpu_time_s": 2.0},
            {"epoch": 2, "val_acc": 0.97, "steps": 30, "cpu_time_s": 3.0}]
    acc = metric_named("test_acc")
    assert time_to_target(rows, acc, 90.0) == Reached(epoch=1, steps=20, cpu_s=3.0)  # % unit; test never read
    assert time_to_target(rows, acc, 98.0) is None
    bpb = [{"epoch": 0, "val_bpb": 4.0, "steps": 5}, {"epoch": 1, "val_bpb": 3.5, "steps": 9}]
    assert time_to_target(bpb, metric_named("test_bpb"), 3.6) == Reached(epoch=1, steps=9, cpu_s=None)
    assert median_time([10, INF, 30]) == 30 and median_time([10, INF, INF]) == INF


def test_profile_and_score_match_a_hand_computed_case() -> None:
    # workload a: x 100, y 200, z misses; b: x 300, y 150, z 600; c: nobody reaches the target
    times = {"a": {"x": 100, "y": 200, "z": INF}, "b": {"x": 300, "y": 150, "z": 600},
             "c": {"x": INF, "y": INF, "z": INF}}
    ratios = performance_ratios(times)
    assert ratios == {"a": {"x": 1.0, "y": 2.0, "z": INF}, "b": {"x": 2.0, "y": 1.0, "z": 4.0},
                      "c": {"x": INF, "y": INF, "z": INF}}
    rho = profile(ratios, [1.0, 1.5, 2.0, 3.9, 4.0])
    assert rho == {"x": pytest.approx([1 / 3, 1 / 3, 2 / 3, 2 / 3, 2 / 3]),
                   "y": pytest.approx([1 / 3, 1 / 3, 2 / 3, 2 / 3, 2 / 3]),
                   "z": pytest.approx([0, 0, 0, 0, 1 / 3])}
    # area under rho from 1 to 4 over 3: x gets (4-1)/3 on a and (4-2)/3 on b, over 3 workloads = 5/9
    assert profile_score(ratios) == pytest.approx({"x": 5 / 9, "y": 5 / 9, "z": 0.0})


def test_ranks_share_ties_and_put_missing_norms_last() -> None:
    assert ranks_of({"x": 90.0, "y": 90.0, "z": None, "w": 95.0}, ["x", "y", "z", "w"], 1.0) == \
        {"w": 1.0, "x": 2.5, "y": 2.5, "z": 4.0}
    assert ranks_of({"x": 3.2, "y": 3.5}, ["x", "y"], -1.0) == {"x": 1.0, "y": 2.0}  # lower is better


def test_mean_rank_bootstrap_resamples_seeds_paired_within_workloads() -> None:
    # w1: x beats y on every seed; w2: y beats x on seeds 0 and 1, x beats y by far on seed 2
    values = {"w1": ({"x": {0: 2.0, 1: 2.0, 2: 2.0}, "y": {0: 1.0, 1: 1.0, 2: 1.0}}, 1.0),
              "w2": ({"x": {0: 1.0, 1: 1.0, 2: 10.0}, "y": {0: 2.0, 1: 2.0, 2: 2.0}}, 1.0)}
    ranks = mean_ranks(values, ["x", "y"], draws=400)
    assert ranks["x"].mean == 1.0 and ranks["y"].mean == 2.0  # w2's means: x 4.0, y 2.0
    # a draw without seed 2 makes y best on w2 (mean rank 1.5 each): the interval shows it
    assert ranks["x"].low == 1.0 and ranks["x"].high == 1.5
    assert ranks["y"].low == 1.5 and ranks["y"].high == 2.0
    assert mean_ranks(values, ["x", "y"], draws=400) == ranks  # a fixed generator: repeatable


def test_a_choice_at_an_end_of_the_grid_is_flagged() -> None:
    from normkit_lab.suite.scorecard import at_edge

    tune = {"lr": [0.01, 0.02, 0.05], "weight_decay": [0.0005]}
    assert at_edge({"lr": 0.01, "weight_decay": 0.0005}, tune) == ["lr"]
    assert at_edge({"lr": 0.05}, tune) == ["lr"] and at_edge({"lr": 0.02}, tune) == []


def _page_row(**changes: object) -> dict:
    """One norm's entry of a scorecard workload (an inconclusive ln against bn), with `changes`."""
    return {"norm": "ln", "excluded": "", "verdict": "inconclusive", "diff_mean": 1.0, "diff_ci95_low": 0.1,
            "diff_ci95_high": 1.9, "diff_adj_low": -0.3, "diff_adj_high": 2.3, "mde": 1.5, "tuned": {},
            "tuned_at_edge": [], "metric_mean": 90.0, "metric_sem": 0.5, "reached": 3, "runs": 3, "failed": 0,
            "tuning_failed": 0, "error": None, "steps_to_target": None, "cpu_s_to_target": None, **changes}


def _workload_html(norm: dict) -> str:
    """The scorecard page's table of a workload with this one norm."""
    from normkit_lab.suite import page

    return page._workload({"norms": [norm], "higher_is_better": True, "task": "demo", "held_out": False,
                           "complete": True, "dir": "demo", "question": "q", "recipe": "r", "budget": "b",
                           "tune_seeds": [3], "seeds": [0, 1, 2], "metric_label": "test accuracy", "unit": "%",
                           "baseline": "bn", "target_field": "val_acc", "target": 0.5, "metric": "test_acc"})


def test_the_scorecard_page_shows_the_adjusted_interval_beside_the_verdict() -> None:
    """The workload table printed the unadjusted 95% interval beside the Holm verdict (here [+0.10, +1.90], which
    excludes 0 beside `inconclusive`); it shows the interval the verdict was decided on."""
    html = _workload_html(_page_row())
    assert "+1.00 [-0.30, +2.30]" in html and "[adj. CI]" in html
    assert "+0.10" not in html and "95% CI" not in html


def test_a_comparison_undecided_at_its_first_look_says_why_its_interval_is_so_wide() -> None:
    """A budget that allows one look (the six-norm suite's ViT: +0.75 [-775.72, +777.21]) prints the interval
    that look tests at; the page says why it is that wide and what would decide it. Decided, or later looks: no note."""
    first_look = {"diff_mean": 0.75, "diff_adj_low": -775.72, "diff_adj_high": 777.21, "mde": 0.47, "look": 1,
                  "diff_n": 3, "stop": "undecided at budget"}
    html = _workload_html(_page_row(**first_look))
    assert "(look 1, 3 seeds; undecided at budget)" in html and "(look 1, undecided): a first look spends" in html
    for changes in ({"look": 2, "diff_n": 5}, {"verdict": "better", "stop": "difference shown"}):
        assert "a first look spends" not in _workload_html(_page_row(**{**first_look, **changes}))
