"""`normkit suite` as a hostile user meets it: a failing norm, norms no workload can host, edited or
damaged plans, foreign and crash-left task directories, a new plan slipped into --resume, version
changes, a closed pipe. Real runs of tiny workloads registered here (a 2-layer CNN of width 4 at batch
256, one epoch), no mocks."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import normkit
from normkit.stages import Step
from normkit.testing import temporary_plugin
from normkit_cli.app import app
from normkit_lab.store.results import ResultsDir
from normkit_lab.suite.run import SUITE_JSON, SuitePlan, create_suite

runner = CliRunner()
TINY = {"question": "does it train a tiny net?",
        "config": {"model": "small-cnn", "model_params": {"depth": 2, "width": 4}, "batch_size": 256, "epochs": 1},
        "tune": {"lr": [0.1]}, "target": 10.0,
        "quick": {"model_params": {"width": 2}, "target": 5.0}}
TINY_LM = {"question": "does it train a tiny causal model?",
           "config": {"model": "gpt-tiny", "dataset": "pysrc", "epochs": 1,
                      "dataset_params": {"seq_len": 16, "train_windows": 64, "test_windows": 32, "stream": False}},
           "tune": {"lr": [0.01]}, "target": 8.0}


class Explode:
    broken = True


class ExplodingStep(Step):
    name = "explode"

    def forward(self, x, groups, layer):
        if Explode.broken and not x.is_meta:
            raise RuntimeError("explode: a plugin bug")
        return x


def exploding_step(ctx) -> ExplodingStep:
    return ExplodingStep()


class TinyPlugin:
    @normkit.hookimpl
    def normkit_register_workloads(self, register):
        register("tiny", TINY)
        register("tinylm", TINY_LM)

    @normkit.hookimpl
    def normkit_register_stages(self, register):
        register("explode", exploding_step, kind="step", position="after", summary="raises (tests)")


@pytest.fixture(autouse=True)
def tiny(monkeypatch, tmp_path):
    monkeypatch.setenv("CI", "1")  # plain progress lines
    monkeypatch.chdir(tmp_path)
    with temporary_plugin(TinyPlugin(), "tiny-suite"):
        yield


def suite(*args: str):
    return runner.invoke(app, ["suite", *args])


def tree_hash(root: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        h.update(str(path.relative_to(root)).encode())
        if path.is_file():
            h.update(path.read_bytes())
    return h.hexdigest()


def one_line_error(result, *needles: str) -> str:
    assert result.exit_code == 2, (result.exit_code, result.output)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in result.output, result.output
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def test_a_failing_norm_makes_the_suite_exit_1_shows_failures_per_norm_and_is_not_ranked(tmp_path: Path) -> None:
    out = tmp_path / "s"
    Explode.broken = True
    result = suite("--norms", "bn,bn+explode", "--workloads", "tiny", "--seeds", "2", "--out", str(out))
    assert result.exit_code == 1, result.output
    assert "3 runs failed (bn+explode 3; first: bn+explode failed:" in result.stderr
    assert f"normkit suite --resume {out}" in result.stderr
    etas = [line.rsplit("ETA ", 1)[1] for line in result.stdout.splitlines() if "ETA " in line]
    assert etas and any(eta[0].isdigit() for eta in etas), result.stdout  # a real ETA, not `ETA -` everywhere
    assert "bn+explode 3 failed" in result.stdout and "not ranked: 3 failed runs on tiny" in result.stdout
    card = json.loads((out / "scorecard.json").read_text())
    (work,) = card["workloads"]
    bad = work["norms"][1]
    assert (bad["runs"], bad["failed"], bad["tuning_runs"], bad["tuning_failed"]) == (0, 2, 0, 1)
    assert bad["error"].startswith("bn+explode failed:")
    assert not work["complete"] and card["missing"] == ["tiny"] and not card["complete"]
    assert card["failed_runs"] == {"bn+explode": 3}
    visible = card["visible"]
    assert visible["norms"] == ["bn"] and "bn+explode" not in visible["mean_rank"]
    assert visible["unranked"] == {"bn+explode": "3 failed runs on tiny"}
    page = (out / "report.html").read_text()
    assert "Failed runs per norm: bn+explode 3" in page and "not ranked: 3 failed runs on tiny" in page
    assert "href='./tiny/report.html'" in page

    Explode.broken = False  # fixed: the resume retries the failed runs, and the suite is whole
    result = suite("--resume", str(out))
    assert result.exit_code == 0, result.output
    card = json.loads((out / "scorecard.json").read_text())
    assert card["complete"] and card["missing"] == [] and card["failed_runs"] == {}
    assert set(card["visible"]["mean_rank"]) == {"bn", "bn+explode"}


def test_a_workload_no_norm_given_can_run_is_marked_for_each_and_the_suite_goes_on(tmp_path: Path) -> None:
    out = tmp_path / "s"
    result = suite("--norms", "bn,bnn", "--workloads", "tinylm,tiny", "--seeds", "1", "--out", str(out))
    assert result.exit_code == 0, result.output
    assert "tinylm: gpt-tiny" in result.stdout and "no norm given can run it" in result.stdout
    assert "  bn left out: gpt-tiny is causal" in result.stdout
    card = json.loads((out / "scorecard.json").read_text())
    lm, work = card["workloads"]
    assert [n["excluded"] is not None for n in lm["norms"]] == [True, True] and lm["complete"] and lm["dir"] is None
    assert work["complete"] and card["missing"] == [] and not (out / "tinylm").exists()
    assert card["visible"]["ratios"]["tinylm"] == {"bn": None, "bnn": None}  # a miss for each
    assert "No norm given can run this workload." in (out / "report.html").read_text()


def test_the_project_norms_check_the_language_model_before_training_anything() -> None:
    """`--norms bn,gn+pn` on the built-in lm: known unable to run before a run starts (no exit 2 after
    the other workloads trained)."""
    from normkit_lab.suite.run import check_plan

    plan = SuitePlan.make("bn,gn+pn", seeds=3, workloads=["lm"])
    ((task, cfg, excluded),) = check_plan(plan)
    assert task.name == "lm" and cfg is None and set(excluded) == {"bn", "gn+pn"}
    assert plan.excluded == {"lm": excluded}


def made(tmp_path: Path, seeds: str = "1", norms: str = "bn") -> Path:
    """A suite directory as `normkit suite` leaves it when stopped before its first run."""
    return create_suite(SuitePlan.make(norms, seeds, ["tiny"]), tmp_path / f"s{seeds}{norms}").path


def edit(path: Path, **changes) -> None:
    data = json.loads((path / SUITE_JSON).read_text())
    data.update(changes)
    (path / SUITE_JSON).write_text(json.dumps({k: v for k, v in data.items() if v is not None}))


@pytest.mark.parametrize(("changes", "needle"), [
    ({"seeds": [0, 1, 2, 3, 4]}, "was edited after the suite was created (seeds: [0] -> [0, 1, 2, 3, 4])"),
    ({"norms": ["bn", "ln"]}, "was edited after the suite was created (norms: ['bn'] -> ['bn', 'ln'])"),
    ({"norms": ["bogus"]}, "holds a plan this installation cannot run (unknown norm or stage 'bogus'"),
    ({"workloads": ["../../x"]}, "holds a plan this installation cannot run (unknown workload '../../x'"),
    ({"seeds": "0-4"}, "they must be a list of integers"),
    ({"excluded": "x"}, "has excluded 'x'"),
    ({"excluded": {"tiny": ["bn"]}}, "has excluded"),
    ({"runtime": {"device": 3}}, "has runtime"),
    ({"identity": None}, "has a missing or damaged identity"),
    ({"format": 1, "identity": None, "seeds": [0, 1]},
     "is not the 'tiny' workload of this suite's plan (seeds: [0] there, [0, 1] in the plan"),
])
def test_an_edited_or_damaged_suite_json_is_refused_in_one_line_and_nothing_changes(tmp_path: Path, changes,
                                                                                    needle) -> None:
    path = made(tmp_path)
    edit(path, **changes)
    before = tree_hash(tmp_path)
    one_line_error(suite("--resume", str(path)), needle)
    assert tree_hash(tmp_path) == before


def test_a_damaged_suite_json_is_one_line(tmp_path: Path) -> None:
    path = made(tmp_path)
    for text in ("[1, 2]", "{", "\xff\xfe"):
        (path / SUITE_JSON).write_text(text, encoding="latin-1")
        one_line_error(suite("--resume", str(path)), "suite.json")
    one_line_error(suite("--resume", str(path / SUITE_JSON)), "is not a directory")


@pytest.mark.parametrize(("args", "needle"), [
    (["--seeds", "9"], "drop --seeds"), (["--scale", "paper"], "drop --scale"), (["--quick"], "drop --quick"),
    (["--norms", "bn"], "drop --norms"), (["--holdout"], "drop --holdout"),
    (["--workloads", "tiny"], "drop --workloads"),
])
def test_resume_refuses_a_new_plan_rather_than_ignoring_it(tmp_path: Path, args, needle) -> None:
    path = made(tmp_path)
    before = tree_hash(tmp_path)
    one_line_error(suite("--resume", str(path), *args), needle, "saved plan")
    assert tree_hash(tmp_path) == before


def test_a_task_directory_a_crash_left_without_config_is_adopted_and_one_with_other_files_refused(
        tmp_path: Path) -> None:
    path = made(tmp_path)
    shutil.rmtree(path / "tiny")
    (path / "tiny").mkdir()  # a crash between the directory's mkdir and its config.yaml
    (path / "tiny" / ".config.yaml.123.0badf00d.tmp").write_text("half")
    result = suite("--resume", str(path))
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in path.iterdir() if p.is_dir()) == ["tiny"]  # no tiny-1
    assert len({(r["norm"], r["seed"], r["phase"]) for r in ResultsDir.open(path / "tiny").rows()}) == 2
    assert json.loads((path / "scorecard.json").read_text())["complete"]

    other = made(tmp_path, norms="ln")
    shutil.rmtree(other / "tiny")
    (other / "tiny").mkdir()
    (other / "tiny" / "notes.txt").write_text("mine")
    one_line_error(suite("--resume", str(other)), "has no config.yaml but holds other files")
    assert (other / "tiny" / "notes.txt").read_text() == "mine"


def test_a_foreign_directory_is_never_adopted_as_a_task_store(tmp_path: Path) -> None:
    mine, foreign = made(tmp_path, seeds="2"), made(tmp_path, seeds="1")
    shutil.rmtree(mine / "tiny")
    shutil.copytree(foreign / "tiny", mine / "tiny")  # another suite's workload in this one's place
    before = tree_hash(tmp_path)
    one_line_error(suite("--resume", str(mine)), "is not the 'tiny' workload of this suite's plan",
                   "seeds: [0] there, [0, 1] in the plan")
    assert tree_hash(tmp_path) == before
    # a second suite with the same --out gets a directory of its own
    again = create_suite(SuitePlan.make("bn", 2, ["tiny"]), mine).path
    assert again != mine and again.name == f"{mine.name}-1"


def test_an_allowed_version_change_is_recorded_so_the_next_plain_resume_goes_on(tmp_path: Path) -> None:
    path = made(tmp_path)
    env_file = path / "tiny" / "environment.json"
    saved = json.loads(env_file.read_text())
    running, saved["versions"]["torch"] = saved["versions"]["torch"], "0.0.1"
    env_file.write_text(json.dumps(saved))
    before = tree_hash(tmp_path)
    line = one_line_error(suite("--resume", str(path)), f"torch 0.0.1 -> {running}", "--allow-version-change")
    assert "continue with" not in line  # no hint that the same refusal would answer
    assert tree_hash(tmp_path) == before
    result = suite("--resume", str(path), "--allow-version-change")
    assert result.exit_code == 0, result.output
    assert json.loads(env_file.read_text())["resumes"][0]["changes"] == [f"torch 0.0.1 -> {running}"]
    result = suite("--resume", str(path))
    assert result.exit_code == 0 and "warning" not in result.stderr, result.output


def test_device_and_data_dir_are_honoured_on_resume(tmp_path: Path) -> None:
    path = made(tmp_path)
    before = tree_hash(tmp_path)
    one_line_error(suite("--resume", str(path), "--device", "bogus"), "unknown device 'bogus'")
    assert tree_hash(tmp_path) == before


def test_quick_is_a_smoke_test_in_the_scorecard_the_page_and_the_terminal(tmp_path: Path) -> None:
    out = tmp_path / "smoke"
    result = suite("--norms", "bn,ln", "--workloads", "tiny", "--quick", "--seeds", "1", "--out", str(out))
    assert result.exit_code == 0, result.output
    assert "this is a smoke test (--quick), not a result" in result.stdout
    assert "inconclusive" not in result.stdout and "mean rank" not in result.stdout
    card = json.loads((out / "scorecard.json").read_text())
    assert card["smoke_test"] and "not a result" in card["note"]
    assert card["visible"] is None and all(n["verdict"] is None for n in card["workloads"][0]["norms"])
    page = (out / "report.html").read_text()
    assert "This is a smoke test (--quick), not a result" in page and "Across the visible workloads" not in page
    assert not (out / "profile.png").exists()


def test_links_on_the_scorecard_page_are_relative_and_quoted() -> None:
    from normkit_lab.suite.page import _href

    assert _href("cnn@narrow") == "./cnn%40narrow/report.html"
    for hostile in ("javascript:alert(1)", "/etc", "../../x", "a'b\"c<d>"):
        href = _href(hostile)
        assert href.startswith("./") and href.count("/") == 2 and not set("'\"<>:") & set(href), href


def test_list_into_a_closed_pipe_exits_0_quietly(tmp_path: Path) -> None:
    code = "from normkit_cli.app import main; main()"
    run = subprocess.run(["bash", "-c", f"set -o pipefail; {sys.executable} -c '{code}' suite --list | head -1"],
                         capture_output=True, text=True, env={**os.environ, "COLUMNS": "80"}, timeout=120)
    assert run.returncode == 0 and run.stderr == "", run.stderr
    assert run.stdout.startswith("small-batch ")


RESUME_SCRIPT = """
import json, sys
import normkit
from normkit.testing import temporary_plugin

