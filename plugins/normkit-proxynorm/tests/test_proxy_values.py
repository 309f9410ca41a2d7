"""pn's numbers: proxy statistics at init, the output formula, gradients, train == eval."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import normkit
import normkit.testing
from normkit_proxynorm import proxy, proxy_quantiles

SPECS = ["gn+pn", "ln+pn", "gn(groups=8)+pn", "bn+pn"]


def standardized(x: torch.Tensor, groups: int) -> torch.Tensor:
    return F.group_norm(x, groups, eps=1e-5)


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("activation", [None, "relu"])
def test_builds_with_and_without_model_activation(spec: str, activation: str | None) -> None:
    layer = normkit.build(spec, 32, activation=activation)
    out = layer(torch.randn(4, 32, 3, 3))
    assert out.shape == (4, 32, 3, 3) and torch.isfinite(out).all()
    assert layer.describe()["recovery"] == "none (affine moved into pn)"


def test_quantile_proxy_statistics_match_the_paper_values() -> None:
    u = proxy_quantiles(200, dtype=torch.float64)
    for act, (mu, var) in {F.relu: (0.3985, 0.3380), F.silu: (0.2060, 0.3100)}.items():
        z = act(u)
        assert z.mean().item() == pytest.approx(mu, abs=5e-5)
        assert z.var(unbiased=False).item() == pytest.approx(var, abs=5e-5)


def test_relu_output_at_init_is_relu_minus_proxy_mean_over_proxy_std() -> None:
    torch.manual_seed(0)
    x = torch.randn(4, 16, 5, 5) * 3 + 1
    out = normkit.build("gn(groups=8)+pn", 16, activation="relu")(x)
    expected = (F.relu(standardized(x, 8)) - 0.3985) / (0.3380 + 0.03) ** 0.5
    torch.testing.assert_close(out, expected, atol=2e-4, rtol=0)


def test_silu_output_at_init() -> None:
    torch.manual_seed(0)
    x = torch.randn(4, 16, 5, 5)
    layer = normkit.build("ln+pn(act=silu)", 16)
    assert isinstance(layer.act, torch.nn.SiLU)
    expected = (F.silu(standardized(x, 1)) - 0.2060) / (0.3100 + 0.03) ** 0.5
    torch.testing.assert_close(layer(x), expected, atol=2e-4, rtol=0)


def test_unscaled_variant_only_centres() -> None:
    x = torch.randn(2, 8, 4, 4)
    out = normkit.build("gn(groups=2)+pn(scale=false)", 8, activation="relu")(x)
    torch.testing.assert_close(out, F.relu(standardized(x, 2)) - 0.3985, atol=2e-4, rtol=0)


def test_variant_without_proxy_parameters_equals_zero_proxy_parameters() -> None:
    x = torch.randn(2, 8, 4, 4)
    plain = normkit.build("gn(groups=2)+pn(proxy_params=false)", 8)
    full = normkit.build("gn(groups=2)+pn", 8)
    assert not hasattr(plain, "proxy_beta") and not hasattr(plain, "proxy_gamma")
    torch.testing.assert_close(plain(x), full(x))


def test_proxy_parameters_change_the_proxy_distribution() -> None:
    torch.manual_seed(0)
    layer = normkit.build("gn(groups=2)+pn", 8)
    with torch.no_grad():
        layer.proxy_beta.fill_(0.5)
        layer.proxy_gamma.fill_(1.0)  # proxy N(0.5, 2^2)
    u = 0.5 + 2 * proxy_quantiles(200, dtype=torch.float64)
    z = F.relu(u)
    x = torch.randn(2, 8, 4, 4)
    expected = (F.relu(standardized(x, 2)) - z.mean()) / (z.var(unbiased=False) + 0.03).sqrt()
    torch.testing.assert_close(layer(x), expected.float(), atol=1e-5, rtol=1e-5)


def test_gradients_flow_through_the_proxy_statistics() -> None:
    """Finite differences of the whole layer in float64 agree only if mu~/var~ carry gradients."""
    torch.manual_seed(0)
    layer = normkit.build("gn(groups=2)+pn(act=silu)", 4).double()
    with torch.no_grad():
        for p in layer.parameters():
            p.add_(0.3 * torch.randn_like(p))
    x = torch.randn(2, 4, 3, 3, dtype=torch.float64)
    names = ["weight", "bias", "proxy_beta", "proxy_gamma"]
    params = [getattr(layer, n) for n in names]

    def run(*values: torch.Tensor) -> torch.Tensor:
        return torch.func.functional_call(layer, dict(zip(names, values, strict=True)), (x,))

    assert torch.autograd.gradcheck(run, tuple(p.detach().clone().requires_grad_() for p in params))
    layer(x).pow(2).sum().backward()
    for name, p in zip(names, params, strict=True):
        assert p.grad is not None and p.grad.abs().sum() > 0, name


@pytest.mark.parametrize("spec", ["gn+pn", "ln+pn", "gn(groups=8)+pn"])
def test_train_and_eval_give_identical_outputs(spec: str) -> None:
    layer = normkit.build(spec, 32, activation="relu")
    with torch.no_grad():
        for p in layer.parameters():
            p.add_(0.2 * torch.randn_like(p))
    x = torch.randn(3, 32, 4, 4)
    train_out = layer.train()(x)
    torch.testing.assert_close(layer.eval()(x), train_out, rtol=0, atol=0)


def test_channels_last_tokens() -> None:
    x = torch.randn(2, 5, 16)
    out = normkit.build("ln+pn", 16, channel_dim=-1)(x)
    expected = (F.relu(F.layer_norm(x, (16,))) - 0.3985) / (0.3380 + 0.03) ** 0.5
    torch.testing.assert_close(out, expected, atol=2e-4, rtol=0)


def test_affine_free_norm_uses_unit_gamma_and_zero_beta() -> None:
    x = torch.randn(2, 8, 4, 4)
    layer = normkit.build("gn(groups=2,affine=false)+pn", 8)
    assert layer.weight is None and layer.decay() == {"proxy_beta": True, "proxy_gamma": True}
    torch.testing.assert_close(layer(x), normkit.build("gn(groups=2)+pn", 8)(x))


@pytest.mark.parametrize("spec, fragment", [
    ("gn(groups=2)+pn(eps=0)", "eps must be a positive finite number"),
    ("gn(groups=2)+pn(samples=1)", r"samples must be in \[2, 100000\]"),
    ("gn(groups=2)+pn(samples=2000000000)", r"gn\(groups=2\)\+pn\(samples=2000000000\): pn: samples must be in"),
    ("gn(groups=2)+pn(eps=nan)", "parameter 'eps' must be a finite number, got nan"),
    ("gn(groups=2)+pn(eps=inf)", "parameter 'eps' must be a finite number, got inf"),
    ("gn+pn(act=nosuch)", "unknown norm or stage"),
])
def test_bad_parameters_raise_spec_errors(spec: str, fragment: str) -> None:
    with pytest.raises(normkit.SpecError, match=fragment):
        normkit.build(spec, 8)


def test_pn_activation_must_match_the_models_activation() -> None:
    with pytest.raises(normkit.SpecError, match="conflicts"):
        normkit.build("gn+pn(act=silu)", 32, activation="relu")


class _PlainReLU(torch.nn.ReLU):
    """A ReLU that is not `nn.ReLU` itself: pn then runs its generic autograd path."""


@pytest.mark.parametrize("spec", ["gn(groups=2)+pn", "gn(groups=2)+pn(scale=false)",
                                  "gn(groups=2)+pn(proxy_params=false)", "ln+pn", "in+pn", "bn+pn",
                                  "gn(groups=2,affine=false)+pn"])
def test_relu_takes_the_fused_function_with_the_generic_paths_values(spec: str) -> None:
    """pn with ReLU runs ReluProxyNorm (same forward ops, hand-written backward): its output equals the generic
    path's bit for bit and every gradient agrees with autograd's (float64), with and without scale and proxy
    parameters."""
    torch.manual_seed(0)
    layer = normkit.build(spec, 4).double()
    with torch.no_grad():
        for p in layer.parameters():
            p.add_(0.5 * torch.randn_like(p))
    x = torch.randn(3, 4, 5, dtype=torch.float64, requires_grad=True)
    g = torch.randn(3, 4, 5, dtype=torch.float64)

    def step() -> list[torch.Tensor]:
        x.grad = None
        layer.zero_grad()
        out = layer(x)
        out.backward(g)
        return [out.detach(), x.grad, *(p.grad for p in layer.parameters())]

    calls = []
    original = proxy.ReluProxyNorm.forward
    proxy.ReluProxyNorm.forward = staticmethod(lambda *a: calls.append(1) or original(*a))
    try:
        fused = step()
    finally:
        proxy.ReluProxyNorm.forward = staticmethod(original)
    assert calls == [1]
    layer.act = _PlainReLU()
    generic = step()
    assert torch.equal(fused[0], generic[0])
    for got, want in zip(fused[1:], generic[1:], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_relu_proxy_norm_passes_gradcheck() -> None:
    torch.manual_seed(1)
    c = 3
    x = torch.randn(2, c, 4, dtype=torch.float64, requires_grad=True)
    weight = (torch.rand(c, dtype=torch.float64) + 0.5).requires_grad_()
    params = [weight, *((0.3 * torch.randn(c, dtype=torch.float64)).requires_grad_() for _ in range(3))]
    u = proxy_quantiles(16, dtype=torch.float64)
    basis = (u.view(1, 1, -1), torch.stack([torch.ones_like(u), u], 1))
    assert torch.autograd.gradcheck(lambda *t: proxy.ReluProxyNorm.apply(*t, basis, 0.03, True), (x, *params))
    assert torch.autograd.gradcheck(lambda *t: proxy.ReluProxyNorm.apply(*t, basis, 0.03, True, (1, 1e-5)),
                                    (x, *params))


class _CountOps(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("spec", ["gn(groups=2)+pn", "in+pn", "ln+pn", "gn(groups=2)+pn(proxy_params=false)"])
def test_relu_pn_after_group_statistics_is_one_autograd_node(spec: str) -> None:
    """gn/in/ln (on N,C,*) + pn with ReLU: the standardization, affine, ReLU and proxy are one autograd Function
    (no NativeGroupNormBackward0 of its own), with the step-by-step path's output bit for bit (float32)."""
    torch.manual_seed(0)
    layer = normkit.build(spec, 4)
    x = torch.randn(3, 4, 5, requires_grad=True)
    out = layer(x)
    assert "NativeGroupNormBackward0" not in normkit.testing.autograd_node_names(out)
    layer.act = _PlainReLU()
    assert torch.equal(out, layer(x))


