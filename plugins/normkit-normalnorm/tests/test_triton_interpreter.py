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


@needs_cpu_parent
def test_interpreter_suite(request):
    """Run test_triton_kernels.py under TRITON_INTERPRET=1 (about 40 s on 2 cores)."""
    pytest.importorskip("triton")
    env = os.environ | {"TRITON_INTERPRET": "1"}
    markers = request.config.option.markexpr or "not slow and not gpu"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", str(HERE / "test_triton_kernels.py"), "-q", "-m", markers,
         "-p", "no:cacheprovider"],
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
