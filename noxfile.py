"""Developer sessions. `nox -l` lists them; `nox` runs the defaults (lint, tests).

- lint: ruff over the whole tree.
- tests: the full test suite against every package installed editable (what CI runs).
- isolated-<package>: a fresh virtualenv with only that package, installed by pip from a local
  wheelhouse of the normkit packages (so only the normkit packages it declares come along) and
  the index (torch and the rest), then tests/isolated_check.py: every plugin loads and every norm
  and stage the package registers builds and passes the conformance checks. Not default: each
  installs torch. The default test run does the same offline (tests/test_isolated_install.py).
- slow: the tests marked slow.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import nox

ROOT = Path(__file__).parent
nox.options.sessions = ["lint", "tests"]
nox.options.reuse_existing_virtualenvs = True

PACKAGES = {tomllib.loads(p.read_text())["project"]["name"]: p.parent
            for p in sorted(ROOT.glob("*/*/pyproject.toml")) if p.parent.parent.name != "examples"}
TORCH = ["torch==2.14.1", "torchvision==0.29.1"]


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff")
    session.run("ruff", "check", ".")


@nox.session
def tests(session: nox.Session) -> None:
    session.install("-r", "requirements.txt")
    session.run("pytest", *session.posargs)


@nox.session
def slow(session: nox.Session) -> None:
    session.install("-r", "requirements.txt")
    session.run("pytest", "-m", "slow", *session.posargs)


@nox.session(default=False)
@nox.parametrize("package", list(PACKAGES), ids=list(PACKAGES))
def isolated(session: nox.Session, package: str) -> None:
    """Install one package with only its declared dependencies; check what it registers."""
    wheelhouse = Path(session.create_tmp()) / "wheelhouse"
    session.run("python", "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(wheelhouse),
                *(str(p) for p in PACKAGES.values()))
    session.install(*TORCH)
    session.install("--find-links", str(wheelhouse), package)
    session.run("python", str(ROOT / "tests" / "isolated_check.py"), package)
