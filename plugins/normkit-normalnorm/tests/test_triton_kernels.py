"""The fused Triton kernels against the reference `normality_norm` (values, gradients, buffers, noise).

Runs on CUDA, or on the Triton CPU interpreter in a process started with TRITON_INTERPRET=1
(Triton decides at `import triton`, so the variable cannot be set from inside a test run that
already imported it); `test_triton_interpreter.py` starts that process in the default run.
Shapes are tiny and grids small, because the interpreter runs programs one after another.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("triton")

from normkit import NormkitError
from torch.utils._python_dispatch import TorchDispatchMode

from normkit_normalnorm.functional import normality_norm
from normkit_normalnorm.triton_kernels import available, normality_triton
from normkit_normalnorm.triton_kernels.config import config
from normkit_normalnorm.triton_kernels.op import interpreting

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu" and not interpreting():
    pytest.skip("no GPU: runs in the TRITON_INTERPRET=1 process that test_triton_interpreter.py starts",
                allow_module_level=True)


@pytest.fixture
def split_path(monkeypatch):
    """Force the split-reduction path with several tiles per group."""
    monkeypatch.setattr(config, "row_max", 0)
    monkeypatch.setattr(config, "chunk", 16)


def make_input(shape: tuple[int, ...], seed: int, *, constant_channel: bool = True) -> torch.Tensor:
    """Skewed data with an outlier and (optionally) one constant channel."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g).exp() * 1.5 - 0.5
    x.view(-1)[0] = 25.0
    if constant_channel and shape[1] > 1:
        x[:, 1] = 0.7
    return x


def as_ncs(x: torch.Tensor, tokens: bool) -> torch.Tensor:
    """The layer's canonical (N, C, S) view (channels-last tokens transpose without copying)."""
    n = x.shape[0]
    if tokens:
        return x.reshape(n, -1, x.shape[-1]).transpose(1, 2)
    return x.reshape(n, x.shape[1], -1)


def run(fn, x3, weight, bias, dy, **kw):
    """Output and (dx, dweight, dbias) of `fn`; leaves are cloned so calls do not interfere."""
    x = x3.detach().clone().requires_grad_()
    w = weight.detach().clone().requires_grad_() if weight is not None else None
    b = bias.detach().clone().requires_grad_() if bias is not None else None
    y = fn(x, w, b, **kw)
    y.backward(dy)
    return y.detach(), x.grad, w.grad if w is not None else None, b.grad if b is not None else None


def reference(x3, weight, bias, dy, **kw):
    """normality_norm in float64, results cast back to float32."""
    def f64(t):
        return t.double() if t is not None else None

    out = run(normality_norm, f64(x3), f64(weight), f64(bias), dy.double(), **kw)
    return tuple(t.float() if t is not None else None for t in out)


def assert_close(got, want, tol=2e-4):
    for name, g, w in zip(("y", "dx", "dweight", "dbias"), got, want):
        if w is None:
            assert g is None, name
            continue
        torch.testing.assert_close(g.cpu(), w.cpu(), rtol=tol, atol=tol, msg=lambda m, name=name: f"{name}: {m}")


