"""`seeds: auto` end to end through the real plan, executor and store, with a train function (the user's
own-code path, docs/own-training.md) whose accuracies are known: a large gap is decided at the first
look and gets no more seeds, a small one gets rounds of seeds; an interrupted comparison resumes to
the same decisions; the CPU budget ends the rounds; fixed seeds run as before."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from normkit.errors import NormkitError
from normkit_lab.analysis.looks import LOOKS_FILE, STOP_BUDGET
from normkit_lab.api import compare_norms
from normkit_lab.study.progress import Progress


def quiet() -> Progress:
    return Progress()


def seq_train(norm: str, seed: int, *, cell: dict[str, Any], report: Any) -> None:
    """bn at 0.90; gn 40 points below with little seed noise (shown at 3 seeds); ln about bn's level with
    seed noise of a point (needs more seeds)."""
    import random

    rng = random.Random(f"{norm}/{seed}")
    mean = {"bn": 0.9, "gn": 0.5}.get(norm, 0.9)
    acc = mean + rng.gauss(0, 0.0005 if norm == "gn" else 0.01)
    report(epoch=0, val_acc=acc, test_acc=acc)


def _seeds(path: Path) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for line in (path / "runs.jsonl").read_text().splitlines():
        row = json.loads(line)
        out.setdefault(row["norm"], []).append(row["seed"])
    return {norm: sorted(set(seeds)) for norm, seeds in out.items()}


def _decisions(summary: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [(r["norm"], r["verdict"], r["diff_n"], r["look"], r["stop"], r["diff_adj_low"], r["diff_adj_high"])
            for r in summary]


def test_rounds_add_seeds_only_to_undecided_comparisons_and_resume_to_the_same_decisions(tmp_path: Path) -> None:
    full = compare_norms("bn,gn,ln", train=seq_train, seeds="auto", max_seeds=8, out=tmp_path / "full",
                         progress=quiet())
    record = json.loads((tmp_path / "full" / LOOKS_FILE).read_text())
    assert record["design"] == {"looks": [3, 5, 8], "alpha": 0.05, "spending": "lan-demets-obrien-fleming",
                                "max_seeds": 8}
    assert full.config["looks"] == [3, 5, 8] and full.config["seeds"] == list(range(8))
    rows = {r["norm"]: r for r in full.summary}
    assert rows["gn"]["verdict"] == "worse" and rows["gn"]["look"] == 1 and rows["gn"]["diff_n"] == 3
    assert rows["gn"]["stop"] == "difference shown"
    seeds = _seeds(tmp_path / "full")
    assert seeds["gn"] == [0, 1, 2]  # decided at the first look: no further seeds
    assert seeds["ln"] == seeds["bn"] and len(seeds["ln"]) > 3  # undecided: the rounds went on
    assert [look["comparisons"] for look in record["looks"]][1:] == [[{"cell": {}, "norm": "ln"}]] * (
        len(record["looks"]) - 1)
    assert rows["ln"]["stop"] in ("equivalence shown", "undecided at max seeds")
    assert rows["gn"]["diff_adj_high"] < 0  # the adjusted interval agrees with "worse"

    # interrupted right after the first look: its runs and record are on disk, nothing after them
    cut = tmp_path / "cut"
    cut.mkdir()
    for name in ("config.yaml", "store.json", "environment.json"):
        (cut / name).write_bytes((tmp_path / "full" / name).read_bytes())
    lines = [line for line in (tmp_path / "full" / "runs.jsonl").read_text().splitlines()
             if json.loads(line)["seed"] < 3]
    (cut / "runs.jsonl").write_text("\n".join(lines) + "\n")
    (cut / LOOKS_FILE).write_text(json.dumps({**record, "looks": record["looks"][:1], "stopped": None}))
    resumed = compare_norms("bn,gn,ln", train=seq_train, resume=cut, progress=quiet())
    assert _decisions(resumed.summary) == _decisions(full.summary)
    assert _seeds(cut) == seeds


def test_a_comparison_with_more_seeds_than_the_last_one_is_analyzed_at_its_own_last_look(tmp_path: Path) -> None:
    """The summary placed seeds by the plan's order through a variable the last comparison's paired seeds
    shadowed: with gn (decided at 3 seeds) listed after ln (8 seeds), ln was replayed only to look 2 and
    reported 'more looks to come' after max seeds."""
    result = compare_norms("bn,ln,gn", train=seq_train, seeds="auto", max_seeds=8, out=tmp_path / "order",
                           progress=quiet())
    rows = {r["norm"]: r for r in result.summary}
    assert rows["gn"]["diff_n"] == 3 and rows["gn"]["look"] == 1
    assert rows["ln"]["stop"] in ("equivalence shown", "undecided at max seeds")
    assert rows["ln"]["verdict"] != "continue"
    if rows["ln"]["stop"] == "undecided at max seeds":
        assert rows["ln"]["look"] == 3 and rows["ln"]["diff_n"] == 8


@pytest.mark.slow  # trains 6 tiny runs of normkit's own loop (the CPU budget counts their CPU time)
def test_the_cpu_budget_ends_the_rounds_and_leaves_comparisons_inconclusive(tmp_path: Path) -> None:
    result = compare_norms("bn,ln", dataset="digits", budget="steps=4", seeds="auto", max_seeds=5,
                           max_cpu_minutes=1e-6, out=tmp_path / "budget", progress=quiet())
    record = json.loads((tmp_path / "budget" / LOOKS_FILE).read_text())
    assert record["stopped"].startswith(STOP_BUDGET) and len(record["looks"]) == 1
    (ln,) = [r for r in result.summary if r["norm"] == "ln"]
    assert ln["verdict"] == "inconclusive" and ln["stop"] == "undecided at budget" and ln["diff_n"] == 3
    assert ln["mde"] is not None and ln["mde"] > 0  # the smallest difference the 5-seed budget could show


def test_fixed_seeds_keep_no_looks_and_bad_sequential_options_are_one_line_errors(tmp_path: Path) -> None:
    fixed = compare_norms("bn,gn", train=seq_train, seeds=4, out=tmp_path / "fixed", progress=quiet())
    assert "looks" not in fixed.config and not (tmp_path / "fixed" / LOOKS_FILE).exists()
    assert {r["norm"]: r["diff_n"] for r in fixed.summary}["gn"] == 4
    for options, message in (({"seeds": "auto", "max_seeds": 2}, "max_seeds must be between 3"),
                             ({"seeds": 4, "max_seeds": 8}, "apply to --seeds auto"),
                             ({"seeds": "auto", "max_cpu_minutes": -1.0}, "max_cpu_minutes must be")):
        with pytest.raises(NormkitError, match=message):
            compare_norms("bn,gn", train=seq_train, out=tmp_path / "bad", progress=quiet(), **options)
    assert not (tmp_path / "bad").exists()


def two_metric_train(norm: str, seed: int, *, cell: dict[str, Any], report: Any) -> None:
    """Accuracy and loss with known gaps: gn far below bn, ln about bn's level."""
    import random

    rng = random.Random(f"{norm}/{seed}/two")
    acc = {"bn": 0.9, "gn": 0.8}.get(norm, 0.9) + rng.gauss(0, 0.01)
    report(epoch=0, val_acc=acc, test_acc=acc, test_loss=1.0 - acc + rng.gauss(0, 0.005))


