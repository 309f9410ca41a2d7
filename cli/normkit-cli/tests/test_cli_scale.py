"""`normkit compare`'s scale-out flags: --jobs, --executor, --log, --keep-checkpoints, --nproc-per-node;
bad values are one line (exit 2) before anything is written."""

from __future__ import annotations

import os

import pytest
from typer.testing import CliRunner

from normkit_cli.app import app

runner = CliRunner()
TINY = ["--norms", "bn", "--epochs", "1", "--batch-size", "128", "--seeds", "1", "--device", "cpu"]


def assert_one_line_error(result, *needles: str) -> None:
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.mark.parametrize(("argv", "needle"), [
    (["--jobs", "0"], "--jobs must be an integer in [1, "),
    (["--jobs-per-gpu", "0"], "--jobs-per-gpu must be an integer in [1, "),
    (["--executor", "dask"], "unknown executor 'dask'; use one of local, ray, slurm"),
    (["--executor", "ray", "--jobs", "2"], "with --executor ray the cluster schedules the runs"),
    (["--log", "wandb"], "unknown --log kind 'wandb'"),
    (["--nproc-per-node", "0"], "nproc_per_node must be an integer in [1, 64]"),
    (["--nproc-per-node", "3"], "batch_size"),
    (["--slurm-param", "novalue"], "--slurm-param 'novalue' is not KEY=VALUE"),
])
def test_bad_scale_flags_are_one_line_and_write_nothing(tmp_path, argv, needle):
    os.chdir(tmp_path)
    result = runner.invoke(app, ["compare", "--dataset", "digits", *TINY, "--out", str(tmp_path / "out"), *argv])
    assert_one_line_error(result, needle)
    assert not (tmp_path / "out").exists() and not (tmp_path / "runs").exists()


def test_keep_checkpoints_and_tensorboard_write_per_run_files(tmp_path):
    out = tmp_path / "out"
    result = runner.invoke(app, ["compare", "--dataset", "digits", *TINY, "--out", str(out), "--keep-checkpoints",
                                 "--log", "tensorboard"])
    assert result.exit_code == 0, result.output
    assert [p.name.endswith(".final.pt") for p in (out / "checkpoints").iterdir()] == [True]
    assert len(list((out / "metrics").glob("*.csv"))) == 1
    assert any(p.name.startswith("events.out.tfevents") for p in (out / "tensorboard").rglob("*"))


def test_resume_may_change_how_runs_execute(tmp_path):
    out = tmp_path / "out"
    assert runner.invoke(app, ["compare", "--dataset", "digits", *TINY, "--out", str(out)]).exit_code == 0
    result = runner.invoke(app, ["compare", "--resume", str(out), "--jobs", "2", "--log", "tensorboard"])
    assert result.exit_code == 0, result.output
