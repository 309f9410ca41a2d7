"""Code fingerprints of module classes, to recognise a norm class that is a copy of one normkit reads.

Hugging Face copies one norm's code into each model's file under a new name (140 classes are
`LlamaRMSNorm`'s code in transformers 5.24); what a class computes is its code, not its name. Two
classes have the same fingerprint when they have the same base classes and the same methods
(compared as syntax trees), with docstrings, type annotations, `extra_repr` (text only) and the
class's own name left out.
"""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap

# Methods that do not change what a module computes or stores.
_IGNORED_METHODS = frozenset({"extra_repr"})

Fingerprint = tuple


def _is_docstring(node: ast.stmt) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)


def _normalized(node: ast.AST, class_name: str) -> str:
    """`node` without docstrings and annotations, with the class's own name replaced."""
    node = ast.parse(ast.unparse(node)).body[0]  # a copy, without line numbers
    for sub in ast.walk(node):
        if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)):
            sub.returns = None
            body = [stmt for i, stmt in enumerate(sub.body) if i or not _is_docstring(stmt)]
            sub.body = body or [ast.Pass()]
        elif isinstance(sub, ast.arg):
            sub.annotation = None
        elif isinstance(sub, ast.Name) and sub.id == class_name:
            sub.id = "__class__"
    return ast.dump(node, include_attributes=False)


@functools.cache
def _class_code(cls: type) -> tuple[tuple[type, ...], dict[str, str], tuple[str, ...]] | None:
    """(bases, method name -> normalized code, other class-body statements), None without source."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError, SyntaxError):
        return None
    definition = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls.__name__), None)
    if definition is None:
        return None
    methods, other = {}, []
    for stmt in definition.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if stmt.name not in _IGNORED_METHODS:
                methods[stmt.name] = _normalized(stmt, cls.__name__)
        elif not _is_docstring(stmt):
            other.append(_normalized(stmt, cls.__name__))
    return cls.__bases__, methods, tuple(other)


def fingerprint(cls: type) -> Fingerprint | None:
    """What `cls` computes, as code: equal for classes that differ only in names and docstrings."""
    code = _class_code(cls)
    if code is None:
        return None
    bases, methods, other = code
    return bases, tuple(sorted(methods.items())), other


def same_code(cls: type, known: list[type]) -> type | None:
    """The first class of `known` whose code is `cls`'s (itself excluded), else None."""
    mine = fingerprint(cls)
    if mine is None:
        return None
    return next((k for k in known if k is not cls and fingerprint(k) == mine), None)


def same_forward(cls: type, known: list[type]) -> type | None:
    """The first class of `known` whose `forward` is `cls`'s code although the class differs elsewhere."""
    mine = _class_code(cls)
    if mine is None or "forward" not in mine[1]:
        return None
    for k in known:
        theirs = _class_code(k)
        if k is not cls and theirs is not None and theirs[1].get("forward") == mine[1]["forward"]:
            return k
    return None
