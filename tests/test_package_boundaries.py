"""Each package imports only what its pyproject declares; nothing imports a plugin by name.

This is the cheap form of the "installs alone and works" check; tests/test_isolated_install.py does
it for real in a fresh virtualenv per package.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = sorted(p.parent for p in ROOT.glob("*/*/pyproject.toml") if p.parent.parent.name != "examples")
IMPORT_NAME = {"scikit-learn": "sklearn", "pyyaml": "yaml", "normkit-lab": "normkit_lab"}
PLUGIN_MODULES = {"normkit_standard", "normkit_normalnorm", "normkit_proxynorm", "normkit_ibnorm", "normkit_zoo",
                  "normkit_whitening"}


def _requirement_names(reqs: list[str]) -> set[str]:
    names = set()
    for req in reqs:
        name = re.split(r"[\s<>=!~\[;]", req.strip(), maxsplit=1)[0].lower()
        names.add(IMPORT_NAME.get(name, name.replace("-", "_")))
    return names


def _imports(src: Path) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for file in src.rglob("*.py"):
        for node in ast.walk(ast.parse(file.read_text())):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    found.setdefault(alias.name.split(".")[0], file)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.setdefault(node.module.split(".")[0], file)
    return found


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.name)
def test_imports_are_declared(package: Path) -> None:
    meta = tomllib.loads((package / "pyproject.toml").read_text())["project"]
    declared = _requirement_names(meta.get("dependencies", []))
    for extra in meta.get("optional-dependencies", {}).values():
        declared |= _requirement_names(extra)
    own = {p.name for p in (package / "src").iterdir() if p.is_dir() and not p.name.endswith(".egg-info")}
    allowed = declared | own | set(sys.stdlib_module_names) | {"__future__"}
    undeclared = {m: str(f.relative_to(ROOT)) for m, f in _imports(package / "src").items() if m not in allowed}
    assert not undeclared, f"{package.name} imports undeclared modules: {undeclared}"


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.name)
def test_nothing_imports_a_plugin_by_name(package: Path) -> None:
    own = {p.name for p in (package / "src").iterdir() if p.is_dir()}
    by_name = {m for m in _imports(package / "src") if m in PLUGIN_MODULES - own}
    assert not by_name, f"{package.name} imports plugins {by_name}; reach them through the registry"


def test_plugins_depend_only_on_normkit_torch_and_the_standard_norms() -> None:
    """normkit-standard is the one plugin others may need: their compositions (bnn = bn+nn) use its names."""
    allowed = {"normkit", "torch", "normkit_standard"}
    for package in PACKAGES:
        if package.parent.name != "plugins":
            continue
        deps = _requirement_names(tomllib.loads((package / "pyproject.toml").read_text())["project"]["dependencies"])
        assert deps <= allowed, f"{package.name} depends on {deps - allowed}"
