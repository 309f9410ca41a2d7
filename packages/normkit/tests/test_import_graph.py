"""The core's modules import each other one way (no circles, TYPE_CHECKING imports included), so
the stage model does not depend on the layer that runs it, nor on the interop subpackage that fits
layers into other libraries' models."""

from __future__ import annotations

import ast
from pathlib import Path

import normkit

PACKAGE = Path(normkit.__file__).parent
# Dotted names below normkit: "stages", "interop.convert" (package __init__ files left out).
MODULES = sorted(".".join(p.relative_to(PACKAGE).with_suffix("").parts) for p in PACKAGE.rglob("*.py")
                 if p.stem != "__init__")
INTEROP = [m for m in MODULES if m.startswith("interop.")]


def _module_level_imports(module: str) -> set[str]:
    """normkit submodules `module` imports at module level (inside `if TYPE_CHECKING:` too)."""
    tree = ast.parse((PACKAGE / f"{module.replace('.', '/')}.py").read_text())
    found: set[str] = set()
    body = list(tree.body)
    while body:
        node = body.pop(0)
        if isinstance(node, ast.If):
            body.extend(node.body + node.orelse)
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module.startswith("normkit."):
                found.add(node.module.removeprefix("normkit."))
            elif node.module in ("normkit", "normkit.interop"):
                prefix = node.module.removeprefix("normkit").lstrip(".")
                found.update(f"{prefix}.{a.name}".lstrip(".") for a in node.names
                             if f"{prefix}.{a.name}".lstrip(".") in MODULES)
        elif isinstance(node, ast.Import):
            found.update(a.name.removeprefix("normkit.") for a in node.names if a.name.startswith("normkit."))
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


def test_the_stage_model_imports_nothing_from_interop() -> None:
    assert INTEROP, "the interop subpackage holds the conversion and deployment modules"
    for module in MODULES:
        if not module.startswith("interop."):
            assert not {m for m in _module_level_imports(module) if m.startswith("interop")}, module


def test_the_stage_model_does_not_import_the_layer() -> None:
    assert "layer" not in _module_level_imports("stages")
    assert _module_level_imports("native") == set()  # plain tensor functions
    assert _module_level_imports("errors") == set()


def test_the_cycle_finder_finds_cycles() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
