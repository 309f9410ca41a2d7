"""The suite's protocol on tiny workloads: every norm gets the same tuning budget on separate seeds, a
norm a workload cannot host is left out and counted as a miss, each workload is an ordinary results
directory, and an interrupted suite resumes without training a finished run again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import normkit
from normkit.testing import temporary_plugin
from normkit_lab.analysis.report import load_results
from normkit_lab.records import RunId
from normkit_lab.store.results import ResultsDir
from normkit_lab.study.progress import Progress
from normkit_lab.suite.run import SuitePlan, create_suite, open_suite, planned_runs, run_suite
from normkit_lab.suite.scorecard import SCORECARD_JSON, write_scorecard

DEMO = {"question": "does it train a small net?", "config": {"model": "small-cnn", "batch_size": 128, "epochs": 1},
        "tune": {"lr": [0.05, 0.1]}, "target": 50.0, "variants": {"wide": {"model_params": {"width": 48}}}}
TINY_VIT = {"question": "does it train a tiny ViT?", "config": {"model": "vit-small", "optimizer": "adamw",
                                                                 "model_params": {"width": 16, "mlp_width": 16},
                                                                 "batch_size": 128, "epochs": 1},
            "tune": {"lr": [0.003]}, "target": 20.0}


class TinyWorkloads:
    @normkit.hookimpl
    def normkit_register_workloads(self, register):
        register("demo", DEMO)
        register("tinyvit", TINY_VIT)


@pytest.fixture(scope="module")
def tiny_workloads():
    with temporary_plugin(TinyWorkloads(), "tiny-workloads"):
        yield


def test_every_norm_of_every_workload_gets_the_same_tuning_budget_on_its_own_seeds() -> None:
    """The plan alone (nothing trains): the same candidates and tuning seeds for each norm, disjoint from
    the comparison seeds, on every built-in workload at every scale."""
    from normkit_lab.study import config as lab_config
    from normkit_lab.study.plan import tune_plan

    for scale in ("cpu", "quick"):
        plan = SuitePlan.make("bn,ln,gn+pn", seeds=3, scale=scale, holdout=True)
        for task in plan.tasks():
            cfg = lab_config.build_config(plan.task_values(task, plan.norms))
            trials = {norm: sorted((r.seed, r.tuned) for r in tune_plan(cfg) if r.norm == norm) for norm in cfg.norms}
            _, tune, _ = task.workload.resolved(scale, task.variant)
            assert len(trials["bn"]) == len(next(iter(tune.values()))) * len(cfg.tune_seeds) >= 2
            assert trials["bn"] == trials["ln"] == trials["gn+pn"], task.name
            assert cfg.tune_seeds == [3] and not set(cfg.tune_seeds) & set(cfg.seeds)


@pytest.fixture(scope="module")
def tiny_suite(tmp_path_factory: pytest.TempPathFactory, tiny_workloads: None):
    """bn and gn+pn on the two tiny workloads, trained once for the tests that read the result."""
    plan = SuitePlan.make("bn,gn+pn", seeds=3, workloads=["demo", "tinyvit"], holdout=True)
    assert [t.name for t in plan.tasks()] == ["demo", "tinyvit", "demo@wide"]
    assert planned_runs(plan) == 2 * (2 + 3) + 2 * (1 + 3) + 2 * (2 + 3)
    suite = create_suite(plan, tmp_path_factory.mktemp("tiny") / "suite")
    run_suite(suite)
    return suite, write_scorecard(suite)


@pytest.mark.slow
def test_equal_tuning_budgets_verdicts_and_a_norm_left_out(tiny_suite) -> None:
    suite, card = tiny_suite
    demo, vit, wide = card["workloads"]
    assert wide["held_out"] and wide["recipe"].startswith("small-cnn(width=48)")
    assert card["visible"]["workloads"] == ["demo", "tinyvit"] and card["held_out"]["workloads"] == ["demo@wide"]
    rows = ResultsDir.open(suite.path / "demo").rows()
    for norm in ("bn", "gn+pn"):
        tuning = {(r["seed"], json.dumps(r["tuned"])) for r in rows if r["norm"] == norm and r["phase"] == "tune"}
        assert tuning == {(3, '{"lr": 0.05}'), (3, '{"lr": 0.1}')}  # the same candidates, on a seed of its own
        compare = {r["seed"] for r in rows if r["norm"] == norm and r["phase"] == "compare"}
        assert compare == {0, 1, 2}
    assert [(n["norm"], n["tuning_runs"], n["runs"]) for n in demo["norms"]] == [("bn", 2, 3), ("gn+pn", 2, 3)]
    tuning = json.loads((suite.path / "demo" / "tuning.json").read_text())
    for norm in ("bn", "gn+pn"):  # chosen on validation: the candidate with the best mean val accuracy
        mine = [t for t in tuning if t["norm"] == norm]
        assert next(t for t in mine if t["chosen"])["val_acc"] == max(t["val_acc"] for t in mine)
    assert demo["norms"][1]["verdict"] is not None and demo["baseline"] == "bn"
    left_out = vit["norms"][1]
    assert left_out["norm"] == "gn+pn" and "cannot host 'gn+pn'" in left_out["excluded"] and left_out["runs"] == 0
    assert card["visible"]["mean_rank"]["gn+pn"]["mean"] >= 1.5  # last on tinyvit, where it cannot run
    assert card["visible"]["ratios"]["tinyvit"]["gn+pn"] is None  # a miss: infinite time
    assert load_results([suite.path / "demo"]).norms == ["bn", "gn+pn"]  # `normkit report` reads each workload
    assert json.loads((suite.path / SCORECARD_JSON).read_text())["norms"] == ["bn", "gn+pn"]
    page = (suite.path / "report.html").read_text()
    assert "<h1>normkit suite scorecard: bn, gn+pn</h1>" in page and "Across the held-out variants" in page


class StopAfter(Progress):
    """Interrupts the suite, as Ctrl-C would, once `limit` runs have finished across its workloads."""

    finished = 0

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit

    def run_end(self, result) -> None:
        StopAfter.finished += 1
        if StopAfter.finished == self.limit:
            raise KeyboardInterrupt


@pytest.mark.slow
def test_an_interrupted_suite_resumes_where_it_stopped(tmp_path: Path, tiny_workloads: None) -> None:
    plan = SuitePlan.make("bn,ln", seeds=3, workloads=["demo", "tinyvit"])
    suite = create_suite(plan, tmp_path / "suite")
    StopAfter.finished = 0
    with pytest.raises(KeyboardInterrupt):
        run_suite(suite, progress=lambda: StopAfter(12))  # demo's 10 runs, then 2 of tinyvit's 8
    before = {RunId.of_row(r).key(): r for r in ResultsDir.open(suite.path / "demo").rows()}
    partial = ResultsDir.open(suite.path / "tinyvit").rows()
    assert len({RunId.of_row(r) for r in partial}) == 2
    resumed = open_suite(suite.path)
    assert resumed.plan == suite.plan
    run_suite(resumed)
    after = ResultsDir.open(suite.path / "demo").rows()
    assert {RunId.of_row(r).key(): r for r in after} == before  # nothing trained twice
    vit_rows = ResultsDir.open(suite.path / "tinyvit").rows()
    assert len({RunId.of_row(r) for r in vit_rows}) == 8 and all(r in vit_rows for r in partial)
    card = write_scorecard(resumed)
    assert card["missing"] == [] and all(w["complete"] for w in card["workloads"])


@pytest.mark.slow
def test_the_scorecard_page_renders_in_headless_chromium(tiny_suite, tmp_path: Path) -> None:
    """What a person sees: the scorecard page rendered by Debian's Chromium, screenshotted, not blank."""
    import shutil
    import subprocess

    pytest.importorskip("matplotlib")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("needs Debian's chromium package (apt-get install chromium)")
    suite, _card = tiny_suite
    shot = tmp_path / "scorecard.png"
    subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    "--window-size=1400,2200", f"--screenshot={shot}", (suite.path / "report.html").as_uri()],
                   capture_output=True, timeout=120, check=True)
    from matplotlib import image

    pixels = image.imread(str(shot))
    assert pixels.shape[:2] == (2200, 1400)
    assert pixels[..., :3].std() > 0.05  # text, tables and the profile figure, not an empty page
    figure = image.imread(str(suite.path / "profile.png"))
    assert figure.shape[0] > 300 and figure[..., :3].std() > 0.05
