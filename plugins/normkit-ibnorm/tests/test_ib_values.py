"""ib-s/l/t numbers: the compression functions, the layer formula per partition, rms, bn eval, aliases."""

from __future__ import annotations

import pytest
import torch

import normkit
from normkit_ibnorm import COMPRESSIONS, Compression

VARIANTS = sorted(COMPRESSIONS)


@pytest.mark.parametrize("variant", VARIANTS)
def test_compressions_are_odd_with_slope_one_at_zero_and_shrink_tails(variant: str) -> None:
    fn, lam = COMPRESSIONS[variant].fn, COMPRESSIONS[variant].default_lam
    c = torch.tensor([0.0, 1e-4, -1e-4, 1.0, -1.0, 10.0, -10.0, 1e4], dtype=torch.float64, requires_grad=True)
    out = fn(c, lam)
    out.sum().backward()
    assert c.grad[0].item() == pytest.approx(1.0) and c.grad[1].item() == pytest.approx(1.0, abs=1e-4)
    torch.testing.assert_close(fn(-c.detach(), lam), -fn(c.detach(), lam))
    assert (out.detach()[3:].abs() < c.detach()[3:].abs()).all()
    assert (c.grad >= 0).all()  # monotone
    assert out[-1].item() < 0.01 * c[-1].item()  # an outlier of 1e4 is squashed


@pytest.mark.parametrize("variant", VARIANTS)
def test_log_and_others_pass_float64_gradcheck(variant: str) -> None:
    c = (torch.randn(20, dtype=torch.float64) * 5).requires_grad_()
    assert torch.autograd.gradcheck(lambda t: COMPRESSIONS[variant].fn(t, 2.0), (c,))
    assert torch.autograd.gradgradcheck(lambda t: COMPRESSIONS[variant].fn(t, 2.0), (c,))


def expected(x: torch.Tensor, variant: str, lam: float, dims: tuple[int, ...], units: str = "std") -> torch.Tensor:
    """standardize(compress((x - mean) / std)) over `dims` (units=raw: without / std), by hand (weight 1, bias 0)."""
    c = x - x.mean(dims, keepdim=True)
    if units == "std":
        c = c / (x.var(dims, unbiased=False, keepdim=True) + 1e-5).sqrt()
    v = COMPRESSIONS[variant].fn(c, lam)
    var, mean = torch.var_mean(v, dims, unbiased=False, keepdim=True)
    return (v - mean) / (var + 1e-5).sqrt()


@pytest.mark.parametrize("units", ["std", "raw"])
@pytest.mark.parametrize("spec, variant, lam, dims, view", [
    ("bn+ib-t", "t", 4.0, (0, 2, 3), None),
    ("ln+ib-l(lam=4)", "l", 4.0, (1, 2, 3), None),
    ("gn(groups=4)+ib-s", "s", 3.0, (2, 3), (3, 4, 2, 25)),
    ("in+ib-t(lam=1.5)", "t", 1.5, (2, 3), None),
])
def test_layer_standardizes_the_compressed_centred_values(spec: str, variant: str, lam: float,
                                                           dims: tuple[int, ...], view: tuple | None,
                                                           units: str) -> None:
    torch.manual_seed(0)
    x = torch.randn(3, 8, 5, 5) * 4 + 2
    x[0, 0, 0, 0] = 60.0  # an outlier the compression squashes
    xv = x.reshape(view) if view else x
    ref = expected(xv, variant, lam, dims, units).reshape(x.shape)
    layer = normkit.build(spec if units == "std" else _with(spec, "units=raw"), 8)
    torch.testing.assert_close(layer(x), ref, atol=1e-5, rtol=1e-5)


def _with(spec: str, param: str) -> str:
    """`spec` with `param` added to its ib step: `bn+ib-t` -> `bn+ib-t(units=raw)`."""
    head, step = spec.split("+ib-")
    return f"{head}+ib-{step[:-1]}, {param})" if step.endswith(")") else f"{head}+ib-{step}({param})"


