"""The command of a `--command` comparison: placeholders, argv, environment and the files it names.

    template = CommandTemplate.parse("python train.py --norm {norm} --seed {seed} --lr {lr}")
    template.check(sweep_keys={"batch_size"}, tune_keys={"lr"})
    argv = template.argv(values)      # ["python", "train.py", "--norm", "gn(groups=8)+pn", ...]

The command is split with shlex first and the placeholders are filled in each argument, so a
value (a spec such as `gn(groups=8)+pn`, a path with spaces) is always one argument and no shell
ever reads it. A shell runs only when the command names one (`bash -c '...'`).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import shlex
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from normkit_lab.errors import ConfigError, short_repr

FIXED = ("norm", "seed", "run_dir", "phase", "epochs", "python")  # placeholders every run has
_FIELD = re.compile(r"\{\{|\}\}|\{([^{}]*)\}")
MAX_HASHED_FILES = 64


@dataclass(frozen=True)
class CommandTemplate:
    """A command line as the user wrote it, split into arguments with placeholders unfilled."""

    text: str
    args: tuple[str, ...]

    @classmethod
    def parse(cls, text: Any) -> CommandTemplate:
        if not isinstance(text, str) or not text.strip():
            raise ConfigError(f"command must be a command line such as \"python train.py --norm {{norm}} --seed "
                              f"{{seed}}\", not {short_repr(text)}")
        try:
            args = tuple(shlex.split(text))
        except ValueError as exc:
            raise ConfigError(f"command {short_repr(text)} cannot be split into arguments ({exc}); check "
                              f"its quotes") from None
        if not args:
            raise ConfigError("command is empty; give the program to run, e.g. --command \"python train.py\"")
        return cls(text, args)

    def fields(self) -> list[str]:
        """Every placeholder name used, in order (`cell.batch_size`, `lr`, ...)."""
        return [m.group(1) for arg in self.args for m in _FIELD.finditer(arg) if m.group(1) is not None]

    def check(self, sweep_keys: Iterable[str], tune_keys: Iterable[str], workdir: Path) -> None:
        """Refuse unknown placeholders and a program that cannot be found (one line each)."""
        known = [*FIXED, *(f"cell.{k}" for k in sweep_keys), *tune_keys]
        for name in self.fields():
            if name not in known:
                hint = "" if not name.startswith("cell.") else " (cell.KEY needs --sweep KEY=...)"
                raise ConfigError(f"placeholder {{{name}}} in the command is not one of {{"
                                  f"{'}, {'.join(known)}}}{hint}; write {{{{ and }}}} for literal braces")
        program = self.args[0]
        if not _FIELD.search(program) and "/" not in program and shutil.which(program) is None:
            raise ConfigError(f"program {program!r} of the command is not on PATH; give its path or install it")
        if "/" in program and not _FIELD.search(program) and not (workdir / program).is_file() \
                and not Path(program).is_file():
            raise ConfigError(f"program {program!r} of the command does not exist (relative paths are from "
                              f"{str(workdir)!r})")

    def argv(self, values: Mapping[str, Any]) -> list[str]:
        """The arguments with every placeholder filled in (each stays one argument)."""
        def fill(match: re.Match[str]) -> str:
            if match.group(0) == "{{":
                return "{"
            if match.group(0) == "}}":
                return "}"
            return text_of(values[match.group(1)])

        return [_FIELD.sub(fill, arg) for arg in self.args]

    def named_files(self, workdir: Path) -> dict[str, str]:
        """sha256 of every file an argument (or the value of an `--opt=value` argument) names that
        exists in `workdir`, by a relative path: the training script, its config... A changed one is
        noticed on resume. Absolute paths (the interpreter, system files) are not the experiment's."""
        hashes: dict[str, str] = {}
        root = workdir.resolve()
        for arg in self.args:
            if _FIELD.search(arg):
                continue
            for candidate in {arg, arg.partition("=")[2]}:
                if not candidate or Path(candidate).is_absolute() or len(hashes) >= MAX_HASHED_FILES:
                    continue
                path = workdir / candidate
                try:
                    if path.is_file() and root in path.resolve().parents:
                        hashes[candidate] = file_hash(path)
                except OSError:
                    continue
        return dict(sorted(hashes.items()))


def text_of(value: Any) -> str:
    """A placeholder value as an argument: text and numbers as written, lists and mappings as JSON."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(value, sort_keys=True)


_INT = re.compile(r"-?(0|[1-9][0-9]*)", re.ASCII)
_FLOAT = re.compile(r"-?[0-9.]+(e[-+]?[0-9]+)?", re.ASCII)


def value_as_written(text: str) -> Any:
    """A `--sweep`/`--tune` value of the user's program, as written: an int or a float when `text` is how
    Python writes that number (`8`, `-3`, `0.05`, `1e-05`), `true`/`false` as booleans, else the text
    itself. Never YAML's reading: `010` stays `010` (YAML 1.1 reads 8), `1:30` stays `1:30` (90), `on`
    stays `on` (true), `0x1F`, `&a b`, `@x` and `{a` stay as written, so the program gets what was typed
    (a number that Python would print otherwise, `1e-3`, reaches it as that text too)."""
    if _INT.fullmatch(text) and text != "-0":
        return int(text)
    if _FLOAT.fullmatch(text):
        try:
            number = float(text)
        except ValueError:
            return text
        return number if repr(number) == text else text
    return {"true": True, "false": False}.get(text, text)


def check_free_values(what: str, key: str, values: list[Any]) -> None:
    """Refuse values of a program's key that could not identify a run: non-finite numbers (a `nan` never
    equals itself, so its run would never count as done), and nested or null values."""
    for value in values:
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{what} {key}={value!r} is not a finite number; give finite values, or quote it in a "
                              f"config file ('nan') to pass the text")
        if not isinstance(value, (int, float, str, bool)):
            raise ConfigError(f"{what} {key}={short_repr(value)} must be a plain value (a number, true/false or "
                              f"text), e.g. {key}=0.03,0.1,0.3")


def file_hash(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return "sha256:" + digest.hexdigest()


def changed_files(saved: Mapping[str, str], now: Mapping[str, str]) -> list[str]:
    """The files whose hash differs (or that are gone) between `saved` and `now`."""
    return [name for name, digest in saved.items() if now.get(name) != digest]
