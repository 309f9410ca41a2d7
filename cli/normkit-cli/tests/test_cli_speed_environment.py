"""What a results directory records about the machine and what the table says about speed: CPU model and
vector instruction sets, the threads runs used, the load at start and end, CPU time beside wall time,
and a load warning when the machine was busier than its cores."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from normkit_cli.app import app
from normkit_lab.analysis.summary import Run, summarize
from normkit_lab.metrics import metric_named

runner = CliRunner()


def test_environment_records_isa_threads_and_load_and_the_table_shows_cpu_time(tmp_path):
    out = tmp_path / "speed"
    result = runner.invoke(app, ["compare", "--dataset", "digits", "--norms", "bn,gn", "--seeds", "1", "--epochs",
                                 "1", "--batch-size",
                                 "128", "--device", "cpu", "--out", str(out)], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    env = json.loads((out / "environment.json").read_text())
    assert env["threads_per_run"] == 1 and env["torch_threads"] >= 1  # the runs' threads, not the process's
    assert set(env["vector_isa"]) == {"cpu", "torch"}
    assert env["vector_isa"]["cpu"] in (None, "AVX-512", "AVX2", "AVX", "SSE4.2", "SVE", "NEON")
    assert len(env["load_average_start"]) == 3 and len(env["load_average_end"]) == 3
    rows = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    assert all(r["cpu_time_s"] > 0 and r["cpu_cores"] >= 1 and r["load_avg"] >= 0 for r in rows)
    assert "CPU s/epoch" in result.output and "s/epoch" in result.output
    summary = json.loads((out / "summary.json").read_text())
    assert all(row["cpu_time_per_epoch_s"] > 0 and row["steps"] == 8 for row in summary)  # 1151 // 128 steps


def _run(norm: str, seed: int, load: float) -> Run:
    return Run(norm, seed, "ok", 1, epochs=[{"epoch": 0, "val_acc": 0.5, "test_acc": 0.9 + seed / 100,
                                             "epoch_time_s": 2.0, "cpu_time_s": 1.0, "load_avg": load,
                                             "cpu_cores": 2}])


def test_a_load_above_the_cores_warns_that_wall_times_are_inflated():
    busy = summarize([_run("bn", s, 1.5) for s in range(3)] + [_run("gn", s, 7.2) for s in range(3)],
                     ["bn", "gn"], "bn", metric_named("test_acc"))
    (note,) = [n for n in busy.notes if n.startswith("load warning")]
    assert "reached 7.2 on 2 cores while gn trained" in note and "compare CPU s/epoch" in note
    idle = summarize([_run("bn", s, 1.5) for s in range(3)], ["bn"], "bn", metric_named("test_acc"))
    assert not [n for n in idle.notes if n.startswith("load warning")]
