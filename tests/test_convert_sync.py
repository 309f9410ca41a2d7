"""`normkit.convert_sync`: K gloo processes compute what one process computes on the whole batch.

Real torch.distributed (gloo, CPU) with two processes; the reference is the same script run as
one process on the concatenated batch. Checked: outputs, input gradients, parameter gradients
(summed over processes), running buffers after two steps, eval outputs; for bn and bnn, with
even, uneven and empty per-process batches; and ghost batches (bn, bnn, brn and bn+pn with ghost=2:
the grouped path, the per-ghost-batch path and a process holding a single ghost batch or none), whose
per-process batches are multiples of ghost so that the ghost batches are those of one process. All
cases run in one launch (process start-up is most of the cost).
"""

from __future__ import annotations

import copy
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import normkit

pytestmark = pytest.mark.xdist_group("gloo")  # its ranks meet in a gloo group; one module fixture runs them all

WORKER = Path(__file__).with_name("distributed_worker.py")
# (rows per process, specs); 8 rows in all
CASES = [("4,4", "bnn(noise=0),bn"), ("5,3", "bn,bnn(noise=0)"), ("8,0", "bnn(noise=0),bnn(noise=0)"),
         ("5,3", "bnn,bn"),
         # ghost batches (grouped path; per-ghost-batch path with one process at a single ghost batch; empty)
         ("4,4", "bn(ghost=2),bnn(noise=0,ghost=2)"), ("6,2", "brn(ghost=2),bn(ghost=2)+pn"),
         ("8,0", "bn(ghost=2),brn(ghost=2)")]
NOISY = 3  # bnn's noise on: outputs are random per process, statistics still global
EXACT = [i for i in range(len(CASES)) if i != NOISY]


def _launch(tmp: Path, world: int, cases: list[tuple[str, str]]) -> list[list[dict]]:
    out = tmp / f"w{world}"
    out.mkdir()
    arg = ";".join(f"{rows if world > 1 else '8'}|{specs}" for rows, specs in cases)
    procs = [subprocess.Popen([sys.executable, str(WORKER), "--rank", str(r), "--world", str(world),
                               "--init", f"file://{tmp / f'store{world}'}", "--cases", arg, "--out", str(out)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(world)]
    for p in procs:
        output, _ = p.communicate(timeout=300)
        assert p.returncode == 0, output
    return [torch.load(out / f"rank{r}.pt") for r in range(world)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict], list[list[dict]]]:
    tmp = tmp_path_factory.mktemp("sync")
    return _launch(tmp, 1, CASES)[0], _launch(tmp, 2, CASES)


def _close(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=lambda m: f"{what}: {m}")


@pytest.mark.parametrize("case", EXACT, ids=[f"{CASES[i][0]}-{CASES[i][1]}" for i in EXACT])
def test_two_processes_equal_one_process_on_the_whole_batch(runs, case: int) -> None:
    single, ranks = runs[0][case], [r[case] for r in runs[1]]
    for step in (0, 1):
        for key in (f"out{step}", f"xgrad{step}"):
            _close(torch.cat([r[key] for r in ranks]), single[key], key)
    _close(torch.cat([r["eval"] for r in ranks]), single["eval"], "eval output")
    for rank in ranks:
        for name, grad in single["grads"].items():
            _close(rank["grads"][name], grad, f"grad of {name}")
        for name, buf in single["buffers"].items():
            if buf.dtype.is_floating_point:
                _close(rank["buffers"][name], buf, f"buffer {name}")
            else:
                assert torch.equal(rank["buffers"][name], buf), name


def test_noise_keeps_running_buffers_synced(runs) -> None:
    single, ranks = runs[0][NOISY], [r[NOISY] for r in runs[1]]
    for name, buf in ranks[0]["buffers"].items():
        assert torch.equal(ranks[1]["buffers"][name], buf), f"{name} differs between processes"
        if name.startswith("1."):  # the first norm's statistics come before any noise
            _close(buf, single["buffers"][name], f"buffer {name}")


def test_convert_sync_marks_only_batch_partitions_and_keeps_single_process_behaviour() -> None:
    net = torch.nn.Sequential(normkit.build("bnn", 4), normkit.build("gn(groups=2)", 4), normkit.build("ln", 4))
    reference = copy.deepcopy(net)
    assert normkit.convert_sync(net) is net
    assert net[0].sync is not None and net[1].sync is None and net[2].sync is None
    x = torch.randn(6, 4, 3, 3)
    torch.manual_seed(0)
    expected = reference(x)
    torch.manual_seed(0)
    torch.testing.assert_close(net(x), expected)  # no process group: the local statistics, unchanged
    clone = pickle.loads(pickle.dumps(net[0].sync))
    assert clone.process_group is None
