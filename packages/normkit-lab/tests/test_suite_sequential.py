"""The suite with sequential seeds (`seeds="auto"`): the plan records its looks and budget in its
identity (so a resume checks them), every task is compare's sequential comparison with its own
looks.json, and the scorecard says for every cell at which look and why it stopped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import normkit
from normkit.testing import temporary_plugin
from normkit_lab.analysis.looks import read_looks
from normkit_lab.errors import ConfigError
from normkit_lab.records import RunId
from normkit_lab.store.results import ResultsDir
from normkit_lab.study.config import load_yaml
from normkit_lab.suite.run import IDENTITY_KEYS, SUITE_JSON, SuitePlan, _hash, create_suite, open_suite, run_suite
from normkit_lab.suite.scorecard import write_scorecard

DEMO = {"question": "does it train a small net?", "config": {"model": "small-cnn", "batch_size": 128, "epochs": 1},
        "tune": {"lr": [0.1]}, "target": 50.0}


class DemoWorkload:
    @normkit.hookimpl
    def normkit_register_workloads(self, register):
        register("seqdemo", DEMO)


@pytest.fixture(scope="module")
def demo_workload():
    with temporary_plugin(DemoWorkload(), "seq-demo"):
        yield


def test_auto_seeds_plan_their_looks_like_compare_and_a_resume_checks_them(tmp_path: Path, demo_workload) -> None:
    plan = SuitePlan.make("bn,gn+pn", "auto", ["seqdemo"], max_seeds=5, max_cpu_minutes=2)
    assert (plan.seeds, plan.looks, plan.max_cpu_minutes) == ([0, 1, 2, 3, 4], [3, 5], 2.0)
    assert SuitePlan.make("bn", "auto", ["seqdemo"]).looks == [3, 5, 8, 12]  # compare's default max seeds
    fixed = SuitePlan.make("bn", 3, ["seqdemo"])
    assert fixed.looks is None and set(fixed.identity()) == set(IDENTITY_KEYS)  # older suites' identity unchanged
    with pytest.raises(ConfigError, match="apply to --seeds auto"):
        SuitePlan.make("bn", 3, ["seqdemo"], max_seeds=5)
    suite = create_suite(plan, tmp_path / "suite")
    config = load_yaml(suite.path / "seqdemo" / "config.yaml", saved=True)
    assert (config["looks"], config["max_cpu_minutes"], config["seeds"]) == ([3, 5], 2.0, [0, 1, 2, 3, 4])
    assert open_suite(suite.path).plan == plan
    saved = json.loads((suite.path / SUITE_JSON).read_text())
    assert saved["identity"]["hash"] == _hash({k: saved[k] for k in (*IDENTITY_KEYS, "looks", "max_cpu_minutes")})
    for key, value in (("looks", [3, 4, 5]), ("max_cpu_minutes", 9.0)):
        (suite.path / SUITE_JSON).write_text(json.dumps({**saved, key: value}))
        with pytest.raises(ConfigError, match=f"was edited after the suite was created \\({key}"):
            open_suite(suite.path)


@pytest.mark.slow
def test_a_suite_with_auto_seeds_runs_rounds_records_why_each_cell_stopped_and_resumes(
        tmp_path: Path, demo_workload) -> None:
    plan = SuitePlan.make("bn,gn+pn,ln", "auto", ["seqdemo"], max_seeds=5)
    suite = create_suite(plan, tmp_path / "suite")
    run_suite(suite)
    record = read_looks(suite.path / "seqdemo")
    assert record is not None and record["design"]["looks"] == [3, 5] and record["stopped"]
    card = write_scorecard(suite)
    task = card["workloads"][0]
    assert card["looks"] == [3, 5] and task["sequential"]["stopped"] == record["stopped"]
    assert task["sequential"]["looks_run"] == len(record["looks"]) and task["rank_seeds"] == [0, 1, 2]
    cells = [n for n in task["norms"] if n["norm"] != "bn"]
    for n in cells:
        assert n["look"] in (1, 2) and n["stop"] and n["diff_n"] in (3, 5)
        if n["verdict"] == "inconclusive":
            assert n["stop"].startswith("undecided") and n["diff_n"] == 5
    decided = sum(n["verdict"].split(" (")[0] in ("better", "worse", "equivalent") for n in cells)
    assert card["decided"] == {"decided": decided, "cells": 2, "left_out": 0} and task["complete"]
    rows = {RunId.of_row(r).key(): r for r in ResultsDir.open(suite.path / "seqdemo").rows()}
    resumed = open_suite(suite.path)
    run_suite(resumed)  # a finished suite resumes without training anything again
    assert {RunId.of_row(r).key(): r for r in ResultsDir.open(suite.path / "seqdemo").rows()} == rows
    assert write_scorecard(resumed)["decided"] == card["decided"]
