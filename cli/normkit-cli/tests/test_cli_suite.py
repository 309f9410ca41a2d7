"""`normkit suite`: --list, and bad input as one line with exit 2 before any directory is made. The
suite's runs are tested in normkit-lab (test_suite_run.py) and with a plugin norm in
tests/test_suite_example_plugin.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from normkit_cli.app import app

runner = CliRunner()


def test_list_shows_every_workload_on_one_line_with_what_it_asks() -> None:
    result = runner.invoke(app, ["suite", "--list"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    for name in ("small-batch", "cnn", "deep-resnet", "vit", "lm"):
        line = next(line for line in lines if line.startswith(name + " "))
        assert re.search(r"tune [3-7] trials \(lr=", line) and "target val_" in line
    assert "batch 16 (norm batch 2), budget steps=300" in result.output  # small-batch: ghost batches of 2
    assert "batch 16, budget steps=300" in result.output  # cnn: the same steps, normalizing over the whole batch
    assert result.output.count("asks: ") == len([line for line in lines if not line.startswith(" ")])
    paper = runner.invoke(app, ["suite", "--list", "--scale", "paper"])
    assert "on cifar10" in paper.output and "budget steps=20000" in paper.output


@pytest.mark.parametrize(("args", "message"), [
    (["suite"], "give the norms to compare"),
    (["suite", "--norms", "bn", "--workloads", "nope"], "unknown workload 'nope'"),
    (["suite", "--norms", "bn,bn"], "listed twice"),
    (["suite", "--norms", "bn", "--holdout", "--scale", "paper"], "held-out variants are defined at CPU scale"),
    (["suite", "--norms", "bn", "--scale", "huge"], "--scale must be one of cpu, quick, paper"),
    (["suite", "--norms", "bn", "--quick", "--scale", "paper"], "drop --scale with it"),
    (["suite", "--norms", "bn", "--seeds", "0,0"], "repeat a seed"),
    (["suite", "--norms", "bn", "--seeds", "3", "--max-seeds", "5"], "apply to --seeds auto"),
    (["suite", "--norms", "bn", "--max-seeds", "2"], "max_seeds must be between 3"),
    (["suite", "--norms", "bn", "--max-cpu-minutes", "-1"], "max_cpu_minutes must be a number of minutes > 0"),
    (["suite", "--norms", "bn", "--allow-version-change"], "give it with --resume"),
    (["suite", "--norms", "bn", "--workloads", "cnn", "--device", "bogus"], "unknown device 'bogus'"),
    (["suite", "--norms", "bn", "--workloads", ""], "--workloads names no workload"),
    (["suite", "--norms", "bn", "--workloads", "cnn", "--scale", "bogus"], "--scale must be one of"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    out = tmp_path / "suite"
    result = runner.invoke(app, [*args, "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert message in result.output and result.output.startswith("error: ")
    assert len(result.output.strip().splitlines()) == 1
    assert not out.exists()  # refused before anything was written


def test_resume_needs_a_suite_directory_and_takes_no_new_plan(tmp_path: Path) -> None:
    result = runner.invoke(app, ["suite", "--resume", str(tmp_path)])
    assert result.exit_code == 2 and "has no suite.json" in result.output
    (tmp_path / "suite.json").write_text('{"norms": ["bn"], "colour": "red"}')
    result = runner.invoke(app, ["suite", "--resume", str(tmp_path)])
    assert result.exit_code == 2 and "is not a suite plan written by `normkit suite`" in result.output
    result = runner.invoke(app, ["suite", "--resume", str(tmp_path), "--norms", "bn"])
    assert result.exit_code == 2 and "continues a suite with its saved plan" in result.output
    result = runner.invoke(app, ["suite", "--resume", str(tmp_path), "--max-seeds", "5"])
    assert result.exit_code == 2 and "drop --max-seeds" in result.output
