"""The doc-test runner itself: parsing, markers, output pairing, ellipsis matching, failures, links."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import docblocks  # noqa: E402

PAGE = """# Title

Text.

<!-- doctest: skip (needs a GPU) -->
```bash
normkit compare --device cuda
```

<!-- doctest: slow -->
```python
x = 1
print(x + 1)
```

```text
2
```

```text
a formula, not an output
```

<!-- doctest: file exp.yaml -->
```yaml
epochs: 1
```

```console
$ echo hi
hi
$ echo there \\
    you
there you
```
"""


def run(page: str) -> list[tuple[docblocks.Block, Exception | None]]:
    """Run every selected block of `page` in order; the exception each raised (None when it passed)."""
    blocks = docblocks.parse(page, "docs/page.md")
    state = docblocks.FileState("docs/page.md")
    results = []
    try:
        for k, block in enumerate(blocks):
            if not docblocks.selected(block) or block.skip:
                continue
            try:
                docblocks.run_in_order(blocks, k, state)
                results.append((block, None))
            except docblocks.BlockFailed as exc:
                results.append((block, exc))
    finally:
        state.close()
    return results


def test_parse_finds_blocks_lines_languages_and_markers() -> None:
    blocks = docblocks.parse(PAGE, "docs/page.md")
    assert [(b.line, b.lang) for b in blocks] == [(6, "bash"), (11, "python"), (16, "text"), (20, "text"),
                                                  (25, "yaml"), (29, "console")]
    bash, python, output, formula, data, _console = blocks
    assert bash.skip == "needs a GPU" and not bash.slow
    assert python.slow and python.output is output and output.is_output
    assert not formula.is_output and formula.output is None
    assert data.file == "exp.yaml"
    assert [b.where for b in blocks if docblocks.selected(b)] == ["docs/page.md:6", "docs/page.md:11",
                                                                  "docs/page.md:25", "docs/page.md:29"]
    assert not any(b.errors for b in blocks)


def test_modules_written_by_a_page_are_forgotten_when_it_closes() -> None:
    page = "<!-- doctest: file docmod_probe.py -->\n```python\nVALUE = 3\n```\n\n```python\nimport docmod_probe\n```\n"
    blocks = docblocks.parse(page, "docs/page.md")
    state = docblocks.FileState("docs/page.md")
    docblocks.run_in_order(blocks, 1, state)
    assert sys.modules["docmod_probe"].VALUE == 3
    state.close()
    assert "docmod_probe" not in sys.modules


def test_console_commands_take_their_shown_output_and_continuations() -> None:
    commands = docblocks.console_commands("$ echo hi\nhi\n$ echo a \\\n    b\n$ true\n", first_line=10)
    assert [(c.line, c.text, c.expected) for c in commands] == [(11, "echo hi", "hi"), (13, "echo a b", None),
                                                               (15, "true", None)]


def test_blocks_run_in_file_order_sharing_a_directory() -> None:
    page = PAGE + """
```python
from pathlib import Path
print(Path("exp.yaml").read_text().strip())
```

