"""A plugin that blocks at import cannot block normkit: after NORMKIT_PLUGIN_TIMEOUT it is recorded
as failed (name and time), every command goes on without it, and `normkit plugins` says so.

The plugin is a real installed distribution (a dist-info with an entry point on PYTHONPATH) whose
module waits forever at import, loaded by a real process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest


def install_blocking_plugin(site: Path) -> None:
    """A distribution `nk-blocking` 1.0 with entry point `blocking` whose import never returns."""
    site.mkdir(parents=True, exist_ok=True)
    (site / "nk_blocking.py").write_text("import threading\nthreading.Event().wait()\n")
    info = site / "nk_blocking-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: nk-blocking\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[normkit]\nblocking = nk_blocking\n")


NORMKIT = [sys.executable, "-c", "from normkit_cli.app import main; main()"]


def _normkit(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    site = tmp_path / "site"
    if not site.exists():
        install_blocking_plugin(site)
    env = {**os.environ, "PYTHONPATH": str(site), "NORMKIT_PLUGIN_TIMEOUT": "1", "NORMKIT_STRICT_PLUGINS": "",
           "NORMKIT_NO_CATALOG_CACHE": "1"}
    return subprocess.run([*NORMKIT, *args], env=env, capture_output=True, text=True, timeout=120)


def test_a_plugin_blocking_at_import_is_timed_out_named_and_skipped(tmp_path: Path) -> None:
    started = time.monotonic()
    show = _normkit(tmp_path, "show", "bn", "--channels", "4")
    assert show.returncode == 0 and "standardize" in show.stdout, show.stdout + show.stderr
    assert time.monotonic() - started < 60  # not blocked forever (the subprocess timeout is 120 s)
    assert "waiting for plugin 'blocking' (nk-blocking 1.0) to finish importing" in show.stderr
    assert "plugin 'blocking' (nk-blocking) did not finish importing within 1 s" in show.stderr
    listing = _normkit(tmp_path, "plugins", "--json")
    assert listing.returncode == 0, listing.stderr
    infos = {i["name"]: i for i in json.loads(listing.stdout)}
    blocked = infos["blocking"]
    assert blocked["distribution"] == "nk-blocking" and blocked["version"] == "1.0"
    assert blocked["error"].startswith("did not finish importing within 1 s"), blocked
    assert 1.0 <= blocked["load_seconds"] < 30
    assert infos["standard"]["error"] is None and "bn" in infos["standard"]["registered"]


def test_strict_mode_turns_the_timeout_into_an_error(tmp_path: Path) -> None:
    code = ("from normkit import plugins, PluginError\ntry:\n    plugins.registry()\n"
            "except PluginError as exc:\n    print(exc)\n")
    site = tmp_path / "site"
    install_blocking_plugin(site)
    env = {**os.environ, "PYTHONPATH": str(site), "NORMKIT_PLUGIN_TIMEOUT": "0.5", "NORMKIT_STRICT_PLUGINS": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.startswith("plugin 'blocking' (nk-blocking) timed out: did not finish importing within 0.5 s")


@pytest.mark.parametrize("value", ["0", "-3", "soon", "nan", "inf"])
def test_a_bad_timeout_setting_is_refused(monkeypatch, value: str) -> None:
    from normkit import PluginError, plugins

    monkeypatch.setenv("NORMKIT_PLUGIN_TIMEOUT", value)
    with pytest.raises(PluginError, match=f"NORMKIT_PLUGIN_TIMEOUT='{value}' is not a positive number"):
        plugins.import_timeout()


def test_a_bad_timeout_setting_is_one_line_at_the_command_line(tmp_path: Path) -> None:
    env = {**os.environ, "NORMKIT_PLUGIN_TIMEOUT": "soon", "NORMKIT_NO_CATALOG_CACHE": "1"}
    out = subprocess.run([*NORMKIT, "show", "bn"], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stderr.strip().splitlines() == [
        "error: NORMKIT_PLUGIN_TIMEOUT='soon' is not a positive number of seconds; set it to e.g. 30 "
        "or unset it for the default (10)"]
