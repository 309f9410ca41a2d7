"""The nn stage in layers: registration, parameters, noise, running lambda, eval, inspection, kernels."""

from __future__ import annotations

import normkit
import normkit.testing
import numpy as np
import pytest
import scipy.stats
import torch

from normkit_normalnorm import CITATION
from normkit_normalnorm.functional import normality_norm
from normkit_normalnorm.yeojohnson import newton_lambda


def skewed(shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).exp() * 2 - 1


@pytest.mark.parametrize(("name", "expands"), [("bnn", "bn+nn"), ("lnn", "ln+nn"), ("gnn", "gn+nn"),
                                               ("inn", "in+nn")])
def test_paper_names_are_compositions_with_citation(name: str, expands: str) -> None:
    entry = {e["name"]: e for e in normkit.available()}[name]
    assert entry["expands_to"] == expands
    assert "2505.00685" in entry["citation"] and entry["summary"]
    assert normkit.parse(name).expanded() == expands
    assert "2505.00685" in CITATION


def test_stage_parameters_and_defaults() -> None:
    entry = {e["name"]: e for e in normkit.available()}["nn"]
    assert entry["kind"] == "step"
    params = entry["parameters"]
    assert {k: v["default"] for k, v in params.items()} == {
        "noise": None, "alpha": 1.0, "eps": 1e-5, "momentum": 0.1, "lambda_min": None, "lambda_max": None,
        "detach_lambda": False, "kernel": "auto"}
    assert normkit.build("bnn", 8).steps[1].noise == 0.4
    assert normkit.build("gnn(groups=2)", 8).steps[1].noise == 0.4
    assert normkit.build("inn", 8).steps[1].noise == 0.4
    assert normkit.build("lnn", 8).steps[1].noise == 1.0
    assert normkit.build("bnn(noise=0.6)", 8).steps[1].noise == 0.6


@pytest.mark.parametrize("spec", ["bn+nn", "ln+nn", "gn(groups=8)+nn", "in+nn"])
def test_composes_with_every_standardizing_partition(spec: str) -> None:
    layer = normkit.build(spec, 16)
    y = layer(skewed((4, 16, 3, 3)))
    assert y.shape == (4, 16, 3, 3) and torch.isfinite(y).all()


@pytest.mark.parametrize(("spec", "message"), [
    ("bnn(noise=-0.1)", "noise must be >= 0"),
    ("bnn(alpha=0)", "alpha"),
    ("bnn(eps=0)", "eps must be > 0"),
    ("bn+nn(momentum=1.5)", "momentum must be in [0, 1]"),
    ("bnn(lambda_min=1.5, lambda_max=0.5)", "lambda_min (1.5) must be <= lambda_max (0.5)"),
    ("bnn(kernel=cuda)", "kernel"),
    ("rms+nn", "needs standardized input"),
    ("none+nn", "no normalizing step"),
])
def test_bad_values_raise_spec_error(spec: str, message: str) -> None:
    with pytest.raises(normkit.SpecError, match=message.replace("(", r"\(").replace(")", r"\)")
                       .replace("[", r"\[").replace("]", r"\]")):
        normkit.build(spec, 8)


def test_functional_rejects_bad_arguments() -> None:
    x3 = skewed((4, 6, 5))
    with pytest.raises(normkit.SpecError, match="partition must be"):
        normality_norm(x3, None, None, partition="channel", training=True)
    with pytest.raises(normkit.SpecError, match="groups"):
        normality_norm(x3, None, None, partition="group", groups=4, training=True)
    with pytest.raises(normkit.SpecError, match="together"):
        normality_norm(x3, None, None, partition="batch", training=True, running_mean=torch.zeros(6))
    with pytest.raises(normkit.NormShapeError, match="more than 1 value"):
        normality_norm(x3[:1, :, :1], None, None, partition="batch", training=True)


def test_describe_shows_settings() -> None:
    layer = normkit.build("bnn(lambda_min=0, lambda_max=2, kernel=torch)", 8)
    info = dict(layer.describe()["steps"])["nn"]
    assert info["noise"] == "0.4 (default for this partition)"
    assert info["lambda_clamp"] == "[0.0, 2.0]"
    assert info["kernel"] == "torch"
    assert {"alpha", "eps", "momentum", "detach_lambda"} <= set(info)
    assert "running_lambda" in layer.describe()["buffers"]


def test_state_dict_keys() -> None:
    assert list(normkit.build("bnn", 8).state_dict()) == [
        "weight", "bias", "running_mean", "running_var", "num_batches_tracked", "running_lambda"]
    assert list(normkit.build("lnn", 8).state_dict()) == ["weight", "bias"]


