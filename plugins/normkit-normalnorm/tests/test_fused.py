"""The fused path (custom autograd.Function) computes the reference path's function and gradients."""

from __future__ import annotations

import copy

import normkit
import pytest
import torch

from normkit_normalnorm.functional import normality_norm
from normkit_normalnorm.yeojohnson import newton_lambda

CASES = [  # spec, channel_dim, input shape, channels_last
    ("bnn", 1, (5, 7, 3, 3), False),
    ("bnn", 1, (5, 7, 3, 3), True),
    ("bnn", 1, (6, 7), False),
    ("bnn", 1, (3, 7, 5), False),
    ("lnn", 1, (3, 7, 5), False),
    ("lnn", 1, (3, 7, 3, 2), True),
    ("lnn", -1, (3, 5, 7), False),
    ("lnn", -1, (2, 3, 2, 7), False),
    ("gnn(groups=7)", 1, (3, 7, 5), False),
    ("gn(groups=3)+nn", 9, (2, 9, 3, 3), True),
    ("inn", 1, (3, 7, 4, 2), False),
    ("bnn(lambda_min=0.8, lambda_max=1.2)", 1, (4, 7, 6), False),
    ("lnn(detach_lambda=true, noise=0.5)", -1, (3, 5, 7), False),
    ("bnn(alpha=0.5, momentum=none)", 1, (4, 7, 5), False),
]


def skewed_input(shape: tuple[int, ...], dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g, dtype=torch.float64).exp() * 2 - 1).to(dtype)


def run(layer: torch.nn.Module, x: torch.Tensor, grad: torch.Tensor, reference: bool) -> list[torch.Tensor]:
    layer.recording = reference  # recording makes the layer take the reference (generic) path
    x = x.detach().clone().requires_grad_(True)
    torch.manual_seed(7)
    y = layer(x)
    layer.recording = False
    grads = torch.autograd.grad(y, [x, layer.weight, layer.bias], grad)
    return [y.detach(), *grads]