def params(c: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(c, generator=g) + 0.5, torch.randn(c, generator=g)


CASES = [
    # (partition, groups, input shape, tokens, channels_last, options)
    ("batch", 1, (5, 3), False, False, {}),
    ("batch", 1, (3, 4, 7), False, False, {"lambda_min": 0.8, "lambda_max": 1.1}),
    ("batch", 1, (2, 3, 3, 5), False, True, {}),
    ("layer", 1, (3, 5, 7), False, False, {}),
    ("layer", 1, (3, 5, 2, 3), False, True, {"detach_lambda": True}),
    ("layer", 1, (2, 5, 6), True, False, {"alpha": 0.5}),
    ("group", 2, (2, 6, 5), False, False, {}),
    ("group", 3, (2, 6, 2, 3), False, True, {"lambda_max": 1.05}),
    ("instance", 1, (2, 3, 9), False, False, {}),
]


@pytest.mark.parametrize("path", ["row", "split"])
@pytest.mark.parametrize(("partition", "groups", "shape", "tokens", "channels_last", "options"), CASES)
def test_forward_and_gradients_match_reference(request, path, partition, groups, shape, tokens,
                                               channels_last, options):
    if path == "split":
        request.getfixturevalue("split_path")
    x = make_input(shape, seed=len(shape) * 7 + shape[1])
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    x3 = as_ncs(x, tokens)
    c = x3.shape[1]
    weight, bias = params(c, 3)
    dy = torch.randn(x3.shape, generator=torch.Generator().manual_seed(4))
    kw = dict(partition=partition, groups=groups, tokens=tokens, training=True, noise=0.0, **options)
    want = reference(x3, weight, bias, dy, **kw)
    got = run(normality_triton, x3.to(DEVICE), weight.to(DEVICE), bias.to(DEVICE), dy.to(DEVICE), **kw)
    assert got[0].stride() == x3.stride()  # output keeps the input's layout
    assert_close(got, want)


@pytest.mark.parametrize("path", ["row", "split"])
def test_no_affine_and_broadcast_gradient(request, path):
    """weight/bias None; dy from y.sum() is an expanded stride-0 tensor."""
    if path == "split":
        request.getfixturevalue("split_path")
    x3 = make_input((3, 4, 6), seed=11)
    x = x3.clone().requires_grad_()
    normality_triton(x.to(DEVICE), None, None, partition="batch", training=True).sum().backward()
    xr = x3.double().requires_grad_()
    normality_norm(xr, None, None, partition="batch", training=True).sum().backward()
    torch.testing.assert_close(x.grad, xr.grad.float(), rtol=2e-4, atol=2e-4)


@pytest.mark.parametrize("path", ["row", "split"])
@pytest.mark.parametrize("clamp", [{}, {"lambda_min": 0.8, "lambda_max": 1.1}])
def test_eval_uses_running_statistics(request, path, clamp):
    if path == "split":
        request.getfixturevalue("split_path")
    x3 = make_input((4, 3, 5), seed=5)
    g = torch.Generator().manual_seed(6)
    running = {"running_mean": torch.randn(3, generator=g), "running_var": torch.rand(3, generator=g) + 0.5,
                   "running_lambda": torch.tensor([0.7, 1.0, 1.3])}
    weight, bias = params(3, 7)
    dy = torch.randn(x3.shape, generator=g)
    kw = {"partition": "batch", "training": False, "noise": 0.4, **clamp}
    want = reference(x3, weight, bias, dy, **kw, **{k: v.double() for k, v in running.items()})
    got = run(normality_triton, x3.to(DEVICE), weight.to(DEVICE), bias.to(DEVICE), dy.to(DEVICE), **kw,
              **{k: v.to(DEVICE) for k, v in running.items()})
    assert_close(got, want)
    batch_stats = run(normality_triton, x3.to(DEVICE), weight.to(DEVICE), bias.to(DEVICE), dy.to(DEVICE),
                      partition="batch", training=False)
    assert not torch.allclose(batch_stats[0].cpu(), got[0].cpu())  # without buffers eval uses the batch


@pytest.mark.parametrize("path", ["row", "split"])
@pytest.mark.parametrize(("momentum", "dtype"), [(0.1, torch.float32), (None, torch.float32), (0.1, torch.float64)])
def test_running_buffers_updated_like_reference(request, path, momentum, dtype):
    """float32 buffers are moved inside the kernel, others on the host: both like the reference."""
    if path == "split":
        request.getfixturevalue("split_path")
    x3 = make_input((4, 3, 5), seed=8, constant_channel=False)
    buffers = {}
    for name, fn, device in (("ref", normality_norm, "cpu"), ("kernel", normality_triton, DEVICE)):
        running = {key: torch.full((3,), value, dtype=dtype, device=device)
                   for key, value in (("running_mean", 0.0), ("running_var", 1.0), ("running_lambda", 1.0))}
        for step in (1, 2):
            fn(x3.to(device) * step, None, None, partition="batch", training=True, noise=0.0, momentum=momentum,
               num_batches_tracked=torch.tensor(step), **running)
        buffers[name] = running
    for key, value in buffers["ref"].items():
        torch.testing.assert_close(buffers["kernel"][key].cpu(), value, rtol=1e-5, atol=1e-6, msg=key)
    assert not torch.allclose(buffers["ref"]["running_lambda"], torch.ones(3, dtype=dtype))


LAYER_CASES = [("bnn", 4, (5, 4), 1, False), ("bnn", 4, (3, 4, 2, 3), 1, True), ("lnn", 6, (2, 3, 6), -1, False),
               ("gnn(groups=2)", 4, (2, 4, 5), 1, False), ("inn", 3, (2, 3, 4), 1, False)]


@pytest.mark.parametrize(("spec", "channels", "shape", "channel_dim", "channels_last"), LAYER_CASES)
def test_layer_with_kernel_triton_matches_kernel_torch(spec, channels, shape, channel_dim, channels_last):
    """Through normkit.build and the stage's dispatch: 2D/3D/4D, channels-last, train and eval."""
    import normkit

    def build(kernel: str) -> torch.nn.Module:
        options = f"noise=0, kernel={kernel}"
        full = spec.replace(")", f", {options})") if "(" in spec else f"{spec}({options})"
        return normkit.build(full, channels, channel_dim=channel_dim).to(DEVICE)

    fast, ref = build("triton"), build("torch")
    with torch.no_grad():
        fast.weight.uniform_(0.5, 1.5)
        fast.bias.normal_()
    ref.load_state_dict(fast.state_dict())
    x = make_input(shape, seed=30, constant_channel=False).to(DEVICE)  # constants: vs float64 above
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    for training in (True, False):
        outs = []
        for layer in (fast, ref):
            layer.train(training)
            xg = x.clone().requires_grad_()
            y = layer(xg)
            outs.append((y, *torch.autograd.grad(y.square().sum(), (xg, layer.weight, layer.bias))))
        for got, want in zip(*outs):
            torch.testing.assert_close(got, want, rtol=2e-4, atol=2e-4)
        if channels_last:
            assert outs[0][0].is_contiguous(memory_format=torch.channels_last)
    for key, value in ref.state_dict().items():
        torch.testing.assert_close(fast.state_dict()[key], value, msg=key)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize(("spec", "shape", "channel_dim"), [("bnn", (6, 4, 3, 3), 1), ("lnn", (3, 5, 16), -1)])
def test_layer_hands_low_precision_input_to_the_kernel(spec, shape, channel_dim, dtype, monkeypatch):
    """fp16/bf16 reach the kernel unconverted (half the bytes) and match the float32 PyTorch path."""
    import normkit

    from normkit_normalnorm import triton_kernels

    seen = []
    real = triton_kernels.normality_triton

    def spy(x3, *args, **kwargs):
        seen.append(x3.dtype)
        return real(x3, *args, **kwargs)

    monkeypatch.setattr(triton_kernels, "normality_triton", spy)
    channels = shape[1] if channel_dim == 1 else shape[-1]
    fast = normkit.build(f"{spec}(kernel=triton, noise=0)", channels, channel_dim=channel_dim).to(DEVICE)
    ref = normkit.build(f"{spec}(kernel=torch, noise=0)", channels, channel_dim=channel_dim).to(DEVICE)
    x = make_input(shape, seed=31, constant_channel=False).to(DEVICE, dtype)
    got, want = fast(x), ref(x)
    assert seen == [dtype] and got.dtype == want.dtype == dtype
    tol = 2e-2 if dtype == torch.float16 else 8e-2
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)
    for key, value in ref.state_dict().items():
        torch.testing.assert_close(fast.state_dict()[key], value, rtol=1e-3, atol=1e-3, msg=key)


