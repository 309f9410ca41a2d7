"""`normkit compare --ablate` and `normkit report`: the stage-ablation table and its attribution lines,
from a real (tiny) comparison."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from normkit_cli.app import app

runner = CliRunner()
TINY = ["--epochs", "1", "--batch-size", "128", "--device", "cpu", "--cpu-threads", "1", "--seeds", "3"]


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args], env={"COLUMNS": "200"})


def test_ablate_trains_the_arms_and_reports_them_apart(tmp_path):
    out = tmp_path / "abl"
    result = invoke("compare", "--dataset", "digits", "--norms", "bn,gn+pn", "--ablate", *TINY, "--out", out)
    assert result.exit_code == 0, result.output
    assert "compare bn, gn+pn (and their stage ablations gn(groups=8))" in result.output
    assert "stage ablations: what switching each stage off changes" in result.output
    assert "Holm over the ablations'" in result.output
    assert "ablation: gn+pn" in result.output and "switching off proxy step (gn(groups=8))" in result.output
    rows = {r["norm"]: r for r in json.loads((out / "summary.json").read_text())}
    assert set(rows) == {"bn", "gn+pn"}  # the arm is not a row of the comparison
    (stage,) = rows["gn+pn"]["ablations"]
    assert stage["arm"] == "gn(groups=8)" and stage["n"] == 3
    again = invoke("report", out)
    assert again.exit_code == 0 and "ablation: gn+pn" in again.output
