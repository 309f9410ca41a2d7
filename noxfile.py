"""Developer sessions. `nox -l` lists them; `nox` runs the defaults (lint, tests).

- lint: ruff over the whole tree.
- tests: the full test suite against every package installed editable (what CI runs).
- isolated-<package>: a fresh virtualenv with only that package and the normkit packages it
  declares, then an import of its module and of its registered plugin (catches undeclared
  dependencies). Not default: each installs torch.
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
LOCAL_DEPS = {"normkit": [], "normkit-lab": ["normkit"], "normkit-cli": ["normkit", "normkit-lab"]}
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
    """Install one package with only its declared dependencies and import it."""
    path = PACKAGES[package]
    local = LOCAL_DEPS.get(package, ["normkit"])
    session.install(*TORCH)
    session.install(*(f"./{PACKAGES[d].relative_to(ROOT)}" for d in local), f"./{path.relative_to(ROOT)}")
    module = next(p.name for p in (path / "src").iterdir() if p.is_dir() and not p.name.endswith("egg-info"))
    session.run("python", "-c", f"import {module}; import normkit; from normkit import plugins; "
                "bad = [p for p in plugins.plugins() if p.error]; assert not bad, bad; "
                f"print('{package}: imports and loads', [p.name for p in plugins.plugins()])",
                env={"NORMKIT_STRICT_PLUGINS": "1"})
