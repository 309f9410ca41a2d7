"""The math of normality normalization against scipy and an independent float64 implementation."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.stats
import torch

from normkit_normalnorm.yeojohnson import newton_lambda, yeo_johnson

LAMBDAS = [-2.0, -1.0, -0.3, 0.0, 1e-7, 0.4, 1.0, 1.6, 2.0 - 1e-7, 2.0, 2.5, 3.0]


def numpy_lambda(h: np.ndarray, alpha: float = 1.0, eps: float = 1e-5) -> float:
    """lambda_hat for one standardized group, written from the notes in float64 numpy."""
    a = np.abs(h)
    log1p_a = np.log1p(a)
    sign = np.where(h >= 0, 1.0, -1.0)
    d = (1 + a) * log1p_a - a
    d2 = sign * ((1 + a) * log1p_a**2 - 2 * d)
    s1 = np.mean(sign * log1p_a)
    dvar = 2 * np.mean(h * d)
    d2var = 2 * np.mean(h * d2 + (d - d.mean()) ** 2)
    g1 = 0.5 * dvar - s1
    g2 = -0.5 * dvar**2 + 0.5 * d2var
    return 1 - alpha * g1 / (g2 + np.sqrt(eps))


def standardized(u: np.ndarray) -> np.ndarray:
    return (u - u.mean()) / np.sqrt(u.var() + 1e-5)


@pytest.mark.parametrize("lam", LAMBDAS)
def test_transform_matches_scipy(lam: float) -> None:
    h = np.concatenate([np.linspace(-6, 6, 401), [0.0, 1e-9, -1e-9, 40.0, -40.0]])
    want = scipy.stats.yeojohnson(h, lmbda=lam)
    got64 = yeo_johnson(torch.tensor(h), lam).numpy()
    np.testing.assert_allclose(got64, want, rtol=1e-6, atol=1e-12)
    got32 = yeo_johnson(torch.tensor(h, dtype=torch.float32), lam).double().numpy()
    np.testing.assert_allclose(got32, want, rtol=2e-5, atol=1e-6)


def test_lambda_one_is_the_identity() -> None:
    h = torch.linspace(-5, 5, 101, dtype=torch.float64)
    torch.testing.assert_close(yeo_johnson(h, 1.0), h, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("lam", [0.0, 0.5, 1.0, 2.0, 2.7])
def test_transform_gradients_finite_and_one_at_zero(lam: float) -> None:
    h = torch.tensor([-3.0, -1e-3, 0.0, 1e-3, 3.0], dtype=torch.float64, requires_grad=True)
    (grad,) = torch.autograd.grad(yeo_johnson(h, lam).sum(), h)
    assert torch.isfinite(grad).all()
    assert grad[2].item() == pytest.approx(1.0)  # dpsi/dh = (1 + |h|)^(mu - 1) = 1 at h = 0
    want = (1 + h.detach().abs()) ** (torch.where(h >= 0, lam, 2 - lam) - 1)
    torch.testing.assert_close(grad, want)


def test_check_values_of_d_and_d2() -> None:
    """d = dpsi/dlambda and d2 = d2psi/dlambda2 at lambda = 1 (the notes' check values)."""
    h = torch.tensor([-3.0, -1.0, -0.3], dtype=torch.float64)
    lam = torch.tensor(1.0, dtype=torch.float64, requires_grad=True)
    d_list, d2_list = [], []
    for value in h:
        (d,) = torch.autograd.grad(yeo_johnson(value, lam), lam, create_graph=True)
        (d2,) = torch.autograd.grad(d, lam)
        d_list.append(d.item())
        d2_list.append(d2.item())
    np.testing.assert_allclose(d_list, [2.54518, 0.38629, 0.04107], atol=1e-5)
    np.testing.assert_allclose(d2_list, [-2.59689, -0.18832, -0.00734], atol=1e-5)
    a = np.abs(h.numpy())
    closed_d = (1 + a) * np.log1p(a) - a
    np.testing.assert_allclose(closed_d, d_list, rtol=1e-10)
    np.testing.assert_allclose(-((1 + a) * np.log1p(a) ** 2 - 2 * closed_d), d2_list, rtol=1e-10)


@pytest.mark.parametrize("seed", range(4))
def test_newton_lambda_matches_independent_implementation(seed: int) -> None:
    rng = np.random.default_rng(seed)
    groups = [standardized(rng.gamma(shape, size=n) * rng.choice([-1, 1]))
              for shape, n in ((0.5, 7), (2.0, 64), (5.0, 301), (1.0, 2))]
    for alpha, eps in ((1.0, 1e-5), (0.5, 1e-3)):
        for h in groups:
            got = newton_lambda(torch.tensor(h).view(1, -1), (1,), alpha, eps).item()
            assert got == pytest.approx(numpy_lambda(h, alpha, eps), rel=1e-10, abs=1e-10)


def test_lambda_symmetry() -> None:
    rng = np.random.default_rng(3)
    h = torch.tensor(standardized(rng.gamma(1.5, size=(5, 40))), dtype=torch.float64)
    lam = newton_lambda(h, (1,))
    torch.testing.assert_close(newton_lambda(-h, (1,)), 2 - lam, rtol=0, atol=1e-12)
    assert (lam - 1).abs().min() > 0.05  # skewed groups: the check is not trivially lambda = 1


def test_lambda_close_to_scipy_normmax_on_mildly_skewed_data() -> None:
    rng = np.random.default_rng(0)
    for sign in (1, -1):
        h = standardized(sign * np.exp(0.2 * rng.standard_normal(4000)))
        got = newton_lambda(torch.tensor(h).view(1, -1), (1,)).item()
        assert got == pytest.approx(scipy.stats.yeojohnson_normmax(h), abs=0.03)
        assert abs(got - 1) > 0.2


def test_constant_group_gives_lambda_one_without_nan() -> None:
    h = torch.zeros(3, 10, dtype=torch.float64, requires_grad=True)
    lam = newton_lambda(h, (1,))
    torch.testing.assert_close(lam, torch.ones(3, 1, dtype=torch.float64))
    (grad,) = torch.autograd.grad(yeo_johnson(h, lam).sum() + lam.sum(), h)
    assert torch.isfinite(grad).all()