@pytest.mark.parametrize("spec", ["ln+ib-t", "ln+ib-l", "ln+ib-s", "bn+ib-t", "rms+ib-t", "gn(groups=2)+ib-s"])
def test_units_std_makes_the_layer_scale_invariant_and_units_raw_does_not(spec: str) -> None:
    """lambda in units of the group's scale: the layer does the same to x and to 0.1 x or 1000 x (up to
    eps, as a plain norm); with lambda in the input's units the compression depends on the activation scale."""
    torch.manual_seed(0)
    x = torch.randn(4, 8, 3, 3) * 2 + 1
    x[0, 1, 1, 1] = 30.0
    std, raw = normkit.build(spec, 8), normkit.build(_with(spec, "units=raw"), 8)
    for factor in (0.1, 1000.0):
        torch.testing.assert_close(std(x * factor), std(x), atol=1e-3, rtol=1e-3)
    assert not torch.allclose(raw(x * 100.0), raw(x), atol=1e-2)


def test_bounded_compressions_stay_below_lambda_and_the_log_does_not() -> None:
    """The abstract's "bounded compression": ib-s and ib-t never exceed lambda in magnitude whatever the
    input; ib-l's signed log grows without bound (slowly), so normkit does not call it bounded."""
    c = torch.tensor([1.0, 1e3, 1e6, 1e30], dtype=torch.float64)
    for variant in ("s", "t"):
        assert (COMPRESSIONS[variant].fn(c, 2.0).abs() <= 2.0).all()
    log = COMPRESSIONS["l"].fn(c, 2.0)
    assert log[-1] > 100.0 and (log[1:] > log[:-1]).all()


def test_bn_units_std_scales_eval_with_the_running_variance_of_the_inputs() -> None:
    torch.manual_seed(0)
    layer = normkit.build("bn+ib-t(lam=2)", 8)
    x = torch.randn(6, 8, 4, 4) * 3 + 5
    layer(x)
    n = 6 * 4 * 4
    torch.testing.assert_close(layer.ib_running_var, 0.9 + 0.1 * x.var((0, 2, 3), unbiased=False) * n / (n - 1))
    layer.eval()
    one = torch.randn(1, 8, 4, 4) * 3 + 5
    z = (one - layer.ib_running_mean.view(1, -1, 1, 1)) / (layer.ib_running_var.view(1, -1, 1, 1) + 1e-5).sqrt()
    v = COMPRESSIONS["t"].fn(z, 2.0)
    ref = (v - layer.running_mean.view(1, -1, 1, 1)) / (layer.running_var.view(1, -1, 1, 1) + 1e-5).sqrt()
    torch.testing.assert_close(layer(one), ref)


def test_units_must_be_std_or_raw() -> None:
    with pytest.raises(normkit.SpecError, match="units must be std .* or raw"):
        normkit.build("ln+ib-t(units=z)", 8)


def test_large_lam_recovers_the_plain_norm() -> None:
    x = torch.randn(3, 8, 4, 4)
    torch.testing.assert_close(normkit.build("ln+ib-t(lam=1e6)", 8)(x), normkit.build("ln", 8)(x))


def test_bn_eval_centres_with_the_running_mean_of_the_inputs() -> None:
    torch.manual_seed(0)
    layer = normkit.build("bn+ib-t(lam=2, units=raw)", 8)
    assert not hasattr(layer, "ib_running_var")
    x = torch.randn(6, 8, 4, 4) * 3 + 5
    layer(x)
    torch.testing.assert_close(layer.ib_running_mean, 0.1 * x.mean((0, 2, 3)))
    layer.eval()
    one = torch.randn(1, 8, 4, 4) * 3 + 5
    v = COMPRESSIONS["t"].fn(one - layer.ib_running_mean.view(1, -1, 1, 1), 2.0)
    ref = (v - layer.running_mean.view(1, -1, 1, 1)) / (layer.running_var.view(1, -1, 1, 1) + 1e-5).sqrt()
    torch.testing.assert_close(layer(one), ref)


def test_bn_cumulative_momentum_matches_the_running_average() -> None:
    layer = normkit.build("bn(momentum=none)+ib-s", 8)
    xs = [torch.randn(4, 8, 3, 3) + i for i in range(3)]
    for x in xs:
        layer(x)
    torch.testing.assert_close(layer.ib_running_mean, torch.stack([x.mean((0, 2, 3)) for x in xs]).mean(0))


def test_bn_without_running_stats_centres_with_the_batch_mean_in_eval() -> None:
    layer = normkit.build("bn(track_running_stats=false)+ib-t", 8).eval()
    assert not hasattr(layer, "ib_running_mean") and not hasattr(layer, "ib_running_var")
    x = torch.randn(4, 8, 3, 3) * 3 + 2
    torch.testing.assert_close(layer(x), expected(x, "t", 4.0, (0, 2, 3)), atol=1e-5, rtol=1e-5)


