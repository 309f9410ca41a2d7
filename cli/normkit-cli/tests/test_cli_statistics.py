"""What the CLI says about the statistics: diagnostic and interaction verdicts, planning notes,
--cpu-threads, the tuning grid-edge warning, metric-only merges; all from real (tiny) comparisons."""

from __future__ import annotations

import json
import os
import warnings

import pytest
from typer.testing import CliRunner

from normkit_cli.app import app
from normkit_cli.compare import grid_edge_warnings

runner = CliRunner()
TINY = ["--epochs", "1", "--batch-size", "128", "--device", "cpu", "--cpu-threads", "1"]


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args], env={"COLUMNS": "200"})


def test_grid_edge_warning_names_the_norm_and_the_side():
    table = [{"cell": {}, "norm": "bn", "values": {"lr": lr}, "val_acc": acc, "chosen": chosen}
             for lr, acc, chosen in ((0.03, 0.5, False), (0.1, 0.7, False), (0.3, 0.9, True))]
    table += [{"cell": {}, "norm": "gn", "values": {"lr": lr}, "val_acc": acc, "chosen": chosen}
              for lr, acc, chosen in ((0.03, 0.5, False), (0.1, 0.9, True), (0.3, 0.7, False))]
    (line,) = grid_edge_warnings(table)
    assert "lr=0.3 for bn, the largest value tried" in line


def test_bad_cpu_threads_is_one_line_and_writes_nothing(tmp_path):
    os.chdir(tmp_path)
    result = invoke("compare", "--dataset", "digits", "--norms", "bn", "--seeds", "1", "--epochs", "1",
                    "--batch-size", "128", "--device",
                    "cpu",
                    "--cpu-threads", "0", "--out", tmp_path / "out")
    assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1, result.output
    assert "cpu_threads" in result.stderr and not (tmp_path / "out").exists()


@pytest.mark.slow
def test_sweep_prints_interaction_verdicts_and_merges_across_metrics(tmp_path):
    out = tmp_path / "sweep"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no library warning reaches the output
        result = invoke("compare", "--dataset", "digits", "--norms", "bn,gn", "--seeds", "3", *TINY, "--sweep",
                        "batch_size=16,64",
                        "--out", out)
    assert result.exit_code == 0, result.output
    assert "interactions: does the gap to bn depend on the swept key?" in result.output
    assert "depends on batch_size" in result.output or "no evidence that it depends on batch_size" in result.output
    assert "Warning" not in result.output and "strictest Holm step" in result.output
    assert "\ncpu_threads: 1\n" in (out / "config.yaml").read_text()
    rows = json.loads((out / "summary.json").read_text())
    (inter,) = [i for r in rows for i in r["interactions"]]
    assert (inter["norm"], inter["key"], inter["from"], inter["to"], inter["n"]) == ("gn", "batch_size", 16, 64, 3)
    assert "<h2>Interactions</h2>" in (out / "report.html").read_text()
    # a second directory that differs only in --metric merges
    other = tmp_path / "loss"
    assert invoke("compare", "--dataset", "digits", "--norms", "bn,gn", "--seeds", "3-5", *TINY, "--sweep",
                  "batch_size=16,64",
                  "--metric", "test_loss", "--out", other).exit_code == 0
    merged = invoke("report", out, other, "--out", tmp_path / "merged")
    assert merged.exit_code == 0, merged.output
    assert [i["n"] for r in json.loads((tmp_path / "merged" / "summary.json").read_text())
            for i in r["interactions"]] == [6]


@pytest.mark.slow
def test_diagnostics_prints_and_saves_verdicts(tmp_path):
    out = tmp_path / "diag"
    result = invoke("compare", "--dataset", "digits", "--norms", "bn,bnn,bnn(noise=0)", "--seeds", "3", *TINY,
                    "--diagnostics",
                    "--out", out)
    assert result.exit_code == 0, result.output
    assert "representation measures vs bn, paired by seed" in result.output
    rows = {r["norm"]: r for r in json.loads((out / "summary.json").read_text())}
    measures = {d["measure"] for d in rows["bnn"]["diagnostic_verdicts"]}
    assert {"qq_r2 depth 1", "zeta"} <= measures
    assert rows["bn"]["diagnostic_verdicts"] == []
    verdicts = {d["verdict"] for r in rows.values() for d in r["diagnostic_verdicts"]}
    assert verdicts <= {"higher", "lower", "no evidence of a difference"}
    assert "<h2>Representation measures</h2>" in (out / "report.html").read_text()