@pytest.mark.skipif(DEVICE == "cuda", reason="check_norm feeds CPU tensors, which the kernels take only under "
                    "the interpreter (test_triton_interpreter.py runs this file there)")
def test_conformance_suite_bnn():
    """normkit's conformance checks with the kernel (float64 gradcheck runs the reference)."""
    from normkit.testing import check_norm

    check_norm("bnn(kernel=triton)", num_channels=8)


@pytest.mark.slow  # about 45 s on the interpreter
@pytest.mark.parametrize(("spec", "options"), [
    ("gnn(groups=2, kernel=triton)", {}), ("inn(kernel=triton)", {}),
    # lnn's default noise 1.0: finite differences move the (detached) noise scale, so gradcheck
    # runs without noise; the reference path needs the same.
    ("lnn(kernel=triton)", {"channel_dim": -1, "gradcheck_overrides": {"noise": 0.0}})])
def test_conformance_suite_other_norms(spec, options):
    from normkit.testing import check_norm

    check_norm(spec, num_channels=8, **options)


NOISE_CASES = [("layer", (6, 8, 64), "row"), ("batch", (32, 3, 8), "split")]


def choose_path(path: str, monkeypatch) -> None:
    """Noise tests need a few hundred values per group; split them into 4 tiles each."""
    if path == "split":
        monkeypatch.setattr(config, "row_max", 0)
        monkeypatch.setattr(config, "chunk", 128)


def noisy(x3, weight, bias, partition, seed, noise=0.5):
    torch.manual_seed(seed)
    return normality_triton(x3.to(DEVICE), weight.to(DEVICE), bias.to(DEVICE), partition=partition,
                            training=True, noise=noise).cpu()


