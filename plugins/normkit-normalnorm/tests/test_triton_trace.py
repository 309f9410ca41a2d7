"""torch.export and AOTAutograd trace the Triton kernels' ops without a GPU, on fake CUDA tensors.

Nothing runs: under a FakeTensorMode the `triton_op` bodies (op.py) are their own fake
implementations, so shapes and dtypes come out of the same code that launches the kernels on a
GPU. torch.export keeps one `normkit_normalnorm::normality_forward` node per layer; AOTAutograd,
the front end of torch.compile, decomposes it into the kernel launches Inductor would compile.
Runs in the default (non-interpreter) process: under TRITON_INTERPRET=1 the kernels are
interpreter functions, which `wrap_triton` cannot capture.
"""

from __future__ import annotations

import logging
import warnings

import pytest
import torch

pytest.importorskip("triton")

import normkit
from torch._subclasses.fake_tensor import FakeTensorMode

from normkit_normalnorm.triton_kernels.op import interpreting, normality_backward

pytestmark = pytest.mark.skipif(interpreting(), reason="interpreted kernels cannot be captured by wrap_triton")


@pytest.fixture(autouse=True)
def _quiet_kernel_analysis():
    """Without a GPU driver torch cannot lower a kernel to find which arguments it writes, logs the
    traceback and assumes all of them; that is expected here (and why grads are off below)."""
    logger = logging.getLogger("torch._higher_order_ops.triton_kernel_wrap")
    level = logger.level
    logger.setLevel(logging.ERROR)
    yield
    logger.setLevel(level)


def to_fake_cuda(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """Parameters and buffers as fake CUDA tensors (call inside the FakeTensorMode); in place."""
    for module in model.modules():
        for table in (module._parameters, module._buffers):
            for name, t in table.items():
                if t is None:
                    continue
                new = t.to("cuda", dtype if t.is_floating_point() else t.dtype)
                table[name] = torch.nn.Parameter(new, t.requires_grad) if isinstance(t, torch.nn.Parameter) else new
    return model


def small_model() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1),
        normkit.build("bnn(kernel=triton)", 8),
        torch.nn.Flatten(2),  # (N, 8, 64): lnn normalizes each of the 8 rows over 64 features
        normkit.build("lnn(kernel=triton)", 64, channel_dim=-1),
    )


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_export_with_fake_cuda_tensors(dtype, training):
    model = small_model().train(training)
    with FakeTensorMode(allow_non_fake_inputs=True):
        to_fake_cuda(model, dtype)
        x = torch.randn(4, 3, 8, 8, device="cuda", dtype=dtype)
        exported = torch.export.export(model, (x,))
        y = exported.module()(x)
    assert (y.shape, y.dtype, y.device.type) == ((4, 8, 64), dtype, "cuda")
    ops = [n for n in exported.graph.nodes if n.target is torch.ops.normkit_normalnorm.normality_forward.default]
    assert len(ops) == 2  # one named op per layer: the exported program stays high-level
    assert [n.args[7] for n in ops] == ["batch", "layer"]
    assert ops[0].args[3] is not None  # running buffers reach the op (updated from its statistics)


def kernels_in(graph_module: torch.fx.GraphModule) -> list[str]:
    from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table

    return [kernel_side_table.get_kernel(n.kwargs["kernel_idx"]).fn.__name__ for n in graph_module.graph.nodes
            if "kernel_idx" in n.kwargs]


class _AsTuple(torch.nn.Module):
    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return (self.fn(*args),)


def aot_kernels(fn, *args) -> list[str]:
    """The kernel launches in the graph AOTAutograd (torch.compile's front end) hands to the backend."""
    from torch._functorch.aot_autograd import aot_export_module

    graph_module, _ = aot_export_module(_AsTuple(fn), args, trace_joint=False)
    return kernels_in(graph_module)


SPLIT_FORWARD = ["split_moments", "split_newton", "split_transform", "split_spread", "split_output"]


@pytest.mark.parametrize(("spec", "shape", "training", "expected"), [
    ("bnn", (4, 8, 8, 8), True, ["row_forward"]),
    ("bnn", (16, 8, 32, 32), True, SPLIT_FORWARD),  # 16384 values per channel: the split path
    ("bnn", (4, 8, 8, 8), False, ["eval_pointwise"]),
    ("lnn", (4, 8, 8, 8), True, ["row_forward"]),
])
def test_compile_front_end_sees_the_forward_kernels(spec, shape, training, expected):
    layer = normkit.build(f"{spec}(kernel=triton)", 8).train(training)
    layer.requires_grad_(False)
    with FakeTensorMode(allow_non_fake_inputs=True):
        to_fake_cuda(layer, torch.float32)
        assert aot_kernels(layer, torch.randn(shape, device="cuda")) == expected