def test_gn_pn_float32_gradients_match_the_float64_reference() -> None:
    """The whole-layer Function's float32 gradients (other summation order than autograd's) stay within float32
    rounding of the generic path's float64 gradients."""
    torch.manual_seed(2)
    layer = normkit.build("gn+pn", 16)
    with torch.no_grad():
        for p in layer.parameters():
            p.add_(0.5 * torch.randn_like(p))
    x = torch.randn(8, 16, 4, 4)
    g = torch.randn(8, 16, 4, 4)

    def grads(model: torch.nn.Module, dtype: torch.dtype) -> list[torch.Tensor]:
        model = model.to(dtype)
        model.zero_grad()
        xi = x.to(dtype, copy=True).requires_grad_()
        model(xi).backward(g.to(dtype))
        return [xi.grad, *(p.grad for p in model.parameters())]

    reference = copy.deepcopy(layer)
    reference.act = _PlainReLU()
    for got, want in zip(grads(layer, torch.float32), grads(reference, torch.float64), strict=True):
        torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-5)


def test_gn_pn_training_step_runs_few_torch_ops() -> None:
    """At tiny shapes a training call costs its torch ops' host work: gn+pn's forward + backward dispatches at most
    51 aten ops (69 before the whole layer was one Function; torch's GroupNorm 9)."""
    layer = normkit.build("gn+pn", 16)
    x = torch.randn(8, 16, 4, 4, requires_grad=True)
    layer(x).sum().backward()  # first call: builds the quantile cache; parameters now have gradients
    x.grad = None
    grad = torch.ones(8, 16, 4, 4)
    with _CountOps() as counted:
        layer(x).backward(grad)
    assert len(counted.ops) <= 51, counted.ops