@pytest.mark.parametrize("seeds", [5, "auto"])
def test_intervals_agree_with_verdicts_across_a_family_of_metrics(tmp_path: Path, seeds: Any) -> None:
    """`--metric test_acc,test_loss` re-decides one Holm family over both metrics (fixed seeds): every shown
    interval is the one of the family's verdict. With sequential seeds the primary metric's looks stand and
    the further metric is said to be a fixed-seed test on the seeds the looks chose."""
    from normkit_lab.analysis.report import load_results

    options = {"max_seeds": 5} if seeds == "auto" else {}
    compare_norms("bn,gn,ln", train=two_metric_train, seeds=seeds, out=tmp_path / "two", progress=quiet(), **options)
    summaries = load_results([tmp_path / "two"], metric="test_acc,test_loss").summaries()
    for summary in summaries:
        for row in summary.rows:
            if row.verdict is None or row.interval is None:
                continue
            excludes_zero = row.interval[0] > 0 or row.interval[1] < 0
            assert excludes_zero == row.verdict.verdict.startswith(("better", "worse")), (summary.metric.field, row)
    primary = {r.norm: r.verdict.verdict for r in summaries[0].rows if r.verdict}
    assert primary["gn"] == "worse"
    if seeds == "auto":
        assert primary == {r.norm: r.verdict.verdict for r in load_results([tmp_path / "two"]).summary().rows
                           if r.verdict}
        assert any("fixed-seed tests on those seeds" in note for note in summaries[1].notes)
