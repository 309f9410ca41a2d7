"""YAML from users and results directories, read with bounds: size, alias expansion, encoding.

`yaml.safe_load` shares aliased nodes, so a "billion laughs" document loads in microseconds but
becomes exponentially large when anything walks or prints it. Here the composed node graph is
walked with a budget before any Python value is built, so such a document is refused up front.

Numbers a user writes are read as YAML 1.2 and Python write them, as the command line reads them, not
by PyYAML's YAML 1.1 rules: `010` is 10 (not octal 8), `1e-3` is 0.001 (not the text "1e-3"), `1:30` and
`1_000` stay text (not 90 and 1000). `dumps` quotes every text that either rule set would read as
something else, so what normkit writes reads the same both ways; a results directory's own files
(`saved=True`) are read by the rules they were written under, so an older directory, whose config.yaml
may hold a plain `1e-3` meaning the text, still matches the hash of its runs.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from normkit_lab.errors import ConfigError, one_line
from normkit_lab.limits import MAX_YAML_BYTES, MAX_YAML_NODES

_INT_TAG, _FLOAT_TAG = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"
_INT = re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$")
_FLOAT = re.compile(r"^(?:[-+]?(?:[0-9]+\.[0-9]*|\.[0-9]+|[0-9]+(?:\.[0-9]*)?[eE][-+]?[0-9]+|\.[0-9]+[eE][-+]?[0-9]+)"
                    r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$")


def _numbers_as_written(cls: type) -> None:
    """Replace `cls`'s YAML 1.1 int and float resolvers with the YAML 1.2 core ones (see the module)."""
    cls.yaml_implicit_resolvers = {first: [(tag, pattern) for tag, pattern in resolvers
                                           if tag not in (_INT_TAG, _FLOAT_TAG)]
                                   for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
    cls.add_implicit_resolver(_INT_TAG, _INT, list("-+0123456789"))
    cls.add_implicit_resolver(_FLOAT_TAG, _FLOAT, list("-+0123456789."))


class _Loader(yaml.SafeLoader):
    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:  # type: ignore[override]
        text = str(self.construct_scalar(node))
        if not _INT.match(text):  # only a `!!int` tag on other text gets here
            raise yaml.constructor.ConstructorError(None, None, f"{text!r} is not an integer", node.start_mark)
        if text[:2] in ("0o", "0x"):
            return int(text[2:], 8 if text[1] == "o" else 16)
        return int(text, 10)  # YAML 1.1 would read 010 as octal 8


class _Dumper(yaml.SafeDumper):
    pass


_numbers_as_written(_Loader)
_Loader.add_constructor(_INT_TAG, _Loader.construct_yaml_int)
_Dumper.yaml_implicit_resolvers = {k: list(v) for k, v in yaml.SafeDumper.yaml_implicit_resolvers.items()}
_Dumper.add_implicit_resolver(_INT_TAG, _INT, list("-+0123456789"))  # quoted when 1.1 or 1.2 reads a number
_Dumper.add_implicit_resolver(_FLOAT_TAG, _FLOAT, list("-+0123456789."))


def dumps(data: Any) -> str:
    """YAML text of `data` that `loads` reads back as the same values (keys in the order given)."""
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False)


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


def loads(text: str, what: str, saved: bool = False) -> Any:
    """The value of YAML `text` (safe types only); `what` names its source in one-line errors; `saved`: a
    file normkit wrote into a results directory, read by the rules it was written under (see the module)."""
    if len(text) > MAX_YAML_BYTES:
        raise ConfigError(f"{what} is larger than {MAX_YAML_BYTES:,} characters; a config is a few lines")
    loader = yaml.SafeLoader(text) if saved else _Loader(text)
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


def read(path: str | Path, what: str, saved: bool = False) -> Any:
    """The value of a YAML file; unreadable, binary, non-UTF-8 or oversized files raise ConfigError.
    `saved`: a results directory's own file (see `loads`)."""
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
    return loads(text, f"{what} {str(path)!r}", saved)
