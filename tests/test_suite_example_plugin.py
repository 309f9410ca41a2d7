"""A third-party plugin takes part in `normkit suite` with no change to normkit: the example plugin,
installed as a real package, adds its norm to the suite's comparison and its workload to the suite."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "normkit-example"


@pytest.mark.slow
def test_the_example_plugins_norm_and_workload_run_in_the_suite(tmp_path: Path) -> None:
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--no-index", "--target", str(target), str(EXAMPLE)], check=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(target), os.environ.get("PYTHONPATH", "")]),
           "NORMKIT_STRICT_PLUGINS": "1"}
    normkit = [sys.executable, "-c", "from normkit_cli.app import main; main()"]
    listed = subprocess.run([*normkit, "suite", "--list"], env=env, capture_output=True, text=True, check=True)
    assert "narrow-cnn" in listed.stdout and "plugin example" in listed.stdout
    out = tmp_path / "suite"
    run = subprocess.run([*normkit, "suite", "--norms", "bn,scbn", "--workloads", "narrow-cnn", "--out", str(out)],
                         env=env, capture_output=True, text=True, cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    card = json.loads((out / "scorecard.json").read_text())
    (workload,) = card["workloads"]
    assert workload["plugin"] == "example" and workload["baseline"] == "bn"
    scbn = workload["norms"][1]
    assert scbn["norm"] == "scbn" and scbn["runs"] == 3 and scbn["tuning_runs"] == 2 and scbn["verdict"] is not None
    assert "scbn" in card["visible"]["mean_rank"]
