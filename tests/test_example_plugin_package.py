"""The third-party example plugin installs as a real package, is discovered, and passes its tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "normkit-example"


# No xdist group: the child pytest runs in one process (-n 0), on one core beside the other worker.
def test_example_plugin_installs_is_discovered_and_passes_its_tests(tmp_path: Path) -> None:
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--no-index", "--target", str(target), str(EXAMPLE)], check=True)
    env = {**os.environ, "PYTHONPATH": str(target), "NORMKIT_STRICT_PLUGINS": "1"}
    probe = ("from normkit import plugins; import normkit;"
             "info = next(p for p in plugins.plugins() if p.name == 'example');"
             "print(info.distribution, info.version, sorted(info.registered));"
             "print(normkit.build('scbn', 4).steps)")
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    assert "normkit-example 0.1.0 ['narrow-cnn', 'scbn', 'scgn', 'softclip']" in out.stdout
    assert "softclip(limit=3.0)" in out.stdout
    tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0",
                            str(EXAMPLE / "tests")],
                           env=env, capture_output=True, text=True, cwd=tmp_path)
    assert tests.returncode == 0, tests.stdout + tests.stderr


def test_the_example_is_not_installed_in_the_dev_environment() -> None:
    import normkit

    assert all(e["name"] != "scbn" for e in normkit.available())
