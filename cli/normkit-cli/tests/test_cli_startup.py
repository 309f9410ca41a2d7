"""Start-up and process behaviour, through real processes: help without torch, help printed once,
option defaults that agree with the lab, and SIGTERM handled like Ctrl-C in `normkit compare`."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from normkit_cli import defaults
from normkit_lab import records, spec

NORMKIT = [sys.executable, "-c", "from normkit_cli.app import main; main()"]
COMMANDS = ["compare", "report", "list", "plugins", "show", "bench", "diagnose"]


def test_cli_defaults_agree_with_the_lab():
    assert defaults.DEFAULTS == spec.defaults()
    assert defaults.RUNTIME_KEYS == records.RUNTIME_KEYS
    from normkit_lab import metrics

    assert defaults.METRIC_NAMES == tuple(metrics.METRICS)
    assert (defaults.DEFAULT_METRIC, defaults.SELECTS) == (metrics.DEFAULT_METRIC, metrics.SELECTS)


def test_help_of_every_command_loads_neither_torch_nor_the_lab():
    code = ("import sys\nfrom typer.testing import CliRunner\nfrom normkit_cli.app import app\n"
            f"for cmd in [[], *([c] for c in {COMMANDS!r})]:\n"
            "    r = CliRunner().invoke(app, [*cmd, '--help'])\n"
            "    assert r.exit_code == 0 and 'Usage' in r.output, (cmd, r.output)\n"
            "heavy = ('torch', 'normkit', 'normkit_lab.runs.training', 'normkit_lab.study.config', 'scipy',\n"
            "         'matplotlib')\n"
            "heavy = sorted(m for m in heavy if m in sys.modules)\n"
            "print(heavy)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]", out.stderr


def test_bare_normkit_prints_its_help_once():
    out = subprocess.run(NORMKIT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and (out.stdout + out.stderr).count("Usage:") == 1


def test_usage_errors_are_one_line():
    out = subprocess.run([*NORMKIT, "compare", "--dataset", "digits", "--epochs", "many"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 2 and out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "'normkit compare --help'" in lines[0]


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143),
                                           pytest.param(signal.SIGINT, 130, marks=pytest.mark.slow)])
@pytest.mark.xdist_group("signals")
def test_a_signal_keeps_finished_runs_and_prints_the_resume_hint(tmp_path, sig, code):
    out = tmp_path / "cmp"
    env = {**os.environ, "CI": "1"}
    proc = subprocess.Popen([*NORMKIT, "compare", "--dataset", "digits", "--norms", "bn", "--epochs", "1",
                             "--batch-size", "128", "--seeds",
                             "200",
                             "--model-param", "depth=2", "--model-param", "width=4", "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    runs = out / "runs.jsonl"
    deadline = time.monotonic() + 120
    while not (runs.exists() and runs.read_text()) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.1)
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == code, (stdout, stderr)
    assert f"continue with: normkit compare --resume {out}" in stderr and "Traceback" not in stderr
    rows = [json.loads(line) for line in runs.read_text().splitlines()]
    assert rows and all(r["status"] == "ok" for r in rows)
    assert runs.read_text().endswith("\n")
    assert Path(out / "config.yaml").is_file()


def test_sigterm_inside_the_block_raises_terminated_and_the_old_handler_returns():
    from normkit_cli.errors import Terminated, interrupted_code, sigterm_as_interrupt

    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Terminated) as info, sigterm_as_interrupt():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the signal arrives before this ends
    assert isinstance(info.value, KeyboardInterrupt) and interrupted_code(info.value) == 143
    assert interrupted_code(KeyboardInterrupt()) == 130
    assert signal.getsignal(signal.SIGTERM) == before


@pytest.mark.xdist_group("signals")
def test_an_interrupt_on_a_terminal_prints_its_message_on_a_line_of_its_own(tmp_path):
    """On a terminal the live progress bar holds the line and hides the cursor: the interruption
    message must start on a fresh line and end with a newline, so the shell prompt is not glued to it."""
    import pty
    import select

    out = tmp_path / "cmp"
    leader, follower = pty.openpty()
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "NO_COLOR")} | {"TERM": "xterm", "COLUMNS": "120"}
    proc = subprocess.Popen([*NORMKIT, "compare", "--dataset", "digits", "--norms", "bn", "--epochs", "1",
                             "--batch-size", "128", "--seeds", "200", "--model-param", "depth=2",
                             "--model-param", "width=4", "--out", str(out)],
                            stdin=follower, stdout=follower, stderr=follower, env=env, cwd=tmp_path)
    os.close(follower)
    screen = b""
    runs = out / "runs.jsonl"
    deadline = time.monotonic() + 120
    signalled = False
    try:
        while time.monotonic() < deadline:
            if not signalled and runs.exists() and runs.read_text():
                proc.send_signal(signal.SIGTERM)
                signalled = True
            ready, _, _ = select.select([leader], [], [], 0.1)
            if ready:
                try:
                    chunk = os.read(leader, 65536)
                except OSError:  # the follower side closed: the program ended
                    break
                if not chunk:
                    break
                screen += chunk
        proc.wait(timeout=60)
    finally:  # a program that never ended is not left running after the test
        proc.kill()
        proc.wait()
        os.close(leader)
    text = screen.decode(errors="replace").replace("\r\n", "\n")
    assert proc.returncode == 143, text[-2000:]
    message = f"interrupted: 1 of 200 runs are saved in {out}"
    assert message in text.replace("\n", "") and text.endswith("\n"), repr(text[-600:])
    line = text[text.rindex("\n", 0, text.index("interrupted: ")) + 1:text.index("interrupted: ")]
    assert re.sub(r"\x1b\[[0-9;?]*[A-Za-z]|\r", "", line) == "", repr(line)  # nothing of the bar before it