@pytest.mark.parametrize(("spec", "channels", "shape", "channels_last"), CASES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_fast_path_equals_reference(spec: str, channels: int, shape: tuple[int, ...], channels_last: bool,
                                    dtype: torch.dtype) -> None:
    channel_dim = 1 if channels == 1 else -1
    num_channels = shape[1] if channels == 1 else shape[-1]
    if channels not in (1, -1):
        num_channels, channel_dim = channels, 1
    layer = normkit.build(spec, num_channels, channel_dim=channel_dim).to(dtype)
    with torch.no_grad():
        layer.weight.uniform_(0.5, 1.5, generator=torch.Generator().manual_seed(1))
        layer.bias.uniform_(-0.5, 0.5, generator=torch.Generator().manual_seed(2))
    x = skewed_input(shape, dtype)
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    grad = skewed_input(shape, dtype, seed=3)
    tol = {"rtol": 1e-9, "atol": 1e-9} if dtype == torch.float64 else {"rtol": 2e-4, "atol": 2e-4}
    for mode in ("train", "eval"):
        fast, ref = copy.deepcopy(layer), copy.deepcopy(layer)
        if mode == "eval":
            for model in (fast, ref):
                for seed in (4, 5):
                    model(skewed_input(shape, dtype, seed))
                model.eval()
        got, want = run(fast, x, grad, reference=False), run(ref, x, grad, reference=True)
        if mode == "eval" and dtype == torch.float64:  # the core's standardize reads running stats as float32
            tol = {"rtol": 1e-5, "atol": 1e-6}
        for name, a, b in zip(("output", "input grad", "weight grad", "bias grad"), got, want):
            torch.testing.assert_close(a, b, **tol, msg=lambda m, n=name, md=mode: f"{spec} {md} {n}: {m}")
        for name, buffer in fast.named_buffers():
            torch.testing.assert_close(buffer, ref.get_buffer(name), **tol)


@pytest.mark.parametrize(("partition", "groups", "tokens"), [
    ("batch", 1, False), ("layer", 1, False), ("layer", 1, True), ("instance", 1, False), ("group", 2, False),
])
@pytest.mark.parametrize("training", [True, False])
def test_gradcheck_of_the_fused_function(partition: str, groups: int, tokens: bool, training: bool) -> None:
    x3 = skewed_input((3, 4, 3), torch.float64).requires_grad_(True)
    weight = torch.linspace(0.5, 1.5, 4, dtype=torch.float64).requires_grad_(True)
    bias = torch.linspace(-0.3, 0.3, 4, dtype=torch.float64).requires_grad_(True)
    running = {}
    if partition == "batch" and not training:
        running = {"running_mean": torch.full((4,), 0.2, dtype=torch.float64),
                   "running_var": torch.full((4,), 1.7, dtype=torch.float64),
                   "running_lambda": torch.linspace(0.2, 1.8, 4, dtype=torch.float64)}

    def fn(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return normality_norm(x, w, b, partition=partition, groups=groups, tokens=tokens, training=training,
                              noise=0.0, **running)

    assert torch.autograd.gradcheck(fn, (x3, weight, bias), eps=1e-6, atol=1e-6, rtol=1e-4)


def test_gradcheck_with_active_clamp_and_alpha() -> None:
    x3 = skewed_input((3, 3, 5), torch.float64).requires_grad_(True)

    def fn(x: torch.Tensor) -> torch.Tensor:
        return normality_norm(x, None, None, partition="instance", training=True, alpha=0.7,
                              lambda_min=0.7, lambda_max=1.1)

    h = (x3 - x3.mean(2, keepdim=True)) / torch.sqrt(x3.var(2, unbiased=False, keepdim=True) + 1e-5)
    raw = newton_lambda(h.detach(), (2,), alpha=0.7)
    assert ((raw < 0.7) | (raw > 1.1)).any() and ((raw > 0.7) & (raw < 1.1)).any()  # the clamp binds for some
    assert torch.autograd.gradcheck(fn, (x3,), eps=1e-6, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("value", [3.0, 0.1, -7.3, 1000.1])
def test_constant_channel_has_lambda_one_and_finite_gradients(value: float) -> None:
    """A constant channel must give h = 0 exactly (float32 rounding of mean * rstd would not)."""
    layer = normkit.build("bnn", 4)
    x = skewed_input((6, 4, 3, 3), torch.float32)
    x[:, 2] = value
    x.requires_grad_(True)
    layer(x).square().sum().backward()
    assert torch.isfinite(x.grad).all()
    assert layer.running_lambda[2].item() == pytest.approx(1.0, abs=1e-6)
    layer.recording = True
    layer(x)
    assert layer.records["lambda"][2].item() == pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize(("spec", "channel_dim"), [("lnn", 1), ("lnn", -1), ("gnn(groups=2)", 1), ("inn", 1)])
def test_constant_rows_match_the_reference(spec: str, channel_dim: int) -> None:
    layer = normkit.build(spec, 4, channel_dim=channel_dim, noise=0.0)
    x = skewed_input((5, 4, 6) if channel_dim == 1 else (5, 6, 4), torch.float32)
    x[3] = 1000.1  # a constant sample: every row/group in it is constant
    got = run(layer, x, torch.ones_like(x), reference=False)
    want = run(layer, x, torch.ones_like(x), reference=True)
    for a, b in zip(got, want):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, rtol=2e-4, atol=2e-4)


@pytest.mark.parametrize("spec", ["bnn", "lnn"])
def test_recycled_saved_buffers_survive_retain_graph(spec: str) -> None:
    """Saved tensors go back to the pool only after the last backward; a forward in between cannot clobber them."""
    layer = normkit.build(spec, 6, channel_dim=-1 if spec == "lnn" else 1)
    x = skewed_input((4, 3, 6) if spec == "lnn" else (4, 6, 3), torch.float32).requires_grad_(True)
    torch.manual_seed(0)
    y = layer(x)
    grad = torch.randn_like(y)
    first = torch.autograd.grad(y, x, grad, retain_graph=True)[0]
    for _ in range(2):  # other steps borrow and return buffers meanwhile
        other = skewed_input(tuple(x.shape), torch.float32, seed=3).requires_grad_(True)
        layer(other).sum().backward()
    second = torch.autograd.grad(y, x, grad)[0]
    torch.testing.assert_close(second, first, rtol=0, atol=0)


@pytest.mark.parametrize("spec", ["bnn", "lnn"])
def test_no_grad_forward_equals_grad_forward(spec: str) -> None:
    """Under no_grad the fused path skips the backward's per-element derivatives; the output is unchanged."""
    layer = normkit.build(spec, 6).eval()
    x = skewed_input((4, 6, 3), torch.float32)
    with torch.no_grad():
        quiet = layer(x)
    torch.testing.assert_close(quiet, layer(x.requires_grad_(True)).detach(), rtol=0, atol=0)