def test_rms_compresses_raw_values_unless_told_to_centre() -> None:
    x = torch.randn(2, 5, 16) * 3 + 4  # tokens, channels last
    layer = normkit.build("rms+ib-t(units=raw)", 16, channel_dim=-1)
    v = COMPRESSIONS["t"].fn(x, 4.0)
    torch.testing.assert_close(layer(x), v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + 1e-6))
    assert "no centring" in layer.describe()["steps"][0][1]["c"]
    centred = normkit.build("rms+ib-t(centre=true, units=raw)", 16, channel_dim=-1)
    v = COMPRESSIONS["t"].fn(x - x.mean(-1, keepdim=True), 4.0)
    torch.testing.assert_close(centred(x), v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + 1e-6))
    scaled = normkit.build("rms+ib-t", 16, channel_dim=-1)  # units=std: over the root mean square
    v = COMPRESSIONS["t"].fn(x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5), 4.0)
    torch.testing.assert_close(scaled(x), v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + 1e-6))
    assert "root mean square" in scaled.describe()["steps"][0][1]["c"]


def test_centre_false_compresses_raw_values_on_a_centring_norm() -> None:
    x = torch.randn(2, 8, 4, 4) + 3
    v = COMPRESSIONS["s"].fn(x, 3.0)
    var, mean = torch.var_mean(v, (1, 2, 3), unbiased=False, keepdim=True)
    out = normkit.build("ln+ib-s(centre=false, units=raw)", 8)(x)
    torch.testing.assert_close(out, (v - mean) / (var + 1e-5).sqrt())


@pytest.mark.parametrize("alias, spec", [(f"ibn-{v}", f"bn+ib-{v}") for v in VARIANTS]
                         + [(f"ibln-{v}", f"ln+ib-{v}") for v in VARIANTS])
def test_paper_names_are_the_compositions(alias: str, spec: str) -> None:
    x = torch.randn(4, 8, 3, 3) * 2
    assert normkit.parse(alias).expanded() == normkit.parse(spec).expanded()
    torch.testing.assert_close(normkit.build(alias, 8)(x), normkit.build(spec, 8)(x))


def test_alias_parameters_reach_the_part_that_declares_them() -> None:
    assert normkit.parse("ibn-t(lam=2,momentum=0.01)").expanded() == "bn(momentum=0.01)+ib-t(lam=2.0)"
    assert normkit.parse("ibln-l(lam=3)").expanded() == "ln+ib-l(lam=3.0)"


@pytest.mark.parametrize(("spec", "message"), [
    ("ln+ib-t(lam=0)", "lam must be a positive finite number"),
    ("bn+ib-s(lam=-1)", "lam must be a positive finite number"),
    ("ln+ib-l(lam=inf)", "parameter 'lam' must be a finite number, got inf"),
    ("ibn-t(lam=nan)", "parameter 'lam' must be a finite number, got nan"),
])
def test_lam_must_be_positive_and_finite(spec: str, message: str) -> None:
    with pytest.raises(normkit.SpecError, match=message):
        normkit.build(spec, 8)


def test_compression_table_is_replaceable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(COMPRESSIONS, "t", Compression(lambda c, lam: c.clamp(-lam, lam), 4.0, "clamp"))
    x = torch.randn(2, 8, 3, 3) * 4
    layer = normkit.build("ln+ib-t(lam=1, units=raw)", 8)
    v = (x - x.mean((1, 2, 3), keepdim=True)).clamp(-1, 1)
    var, mean = torch.var_mean(v, (1, 2, 3), unbiased=False, keepdim=True)
    torch.testing.assert_close(layer(x), (v - mean) / (var + 1e-5).sqrt())
    assert layer.describe()["steps"][0][1]["compression"] == "clamp"


def test_ib_step_is_placed_before_standardization_and_needs_a_norm() -> None:
    assert [name for name, _ in normkit.build("gn(groups=2)+ib-l", 8).describe()["steps"]] == [
        "ib-l", "standardize"]
    with pytest.raises(normkit.SpecError, match="no normalizing step"):
        normkit.build("none+ib-t", 8)


def test_gradients_stay_finite_with_huge_outliers() -> None:
    x = torch.randn(2, 8, 3, 3) * 3
    x[0, 0, 0, 0] = 1e6
    x.requires_grad_()
    layer = normkit.build("gn(groups=4)+ib-l", 8)
    layer(x).pow(2).sum().backward()
    assert torch.isfinite(x.grad).all() and torch.isfinite(layer.weight.grad).all()
