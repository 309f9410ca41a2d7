"""Doc-test runner over Markdown: parse fenced blocks and their markers, run them, compare shown output.

Used by tests/test_docs.py so that every example in README.md and docs/ stays true. The conventions
for doc writers are in docs/writing-docs.md.
"""

from __future__ import annotations

import contextlib
import difflib
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import tomllib
import traceback
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]

PYTHON = {"python", "py"}
SHELL = {"bash", "sh", "shell"}
CONSOLE = {"console"}
DATA = {"yaml": "yaml", "yml": "yaml", "toml": "toml", "json": "json"}
TEXT = {"text", "txt"}
KNOWN = PYTHON | SHELL | CONSOLE | set(DATA) | TEXT

FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<lang>[^\s`]*)[^`]*$")
MARKER = re.compile(r"^\s*<!--\s*doctest:\s*(?P<body>.*?)\s*-->\s*$")
CI_OPEN = re.compile(r"^\s*<!--\s*ci:(?P<name>[\w-]+)\s*-->\s*$")
CI_CLOSE = re.compile(r"^\s*<!--\s*/ci:(?P<name>[\w-]+)\s*-->\s*$")
MARKER_WORDS = ("skip", "slow", "file", "copy-of", "output", "exit", "timeout")
COMMAND_TIMEOUT_S = 300


class DocError(Exception):
    """A block or marker that breaks the conventions; the message names the file:line."""


@dataclass
class Block:
    """One fenced block of a Markdown file, with the doctest markers written on the lines before it."""

    path: str            # relative to the repository root, e.g. docs/norms/gn.md
    line: int            # 1-based line of the opening fence
    lang: str
    text: str            # the content, without the fences and the fence's indentation
    skip: str | None = None
    slow: bool = False
    file: str | None = None
    copy_of: str | None = None              # a repository file this block shows verbatim
    output_marker: bool = False
    exit_status: int | None = None
    timeout: int | None = None
    ci: str | None = None                   # name of the enclosing <!-- ci:NAME --> region
    errors: list[str] = field(default_factory=list)
    output: Block | None = None             # the expected-output block shown after this one
    is_output: bool = False                 # this block is the expected output of the block before it

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"

    @property
    def runnable(self) -> bool:
        return self.lang in PYTHON | SHELL or (self.lang in CONSOLE and bool(console_commands(self.text)))


def _apply_marker(block_markers: dict, body: str, where: str, errors: list[str]) -> None:
    word, _, rest = body.partition(" ")
    rest = rest.strip()
    if word == "skip":
        reason = re.fullmatch(r"\((.*\S.*)\)", rest)
        if not reason:
            errors.append(f"{where}: 'doctest: skip' needs a reason in parentheses: <!-- doctest: skip (why) -->")
        else:
            block_markers["skip"] = reason.group(1).strip()
    elif word == "slow" and not rest:
        block_markers["slow"] = True
    elif word == "output" and not rest:
        block_markers["output_marker"] = True
    elif word == "file" and re.fullmatch(r"[\w.\-/]+", rest) and not rest.startswith(("/", "..")):
        block_markers["file"] = rest
    elif word == "copy-of" and re.fullmatch(r"[\w.\-/]+", rest) and not rest.startswith(("/", "..")):
        block_markers["copy_of"] = rest
    elif word == "exit" and rest.isdigit():
        block_markers["exit_status"] = int(rest)
    elif word == "timeout" and rest.isdigit():
        block_markers["timeout"] = int(rest)
    else:
        errors.append(f"{where}: unknown or malformed marker '<!-- doctest: {body} -->' "
                      f"(known: {', '.join(MARKER_WORDS)}; see docs/writing-docs.md)")


