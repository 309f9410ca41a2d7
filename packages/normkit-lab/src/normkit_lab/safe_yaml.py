"""YAML from users and results directories, read with bounds: size, alias expansion, encoding.

`yaml.safe_load` shares aliased nodes, so a "billion laughs" document loads in microseconds but
becomes exponentially large when anything walks or prints it. Here the composed node graph is
walked with a budget before any Python value is built, so such a document is refused up front.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from normkit_lab.errors import ConfigError, one_line
from normkit_lab.limits import MAX_YAML_BYTES, MAX_YAML_NODES


def _count_nodes(node: yaml.Node, what: str) -> None:
    budget = MAX_YAML_NODES
    stack = [node]
    while stack:
        current = stack.pop()
        budget -= 1
        if budget < 0:
            raise ConfigError(f"{what} expands to more than {MAX_YAML_NODES:,} YAML values (aliases "
                              f"repeated too often); write the values out")
        if isinstance(current, yaml.SequenceNode):
            stack.extend(current.value)
        elif isinstance(current, yaml.MappingNode):
            _refuse_duplicate_keys(current, what)
            for key, value in current.value:
                stack.extend((key, value))


def _refuse_duplicate_keys(node: yaml.MappingNode, what: str) -> None:
    """A key given twice in one mapping (PyYAML keeps the last silently): one line naming it and its lines."""
    seen: dict[tuple[str, str], int] = {}
    for key, _ in node.value:
        if not isinstance(key, yaml.ScalarNode) or key.tag == "tag:yaml.org,2002:merge":
            continue
        line = key.start_mark.line + 1
        first = seen.get((key.tag, key.value))
        if first is not None:
            where = f"line {line}" if first == line else f"lines {first} and {line}"
            raise ConfigError(f"{what} gives key {key.value!r} twice ({where}); keep one")
        seen[(key.tag, key.value)] = line


def _problem(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    problem = getattr(exc, "problem", None) or "invalid YAML"
    return one_line(f"{problem}{where}")


def loads(text: str, what: str) -> Any:
    """The value of YAML `text` (safe types only); `what` names its source in one-line errors."""
    if len(text) > MAX_YAML_BYTES:
        raise ConfigError(f"{what} is larger than {MAX_YAML_BYTES:,} characters; a config is a few lines")
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _count_nodes(node, what)
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{what} is not valid YAML: {_problem(exc)}") from None
    except RecursionError:
        raise ConfigError(f"{what} nests too deeply to be a config") from None
    finally:
        loader.dispose()


def read(path: str | Path, what: str) -> Any:
    """The value of a YAML file; unreadable, binary, non-UTF-8 or oversized files raise ConfigError."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_YAML_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {str(path)!r}: {exc.strerror or exc}") from None
    if len(data) > MAX_YAML_BYTES:
        raise ConfigError(f"{what} {str(path)!r} is larger than {MAX_YAML_BYTES:,} bytes; "
                          f"a config is a few lines")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise ConfigError(f"{what} {str(path)!r} line {line} is not UTF-8 text (a binary file?); "
                          f"give a YAML file") from None
    if "\x00" in text:
        line = text[:text.index("\x00")].count("\n") + 1
        raise ConfigError(f"{what} {str(path)!r} line {line} holds a NUL byte (a binary file?); "
                          f"give a YAML file")
    return loads(text, f"{what} {str(path)!r}")
