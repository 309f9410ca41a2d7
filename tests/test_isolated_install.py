"""Every normkit package installed alone, with only the dependencies it declares, works: in a fresh
virtual environment per package (no system site-packages, nothing of normkit but what pip resolves
from the package's own requirements), every plugin loads and every norm and stage the package
registers builds and passes the conformance checks (tests/isolated_check.py).

Offline and fast: the normkit packages are built into a local wheelhouse and pip resolves them with
`--no-index --find-links`; third-party requirements (torch and what it needs, pluggy, ...) are the
transitive closure of the package's declared requirements, taken from the test's own environment
and linked into a directory the new environment sees through a .pth file. A requirement the
package forgets to declare is therefore missing, as it would be for a user.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from filelock import FileLock
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {tomllib.loads(p.read_text())["project"]["name"]: p.parent
            for p in sorted(ROOT.glob("*/*/pyproject.toml")) if p.parent.parent.name != "examples"}
CHECK = ROOT / "tests" / "isolated_check.py"


def _key(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _declared(package: str) -> list[Requirement]:
    return [Requirement(r) for r in
            tomllib.loads((PACKAGES[package] / "pyproject.toml").read_text())["project"]["dependencies"]]


def _third_party_closure(package: str) -> set[str]:
    """Distributions (not normkit's) the package needs, following declared requirements (normkit
    packages' own included, as pip would)."""
    todo, seen, local = _declared(package), set(), {package}
    while todo:
        req = todo.pop()
        name = _key(req.name)
        if name in PACKAGES:
            if name not in local:
                local.add(name)
                todo += _declared(name)
            continue
        if name in seen or (req.marker and not req.marker.evaluate({"extra": ""})):
            continue
        seen.add(name)
        dist = md.distribution(name)  # present here: requirements.txt installs every package's needs
        todo += [Requirement(r) for r in dist.requires or ()]
        for extra in req.extras:
            for dep in map(Requirement, dist.requires or ()):
                if dep.marker and dep.marker.evaluate({"extra": extra}):
                    dep.marker = None  # decided here; popped again it would read as extra-less
                    todo.append(dep)
    return seen


def _link_third_party(package: str, target: Path) -> None:
    """Symlink the closure's top-level modules and metadata directories into `target`."""
    target.mkdir(parents=True)
    for name in _third_party_closure(package):
        dist = md.distribution(name)
        site = Path(dist.locate_file(""))
        tops = {Path(str(f)).parts[0] for f in dist.files or () if not str(f).startswith("..")}
        for top in tops:
            source, link = site / top, target / top
            if source.exists() and not link.exists() and top != "__pycache__":
                link.symlink_to(source)


def _isolated_env(package: str, root: Path, wheelhouse: Path) -> Path:
    """A fresh venv with `package` installed by pip from its declared requirements; its python."""
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    _link_third_party(package, root / "third-party")
    (site / "third_party.pth").write_text(f"{root / 'third-party'}\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--isolated",
                    "--no-index", "--find-links", str(wheelhouse), "--disable-pip-version-check", package],
                   check=True, capture_output=True, text=True)
    return python


@pytest.fixture(scope="session")
def wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The packages' wheels, built once for the run: xdist workers share their base temporary
    directory's parent (this run's own), and a file lock makes the first worker build while the other waits."""
    base = tmp_path_factory.getbasetemp()
    shared = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "normkit-wheelhouse"
    with FileLock(f"{shared}.lock"):
        if not (shared / "complete").exists():
            shutil.rmtree(shared, ignore_errors=True)
            subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--isolated", "--no-deps",
                            "--no-build-isolation", "--no-index", "--disable-pip-version-check", "-w", str(shared),
                            *map(str, PACKAGES.values())], check=True, capture_output=True, text=True)
            (shared / "complete").touch()
    return shared


def _check(package: str, root: Path, wheelhouse: Path) -> subprocess.CompletedProcess:
    try:
        python = _isolated_env(package, root, wheelhouse)
    except subprocess.CalledProcessError as exc:
        return subprocess.CompletedProcess(exc.cmd, exc.returncode, exc.stdout or "", exc.stderr or "")
    freeze = subprocess.run([str(python), "-c", "import importlib.metadata as md; print(sorted("
                             "d.name for d in md.distributions() if d.name.startswith('normkit')))"],
                            capture_output=True, text=True)
    out = subprocess.run([str(python), str(CHECK), package], capture_output=True, text=True, timeout=300,
                         cwd=root)
    out.stdout = f"installed: {freeze.stdout}{out.stdout}"
    return out


# One test per package, on one core each: xdist spreads them over both workers (no xdist group).
@pytest.mark.parametrize("package", list(PACKAGES))
def test_every_package_installed_alone_builds_and_checks_what_it_registers(package: str, tmp_path: Path,
                                                                         wheelhouse: Path) -> None:
    out = _check(package, tmp_path, wheelhouse)
    assert out.returncode == 0, f"{package}:\n{(out.stdout + out.stderr)[-3000:]}"


def test_the_use_install_lists_every_package_of_the_checkout_and_no_test_dependency() -> None:
    """README's "Use it" install (requirements-use.txt) builds every package from this checkout, so a
    new plugin cannot be left out of it, and pulls none of requirements.txt's test and development tools."""
    lines = [line.split("#")[0].strip() for line in (ROOT / "requirements-use.txt").read_text().splitlines()]
    local = {line.partition("[")[0].removeprefix("./") for line in lines if line.startswith("./")}
    assert local == {str(path.relative_to(ROOT)) for path in PACKAGES.values()}
    named = {_key(Requirement(line).name) for line in lines if line and not line.startswith("./")}
    assert named == {"torch", "torchvision"}  # pinned as requirements.txt pins them; the rest is declared