def parse(text: str, path: str) -> list[Block]:
    """All fenced blocks of one Markdown text, in order, with markers, CI regions and output pairing."""
    lines = text.splitlines()
    blocks: list[Block] = []
    pending: dict = {}
    pending_errors: list[str] = []
    ci: str | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        if m := MARKER.match(line):
            _apply_marker(pending, m.group("body"), f"{path}:{i + 1}", pending_errors)
            i += 1
            continue
        if m := CI_OPEN.match(line):
            ci = m.group("name")
        elif m := CI_CLOSE.match(line):
            ci = None
        fence = FENCE.match(line)
        if not fence:
            if line.strip() and (pending or pending_errors):
                pending_errors.append(f"{path}:{i + 1}: a doctest marker must be directly followed by a code block")
            i += 1
            continue
        indent, mark, lang = fence.group("indent"), fence.group("fence"), fence.group("lang").lower()
        body: list[str] = []
        j = i + 1
        while j < len(lines) and not re.match(rf"^[ \t]*{re.escape(mark[0])}{{{len(mark)},}}[ \t]*$", lines[j]):
            body.append(lines[j][len(indent):] if lines[j].startswith(indent) else lines[j].lstrip())
            j += 1
        block = Block(path=path, line=i + 1, lang=lang, text="\n".join(body) + ("\n" if body else ""),
                      ci=ci, errors=pending_errors, **pending)
        if j >= len(lines):
            block.errors.append(f"{block.where}: the code block is never closed")
        blocks.append(block)
        pending, pending_errors = {}, []
        i = j + 1
    if pending or pending_errors:
        pending_errors.append(f"{path}: a doctest marker at the end of the file precedes no code block")
        blocks.append(Block(path=path, line=len(lines), lang="text", text="", errors=pending_errors))
    _pair_outputs(blocks, lines)
    _check(blocks)
    return blocks


def _pair_outputs(blocks: list[Block], lines: list[str]) -> None:
    """An output block is a text (or command-less console) block right after a runnable block, or one marked
    output; only blank lines and markers may stand between a runnable block and its unmarked output block."""
    previous: Block | None = None
    previous_end = 0
    for block in blocks:
        between = lines[previous_end:block.line - 1] if previous else []
        adjacent = previous is not None and all(not s.strip() or MARKER.match(s) for s in between)
        outputish = block.lang in TEXT or (block.lang in CONSOLE and not console_commands(block.text))
        if block.output_marker or (adjacent and outputish and previous.runnable and previous.output is None):
            if previous is None or not previous.runnable:
                block.errors.append(f"{block.where}: marked as output, but the block before it runs nothing")
            elif previous.output is not None:
                block.errors.append(f"{block.where}: {previous.where} already has an output block")
            else:
                previous.output = block
                block.is_output = True
        previous = block
        end = block.line + block.text.count("\n")
        previous_end = end + 1


def _check(blocks: list[Block]) -> None:
    for block in blocks:
        if block.skip:
            continue
        if not block.lang:
            block.errors.append(f"{block.where}: code block without a language; tag it (python, bash, console, "
                                "yaml, toml, json, or text for what is not run) or mark it skip with a reason")
        elif block.lang not in KNOWN:
            block.errors.append(f"{block.where}: unknown block language '{block.lang}' "
                                f"(known: {', '.join(sorted(KNOWN))}); tag it text or mark it skip with a reason")
        elif block.lang in CONSOLE and not block.is_output and not console_commands(block.text):
            block.errors.append(f"{block.where}: console block without a '$ ' command that is not the output of "
                                "the block before it; tag a message shown as an example `text`")
        if (block.file or block.copy_of) and block.lang not in {*DATA, *TEXT, *PYTHON}:
            block.errors.append(f"{block.where}: 'doctest: file' and 'copy-of' apply to python, yaml, toml, json or "
                                "text blocks")


def collect(root: Path = REPO) -> list[Block]:
    """Every block of README.md and docs/**/*.md, files in sorted order, blocks in file order."""
    files = [root / "README.md", *sorted((root / "docs").rglob("*.md"))]
    blocks: list[Block] = []
    for md in files:
        if md.exists():
            blocks.extend(parse(md.read_text(encoding="utf-8"), md.relative_to(root).as_posix()))
    return blocks


# ---- commands -------------------------------------------------------------------------------------------


@dataclass
class Command:
    line: int            # 1-based line in the Markdown file
    text: str
    expected: str | None  # output shown after it in a console block, None when none is shown


def _join_continuations(raw: list[tuple[int, str]]) -> Iterator[tuple[int, str]]:
    while raw:
        start, text = raw.pop(0)
        while text.rstrip().endswith("\\") and raw:
            text = text.rstrip()[:-1] + " " + raw.pop(0)[1].strip()
        yield start, text.strip()


def shell_commands(block: Block) -> list[Command]:
    """A bash block's commands: one per line, `\\` continues a line, comments and blank lines are dropped."""
    raw = [(block.line + 1 + k, s) for k, s in enumerate(block.text.splitlines())
           if s.strip() and not s.lstrip().startswith("#")]
    return [Command(line, text, None) for line, text in _join_continuations(raw)]


