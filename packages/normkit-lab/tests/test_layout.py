"""The lab's layout holds: no import cycles, and every room imports only the rooms below it.

Every `import` and `from ... import` of every module counts, at module level, inside functions and
under `if TYPE_CHECKING:` alike (relative imports resolved), so a cycle cannot hide in a lazy
import. `from package import name` counts as importing the submodule `package.name` when that is a
module, else the package. The rooms and what each may import are docs/lab-layout.md's table.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

import normkit_lab

PACKAGE = "normkit_lab"
ROOT = Path(normkit_lab.__file__).parent
# top-level modules that sit above everything: the public facade and the plugin entry point
FACADES = {"normkit_lab", "normkit_lab.api", "normkit_lab.plugin"}
# room -> the rooms it may import ("leaves": the other top-level modules: errors, limits, spec, records...)
ALLOWED = {
    "leaves": {"leaves"},
    "models": {"leaves"},
    "datasets": {"leaves"},
    "store": {"leaves"},
    "diagnostics": {"leaves", "store"},
    "runs": {"leaves", "store", "models", "datasets", "diagnostics"},
    "executors": {"leaves", "store", "runs"},
    "analysis": {"leaves", "store", "diagnostics"},
    "study": {"leaves", "store", "runs", "executors", "analysis", "diagnostics", "models", "datasets"},
    "reproduce": {"leaves", "store", "runs", "executors", "analysis", "study", "diagnostics", "models", "datasets"},
    "suite": {"leaves", "store", "runs", "executors", "analysis", "study", "diagnostics", "models", "datasets"},
}
# the only modules of runs/ an executor may import: the job runner and the Trainer protocol
EXECUTOR_ENTRIES = {"normkit_lab.runs.execute", "normkit_lab.runs.trainer"}


def module_files(root: Path = ROOT) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package (packages by their __init__)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _imported(node: ast.AST, module: str, is_package: bool) -> list[str]:
    """The dotted names one import statement names (for `from X import a`: X.a and X)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    if node.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[:len(base) - (node.level - 1)]
        source = ".".join([*base, *([node.module] if node.module else [])])
    else:
        source = node.module or ""
    return [f"{source}.{alias.name}" for alias in node.names] + [source]


def import_graph(files: Mapping[str, Path]) -> dict[str, set[str]]:
    """Module -> the package's modules it imports, from every import statement in its source."""
    graph: dict[str, set[str]] = {name: set() for name in files}
    for module, path in files.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            names = _imported(node, module, is_package)
            if isinstance(node, ast.ImportFrom):  # a submodule named in `from X import sub` is the target
                subs = [n for n in names[:-1] if n in files]
                names = subs + ([names[-1]] if len(subs) < len(names) - 1 else [])
            for name in names:
                while name and name not in files:
                    name = name.rpartition(".")[0]
                if name and name != module:
                    graph[module].add(name)
    return graph


def find_cycle(graph: Mapping[str, Iterable[str]]) -> list[str] | None:
    """One cycle of `graph` as a path [a, b, ..., a], or None when it has none."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def room(module: str) -> str:
    """The room of a module: its subpackage, "leaves" for a top-level module, "facade" for the public face."""
    if module in FACADES:
        return "facade"
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or module.replace(".", "/") + "/__init__.py" in _PACKAGES else "leaves"


_PACKAGES = {str(p.relative_to(ROOT.parent)) for p in ROOT.rglob("__init__.py")}


def room_graph(graph: Mapping[str, Iterable[str]]) -> dict[str, set[str]]:
    rooms: dict[str, set[str]] = {}
    for module, targets in graph.items():
        rooms.setdefault(room(module), set()).update(room(t) for t in targets if room(t) != room(module))
    return rooms


GRAPH = import_graph(module_files())


def test_the_graph_sees_every_kind_of_import():
    """Lazy, TYPE_CHECKING and relative imports all count (checked on modules known to have them)."""
    assert "normkit_lab.runs.distributed" in GRAPH["normkit_lab.runs.builtin"]  # inside a method
    assert "normkit_lab.runs.checkpoints" in GRAPH["normkit_lab.runs.trainer"]  # under TYPE_CHECKING
    assert "normkit_lab.diagnostics.figures" in GRAPH["normkit_lab.diagnostics.report"]  # from package import sub


def test_find_cycle_finds_a_cycle_however_it_is_imported(tmp_path):
    """A toy package whose cycle closes only through a lazy import and a TYPE_CHECKING import."""
    pkg = tmp_path / "toy"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from toy.sub import b\n")
    (pkg / "sub" / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..c import X\n")
    (pkg / "c.py").write_text("from . import a\n")
    cycle = find_cycle(import_graph(module_files(pkg)))
    assert cycle is not None and cycle[0] == cycle[-1]
    assert set(cycle) == {"toy.a", "toy.sub.b", "toy.c"}
    assert find_cycle({"x": {"y"}, "y": set()}) is None


def test_no_module_imports_itself_through_others():
    cycle = find_cycle(GRAPH)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_no_room_imports_itself_through_others():
    rooms = room_graph(GRAPH)
    cycle = find_cycle(rooms)
    assert cycle is None, "cycle between subpackages: " + " -> ".join(cycle or [])


def layering_violations(graph: Mapping[str, Iterable[str]]) -> list[str]:
    """Every import against ALLOWED, and every import of runs/ by an executor beyond EXECUTOR_ENTRIES."""
    bad = [f"{module} ({room(module)}) imports {target} ({room(target)})"
           for module, targets in sorted(graph.items()) if room(module) != "facade"
           for target in sorted(targets)
           if room(target) != room(module) and room(target) not in ALLOWED.get(room(module), ())]
    bad += [f"{module} imports {target}, not one of {sorted(EXECUTOR_ENTRIES)}"
            for module, targets in sorted(graph.items()) if room(module) == "executors"
            for target in sorted(targets) if room(target) == "runs" and target not in EXECUTOR_ENTRIES]
    return bad


def test_every_room_imports_only_the_rooms_below_it():
    bad = layering_violations(GRAPH)
    assert not bad, "\n".join(bad)
    assert set(room_graph(GRAPH)) - {"facade"} <= set(ALLOWED), "a new room needs its row in ALLOWED"


def test_the_layering_check_names_what_breaks_it():
    """Imports the layout forbids, added to the real graph, are each reported."""
    broken = {**GRAPH, "normkit_lab.analysis.summary": {"normkit_lab.runs.training"},
              "normkit_lab.executors.local": {"normkit_lab.runs.builtin", "normkit_lab.runs.execute"},
              "normkit_lab.store.results": {"normkit_lab.study.plan"}}
    assert layering_violations(broken) == [
        "normkit_lab.analysis.summary (analysis) imports normkit_lab.runs.training (runs)",
        "normkit_lab.store.results (store) imports normkit_lab.study.plan (study)",
        "normkit_lab.executors.local imports normkit_lab.runs.builtin, not one of "
        "['normkit_lab.runs.execute', 'normkit_lab.runs.trainer']",
    ]
    cycle = find_cycle(room_graph(broken))
    assert cycle is not None and "store" in cycle and "study" in cycle


def test_leaves_import_no_room():
    """The top-level modules (errors, limits, spec, records, ...) import only each other."""
    bad = [f"{module} imports {target}" for module, targets in sorted(GRAPH.items())
           if room(module) == "leaves" for target in targets if room(target) != "leaves"]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("name", ["compare_norms", "read_result", "ExecutorOptions", "RunOptions", "report_metrics"])
def test_public_names_stay_at_the_top(name):
    assert name in normkit_lab.__all__
    assert getattr(normkit_lab, name) is not None