```text
epochs: 1
```
"""
    results = run(page)
    assert [(b.line, exc) for b, exc in results] == [(11, None), (25, None), (29, None), (37, None)]


@pytest.mark.parametrize(("expected", "actual", "match"), [
    ("a ... c", "a b c", True),
    ("a...", "a\nb\nc", True),                        # across lines
    ("x\n...\ny", "x\ny", True),                      # a line of ... matches no line
    ("x\n...\ny", "x\n1\n2\ny", True),                # or several
    ("time ... s", "time 1.5 s  \n\n", True),          # trailing whitespace and blank lines ignored
    ("a ... c", "a b d", False),
    ("x\n...\ny", "x\n1\nz", False),
    ("exactly", "exactly not", False),
])
def test_ellipsis_matching(expected: str, actual: str, match: bool) -> None:
    assert docblocks.matches(expected, actual) is match


def test_a_wrong_output_reports_file_line_command_and_a_diff() -> None:
    page = "intro\n\n```console\n$ echo actual\nshown\n```\n"
    [(_, exc)] = run(page)
    message = str(exc)
    assert isinstance(exc, docblocks.OutputDiffers)
    assert message.startswith("docs/page.md:4: $ echo actual")
    assert "--- expected (shown in docs/page.md:3)\n+++ actual" in message
    assert "-shown\n+actual" in message


def test_a_wrong_python_output_shows_a_diff_against_the_output_block() -> None:
    page = "```python\nprint('one')\nprint('two')\n```\n\n```text\none\nthree\n```\n"
    [(_, exc)] = run(page)
    assert str(exc).startswith("docs/page.md:1: python block printed something else")
    assert "--- expected (shown in docs/page.md:6)" in str(exc) and "-three\n+two" in str(exc)


def test_an_exception_names_the_markdown_line_and_stops_later_blocks() -> None:
    page = "```python\nx = 1\nraise ValueError('bad doc')\n```\n\n```python\nprint(x)\n```\n"
    (_, first), (_, second) = run(page)
    assert "python block raised ValueError: bad doc" in str(first)
    assert 'page.md", line 3' in str(first)
    assert "an earlier block of this file failed (docs/page.md:1)" in str(second)


def test_exit_status_rules() -> None:
    page = ("```bash\nfalse\n```\n\nprose\n\n```console\n$ echo 'error: bad' >&2; exit 2\nerror: bad\n```\n\n"
            "```console\n$ echo 'error: bad'\nerror: bad\n```\n")
    (_, failing), (_, error_ok), (_, error_exit_0) = run(page)
    assert "docs/page.md:2: $ false\nexit status 1, expected 0" in str(failing)
    assert error_ok is None
    assert "exit status 0, expected 2" in str(error_exit_0)


def test_skip_without_a_reason_is_an_error() -> None:
    [block] = docblocks.parse("<!-- doctest: skip -->\n```bash\ntrue\n```\n", "docs/page.md")
    assert docblocks.selected(block) and block.skip is None
    assert "needs a reason in parentheses" in block.errors[0]
    with pytest.raises(docblocks.ConventionBroken, match="docs/page.md:1: 'doctest: skip' needs a reason"):
        docblocks.run_block(block, None)


@pytest.mark.parametrize(("page", "error"), [
    ("```\nplain\n```\n", "docs/page.md:1: code block without a language"),
    ("```mermaid\ngraph\n```\n", "unknown block language 'mermaid'"),
    ("<!-- doctest: sometimes -->\n```bash\ntrue\n```\n", "unknown or malformed marker"),
    ("<!-- doctest: slow -->\n\nprose\n```bash\ntrue\n```\n", "must be directly followed by a code block"),
    ("```console\nno command here\n```\n", "console block without a '$ ' command"),
    ("<!-- doctest: output -->\n```text\nx\n```\n", "marked as output, but the block before it runs nothing"),
    ("```python\nx = 1\n", "never closed"),
])
def test_convention_errors_are_reported_at_their_line(page: str, error: str) -> None:
    blocks = docblocks.parse(page, "docs/page.md")
    errors = [e for b in blocks for e in b.errors]
    assert any(error in e for e in errors), errors
    assert all(docblocks.selected(b) for b in blocks if b.errors)


def test_ci_blocks_are_recognised() -> None:
    page = "<!-- ci:test -->\n```bash\npytest\n```\n<!-- /ci:test -->\n\n```bash\ntrue\n```\n"
    ci, plain = docblocks.parse(page, "README.md")
    assert ci.ci == "test" and plain.ci is None


def test_data_blocks_must_parse() -> None:
    [block] = docblocks.parse("```json\n{\"a\": 1,}\n```\n", "docs/page.md")
    with pytest.raises(docblocks.BlockFailed, match="docs/page.md:1: invalid json"):
        docblocks.check_data(block, None)


def test_copy_of_detects_a_block_that_drifted_from_its_file() -> None:
    [same, drifted] = docblocks.parse(
        "<!-- doctest: copy-of tests/docblocks.py -->\n```python\n"
        + (docblocks.REPO / "tests" / "docblocks.py").read_text() + "```\n\n"
        "<!-- doctest: copy-of tests/docblocks.py -->\n```python\nsomething else\n```\n", "docs/page.md")
    docblocks.check_copy(same)
    with pytest.raises(docblocks.OutputDiffers, match="no longer equals tests/docblocks.py"):
        docblocks.check_copy(drifted)


def test_links_outside_the_repository_and_to_missing_files_are_caught(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "other.md").write_text("# Other page\n\n## A section\n")
    page = tmp_path / "docs" / "page.md"
    page.write_text("[notes](../../shared/notes/x.md) and [ok](other.md#a-section) and [gone](missing.md)\n"
                    "see ../shared/notes/ for the values\n"
                    "[bad anchor](other.md#nowhere) [web](https://example.org) [self](#title)\n\n# Title\n"
                    "```bash\n[not a link](nowhere.md)\n```\n")
    problems = docblocks.check_links(page, root=tmp_path)
    assert "docs/page.md:1: link '../../shared/notes/x.md' points outside the repository" in problems
    assert "docs/page.md:1: link 'missing.md' points to a file that does not exist" in problems
    assert any(p.startswith("docs/page.md:2: points outside the repository ('../shared')") for p in problems)
    assert any("no heading with anchor '#nowhere'" in p for p in problems)
    assert len(problems) == 5, problems   # ../shared in line 1's link text counts too; nothing else


def test_the_repository_docs_parse_without_convention_errors() -> None:
    blocks = docblocks.collect()
    assert blocks, "no doc blocks found"
    assert [e for b in blocks for e in b.errors] == []