@pytest.mark.parametrize(("partition", "shape", "path"), NOISE_CASES)
def test_noise_reproducible_and_scaled_per_group(monkeypatch, partition, shape, path):
    choose_path(path, monkeypatch)
    x3 = make_input(shape, seed=9, constant_channel=False)
    weight, bias = params(shape[1], 10)
    first, again, other = (noisy(x3, weight, bias, partition, s) for s in (0, 0, 1))
    assert torch.equal(first, again)
    assert not torch.allclose(first, other)
    clean = noisy(x3, weight, bias, partition, 0, noise=0.0)
    # The noise-free pre-affine values give the per-group scale s = mean |x - mean x|.
    pre = normality_norm(x3.double(), None, None, partition=partition, training=True)
    dims = (0, 2) if partition == "batch" else (1, 2)
    scale = (pre - pre.mean(dims, keepdim=True)).abs().mean(dims, keepdim=True).float()
    z = (first - clean) / (weight.view(1, -1, 1) * 0.5 * scale)
    assert abs(z.mean().item()) < 4 / z.numel() ** 0.5
    assert abs(z.std().item() - 1) < 0.1
    per_group = z.std(dim=dims)
    assert ((per_group - 1).abs() < 0.3).all(), per_group  # each group's noise has its own scale


@pytest.mark.parametrize(("partition", "shape", "path"), NOISE_CASES)
def test_successive_calls_draw_new_noise_and_manual_seed_replays_them(monkeypatch, partition, shape, path):
    """Each call draws its seed from the generator's advancing state: two calls differ, and
    torch.manual_seed replays the same sequence of calls (forward and the backward's dweight)."""
    choose_path(path, monkeypatch)
    x3 = make_input(shape, seed=54, constant_channel=False).to(DEVICE)
    weight, bias = (p.to(DEVICE) for p in params(shape[1], 55))
    dy = torch.randn(shape, generator=torch.Generator().manual_seed(56)).to(DEVICE)

    def two_calls():
        return [run(normality_triton, x3, weight, bias, dy, partition=partition, training=True, noise=0.5)
                for _ in range(2)]

    torch.manual_seed(11)
    first, second = two_calls()
    assert not torch.allclose(first[0], second[0])
    assert not torch.allclose(first[2], second[2])  # dweight regenerates each call's own noise
    torch.manual_seed(11)
    for got, want in zip(two_calls(), (first, second)):
        for g, w in zip(got, want):
            assert torch.equal(g, w)


