"""`normkit diagnose` and `normkit compare --diagnostics` from the command line."""

from __future__ import annotations

import json

import pytest

typer_testing = pytest.importorskip("typer.testing")
app = pytest.importorskip("normkit_cli.app").app


def invoke(*args: str):
    return typer_testing.CliRunner().invoke(app, list(args))


def test_random_net_prints_the_table_and_writes_files(tmp_path):
    result = invoke("diagnose", "--random-net", "--depth", "6", "--width", "8", "--batch", "8", "--image-size", "8",
                    "--seeds", "1", "--norms", "bn,ln", "--out", str(tmp_path))
    assert result.exit_code == 0, result.output
    assert "| depth | bn dataset share | ln dataset share |" in result.output
    saved = json.loads((tmp_path / "random_net.json").read_text())
    assert list(saved["norms"]) == ["bn", "ln"] and len(saved["norms"]["ln"]) == 6


@pytest.mark.parametrize("args", [
    ("diagnose", "--random-net", "--norms", "no-such-norm"),
    ("diagnose", "/no/such/results/dir"),
    ("diagnose", "--random-net", "/tmp"),
])
def test_bad_input_is_one_line_and_exit_2(args):
    result = invoke(*args)
    assert result.exit_code == 2
    assert result.output.count("error:") == 1


def test_compare_with_diagnostics_writes_the_report(tmp_path):
    out = tmp_path / "cmp"
    result = invoke("compare", "--norms", "bn,bnn", "--epochs", "1", "--seeds", "1", "--model-param", "width=4",
                    "--model-param", "depth=2", "--diagnostics", "--out", str(out))
    assert result.exit_code == 0, result.output
    assert set(json.loads((out / "diagnostics.json").read_text())["norms"]) == {"bn", "bnn"}
    assert "Noise robustness" in (out / "diagnostics.md").read_text()
    rerun = invoke("diagnose", str(out))
    assert rerun.exit_code == 0 and "Q-Q normality" in rerun.output
