"""Every code block of README.md and docs/**/*.md runs, and shows what the code prints today.

One test item per block, named by file:line, in file order; blocks of one file share a working
directory and a Python namespace. Conventions for doc writers: docs/writing-docs.md.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import docblocks  # noqa: E402

BLOCKS = docblocks.collect()
BY_FILE: dict[str, list[docblocks.Block]] = {}
for _block in BLOCKS:
    BY_FILE.setdefault(_block.path, []).append(_block)
PAGES = [docblocks.REPO / "README.md", *sorted((docblocks.REPO / "docs").rglob("*.md"))]


def _param(block: docblocks.Block) -> pytest.param:
    # a page's blocks share a namespace and build on each other: one xdist worker runs them, in order
    marks = [pytest.mark.xdist_group(f"doc:{block.path}")]
    if block.errors:
        pass
    elif block.skip:
        marks.append(pytest.mark.skip(reason=f"{block.where}: {block.skip}"))
    elif block.ci in ("install", "test"):
        marks.append(pytest.mark.skip(reason=f"{block.where}: ci:{block.ci}, run by .ci/run"))
    elif block.slow or block.ci:
        marks.append(pytest.mark.slow)
    return pytest.param(block, marks=marks, id=block.where)


@pytest.fixture(scope="module")
def file_states() -> Iterator[dict[str, docblocks.FileState]]:
    states: dict[str, docblocks.FileState] = {}
    yield states
    for state in states.values():
        state.close()


@pytest.mark.parametrize("block", [_param(b) for b in BLOCKS if docblocks.selected(b)])
def test_doc_block(block: docblocks.Block, file_states: dict[str, docblocks.FileState]) -> None:
    state = file_states.setdefault(block.path, docblocks.FileState(block.path))
    blocks = BY_FILE[block.path]
    failure = None
    try:
        docblocks.run_in_order(blocks, blocks.index(block), state)
    except docblocks.BlockFailed as exc:
        failure = str(exc)
    if failure:
        pytest.fail(failure, pytrace=False)


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(docblocks.REPO).as_posix() for p in PAGES])
def test_links_stay_inside_the_repository_and_resolve(page: Path) -> None:
    problems = docblocks.check_links(page)
    assert not problems, "\n".join(problems)