@pytest.mark.parametrize(("partition", "shape", "expected"), [
    ("layer", (4, 8, 16), ["row_backward"]),
    ("batch", (16, 8, 1024), ["split_backward_reduce", "split_backward_input"]),
])
def test_compile_front_end_sees_the_backward_kernels(partition, shape, expected):
    def backward(dy, x3, weight, bias, stats, seed):
        dx, dw, db = normality_backward(dy, x3, weight, bias, None, None, None, stats, seed, partition, 1, False,
                                        True, 1e-5, 1.0, 0.4, None, None, False)
        return dx + 0, dw, db

    with FakeTensorMode():
        x3 = torch.randn(shape, device="cuda")
        groups = shape[1] if partition == "batch" else shape[0]
        args = (torch.randn_like(x3), x3, torch.ones(shape[1], device="cuda"), torch.zeros(shape[1], device="cuda"),
                torch.zeros(groups, 9, device="cuda"), torch.zeros(1, dtype=torch.int64, device="cuda"))
        assert aot_kernels(lambda *a: backward(*a)[0], *args) == expected


def test_noise_seed_is_drawn_on_the_inputs_device():
    """The noise seed comes from the CUDA generator: no host draw, no host-to-device copy in the graph."""
    layer = normkit.build("lnn(kernel=triton)", 64, channel_dim=-1).train()  # noise 1.0 by default
    with FakeTensorMode(allow_non_fake_inputs=True):
        to_fake_cuda(layer, torch.float32)
        exported = torch.export.export(layer, (torch.randn(4, 8, 64, device="cuda"),))
    op = next(n for n in exported.graph.nodes if n.target is torch.ops.normkit_normalnorm.normality_forward.default)
    seed = op.args[6]
    assert "randint" in str(seed.target)
    assert seed.meta["val"].device.type == "cuda"


def test_no_seed_without_noise():
    """A step without noise draws and allocates no seed: the op gets None for it."""
    layer = normkit.build("lnn(kernel=triton, noise=0)", 64, channel_dim=-1).train()
    with FakeTensorMode(allow_non_fake_inputs=True):
        to_fake_cuda(layer, torch.float32)
        exported = torch.export.export(layer, (torch.randn(4, 8, 64, device="cuda"),))
    op = next(n for n in exported.graph.nodes if n.target is torch.ops.normkit_normalnorm.normality_forward.default)
    assert op.args[6] is None
    assert not any("randint" in str(n.target) or "zeros" in str(n.target) for n in exported.graph.nodes)


def test_dynamo_takes_a_training_step_in_one_graph_that_cuda_graphs_can_capture():
    """torch.compile's front end, Dynamo (run here by strict torch.export), traces a train-mode conv +
    bnn + lnn model with kernel=triton into one graph: no graph break, so fullgraph=True holds, and no
    warning. What CUDA graphs (mode="reduce-overhead") need of that graph holds: every tensor on the
    GPU (a CPU tensor makes torch.compile skip CUDA graphs), no host read of a device value (.item()),
    no copy between devices; each layer's noise seed is a randint on the GPU. Not checked without a
    GPU: Inductor's CUDA compile, the backward graph, capture and replay."""
    model = small_model().train()
    with FakeTensorMode(allow_non_fake_inputs=True), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        to_fake_cuda(model, torch.float32)
        exported = torch.export.export(model, (torch.randn(4, 3, 8, 8, device="cuda"),), strict=True)
    assert not [w for w in caught if "normkit" in str(w.filename) or "lru_cache" in str(w.message)], [
        f"{w.filename}:{w.lineno}: {w.message}" for w in caught]
    nodes = list(exported.graph.nodes)
    ops = [n for n in nodes if n.target is torch.ops.normkit_normalnorm.normality_forward.default]
    assert len(ops) == 2
    assert [str(op.args[6].target) for op in ops] == ["aten.randint.low"] * 2
    values = [n.meta["val"] for n in nodes if isinstance(n.meta.get("val"), torch.Tensor)]
    assert values and all(v.device.type == "cuda" for v in values)
    assert not [n for n in nodes if "_local_scalar_dense" in str(n.target) or "_to_copy" in str(n.target)]
