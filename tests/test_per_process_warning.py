"""An unsynced batch-statistics layer training under torch.distributed says so, once per process.

Tools that sync torch's BatchNorm (Lightning's `Trainer(sync_batchnorm=True)`) do not see normkit's
layers; they must not stay per-process silently. Two real gloo processes; `normkit.convert_sync`
and batch-free partitions (ln) stay silent, as does a single process.
"""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

import normkit
from normkit.sync import PerProcessBatchStatistics

pytestmark = pytest.mark.xdist_group("gloo")  # its ranks meet in a gloo group (conftest.py)

RANK = r'''
import json, sys, warnings
import torch, torch.distributed as dist
import normkit
rank, world, init, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
seen = {}
for name, make in [("ln", lambda: normkit.build("ln", 4)),
                   ("synced bn", lambda: normkit.convert_sync(normkit.build("bn", 4))),
                   ("eval bn", lambda: normkit.build("bn", 4).eval()),
                   ("bn", lambda: normkit.build("bn", 4)),
                   ("bnn again", lambda: normkit.build("bnn", 4))]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        make()(torch.randn(3, 4, 2, 2))
    seen[name] = [f"{w.category.__name__}: {w.message}" for w in caught]
dist.barrier()
dist.destroy_process_group()
open(f"{out}/rank{rank}.json", "w").write(json.dumps(seen))
'''


def _run(tmp_path: Path, world: int) -> list[dict]:
    procs = [subprocess.Popen([sys.executable, "-c", RANK, str(r), str(world), f"file://{tmp_path / 'store'}",
                               str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(world)]
    for p in procs:
        output, _ = p.communicate(timeout=120)
        assert p.returncode == 0, output
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]


def test_two_processes_warn_once_each_for_an_unsynced_batch_norm(tmp_path: Path) -> None:
    for seen in _run(tmp_path, 2):
        assert seen["ln"] == [] and seen["synced bn"] == [] and seen["eval bn"] == []
        assert len(seen["bn"]) == 1 and seen["bn"][0].startswith("PerProcessBatchStatistics: normkit:")
        assert "2 processes" in seen["bn"][0] and "normkit.convert_sync(model)" in seen["bn"][0]
        assert seen["bnn again"] == []  # once per process


def test_one_process_is_silent(tmp_path: Path) -> None:
    assert all(v == [] for v in _run(tmp_path, 1)[0].values())


def test_no_process_group_is_silent() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        normkit.build("bn", 4)(torch.randn(3, 4))
    assert not [w for w in caught if issubclass(w.category, PerProcessBatchStatistics)]