class Tiny:
    @normkit.hookimpl
    def normkit_register_workloads(self, register):
        register("tiny", json.loads(sys.argv[1]))

with temporary_plugin(Tiny(), "tiny-suite"):
    from normkit_cli.app import main
    sys.argv = ["normkit", "suite", "--resume", sys.argv[2]]
    main()
"""


@pytest.mark.slow
def test_two_resumes_at_once_train_each_run_once(tmp_path: Path) -> None:
    path = create_suite(SuitePlan.make("bn,ln", 3, ["tiny"]), tmp_path / "s").path
    shutil.rmtree(path / "tiny")  # not created yet: both resumes reach it at once
    script = tmp_path / "resume.py"
    script.write_text(RESUME_SCRIPT)
    procs = [subprocess.Popen([sys.executable, str(script), json.dumps(TINY), str(path)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env={**os.environ, "CI": "1"}) for _ in range(2)]
    outputs = [p.communicate(timeout=500) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    assert sorted(p.name for p in path.iterdir() if p.is_dir()) == ["tiny"]  # not tiny and tiny-1
    rows = ResultsDir.open(path / "tiny").rows()
    ids = [(r["norm"], r["seed"], r["phase"]) for r in rows]
    assert len(ids) == len(set(ids)) == 8 and all(r["status"] == "ok" for r in rows)  # each run trained once
