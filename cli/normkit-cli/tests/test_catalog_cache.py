"""`normkit list` / `show` / `plugins` answer from a cached catalog without importing torch, and the
catalog is rebuilt whenever a plugin changes: a new version, or an edited source file of an
editable install with the same version. A damaged or foreign catalog is never trusted, and a
catalog is never written while a plugin fails to load.

Real processes and a real plugin distribution (dist-info with an entry point on PYTHONPATH).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from normkit_cli import catalog_cache

# Runs the CLI; on exit says on stderr whether torch was imported (a catalog answer does not).
RUN = ("import atexit, sys\n"
       "atexit.register(lambda: print('torch imported:', 'torch' in sys.modules, file=sys.stderr))\n"
       "from normkit_cli.app import main\nmain()\n")

PLUGIN = """
import normkit

@normkit.hookimpl
def normkit_register_norms(register):
    for name in {names!r}:
        register(name, compose="bn", summary="cache test")
"""


def install(site: Path, version: str, names: list[str], editable: bool = False) -> None:
    """Distribution nk-cachetest `version`, entry point `cachetest`, registering `names` (each = bn)."""
    root = site / "editable-src" if editable else site
    (root / "src" if editable else root).mkdir(parents=True, exist_ok=True)
    module = (root / "src" if editable else root) / "nk_cachetest.py"
    module.write_text(PLUGIN.format(names=names))
    for old in site.glob("nk_cachetest-*.dist-info"):
        for f in old.iterdir():
            f.unlink()
        old.rmdir()
    info = site / f"nk_cachetest-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: nk-cachetest\nVersion: {version}\n")
    (info / "entry_points.txt").write_text("[normkit]\ncachetest = nk_cachetest\n")
    (info / "RECORD").write_text(f"nk_cachetest.py,,{len(module.read_bytes())}\n")
    if editable:
        (info / "direct_url.json").write_text(json.dumps({"dir_info": {"editable": True},
                                                          "url": f"file://{root}"}))
        (site / "nk_cachetest.pth").write_text(f"{root / 'src'}\n")


def normkit(tmp_path: Path, *args: str, all_plugins: bool = False,
            **env: str) -> tuple[subprocess.CompletedProcess, bool]:
    site = tmp_path / "site"
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), *(
        [str(site / "editable-src" / "src")] if (site / "editable-src").exists() else []),
        *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]),  # the sources under test
               "NORMKIT_CACHE_DIR": str(tmp_path / "cache"), "NORMKIT_STRICT_PLUGINS": "", **env}
    environ.pop("NORMKIT_NO_CATALOG_CACHE", None)
    if not all_plugins:  # plugins the catalogs need not hold: each rebuild then imports core, standard, nk-cachetest
        environ["NORMKIT_DISABLED_PLUGINS"] = "lab,normalnorm,proxynorm,ibnorm,whitening,zoo"
    out = subprocess.run([sys.executable, "-c", RUN, *args], env=environ, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return out, "torch imported: True" in out.stderr


def names(out: subprocess.CompletedProcess) -> set[str]:
    return {e["name"] for e in json.loads(out.stdout)["norms"] if e["plugin"] == "cachetest"}


def test_the_catalog_answers_without_torch_and_is_rebuilt_when_a_plugin_changes(tmp_path: Path) -> None:
    site = tmp_path / "site"
    install(site, "1.0", ["cachetest_a"])
    first, loaded = normkit(tmp_path, "list", "--json")
    assert names(first) == {"cachetest_a"} and loaded
    again, loaded = normkit(tmp_path, "list", "--json")
    assert again.stdout == first.stdout and not loaded  # from the catalog
    show, loaded = normkit(tmp_path, "show", "cachetest_a")
    assert "standardize" in show.stdout and not loaded
    listing, loaded = normkit(tmp_path, "plugins", "--json")
    assert not loaded
    assert {p["name"]: p["version"] for p in json.loads(listing.stdout)}["cachetest"] == "1.0"

    install(site, "1.1", ["cachetest_a", "cachetest_b"])  # a new version registers a new name
    bumped, loaded = normkit(tmp_path, "list", "--json")
    assert names(bumped) == {"cachetest_a", "cachetest_b"} and loaded
    assert len(list((tmp_path / "cache").glob("catalog-*.json"))) == 1  # the stale one is gone


def test_an_edited_editable_plugin_rebuilds_the_catalog(tmp_path: Path) -> None:
    site = tmp_path / "site"
    install(site, "1.0", ["cachetest_a"], editable=True)
    first, _ = normkit(tmp_path, "list", "--json")
    assert names(first) == {"cachetest_a"}
    module = site / "editable-src" / "src" / "nk_cachetest.py"
    module.write_text(PLUGIN.format(names=["cachetest_a", "cachetest_c"]))  # same version, new source
    os.utime(module, ns=(module.stat().st_atime_ns, module.stat().st_mtime_ns + 10**9))
    edited, loaded = normkit(tmp_path, "list", "--json")
    assert names(edited) == {"cachetest_a", "cachetest_c"} and loaded


def test_a_damaged_or_foreign_catalog_is_not_trusted(tmp_path: Path) -> None:
    install(tmp_path / "site", "1.0", ["cachetest_a"])
    first, _ = normkit(tmp_path, "list", "--json")
    (catalog,) = (tmp_path / "cache").glob("catalog-*.json")
    data = json.loads(catalog.read_text())
    data["list"]["norms"] = [dict(data["list"]["norms"][0], name="forged")]
    data["fingerprint"] = "0" * 64  # a catalog written for other plugins
    catalog.write_text(json.dumps(data))
    out, loaded = normkit(tmp_path, "list", "--json")
    assert out.stdout == first.stdout and loaded
    catalog.write_text("{not json")
    out, loaded = normkit(tmp_path, "list", "--json")
    assert out.stdout == first.stdout and loaded


DAMAGES = ({"list": 5}, {"plugins": [{"name": 1}]}, {"show": {"x": {"title": None}}},
           {"list": {"norms": [{"name": "bn"}], "items": []}}, {"created": 3})


def test_a_catalog_with_the_right_fingerprint_but_ill_formed_content_is_rebuilt(tmp_path: Path) -> None:
    """Each damage is refused by the shape check `read()` applies (here, in this process); one of them, under
    a command that reads the catalog, is rebuilt and answered like the good catalog (real processes)."""
    install(tmp_path / "site", "1.0", ["cachetest_a"])
    normkit(tmp_path, "list", "--json")
    plugins, _ = normkit(tmp_path, "plugins")
    assert "normalnorm" in plugins.stdout and "cachetest" in plugins.stdout  # disabled plugins are still listed
    (catalog,) = (tmp_path / "cache").glob("catalog-*.json")
    good = json.loads(catalog.read_text())
    assert catalog_cache._well_formed(good)
    for damage in DAMAGES:
        assert not catalog_cache._well_formed({**good, **damage}), damage
    catalog.write_text(json.dumps({**good, **DAMAGES[1]}))  # read as it is, `plugins` would fail on it
    out, loaded = normkit(tmp_path, "plugins")  # exits 0: asserted by normkit()
    assert loaded and _gist(out.stdout) == _gist(plugins.stdout), out.stderr
    assert catalog_cache._well_formed(json.loads(catalog.read_text()))  # rewritten whole


def _gist(text: str) -> list[str]:
    """What must not change when the catalog is rebuilt: a table's plugin and distribution cells (its
    width, and so its centred title, follows the `load` column's milliseconds, which vary per run),
    else the first line."""
    rows = [[cell.strip() for cell in line.split("│")[1:3]] for line in text.splitlines() if line.startswith("│")]
    return [" | ".join(row) for row in rows] if rows else text.splitlines()[:1]


def test_no_catalog_while_a_plugin_fails(tmp_path: Path) -> None:
    site = tmp_path / "site"
    install(site, "1.0", ["cachetest_a"])
    (site / "nk_cachetest.py").write_text("raise ImportError('broken on purpose')\n")
    for _ in range(2):
        out, loaded = normkit(tmp_path, "plugins", "--json")
        failed = {p["name"]: p["error"] for p in json.loads(out.stdout) if p["error"]}
        assert failed == {"cachetest": "import failed: ImportError: broken on purpose"} and loaded
    assert not list((tmp_path / "cache").glob("catalog-*.json"))


def test_a_misspelled_norm_is_answered_from_the_catalog_without_torch(tmp_path: Path) -> None:
    """Issue 41: `normkit compare --norms bogus` imported torch and every plugin (8 s of CPU, 80 s at load 11)
    before its one-line error; with a current catalog the names are checked first."""
    site = tmp_path / "site"
    install(site, "1.0", ["cachenorm"])
    normkit(tmp_path, "list", "--json", all_plugins=True)  # builds the catalog compare reads below
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), *filter(None, os.environ.get(
        "PYTHONPATH", "").split(os.pathsep))]), "NORMKIT_CACHE_DIR": str(tmp_path / "cache"),
        "NORMKIT_STRICT_PLUGINS": ""}
    environ.pop("NORMKIT_NO_CATALOG_CACHE", None)
    for norms, error in [("bn,gnn2+pn", "unknown norm or stage 'gnn2'; did you mean 'gnn' or 'nn' or 'gn'?"),
                         ("cachenorm,bnn(noise=[0,0.4])+cachenrm", "unknown norm or stage 'cachenrm'; did you "
                                                                    "mean 'cachenorm'")]:
        out = subprocess.run([sys.executable, "-c", RUN, "compare", "--dataset", "digits", "--norms", norms],
                             env=environ,
                             capture_output=True, text=True, timeout=120, cwd=tmp_path)
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 2 and lines[0].startswith(f"error: {error}"), out.stderr
        assert lines[-1] == "torch imported: False" and len(lines) == 2, out.stderr
    assert not any(tmp_path.glob("runs"))  # nothing written


def test_without_a_catalog_compare_writes_one_so_the_next_misspelling_skips_torch(tmp_path: Path) -> None:
    """Issue 41: the fast answer needed a catalog that only `normkit list` wrote, so a new user's
    misspellings each cost the full plugin load (8 s of CPU here). compare loads the plugins anyway:
    with no current catalog it writes one, and the next misspelled norm is answered before torch."""
    environ = {**os.environ, "NORMKIT_CACHE_DIR": str(tmp_path / "cache"), "NORMKIT_STRICT_PLUGINS": ""}
    environ.pop("NORMKIT_NO_CATALOG_CACHE", None)
    torch_seen = []
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", RUN, "compare", "--dataset", "digits", "--norms", "bn,gnx"],
                             env=environ, capture_output=True, text=True, timeout=120, cwd=tmp_path)
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 2 and lines[0].startswith("error: unknown norm or stage 'gnx'"), out.stderr
        torch_seen.append(lines[-1])
    assert torch_seen == ["torch imported: True", "torch imported: False"]
    (catalog,) = (tmp_path / "cache").glob("catalog-*.json")
    assert json.loads(catalog.read_text())["show"] == {}  # shows are added when `normkit show` asks
    assert not any(tmp_path.glob("runs"))  # nothing written
