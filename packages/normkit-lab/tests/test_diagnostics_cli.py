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


def test_random_net_reports_the_spread_over_nets(tmp_path):
    from scipy import stats as sps

    from normkit_lab.diagnostics.random_net import random_net_runs

    result = invoke("diagnose", "--random-net", "--depth", "3", "--width", "8", "--batch", "8", "--image-size", "8",
                    "--seeds", "3", "--norms", "ln", "--out", str(tmp_path))
    assert result.exit_code == 0, result.output
    assert "ln dataset share [95% CI over nets]" in result.output
    spread = json.loads((tmp_path / "random_net.json").read_text())["dataset_share_spread"]["ln"]
    nets = random_net_runs(["ln"], depth=3, width=8, batch=8, image_size=8, seeds=3)["ln"]
    for d, row in enumerate(spread):
        values = [net[d]["dataset"] for net in nets]
        low, high = sps.t.interval(0.95, 2, loc=sum(values) / 3, scale=sps.sem(values))
        assert (row["n"], row["ci95_low"], row["ci95_high"]) == (3, pytest.approx(max(0, low)),
                                                                 pytest.approx(min(1, high)))


def test_random_net_checks_every_spec_before_computing(tmp_path):
    # gn's default 32 groups do not divide width 24: refused before bn's nets are computed (and fast
    # even at a depth that would take minutes)
    result = invoke("diagnose", "--random-net", "--norms", "bn,gn", "--depth", "1000", "--seeds", "50",
                    "--out", str(tmp_path))
    assert result.exit_code == 2 and result.output.count("error:") == 1
    assert "not divisible into 32 groups" in result.output and not (tmp_path / "random_net.json").exists()


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
    result = invoke("compare", "--dataset", "digits", "--norms", "bn,bnn", "--epochs", "1", "--batch-size", "128",
                    "--seeds", "1",
                    "--model-param", "width=4",
                    "--model-param", "depth=2", "--diagnostics", "--out", str(out))
    assert result.exit_code == 0, result.output
    assert set(json.loads((out / "diagnostics.json").read_text())["norms"]) == {"bn", "bnn"}
    assert "Noise robustness" in (out / "diagnostics.md").read_text()
    rerun = invoke("diagnose", str(out))
    assert rerun.exit_code == 0 and "Q-Q normality" in rerun.output
