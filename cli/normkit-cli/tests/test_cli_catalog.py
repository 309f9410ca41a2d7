"""`normkit list/plugins/show/bench`: output and one-line errors with exit code 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from normkit_cli.app import app

runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(app, list(args))


def test_list_shows_norms_with_plugin_and_summary() -> None:
    result = invoke("list", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    bn = next(e for e in data["norms"] if e["name"] == "bn")
    assert bn["plugin"] == "standard" and "batchnorm" in bn["aliases"]
    assert bn["parameters"]["eps"] == {"type": "float", "default": 1e-5}
    assert "Ioffe" in bn["citation"]
    table = invoke("list")
    assert table.exit_code == 0 and "bn" in table.output and "standard" in table.output


def test_plugins_lists_distributions_and_what_they_register() -> None:
    result = invoke("plugins", "--json")
    assert result.exit_code == 0
    infos = {p["name"]: p for p in json.loads(result.output)}
    assert infos["standard"]["distribution"] == "normkit-standard"
    assert {"bn", "ln", "in", "gn", "rms", "none"} <= set(infos["standard"]["registered"])
    assert infos["standard"]["error"] is None


def test_show_explains_the_stages() -> None:
    result = invoke("show", "gn(groups=8)", "--channels", "32")
    assert result.exit_code == 0, result.output
    for text in ("group(8)", "standardize", "eps=1e-05", "affine", "learnable parameters: 64"):
        assert text in result.output
    assert "momentum" not in result.output  # no running statistics for group partitions


@pytest.mark.parametrize(("args", "message"), [
    (("show", "bx"), "unknown norm or stage 'bx'; did you mean 'bn'"),
    (("show", "gn(groups=3)"), "64 channels are not divisible into 3 groups"),
    (("show", "gn(grups=8)"), "unknown parameter 'grups'"),
    (("show", "bn+ln"), "names 2 norms"),
    (("show", "bn", "--channels", "0"), "Invalid value"),
])
def test_bad_input_is_one_line_and_exit_2(args: tuple[str, ...], message: str) -> None:
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output
    if result.output.startswith("error:"):
        assert result.output.strip().count("\n") == 0


def test_help_everywhere() -> None:
    for args in ((), ("list",), ("plugins",), ("show",), ("bench",)):
        result = invoke(*args, "--help")
        assert result.exit_code == 0 and "Usage" in result.output


@pytest.mark.parametrize(("args", "message"), [
    (["compare", "--dataset", "digits", "--epochs", "abc"], "error: Invalid value for '--epochs'"),
    (["nosuch"], "error: No such command 'nosuch'."),
    (["list", "--bogus"], "error: No such option: --bogus"),
])
def test_usage_errors_from_the_console_script_are_one_line(args: list[str], message: str) -> None:
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", "from normkit_cli.app import main; main()", *args],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.startswith(message) and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stdout == ""


def test_no_arguments_prints_help_and_succeeds() -> None:
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", "from normkit_cli.app import main; main()"],
                          capture_output=True, text=True)
    assert proc.returncode == 0 and "compare" in proc.stdout and "show" in proc.stdout


NORMKIT = [sys.executable, "-c", "from normkit_cli.app import main; main()"]


def _piped(*args: str, columns: str | None = None) -> str:
    """The command's stdout read through a real pipe, as `normkit list | less` sees it."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    if columns is not None:
        env["COLUMNS"] = columns
    proc = subprocess.run([*NORMKIT, *args], capture_output=True, text=True, env=env,
                          timeout=120, check=True)
    return proc.stdout


def _cells(out: str) -> set[str]:
    return {cell.strip() for line in out.splitlines() for cell in line.split("│")}


def test_list_piped_has_one_whole_row_per_entry() -> None:
    """Through a real pipe (rich would assume 80 columns and cut names): every name, its aliases and its
    plugin whole in their cells, each row on one line."""
    listing = json.loads(invoke("list", "--json").output)
    out = _piped("list")
    assert "…" not in out
    cells = _cells(out)
    for entry in listing["norms"] + listing["items"]:
        assert {entry["name"], entry["plugin"], ", ".join(entry["aliases"]), entry["summary"]} <= cells
    assert len(out.splitlines()) == len(listing["norms"]) + len(listing["items"]) + 3 * 5  # 5 frame lines a table


@pytest.mark.parametrize("columns", ["40", "100"])
def test_list_on_a_narrow_terminal_fits_and_cuts_no_name(columns) -> None:
    listing = json.loads(invoke("list", "--json").output)
    out = _piped("list", columns=columns)
    assert "…" not in out and max(len(line) for line in out.splitlines()) <= int(columns)
    cells = _cells(out)
    assert all(entry["name"] in cells for entry in listing["norms"] + listing["items"])  # never broken


@pytest.mark.parametrize("columns", [None, "60"])
def test_plugins_piped_names_every_registered_item(columns) -> None:
    infos = json.loads(invoke("plugins", "--json").output)
    out = _piped("plugins", columns=columns)
    assert "…" not in out
    if columns is None:  # one line per plugin: every registered name whole
        words = {w.strip(" ,") for line in out.splitlines() for cell in line.split("│") for w in cell.split()}
        for info in infos:
            assert {info["name"], info["distribution"], info["version"], *info["registered"]} <= words
    else:
        assert {info["name"] for info in infos} <= _cells(out)
