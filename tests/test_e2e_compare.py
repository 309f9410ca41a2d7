"""End to end: `normkit compare` and `normkit report` through the Typer app, with real (tiny) training.

Tiny settings: small-cnn of depth 2 on the bundled digits, one epoch, two seeds.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

import normkit
from normkit_cli.app import app
from normkit_lab.runs import builtin as lab_execute

NORMS = ["bn", "gn+pn"] + (["bnn"] if any(e["name"] == "bnn" for e in normkit.available()) else [])
TINY = ["--epochs", "1", "--batch-size", "128", "--seeds", "2", "--model-param", "depth=2"]
runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(app, [str(a) for a in args])


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def compared(tmp_path_factory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("e2e") / "cmp"
    result = invoke("compare", "--dataset", "digits", "--norms", ",".join(NORMS), *TINY, "--out", out)
    assert result.exit_code == 0, result.output
    return out, result.output


def test_compare_writes_every_file(compared):
    out, output = compared
    assert f"Δ vs {NORMS[0]}" in output and f"results: {out}" in output
    cfg = yaml.safe_load((out / "config.yaml").read_text())
    assert cfg["norms"] == NORMS and cfg["seeds"] == [0, 1] and cfg["epochs"] == 1
    rows = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    assert sorted((r["norm"], r["seed"], r["epoch"]) for r in rows) == sorted(
        (n, s, 0) for n in NORMS for s in (0, 1))
    assert all(r["status"] == "ok" and r["device"] == "cpu" and r["host"] and r["torch_version"] for r in rows)
    assert all(0.0 <= r["val_acc"] <= 1.0 for r in rows)
    summary = list(csv.DictReader((out / "summary.csv").open()))
    assert [r["norm"] for r in summary] == NORMS
    assert summary[0]["diff_note"] == "baseline" and all(r["ok"] == "2" for r in summary)
    assert all(r["diff_ci95_low"] and r["diff_p_value"] for r in summary[1:])
    assert [r["norm"] for r in json.loads((out / "summary.json").read_text())] == NORMS
    env = json.loads((out / "environment.json").read_text())
    assert env["versions"]["torch"] and env["device"] == "cpu" and env["torch_threads"] >= 1
    assert {"lab", "standard"} <= {p["name"] for p in env["plugins"]}
    logs = sorted((out / "metrics" / "steps").glob("*.csv"))  # every step's loss and lr, for curves.png
    assert len(logs) == 2 * len(NORMS)
    steps = [line.split(",") for line in logs[0].read_text().splitlines()[1:]]
    assert [int(s[0]) for s in steps] == list(range(1, 9)) and {s[1] for s in steps} == {"0"}  # 1151 // 128 steps
    assert float(steps[0][3]) > float(steps[-1][3]) > 0  # the cosine schedule decays within the one epoch
    pytest.importorskip("matplotlib")
    assert all((out / name).stat().st_size > 0 for name in ("forest.png", "primary_metric.png", "curves.png"))
    assert (out / "report.html").read_text().count("data:image/png;base64,") == 3


def test_report_prints_and_merges_without_touching_its_inputs(compared, tmp_path):
    out, _ = compared
    before = snapshot(out)
    result = invoke("report", out)
    assert result.exit_code == 0, result.output
    assert f"Δ vs {NORMS[0]}" in result.output and "verdict" in result.output
    assert snapshot(out) == before

    extra = tmp_path / "extra"
    result = invoke("compare", "--dataset", "digits", "--norms", NORMS[0], "--epochs", "1", "--batch-size", "128",
                    "--seeds", "2-2",
                    "--model-param", "depth=2",
                    "--out", extra)
    assert result.exit_code == 0, result.output
    merged = tmp_path / "merged"
    before = {**snapshot(out), **{f"extra/{k}": v for k, v in snapshot(extra).items()}}
    result = invoke("report", out, extra, "--out", merged)
    assert result.exit_code == 0, result.output
    assert {**snapshot(out), **{f"extra/{k}": v for k, v in snapshot(extra).items()}} == before
    assert (merged / "report.html").is_file()
    rows = [json.loads(line) for line in (merged / "runs.jsonl").read_text().splitlines()]
    assert {(r["norm"], r["seed"]) for r in rows if r["norm"] == NORMS[0]} == {(NORMS[0], s) for s in (0, 1, 2)}
    summary = json.loads((merged / "summary.json").read_text())
    assert [r["runs"] for r in summary] == [3] + [2] * (len(NORMS) - 1)
    steps = sorted(p.name for p in (merged / "metrics" / "steps").iterdir())  # every run's step log came along
    assert steps == sorted([p.name for p in (out / "metrics" / "steps").iterdir()]
                           + [p.name for p in (extra / "metrics" / "steps").iterdir()])


def test_report_refuses_different_configs_and_duplicate_runs(compared, tmp_path):
    out, _ = compared
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    result = invoke("report", out, copy)
    assert result.exit_code == 2 and "seed 0 is in both" in result.output
    cfg = yaml.safe_load((copy / "config.yaml").read_text())
    (copy / "config.yaml").write_text(yaml.safe_dump({**cfg, "epochs": 2, "batch_size": 128}))
    result = invoke("report", out, copy)
    assert result.exit_code == 2 and "was edited after the store was created (epochs: 1 -> 2)" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_interrupted_compare_resumes_only_the_missing_runs(tmp_path, monkeypatch):
    real = lab_execute.train_run
    calls: list[tuple[str, int]] = []

    def interrupt_after_first(cfg, norm, seed, **kw):
        if calls:  # a real Ctrl-C (a KeyboardInterrupt merely raised by a run's code is that run's failure)
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(30)
        calls.append((norm, seed))
        return real(cfg, norm, seed, **kw)

    out = tmp_path / "cmp"
    monkeypatch.setattr(lab_execute, "train_run", interrupt_after_first)
    result = invoke("compare", "--dataset", "digits", "--norms", "bn,gn+pn", *TINY, "--out", out)
    assert result.exit_code == 130
    assert f"interrupted: 1 of 4 runs are saved in {out}; continue with: normkit compare --resume {out}" in (
        result.output)
    assert {(json.loads(line)["norm"], json.loads(line)["seed"]) for line in
            (out / "runs.jsonl").read_text().splitlines()} == {("bn", 0)}

    def counting(cfg, norm, seed, **kw):
        calls.append((norm, seed))
        return real(cfg, norm, seed, **kw)

    monkeypatch.setattr(lab_execute, "train_run", counting)
    result = invoke("compare", "--resume", out)
    assert result.exit_code == 0, result.output
    assert calls == [("bn", 0), ("gn+pn", 0), ("bn", 1), ("gn+pn", 1)]
    rows = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    assert sorted((r["norm"], r["seed"]) for r in rows) == [("bn", 0), ("bn", 1), ("gn+pn", 0), ("gn+pn", 1)]


def test_existing_out_is_never_overwritten(compared, tmp_path):
    out, _ = compared
    before = snapshot(out)
    result = invoke("compare", "--dataset", "digits", "--norms", "bn", "--epochs", "1", "--batch-size", "128",
                    "--seeds", "1",
                    "--model-param", "depth=2",
                    "--out", out)
    assert result.exit_code == 0, result.output
    assert snapshot(out) == before
    assert f"results: {out}-1" in result.output


BAD = [
    (["--norms", "bn,nosuchnorm"], "unknown norm or stage 'nosuchnorm'"),
    (["--norms", "bn", "--model", "nosuchmodel"], "unknown model 'nosuchmodel'"),
    (["--norms", "bn", "--dataset", "nosuchdata"], "unknown dataset 'nosuchdata'"),
    (["--norms", "bn", "--epochs", "0"], "epochs must be an integer in [1, 10,000]"),
    (["--norms", "bn", "--lr", "-1"], "lr must be a number > 0"),
    (["--norms", "bn", "--batch-size", "0"], "batch_size must be an integer in [1, 65,536]"),
    (["--norms", "bn", "--seeds", "0"], "selects no seed"),
    (["--norms", "bn", "--seeds", "1,1"], "repeat a seed"),
    (["--norms", "bn,bn"], "listed twice"),
    (["--norms", "bn,gn+pn", "--model", "resnet18"], "model 'resnet18' cannot host 'gn+pn'"),
    (["--norms", "bn,ln", "--baseline", "gn"], "baseline 'gn' is not one of the compared norms"),
    (["--norms", "bn", "--dataset", "cifar10", "--data-dir", "{tmp}/empty"], "not found in"),
    (["--norms", "bn", "--config", "{tmp}/missing.yaml"], "cannot read config"),
    (["--norms", "bn", "--config", "{tmp}/bad.yaml"], "unknown key 'epoch' in"),
    (["--norms", "bn", "--config", "{tmp}/broken.yaml"], "is not valid YAML"),
    (["--epochs", "1"], "no norms to compare"),
    (["--resume", "{tmp}/done", "--epochs", "3"], "drop --epochs"),
    (["--resume", "{tmp}"], "has no config.yaml"),
]


@pytest.mark.parametrize(("args", "message"), BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(args, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.yaml").write_text("epoch: 3\n")
    (tmp_path / "broken.yaml").write_text("norms: [bn\n")
    (tmp_path / "empty").mkdir()
    done = tmp_path / "done"
    done.mkdir()
    (done / "config.yaml").write_text("norms: [bn]\nseeds: [0]\n")
    (done / "runs.jsonl").write_text('{"norm": "bn", "seed": 0}\n')
    before = snapshot(tmp_path)
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    out = [] if "--resume" in args else ["--out", str(tmp_path / "fresh")]
    result = invoke("compare", *args, *out)
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], result.output
    assert snapshot(tmp_path) == before  # nothing written, nothing removed (no runs/ and no fresh/)


def test_report_of_a_non_results_directory(tmp_path):
    result = invoke("report", tmp_path)
    assert result.exit_code == 2 and result.output.strip().splitlines() == [
        f"error: '{tmp_path}' has no config.yaml; give a directory written by `normkit compare`"]


def test_compare_tunes_on_disjoint_seeds_and_sweeps_cells(tmp_path):
    out = tmp_path / "tuned"
    result = invoke("compare", "--dataset", "digits", "--norms", "bn,ln", "--epochs", "1", "--seeds", "2",
                    "--model-param", "depth=2",
                    "--tune", "lr=0.05,0.1", "--tune-seeds", "1", "--sweep", "batch_size=64,128", "--out", out)
    assert result.exit_code == 0, result.output
    assert "8 tuning runs + 8 comparison runs" in result.output and "tuning (val accuracy" in result.output
    rows = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    tune = [r for r in rows if r["phase"] == "tune"]
    assert {r["seed"] for r in tune} == {2} and {r["seed"] for r in rows if r["phase"] == "compare"} == {0, 1}
    assert {r["cell"]["batch_size"] for r in rows} == {64, 128} and all(r["test_acc"] is not None for r in rows)
    table = json.loads((out / "tuning.json").read_text())
    assert len(table) == 8 and sum(r["chosen"] for r in table) == 4
    cfg = yaml.safe_load((out / "config.yaml").read_text())
    assert cfg["tune"] == {"lr": [0.05, 0.1]} and cfg["tune_seeds"] == [2] and cfg["sweep"] == {
        "batch_size": [64, 128]}


def test_overlapping_tune_seeds_are_one_line_errors(tmp_path):
    result = invoke("compare", "--dataset", "digits", "--norms", "bn", "--seeds", "0-2", "--tune", "lr=0.1,0.3",
                    "--tune-seeds", "2,5",
                    "--out", tmp_path / "x")
    assert result.exit_code == 2 and "tune_seeds 2 are also comparison seeds" in result.output
    assert len(result.output.strip().splitlines()) == 1 and not (tmp_path / "x").exists()


def test_report_reads_a_swept_comparison_again(tmp_path):
    out = tmp_path / "swept"
    result = invoke("compare", "--dataset", "digits", "--norms", "bn,ln", "--epochs", "1", "--seeds", "2",
                    "--model-param", "depth=2",
                    "--sweep", "batch_size=64,128", "--out", out)
    assert result.exit_code == 0, result.output
    again = invoke("report", out)
    assert again.exit_code == 0, again.output
