"""Ahead-of-time compile check: the kernels compile for real GPU targets without a device, with the
specialization Triton's JIT applies at the launch, and the configurations the launcher picks neither
fail nor spill registers (bundled ptxas -v)."""

from __future__ import annotations

import dataclasses
import io

import pytest

pytest.importorskip("triton")

from normkit_normalnorm.triton_kernels import aot, compile_cost

ALL_ON = dict.fromkeys(("affine", "noise", "clamp", "detach", "running"), True)


def _launch(kernel: str, dtype: str = "bf16", shape=(2, 4096, 3)) -> compile_cost.Launch:
    """A launch the launcher makes for a token-layout layer call (the largest row group)."""
    return next(item for item in aot._record("layer", True, shape, ALL_ON, dtype) if item.name == kernel)


def test_launches_are_specialized_like_the_jit():
    """Ints equal to 1 become constants and 16-aligned pointers get divisibility hints, as at launch."""
    item = _launch("row_forward", "fp32")
    assert item.argument("sc") == 1  # channels-last tokens: the row stride
    _options, signature, constexprs, attrs = compile_cost.specialization(item, "sm_90")
    assert signature["sc"] == "constexpr"
    assert constexprs[(item.kernel.arg_names.index("sc"),)] == 1
    assert signature["sn"] == "i32"
    pointer = item.kernel.arg_names.index("x_ptr")
    assert ["tt.divisibility", 16] in attrs[(pointer,)]


def test_largest_row_backward_compiles_for_sm80_without_spills():
    """The largest row group the launcher gives the row backward (4096 values, every flag on)."""
    item = _launch("row_backward")
    assert item.kwargs["BLOCK"] == 4096
    result = aot.compile_case(aot.Case(item.name, "bf16", aot._label(item), item.num_warps, item), "sm_80")
    assert result.error == ""
    assert result.registers > 0 and result.ptx_lines > 0
    assert (result.spill_store, result.spill_load) == (0, 0)


def test_a_compile_error_is_reported_not_raised():
    item = _launch("row_forward", "fp32", shape=(2, 5, 3))
    bad = dataclasses.replace(item, kwargs={**item.kwargs, "BLOCK": 1000})  # not a power of 2
    result = aot.compile_case(aot.Case(bad.name, "fp32", "BLOCK=1000", 4, bad), "sm_90")
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


def test_issue_budget_counts_the_split_forwards_workspace():
    """With noise the split forward writes x to a float32 workspace once and reads it twice; the
    kernel-cost model's activation bytes say so (bf16 input: 2-byte x and y, 4-byte workspace)."""
    noisy = {item.name: item.activation_bytes() for item in aot._record("batch", False, (8, 2, 1024), ALL_ON, "bf16")}
    assert noisy["split_transform"] == (2, 4)
    assert noisy["split_spread"] == (4, 0)
    assert noisy["split_output"] == (6, 2)
    quiet = {item.name: item.activation_bytes()
             for item in aot._record("batch", False, (8, 2, 1024), {"affine": True}, "bf16")}
    assert "split_transform" not in quiet and quiet["split_output"] == (2, 2)