@pytest.mark.parametrize("reference", [False, True])
def test_noise_off_is_deterministic(reference: bool) -> None:
    layer = normkit.build("bnn(noise=0)", 6)
    layer.recording = reference
    x = skewed((5, 6, 4))
    torch.testing.assert_close(layer(x), layer(x), rtol=0, atol=0)


@pytest.mark.parametrize(("partition", "groups", "tokens", "dims"), [
    ("batch", 1, False, (0, 2)), ("layer", 1, False, (1, 2)), ("layer", 1, True, (1,)),
    ("instance", 1, False, (2,)),
])
def test_noise_has_the_per_group_scale(partition: str, groups: int, tokens: bool,
                                       dims: tuple[int, ...]) -> None:
    """y - y_clean == xi * mean|x - mean x| * z with z exactly torch's N(0,1) draw under the seed."""
    x3 = skewed((4, 6, 5))
    clean = normality_norm(x3, None, None, partition=partition, groups=groups, tokens=tokens, training=True)
    torch.manual_seed(3)
    noisy = normality_norm(x3, None, None, partition=partition, groups=groups, tokens=tokens, training=True,
                           noise=0.7)
    torch.manual_seed(3)
    z = torch.randn(4, 5, 6).transpose(1, 2) if tokens else torch.randn(4, 6, 5)
    scale = (clean - clean.mean(dims, keepdim=True)).abs().mean(dims, keepdim=True)
    torch.testing.assert_close(noisy - clean, 0.7 * scale * z, rtol=1e-5, atol=1e-5)


def test_noise_reproducible_and_off_in_eval() -> None:
    layer = normkit.build("lnn", 6, channel_dim=-1)
    x = skewed((3, 4, 6))
    torch.manual_seed(0)
    a = layer(x)
    torch.manual_seed(0)
    torch.testing.assert_close(layer(x), a, rtol=0, atol=0)
    assert not torch.equal(layer(x), a)
    layer.eval()
    torch.testing.assert_close(layer(x), layer(x), rtol=0, atol=0)


@pytest.mark.parametrize("momentum", [0.1, None])
def test_running_lambda_is_the_ema_of_batch_estimates(momentum: float | None) -> None:
    layer = normkit.build("bnn(momentum=none)" if momentum is None else "bnn", 5)
    expected = torch.ones(5, dtype=torch.float64)
    for step in range(1, 4):
        x = skewed((6, 5, 7), seed=step) * step
        layer(x)
        u = x.double().transpose(0, 1).reshape(5, -1)
        h = (u - u.mean(1, keepdim=True)) / torch.sqrt(u.var(1, unbiased=False, keepdim=True) + 1e-5)
        batch_lambda = newton_lambda(h, (1,)).squeeze(1)
        factor = 1 / step if momentum is None else momentum
        expected = (1 - factor) * expected + factor * batch_lambda
    assert int(layer.num_batches_tracked) == 3
    torch.testing.assert_close(layer.running_lambda.double(), expected, rtol=1e-4, atol=1e-5)
    assert (expected - 1).abs().max() > 0.05


@pytest.mark.parametrize("reference", [False, True])
def test_eval_uses_running_statistics(reference: bool) -> None:
    layer = normkit.build("bnn", 4)
    for step in range(3):
        layer(skewed((8, 4, 3, 3), seed=step))
    layer.eval()
    layer.recording = reference
    x = skewed((2, 4, 3, 3), seed=9)
    rm, rv, rl = (layer.get_buffer(n).double().numpy() for n in ("running_mean", "running_var", "running_lambda"))
    h = (x.double().numpy() - rm[None, :, None, None]) / np.sqrt(rv[None, :, None, None] + 1e-5)
    want = np.stack([scipy.stats.yeojohnson(h[:, c].ravel(), lmbda=rl[c]).reshape(h[:, c].shape)
                     for c in range(4)], axis=1)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([0.5, 1.0, 1.5, 2.0]))
        layer.bias.copy_(torch.tensor([0.1, -0.2, 0.3, 0.0]))
    want = want * np.array([0.5, 1.0, 1.5, 2.0])[None, :, None, None] + np.array([0.1, -0.2, 0.3, 0.0])[
        None, :, None, None]
    np.testing.assert_allclose(layer(x).detach().double().numpy(), want, rtol=2e-5, atol=2e-5)
    torch.testing.assert_close(layer(x[:1]), layer(x)[:1])  # no batch statistics in eval