def console_commands(text: str, first_line: int = 0) -> list[Command]:
    """A console block's `$ ` commands, each with the output lines shown after it (until the next `$ `)."""
    commands: list[Command] = []
    lines = text.splitlines()
    k = 0
    while k < len(lines):
        if not lines[k].startswith("$ "):
            k += 1
            continue
        start, parts = k, [lines[k][2:]]
        while parts[-1].rstrip().endswith("\\") and k + 1 < len(lines):
            k += 1
            parts.append(lines[k].removeprefix("> "))
        command = " ".join(p.rstrip().removesuffix("\\").strip() for p in parts)
        k += 1
        shown: list[str] = []
        while k < len(lines) and not lines[k].startswith("$ "):
            shown.append(lines[k])
            k += 1
        expected = "\n".join(shown) if any(s.strip() for s in shown) else None
        commands.append(Command(first_line + 1 + start, command, expected))
    return commands


# ---- output comparison ------------------------------------------------------------------------------------


def normalize(text: str) -> str:
    """Trailing whitespace of each line and blank lines at both ends do not count."""
    return "\n".join(s.rstrip() for s in text.strip("\n").splitlines()).strip("\n")


def matches(expected: str, actual: str) -> bool:
    """`...` in the expected text matches any text, across lines too; a line of only `...` matches any
    number of lines, none included."""
    pattern = ""
    for line in normalize(expected).splitlines():
        if line.strip() == "...":
            pattern += r"(?:[^\n]*\n)*?"
        else:
            pattern += ".*?".join(re.escape(piece) for piece in line.split("...")) + r"\n"
    return re.fullmatch(pattern, normalize(actual) + "\n", flags=re.DOTALL) is not None


def diff(expected: str, actual: str, where: str) -> str:
    lines = difflib.unified_diff(normalize(expected).splitlines(), normalize(actual).splitlines(),
                                 f"expected (shown in {where})", "actual", lineterm="")
    return "\n".join(lines)


# ---- running ---------------------------------------------------------------------------------------------


class BlockFailed(Exception):
    """A block that ran and failed; the message says where, what ran, and expected vs actual."""


class ConventionBroken(BlockFailed):
    """A block or marker written against the conventions (not run); the file's later blocks still run."""


class OutputDiffers(BlockFailed):
    """A block that ran but printed something else than shown; the file's later blocks can still run."""


def command_env() -> dict[str, str]:
    """CI-like environment: the repository's venv first on PATH, fixed width, strict plugins, no display."""
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.update(COLUMNS="100", LINES="50", NORMKIT_STRICT_PLUGINS="1", CI="true", MPLBACKEND="Agg",
               NO_COLOR="1", TERM="dumb", PYTHONHASHSEED="0")
    env.pop("FORCE_COLOR", None)
    return env


class FileState:
    """What the blocks of one Markdown file share: a temporary working directory and a Python namespace."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._tmp = tempfile.TemporaryDirectory(prefix="normkit-doc-")
        self.cwd = Path(self._tmp.name)
        (self.cwd / ".venv").symlink_to(Path(sys.prefix), target_is_directory=True)
        # The page's blocks run in a real, importable module, so what they define pickles by
        # reference as it would from a user's own module (normkit's conformance suite pickles norms).
        self.module_name = "normkit_docpage_" + re.sub(r"\W", "_", path) + f"_{id(self):x}"
        module = types.ModuleType(self.module_name)
        sys.modules[self.module_name] = module
        self.namespace: dict = module.__dict__
        self.done: set[int] = set()
        self.broken: dict[int, str] = {}     # line of a Python block that raised -> its message

    def close(self) -> None:
        """Forget the modules the page's blocks imported from its directory, then delete the directory."""
        for name, module in list(sys.modules.items()):
            if str(getattr(module, "__file__", None) or "").startswith(str(self.cwd)):
                del sys.modules[name]
        sys.modules.pop(self.module_name, None)
        self._tmp.cleanup()