class _Ops(TorchDispatchMode):
    """Records the aten ops a call runs, the tensors they return, and copies between devices
    (the interpreter itself copies kernel results back within the CPU)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, list[torch.Tensor]]] = []
        self.transfers: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        outs = [t for t in (out if isinstance(out, (tuple, list)) else [out]) if isinstance(t, torch.Tensor)]
        self.calls.append((str(func), outs))
        sources = [a.device for a in args if isinstance(a, torch.Tensor)]
        if any(t.device != d for t in outs for d in sources):
            self.transfers.append(str(func))
        return out


@pytest.mark.parametrize("noise", [0.5, 0.0])
def test_seed_is_one_draw_on_the_inputs_device_and_none_without_noise(noise):
    """A noisy training forward draws its seed with one random op on the input's device (no host draw,
    no copy); without noise (or in eval) nothing is drawn or allocated for a seed."""
    x3 = make_input((3, 4, 8), seed=57, constant_channel=False).to(DEVICE)
    weight, bias = (p.to(DEVICE) for p in params(4, 58))
    for training in (True, False):
        with _Ops() as ops:
            normality_triton(x3, weight, bias, partition="layer", training=training, noise=noise)
        random = [(name, outs) for name, outs in ops.calls if "rand" in name]
        int_tensors = [name for name, outs in ops.calls for t in outs if t.dtype == torch.int64]
        if training and noise:
            assert [name for name, _ in random] == ["aten.randint.low"], ops.calls
            assert random[0][1][0].device == x3.device
        else:
            assert random == [] and int_tensors == [], ops.calls
        assert ops.transfers == []


@pytest.mark.parametrize(("partition", "shape", "path"), NOISE_CASES)
def test_noise_regenerated_in_backward(monkeypatch, partition, shape, path):
    """dx and dbias ignore the noise; dweight = sum dy * (y - b) / w needs the forward's noise."""
    choose_path(path, monkeypatch)
    x3 = make_input(shape, seed=12, constant_channel=False)
    weight, bias = params(shape[1], 13)
    dy = torch.randn(shape, generator=torch.Generator().manual_seed(14)).to(DEVICE)
    args = (x3.to(DEVICE), weight.to(DEVICE), bias.to(DEVICE), dy)
    torch.manual_seed(3)
    y, dx, dw, db = run(normality_triton, *args, partition=partition, training=True, noise=0.5)
    _, dx_clean, _, db_clean = run(normality_triton, *args, partition=partition, training=True, noise=0.0)
    torch.testing.assert_close(dx, dx_clean, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(db, db_clean, rtol=1e-5, atol=1e-6)
    dims = (0, 2)
    want = (dy * (y - bias.to(DEVICE).view(1, -1, 1)) / weight.to(DEVICE).view(1, -1, 1)).sum(dims)
    torch.testing.assert_close(dw, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(("partition", "groups", "shape", "tokens", "path", "programs"), [
    ("layer", 1, (9, 4, 5), False, "row", 7),  # one class, 7 splits: sets of 3, 3 and 1, then the sets
    ("layer", 1, (3, 5, 7), True, "row", 1),  # tokens, one split: one set of one
    ("group", 2, (7, 4, 3), False, "row", 4),  # two classes, each with its own tree
    ("batch", 1, (4, 3, 5), False, "row", 4),  # one program per channel: sums stored directly
    ("batch", 1, (6, 3, 7), False, "split", 4),  # the dx pass finishes them
    ("layer", 1, (4, 6, 3), True, "split", 4),  # partials of 12 tokens per channel
])
def test_weight_and_bias_gradients_finished_in_the_kernel(monkeypatch, partition, groups, shape, tokens, path,
                                                           programs):
    """dweight and dbias come out of the kernels (no torch sum after them), equal to the reference's for
    every program budget of the row backward (7 splits: sets of 3, 3 and 1), and bit-identical when
    the backward runs again (a fixed summation order, whichever program finishes last)."""
    monkeypatch.setattr(config, "interpreter_programs", programs)
    if path == "split":
        monkeypatch.setattr(config, "row_max", 0)
        monkeypatch.setattr(config, "chunk", 8)
    x3 = make_input(shape, seed=60, constant_channel=False)
    x3 = x3.transpose(1, 2).contiguous().transpose(1, 2) if tokens else x3
    weight, bias = params(shape[1], 61)
    dy = torch.randn(shape, generator=torch.Generator().manual_seed(62))
    kw = {"partition": partition, "groups": groups, "tokens": tokens, "training": True, "noise": 0.0}
    want = reference(x3, weight, bias, dy, **kw)
    x, w, b = (t.to(DEVICE).requires_grad_() for t in (x3, weight, bias))
    y = normality_triton(x, w, b, **kw)
    with _Ops() as ops:
        got = torch.autograd.grad(y, (x, w, b), dy.to(DEVICE), retain_graph=True)
    assert not [name for name, _ in ops.calls if "sum" in name], ops.calls
    assert_close((y, *got), want)
    again = torch.autograd.grad(y, (x, w, b), dy.to(DEVICE))
    assert torch.equal(again[1], got[1]) and torch.equal(again[2], got[2])


@pytest.mark.parametrize(("partition", "shape", "path"), [("layer", (3, 4, 5), "row"), ("batch", (4, 3, 6), "split")])
def test_second_call_at_a_shape_rebuilds_nothing(monkeypatch, partition, shape, path):
    """The checks, geometry and every launch's non-tensor arguments are built once per shape, layout,
    dtype and settings: a second training step at the same shape finds them all cached (no cache
    misses) and runs no import statement in the plugin's Triton modules; a new shape builds anew."""
    import builtins

    from normkit_normalnorm.triton_kernels import _call_plan, launch

    if path == "split":
        monkeypatch.setattr(config, "row_max", 0)
        monkeypatch.setattr(config, "chunk", 8)
    weight, bias = (p.to(DEVICE).requires_grad_() for p in params(shape[1], 63))

    def step(shape):
        x = make_input(shape, seed=64, constant_channel=False).to(DEVICE).requires_grad_()
        normality_triton(x, weight, bias, partition=partition, training=True, noise=0.5).sum().backward()

    caches = (_call_plan, launch.forward_plan, launch.backward_plan)
    step(shape)
    misses = [f.cache_info().misses for f in caches]
    hits = [f.cache_info().hits for f in caches]
    imports = []
    real_import = builtins.__import__

    def counting_import(name, globals=None, *args, **kwargs):
        if (globals or {}).get("__name__", "").startswith("normkit_normalnorm.triton_kernels"):
            imports.append(name)
        return real_import(name, globals, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", counting_import)
    step(shape)
    monkeypatch.setattr(builtins, "__import__", real_import)
    assert imports == []
    assert [f.cache_info().misses for f in caches] == misses
    assert all(f.cache_info().hits > h for f, h in zip(caches, hits))
    step((shape[0] + 1, *shape[1:]))  # another shape: its own plans
    assert [f.cache_info().misses for f in caches] == [m + 1 for m in misses]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_input_and_output(dtype):
    x3 = make_input((3, 4, 10), seed=15).to(dtype)
    weight, bias = params(4, 16)
    dy = torch.randn(x3.shape, generator=torch.Generator().manual_seed(17)).to(dtype)
    got = run(normality_triton, x3.to(DEVICE), weight.to(DEVICE), bias.to(DEVICE), dy.to(DEVICE),
              partition="layer", training=True)
    assert got[0].dtype == dtype and got[1].dtype == dtype and got[2].dtype == torch.float32
    want = reference(x3.float(), weight, bias, dy.float(), partition="layer", training=True)
    tol = 2e-2 if dtype == torch.float16 else 8e-2
    for g, w in zip(got, want):
        torch.testing.assert_close(g.float().cpu(), w, rtol=tol, atol=tol)
    out32 = normality_triton(x3.to(DEVICE), weight.to(DEVICE), bias.to(DEVICE), partition="layer",
                             training=True, out_dtype=torch.float32)
    torch.testing.assert_close(out32.cpu(), want[0], rtol=1e-4, atol=1e-4)  # fp32 math on the fp16 values


def test_torch_compile_of_a_model_with_the_op():
    """Dynamo + AOTAutograd trace the custom op (fake impl) and run the kernels (real impl)."""
    torch.manual_seed(0)
    conv = torch.nn.Conv1d(4, 4, 1).to(DEVICE)
    weight, bias = (p.to(DEVICE).requires_grad_() for p in params(4, 18))

    def model(x, running):
        return normality_triton(conv(x), weight, bias, partition="batch", training=True, noise=0.0, **running)

    x = torch.randn(3, 4, 5, device=DEVICE)
    results = []
    for fn in (model, torch.compile(model, fullgraph=True, backend="aot_eager")):
        running = {k: torch.full((4,), v, device=DEVICE) for k, v in
                   (("running_mean", 0.0), ("running_var", 1.0), ("running_lambda", 1.0))}
        y = fn(x, running)
        grads = torch.autograd.grad(y.square().sum(), (conv.weight, weight, bias))
        results.append((y.detach(), *grads, *running.values()))
    for eager, compiled in zip(*results):
        torch.testing.assert_close(compiled, eager)


def _layers(kernel: str, noise: float) -> torch.nn.Module:
    """conv -> bnn -> flatten -> lnn over the last dim (inputs (N, 3, 2, 2)); fixed weights."""
    import normkit

    torch.manual_seed(40)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1), normkit.build(f"bnn(kernel={kernel}, noise={noise})", 4),
                                torch.nn.Flatten(2), normkit.build(f"lnn(kernel={kernel}, noise={noise})", 4,
                                                                   channel_dim=-1))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model.to(DEVICE)


def _step(model: torch.nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    """Output, input and parameter gradients, then the buffers, of one training step."""
    x = x.clone().requires_grad_()
    y = model(x)
    grads = torch.autograd.grad((y * torch.linspace(-1, 2, y.numel(), device=y.device).view(y.shape)).sum(),
                                (x, *model.parameters()))
    return [y.detach(), *grads, *(b.clone() for b in model.buffers())]


def test_compiled_layers_with_kernel_triton_match_eager():
    """torch.compile(fullgraph=True) of a model whose norms use kernel=triton: the graph goes through
    the triton_ops and their autograd (on CPU the interpreted kernels run inside the CPU op). Same
    values, gradients and buffers as eager over two steps (the second reads updated buffers). The
    compiled graph draws the noise seed from the same generator call as eager, so under one seed the
    noise agrees too; a seed baked into the graph would repeat the first step's noise."""
    x = make_input((4, 3, 2, 2), seed=41, constant_channel=False).to(DEVICE)
    results = []
    for compiled in (False, True):
        model = _layers("triton", 0.5)
        run = torch.compile(model, fullgraph=True, backend="aot_eager") if compiled else model
        torch.manual_seed(42)
        results.append([_step(run, x) for _ in range(2)])
    for step_got, step_want in zip(*results):
        for a, b in zip(step_got, step_want):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_exported_layers_with_kernel_triton_match_eager():
    """torch.export keeps the triton_op as one node; running the exported module launches it."""
    model = _layers("triton", 0.0).eval()
    x = make_input((4, 3, 2, 2), seed=43, constant_channel=False).to(DEVICE)
    exported = torch.export.export(model, (x,))
    targets = [n.target for n in exported.graph.nodes]
    assert targets.count(torch.ops.normkit_normalnorm.normality_forward.default) == 2
    torch.testing.assert_close(exported.module()(x), model(x), rtol=1e-6, atol=1e-6)


@pytest.mark.slow  # inductor compiles C++ for the surrounding ops: about 15 s on 2 cores
def test_torch_compile_inductor():
    torch.manual_seed(0)
    weight, bias = (p.to(DEVICE).requires_grad_() for p in params(4, 19))

    def model(x):
        return normality_triton(torch.relu(x), weight, bias, partition="layer", training=True, noise=0.0) * 2

    x = torch.randn(3, 4, 5, device=DEVICE)
    eager = model(x)
    compiled = torch.compile(model, fullgraph=True)(x)
    torch.testing.assert_close(compiled, eager)
    torch.testing.assert_close(torch.autograd.grad(compiled.sum(), weight)[0],
                               torch.autograd.grad(eager.sum(), weight)[0])


def test_opcheck():
    from normkit_normalnorm.triton_kernels.op import normality_forward

    x3 = make_input((3, 4, 5), seed=20).to(DEVICE)
    weight, bias = (p.to(DEVICE).requires_grad_() for p in params(4, 21))
    torch.library.opcheck(normality_forward, (x3, weight, bias, None, None, None, torch.tensor([5]), "group", 2,
                                              False, True, 1e-5, 1.0, 0.3, None, None, False, None))


def test_available():
    assert available()


def test_bad_arguments_raise_normkit_errors():
    x3 = torch.randn(2, 6, 4, device=DEVICE)
    with pytest.raises(NormkitError, match="groups"):
        normality_triton(x3, None, None, partition="group", groups=4, training=True)
    with pytest.raises(NormkitError, match="more than 1 value"):
        normality_triton(x3[:1, :, :1], None, None, partition="batch", training=True)
    with pytest.raises(NormkitError, match="float16, bfloat16, float32 or float64"):
        normality_triton(x3.to(torch.int32), None, None, partition="layer", training=True)


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE != "cuda", reason="needs a CUDA device")
@pytest.mark.parametrize(("partition", "shape", "tokens"), [
    ("batch", (128, 64, 1024), False), ("batch", (128, 512, 16), False),
    ("layer", (32, 768, 65), True), ("layer", (8, 4096, 1024), True), ("group", (16, 64, 1024), False)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_benchmark_shapes_match_reference(partition, shape, tokens, dtype):
    g = torch.Generator().manual_seed(22)
    x3 = (torch.randn(shape, generator=g).exp() - 1).to(DEVICE, dtype)
    if tokens:
        x3 = x3.transpose(1, 2).contiguous().transpose(1, 2)
    weight, bias = (p.to(DEVICE) for p in params(shape[1], 23))
    dy = torch.randn(shape, generator=g).to(DEVICE, dtype)
    kw = {"partition": partition, "groups": 8 if partition == "group" else 1, "tokens": tokens, "training": True}
    got = run(normality_triton, x3, weight, bias, dy, **kw)
    want = run(normality_norm, x3.double(), weight.double(), bias.double(), dy.double(), **kw)
    tol = 1e-3 if dtype == torch.float32 else 5e-2
    for g_, w_ in zip(got, want):
        torch.testing.assert_close(g_.float(), w_.float(), rtol=tol, atol=tol)


@pytest.mark.parametrize(("partition", "shape", "tokens"), [("batch", (4, 3, 10), False), ("layer", (3, 24, 1), True)])
def test_row_forward_with_split_backward_matches_row_backward(monkeypatch, partition, shape, tokens):
    """Groups between backward_row_max and row_max run the row forward and the split backward
    (the backward spills first on a GPU); with noise, both backwards regenerate the same noise."""
    x3 = make_input(shape, 31).to(DEVICE)
    weight, bias = (p.to(DEVICE) for p in params(shape[1], 32))
    dy = torch.randn(shape, generator=torch.Generator().manual_seed(33)).to(DEVICE)
    kw = {"partition": partition, "tokens": tokens, "training": True, "noise": 0.4}
    torch.manual_seed(5)
    want = run(normality_triton, x3, weight, bias, dy, **kw)
    monkeypatch.setattr(config, "backward_row_max", 0)
    monkeypatch.setattr(config, "chunk", 16)
    torch.manual_seed(5)
    got = run(normality_triton, x3, weight, bias, dy, **kw)
    assert torch.equal(got[0], want[0])
    assert_close(got, want, tol=1e-5)


def _philox4x32_7(seed: int, counter: np.ndarray) -> list[np.ndarray]:
    """Philox-4x32 with 7 rounds at (counter, 0, 0, 0) and key (seed low, seed high), as tl.randint4x."""
    mask = np.uint64(0xFFFFFFFF)
    c = [counter.astype(np.uint64), *(np.zeros_like(counter, dtype=np.uint64) for _ in range(3))]
    k0, k1 = np.uint64(seed & 0xFFFFFFFF), np.uint64(seed >> 32)
    for _ in range(7):
        p0, p2 = np.uint64(0xD2511F53) * c[0], np.uint64(0xCD9E8D57) * c[2]
        c = [((p2 >> np.uint64(32)) ^ c[1] ^ k0) & mask, p2 & mask, ((p0 >> np.uint64(32)) ^ c[3] ^ k1) & mask,
             p0 & mask]
        k0, k1 = (k0 + np.uint64(0x9E3779B9)) & mask, (k1 + np.uint64(0xBB67AE85)) & mask
    return c


def documented_noise(seed: int, gid: int, m: int) -> np.ndarray:
    """The noise of in-group values j = 0..m-1 of group `gid`, as docs/performance.md defines it: lane j % 4
    of Philox-4x32-7 at counter gid * ceil(m / 4) + j // 4; Box-Muller on lanes (0, 1) and (2, 3) with
    u = (bits >> 8 + 0.5) / 2^24, radius sqrt(-2 ln u1), angle 2 pi u2 - pi, cos then sin."""
    j = np.arange(m)
    lanes = _philox4x32_7(seed, gid * ((m + 3) // 4) + j // 4)
    first = (j % 4) < 2
    bits_r, bits_a = np.where(first, lanes[0], lanes[2]), np.where(first, lanes[1], lanes[3])
    u1 = ((bits_r >> np.uint64(8)).astype(np.float64) + 0.5) / 2**24
    angle = ((bits_a >> np.uint64(8)).astype(np.float64) + 0.5) / 2**24 * 2 * np.pi - np.pi
    radius = np.sqrt(-2 * np.log(u1))
    return np.where(j % 2 == 0, radius * np.cos(angle), radius * np.sin(angle))


def noise_of(x3, weight, bias, partition, seed):
    """The standard normals a noisy training forward drew: (noisy - clean) / (w * noise * scale)."""
    first, clean = noisy(x3, weight, bias, partition, seed), noisy(x3, weight, bias, partition, seed, noise=0.0)
    pre = normality_norm(x3.double(), None, None, partition=partition, training=True)
    dims = (0, 2) if partition == "batch" else (1, 2)
    scale = (pre - pre.mean(dims, keepdim=True)).abs().mean(dims, keepdim=True).float()
    return (first - clean) / (weight.view(1, -1, 1) * 0.5 * scale)


@pytest.mark.parametrize("path", ["row", "split"])
def test_noise_is_the_documented_philox_stream(monkeypatch, path):
    """Both paths draw the documented numbers (one Philox call per four neighbouring values of a group,
    in the partition's in-group order, so neither the memory layout nor the path changes them)."""
    choose_path(path, monkeypatch)
    x3 = make_input((3, 4, 40), seed=52, constant_channel=False)  # layer: 3 groups of 160 values, j = c*S + s
    weight, bias = params(4, 53)
    torch.manual_seed(8)
    seed = int(torch.randint(0, 2**31 - 1, (1,), device=DEVICE))  # the launcher's draw, same generator state
    z = noise_of(x3, weight, bias, "layer", 8)
    want = np.stack([documented_noise(seed, gid, 160) for gid in range(3)]).reshape(3, 4, 40)
    torch.testing.assert_close(z, torch.from_numpy(want).float(), rtol=2e-3, atol=2e-3)


def test_noise_of_shared_philox_calls_is_standard_normal_and_independent():
    """Four values share one Philox call and two share a Box-Muller radius: still mean 0, variance 1, and
    no correlation of values or of squares between neighbours within or across quads (lags 1-4)."""
    x3 = make_input((4, 8, 64), seed=50, constant_channel=False)
    weight, bias = params(8, 51)
    z = noise_of(x3, weight, bias, "layer", 7).reshape(4, -1).double()  # in-group order
    n = z.numel()
    assert abs(z.mean().item()) < 4 / n**0.5
    assert abs(z.var().item() - 1) < 4 * (2 / n) ** 0.5
    for lag in (1, 2, 3, 4):
        for power in (1, 2):
            a, b = z[:, :-lag].pow(power).flatten(), z[:, lag:].pow(power).flatten()
            corr = torch.corrcoef(torch.stack([a, b]))[0, 1].item()
            assert abs(corr) < 4 / a.numel() ** 0.5, (lag, power, corr)
