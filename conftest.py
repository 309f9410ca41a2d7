"""Test-run set-up shared by every test directory (pytest finds this file at the repository root).

The default run uses two pytest-xdist workers (`addopts` in pyproject.toml); `-n 0` runs everything
in one process, to debug with pdb or `-s`. With `--dist loadgroup`, tests that must not run beside
each other carry `@pytest.mark.xdist_group(NAME)` and run one after another on one worker:

- "ray": tests that start a local Ray instance (they share /tmp/ray, its ports and its memory);
- "signals": tests that signal a real process or read a pseudo-terminal, and tests that watch
  process trees in /proc under short timeouts;
- "subprocess-suites": tests that run a whole child pytest keeping both cores busy on its own (the
  Triton interpreter suite). A child that runs on one core needs no group: the isolated installs
  (tests/test_isolated_install.py, one test per package, sharing one wheelhouse per run) and the
  example plugin's tests spread over both workers, so no long chain of them holds one worker;
- "gloo": tests whose processes meet in a torch.distributed gloo group (the ranks wait for each other,
  so a rank starved of CPU by another such test stalls the whole group).

Everything else is spread over both workers test by test.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile

import pytest

_CACHE = pytest.StashKey[str | None]()  # NORMKIT_CACHE_DIR before the run, to give back at its end


def pytest_configure(config: pytest.Config) -> None:
    # A test run started in the background of a non-interactive shell (`cmd &`, nohup) inherits SIGINT
    # ignored, and Python then never turns Ctrl-C into KeyboardInterrupt, in this process or in the programs
    # it starts. The interruption tests send real SIGINTs, so give the run the ordinary handler back.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    # The CLI caches its plugin catalog in ~/.cache/normkit: the tests use one of their own, shared by the
    # workers (made before they start and removed at the end), so they neither read nor rewrite the user's.
    if not hasattr(config, "workerinput"):
        config.stash[_CACHE] = os.environ.get("NORMKIT_CACHE_DIR")
        os.environ["NORMKIT_CACHE_DIR"] = tempfile.mkdtemp(prefix="normkit-test-cache-")


def pytest_unconfigure(config: pytest.Config) -> None:
    if _CACHE not in config.stash:
        return
    shutil.rmtree(os.environ["NORMKIT_CACHE_DIR"], ignore_errors=True)
    before = config.stash[_CACHE]
    if before is None:
        os.environ.pop("NORMKIT_CACHE_DIR", None)
    else:
        os.environ["NORMKIT_CACHE_DIR"] = before


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Make xdist_group marks take effect under pytest 9.2. pytest-xdist 3.8 names a grouped test's work unit
    by setting `item._nodeid` to "NODEID@GROUP", which pytest 9.2's `item.nodeid` no longer reads (it reads
    `item._id`): without this, --dist loadgroup silently spreads a group over both workers."""
    from_xdist = [(item, getattr(item, "_nodeid", None)) for item in items]
    regrouped = [(item, nodeid) for item, nodeid in from_xdist if isinstance(nodeid, str) and item.nodeid != nodeid]
    if regrouped:
        from _pytest.nodeid import NodeId  # pytest >= 9.2; earlier versions read _nodeid and never get here

        for item, nodeid in regrouped:
            item._id = NodeId.parse(nodeid)


@pytest.fixture(autouse=True)
def _torch_starts_each_test_from_seed_0() -> None:
    """Each test draws the same random numbers whichever tests ran before it on its worker.

    Under xdist a worker's test order changes from run to run, so a test that draws from torch's global
    generator without seeding it would see different inputs each time (CI once failed a tolerance that
    held here). Tests that need other draws seed their own `torch.Generator`."""
    import sys

    torch = sys.modules.get("torch")  # not imported yet: its own fixed start-up seed applies
    if torch is not None:
        torch.manual_seed(0)