def run_python(block: Block, state: FileState) -> None:
    code = compile("\n" * block.line + block.text, str(REPO / block.path), "exec")
    out = io.StringIO()
    previous = Path.cwd()
    os.chdir(state.cwd)
    sys.path.insert(0, str(state.cwd))
    try:
        with contextlib.redirect_stdout(out):
            exec(code, state.namespace)
    except Exception as exc:
        trace = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__.tb_next))
        raise BlockFailed(f"{block.where}: python block raised {type(exc).__name__}: {exc}\n{trace}"
                          f"printed before:\n{out.getvalue()}") from None
    finally:
        sys.path.remove(str(state.cwd))
        os.chdir(previous)
    if block.output and not matches(block.output.text, out.getvalue()):
        raise OutputDiffers(f"{block.where}: python block printed something else than shown "
                            f"('...' matches any text):\n{diff(block.output.text, out.getvalue(), block.output.where)}")


def run_command(block: Block, command: Command, state: FileState) -> str:
    """Run one command with bash in the file's working directory; its stdout and stderr, in order."""
    timeout = block.timeout or COMMAND_TIMEOUT_S
    try:
        proc = subprocess.run(["bash", "-o", "pipefail", "-c", command.text], cwd=state.cwd, env=command_env(),
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise BlockFailed(f"{block.path}:{command.line}: $ {command.text}\ntimed out after {timeout} s; make the "
                          "example smaller, or mark the block <!-- doctest: slow -->") from None
    wanted = block.exit_status
    if wanted is None:
        shown = command.expected if command.expected is not None else (block.output.text if block.output else "")
        wanted = 2 if normalize(shown).startswith("error:") else 0
    if proc.returncode != wanted:
        raise BlockFailed(f"{block.path}:{command.line}: $ {command.text}\nexit status {proc.returncode}, expected "
                          f"{wanted}; output:\n{proc.stdout}")
    if command.expected is not None and not matches(command.expected, proc.stdout):
        raise OutputDiffers(f"{block.path}:{command.line}: $ {command.text}\noutput differs from the shown output "
                          f"('...' matches any text):\n{diff(command.expected, proc.stdout, block.where)}")
    return proc.stdout


def run_commands(block: Block, state: FileState) -> None:
    if block.lang in CONSOLE:
        commands = console_commands(block.text, block.line)
    else:
        commands = shell_commands(block)
    outputs = [run_command(block, command, state) for command in commands]
    if block.output:
        shown = block.output.text
        actual = "".join(outputs)
        if not matches(shown, actual):
            listing = "\n".join(f"$ {c.text}" for c in commands)
            raise OutputDiffers(f"{block.where}:\n{listing}\noutput differs from the shown output "
                              f"('...' matches any text):\n{diff(shown, actual, block.output.where)}")


def check_data(block: Block, state: FileState) -> None:
    kind = DATA[block.lang]
    try:
        if kind == "yaml":
            yaml.safe_load(block.text)
        elif kind == "toml":
            tomllib.loads(block.text)
        else:
            json.loads(block.text)
    except Exception as exc:
        raise BlockFailed(f"{block.where}: invalid {kind}: {exc}") from None


def check_copy(block: Block) -> None:
    """The block equals the repository file it shows; a first line that only names the file does not count."""
    source = REPO / block.copy_of
    if not source.is_file():
        raise BlockFailed(f"{block.where}: 'doctest: copy-of {block.copy_of}': no such file in the repository")
    shown = block.text
    first, _, rest = shown.partition("\n")
    if re.fullmatch(r"\s*(#|//)\s*\S+\s*", first) and first.strip().lstrip("#/ ").strip() in block.copy_of:
        shown = rest
    actual = source.read_text(encoding="utf-8")
    if normalize(shown) != normalize(actual):
        raise OutputDiffers(f"{block.where}: the block no longer equals {block.copy_of}; copy the file again:\n"
                            + "\n".join(difflib.unified_diff(normalize(shown).splitlines(),
                                                             normalize(actual).splitlines(),
                                                             f"shown in {block.where}", block.copy_of, lineterm="")))


def run_block(block: Block, state: FileState) -> None:
    """Run (or check) one block in its file's state; raise BlockFailed with file:line, what ran, and a diff."""
    if block.errors:
        raise ConventionBroken("\n".join(block.errors))
    if block.copy_of:
        check_copy(block)
    if block.file:
        target = state.cwd / block.file
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(block.text, encoding="utf-8")
    if block.lang in DATA:
        check_data(block, state)
    elif block.lang in PYTHON:
        run_python(block, state)
    elif block.lang in SHELL or block.lang in CONSOLE:
        run_commands(block, state)


def selected(block: Block) -> bool:
    """A block the runner executes as its own test item (output and plain text blocks are not)."""
    if block.errors:
        return True
    return not block.is_output and (block.runnable or block.lang in DATA or block.copy_of is not None)


def run_in_order(blocks: list[Block], index: int, state: FileState) -> None:
    """Run block `index` after any earlier block of its file that did not run yet (a `-m slow` run starts
    with the fast blocks a slow one builds on); skipped, slow and CI blocks are never prerequisites."""
    for k in range(index):
        prior = blocks[k]
        if prior.line in state.broken:
            raise BlockFailed(f"{blocks[index].where}: not run: an earlier block of this file failed "
                              f"({prior.where}); fix that one first")
        if k in state.done or not selected(prior) or prior.skip or prior.slow or prior.ci:
            continue
        _run_recorded(prior, k, state)
    _run_recorded(blocks[index], index, state)


def _run_recorded(block: Block, k: int, state: FileState) -> None:
    state.done.add(k)
    try:
        run_block(block, state)
    except BlockFailed as exc:
        # a Python block that raised leaves its namespace half-built, so later blocks of the page would
        # fail for its sake; a failed command or a differing output leaves nothing later blocks trip on
        if block.lang in PYTHON and not isinstance(exc, OutputDiffers | ConventionBroken):
            state.broken[block.line] = str(exc)
        raise


# ---- links -----------------------------------------------------------------------------------------------

INLINE_LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?(?P<target>[^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_LINK = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(?P<target>\S+?)>?(?:\s+.*)?$")
HTML_LINK = re.compile(r"""(?:href|src)\s*=\s*["'](?P<target>[^"']+)["']""")
OUTSIDE = re.compile(r"(?:\.\./)+shared\b|/work/(?:shared|main|wt)\b")
EXTERNAL = re.compile(r"^(?:[a-z][a-z0-9+.-]*:|//)", re.IGNORECASE)


def _outside_code(text: str) -> Iterator[tuple[int, str]]:
    """(line number, line) of the lines of a Markdown text that are not inside a fenced block."""
    fence: str | None = None
    for number, line in enumerate(text.splitlines(), 1):
        m = FENCE.match(line)
        if fence is None and m:
            fence = m.group("fence")
        elif fence is not None and re.match(rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$", line):
            fence = None
        elif fence is None:
            yield number, line


def heading_anchors(text: str) -> set[str]:
    """GitHub's anchors for the headings of a Markdown text (lower case, punctuation dropped, spaces to -)."""
    anchors: set[str] = set()
    seen: dict[str, int] = {}
    for _, line in _outside_code(text):
        if not (m := re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)):
            continue
        slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


def link_targets(text: str) -> Iterator[tuple[int, str]]:
    """(line, target) of every Markdown or HTML link outside code blocks."""
    for number, line in _outside_code(text):
        prose = re.sub(r"`[^`]*`", "", line)      # code spans are not links
        for pattern in (INLINE_LINK, REFERENCE_LINK, HTML_LINK):
            for m in pattern.finditer(prose):
                yield number, m.group("target")


def check_links(md: Path, root: Path = REPO) -> list[str]:
    """Problems with one page's links: pointers outside the repository, missing files, missing anchors."""
    text = md.read_text(encoding="utf-8")
    where = md.relative_to(root).as_posix()
    problems = [f"{where}:{n}: points outside the repository ('{m.group(0)}'); docs must stand alone"
                for n, line in enumerate(text.splitlines(), 1) for m in OUTSIDE.finditer(line)]
    for number, target in link_targets(text):
        if EXTERNAL.match(target):
            continue
        path_part, _, anchor = target.partition("#")
        resolved = (md.parent / path_part).resolve() if path_part else md.resolve()
        if path_part.startswith("/") or not resolved.is_relative_to(root.resolve()):
            problems.append(f"{where}:{number}: link '{target}' points outside the repository")
        elif not resolved.exists():
            problems.append(f"{where}:{number}: link '{target}' points to a file that does not exist")
        elif anchor and resolved.suffix == ".md" and anchor not in heading_anchors(resolved.read_text("utf-8")):
            problems.append(f"{where}:{number}: link '{target}': no heading with anchor '#{anchor}' in "
                            f"{resolved.relative_to(root.resolve()).as_posix()}")
    return problems
