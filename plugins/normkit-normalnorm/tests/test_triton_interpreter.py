"""CPU side of the Triton kernel: the interpreter suite in its own process, and the no-Triton guards.

`test_triton_kernels.py` needs TRITON_INTERPRET=1 from interpreter start on a machine without a
GPU; setting it inside this test run would leak into other test files (and come too late for an
already imported triton), so it runs in a child pytest with the variable set.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from normkit import NormkitError

from normkit_normalnorm.triton_kernels import available, normality_triton
from normkit_normalnorm.triton_kernels.op import interpreting

HERE = Path(__file__).parent
needs_cpu_parent = pytest.mark.skipif(torch.cuda.is_available() or interpreting(),
                                      reason="the kernel tests run directly in this process")


@pytest.mark.xdist_group("subprocess-suites")
@needs_cpu_parent
def test_interpreter_suite(request):
    """Run test_triton_kernels.py under TRITON_INTERPRET=1 (about 40 s on 2 cores)."""
    pytest.importorskip("triton")
    env = os.environ | {"TRITON_INTERPRET": "1"}
    markers = request.config.option.markexpr or "not slow and not gpu"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", str(HERE / "test_triton_kernels.py"), "-q", "-m", markers,
         "-p", "no:cacheprovider", "-n", "0"],  # one process: this test already holds one of the run's workers
        cwd=request.config.rootpath, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert " passed" in done.stdout.splitlines()[-1], done.stdout[-2000:]


@needs_cpu_parent
def test_cpu_without_interpreter_raises_one_clear_line():
    assert not available()
    with pytest.raises(NormkitError, match=r"set TRITON_INTERPRET=1 .* or use kernel=torch"):
        normality_triton(torch.randn(2, 3, 4), None, None, partition="layer", training=True)


def test_plugin_imports_without_triton():
    """With triton unimportable the subpackage still imports; available() is False; calls say why."""
    code = (
        "import sys; sys.modules['triton'] = None\n"
        "import torch, normkit\n"
        "from normkit_normalnorm.triton_kernels import available, normality_triton\n"
        "assert not available()\n"
        "try:\n"
        "    normality_triton(torch.randn(2, 3, 4), None, None, partition='layer', training=True)\n"
        "except normkit.NormkitError as err:\n"
        "    print(err)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert "needs the triton package" in done.stdout


@needs_cpu_parent
def test_custom_op_on_cpu_runs_the_reference_and_compiles():
    """Without the interpreter the custom op's CPU implementation is the reference, under the seed."""
    from normkit_normalnorm.functional import normality_norm
    from normkit_normalnorm.triton_kernels.autograd import update_running_from
    from normkit_normalnorm.triton_kernels.op import normality_forward

    g = torch.Generator().manual_seed(0)
    x3 = torch.randn(4, 3, 5, generator=g).exp()
    weight, bias = torch.rand(3, generator=g) + 0.5, torch.randn(3, generator=g)
    seed = torch.tensor([7])

    def via_op(x, w, b, running):
        y, stats = normality_forward(x, w, b, *running, seed, "batch", 1, False, True, 1e-5, 1.0, 0.4, None, None,
                                     False, None)
        update_running_from(stats, x.shape[0] * x.shape[2], 0.1, *running)
        return y

    def via_reference(x, w, b, running):
        torch.manual_seed(7)
        return normality_norm(x, w, b, partition="batch", training=True, noise=0.4, running_mean=running[0],
                              running_var=running[1], running_lambda=running[2], momentum=0.1)

    results = []
    for fn in (via_reference, via_op, torch.compile(via_op, fullgraph=True, backend="aot_eager")):
        running = (torch.zeros(3), torch.ones(3), torch.ones(3))
        leaves = [t.clone().requires_grad_() for t in (x3, weight, bias)]
        y = fn(*leaves, running)
        results.append((y.detach(), *torch.autograd.grad(y.square().sum(), leaves), *running))
    for got in results[1:]:
        for a, b in zip(got, results[0]):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
