"""The core's modules import each other one way (no circles, TYPE_CHECKING imports included), so
the stage model does not depend on the layer that runs it."""

from __future__ import annotations

import ast
from pathlib import Path

import normkit

PACKAGE = Path(normkit.__file__).parent
MODULES = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__")


def _module_level_imports(module: str) -> set[str]:
    """normkit submodules `module` imports at module level (inside `if TYPE_CHECKING:` too)."""
    tree = ast.parse((PACKAGE / f"{module}.py").read_text())
    found: set[str] = set()
    body = list(tree.body)
    while body:
        node = body.pop(0)
        if isinstance(node, ast.If):
            body.extend(node.body + node.orelse)
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module.startswith("normkit."):
                found.add(node.module.split(".")[1])
            elif node.module == "normkit":
                found.update(a.name for a in node.names if a.name in MODULES)
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".")[1] for a in node.names if a.name.startswith("normkit."))
    return found - {module}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = 2
        path.pop()
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_core_modules_form_no_import_circle() -> None:
    graph = {m: _module_level_imports(m) for m in MODULES}
    assert _cycle(graph) is None, " -> ".join(_cycle(graph))


def test_the_stage_model_does_not_import_the_layer() -> None:
    assert "layer" not in _module_level_imports("stages")
    assert _module_level_imports("native") == set()  # plain tensor functions
    assert _module_level_imports("errors") == set()


def test_the_cycle_finder_finds_cycles() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