def test_row_partitions_estimate_lambda_in_eval() -> None:
    layer = normkit.build("lnn", 6).eval()
    layer.recording = True
    x = skewed((3, 6, 8))
    layer(x)
    h = (x - x.mean((1, 2), keepdim=True)) / torch.sqrt(x.var((1, 2), unbiased=False, keepdim=True) + 1e-5)
    torch.testing.assert_close(layer.records["lambda"], newton_lambda(h, (1, 2)).flatten())


@pytest.mark.parametrize(("spec", "channel_dim", "shape", "lambda_shape"), [
    ("bnn", 1, (4, 6, 3, 3), (6,)), ("lnn", 1, (4, 6, 5), (4,)), ("lnn", -1, (4, 5, 6), (4, 5)),
    ("gnn(groups=3)", 1, (4, 6, 5), (4, 3)), ("inn", 1, (4, 6, 5), (4, 6)),
])
def test_inspection_records_lambda_and_post_transform(spec: str, channel_dim: int, shape: tuple[int, ...],
                                                      lambda_shape: tuple[int, ...]) -> None:
    layer = normkit.build(spec, 6, channel_dim=channel_dim)
    x = skewed(shape)
    layer(x)
    assert layer.records == {}  # nothing is copied unless someone records
    layer.recording = True
    layer(x)
    assert layer.records["lambda"].shape == lambda_shape
    n, s = shape[0], int(np.prod(shape[1:])) // 6
    assert layer.records["post_transform"].shape == (n, 6, s)


def test_kernel_choice(monkeypatch) -> None:
    """kernel=auto on a small CPU step: rows.c's grouped functions, the PyTorch path's function and noise to
    float32 rounding (their log1p/expm1 differ in the last bits); bit for bit with rows.c switched off."""
    x = skewed((4, 6, 5))
    torch.manual_seed(0)
    auto = normkit.build("bnn", 6)(x)
    torch.manual_seed(0)
    torch.testing.assert_close(normkit.build("bnn(kernel=torch)", 6)(x), auto, rtol=1e-5, atol=1e-5)
    monkeypatch.setenv("NORMKIT_NN_ROWS", "0")
    torch.manual_seed(0)
    auto = normkit.build("bnn", 6)(x)
    torch.manual_seed(0)
    torch.testing.assert_close(normkit.build("bnn(kernel=torch)", 6)(x), auto, rtol=0, atol=0)
    from normkit_normalnorm import triton_kernels

    if not triton_kernels.available():
        with pytest.raises(normkit.NormkitError, match="kernel=triton.*use kernel=auto or kernel=torch"):
            normkit.build("bnn(kernel=triton)", 6)(x)


def test_build_and_convert_resnet18() -> None:
    torchvision = pytest.importorskip("torchvision")
    layer = normkit.build("bnn", 64)
    assert layer(skewed((2, 64, 4, 4))).shape == (2, 64, 4, 4)
    model = torchvision.models.resnet18(num_classes=10)
    summary = normkit.convert(model, "bnn")
    assert summary is not None
    layers = [m for m in model.modules() if isinstance(m, normkit.NormLayer)]
    assert len(layers) == 20 and all(hasattr(m, "running_lambda") for m in layers)
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules())
    out = model(torch.randn(2, 3, 32, 32))
    out.sum().backward()
    assert torch.isfinite(out).all()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    assert all(int(m.num_batches_tracked) == 1 for m in layers)


@pytest.mark.parametrize(("spec", "shape", "channel_dim"), [("lnn", (4, 8, 32), -1), ("gnn(groups=2)", (3, 4, 5), 1)])
def test_fused_path_adds_no_view_nodes_for_three_dim_inputs(spec: str, shape: tuple[int, ...], channel_dim: int) -> None:
    """An input already `(N, S, C)` / `(N, C, S)` reaches the fused function without a reshape (each view op is an
    autograd node: host work in the forward and again in the backward at tiny shapes); outputs and gradients are
    those of the reshaped 4-dim input."""
    layer = normkit.build(spec, shape[channel_dim], channel_dim=channel_dim)
    x = torch.randn(shape, requires_grad=True)
    torch.manual_seed(0)
    out = layer(x)
    assert "ViewBackward0" not in normkit.testing.autograd_node_names(out)
    out.backward(torch.ones(shape))
    x4 = x.detach().unsqueeze(1 if channel_dim == -1 else 2).requires_grad_()  # the same values as (N, 1, S, C) / (N, C, 1, S)
    torch.manual_seed(0)
    out4 = layer(x4)
    out4.backward(torch.ones(x4.shape))
    assert torch.equal(out4.reshape(shape), out) and torch.equal(x4.grad.reshape(shape), x.grad)
