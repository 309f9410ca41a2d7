"""Ahead-of-time compile check: the kernels compile for real GPU targets without a device, and the
configurations the launcher picks neither fail nor spill registers (bundled ptxas -v)."""

from __future__ import annotations

import io

import pytest

pytest.importorskip("triton")

from normkit_normalnorm.triton_kernels import aot
from normkit_normalnorm.triton_kernels.config import config
from normkit_normalnorm.triton_kernels.geometry import NSTAT
from normkit_normalnorm.triton_kernels.launch import _num_warps


def _heaviest_row_backward(block: int) -> aot.Case:
    flags = {"HAS_W": True, "HAS_B": True, "USE_RUNNING": False, "NOISE": True, "LAMBDA_GRAD": True}
    return aot.Case("row_backward", "bf16", (("PART", 0), ("BLOCK", block), ("NSTAT", NSTAT), *flags.items()),
                    _num_warps(block))


def test_largest_row_backward_compiles_for_sm80_without_spills():
    """The largest block the launcher gives the row backward (the config that spilled before)."""
    result = aot.compile_case(_heaviest_row_backward(min(config.row_max, config.backward_row_max)), "sm_80")
    assert result.error == ""
    assert result.registers > 0 and result.ptx_lines > 0
    assert (result.spill_store, result.spill_load) == (0, 0)


def test_a_compile_error_is_reported_not_raised():
    case = aot.Case("row_forward", "fp32", (("PART", 0), ("BLOCK", 1000)), 4)  # BLOCK not a power of 2
    result = aot.compile_case(case, "sm_90")
    assert result.error and not result.ok


def test_bad_arch_exits_2(capsys):
    assert aot.main(["--arch", "gfx90a"]) == 2
    assert "sm_80" in capsys.readouterr().err


def test_matrix_covers_every_launchable_kernel():
    kernels = {case.kernel for case in aot.launch_cases(full=False)}
    assert kernels == set(aot._kernels())


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_representative_matrix_is_green(arch):
    out = io.StringIO()
    results = aot.run([arch], full=False, out=out)
    assert all(r.ok for r in results), out.getvalue()
