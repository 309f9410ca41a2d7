"""`fastmath`: the float32 log, log1p, expm1 and cos(2 pi u) of the compiled CPU path, against
torch's float64 functions over their whole useful range, their special values, and the same
functions compiled (Inductor contracts a * b + c into FMAs there, which must not hurt accuracy)."""

from __future__ import annotations

import math

import pytest
import torch

from normkit_normalnorm import fastmath


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float(((got.double() - want) / want.abs().clamp_min(1e-300)).abs().max())


def log1p_inputs() -> torch.Tensor:
    a = torch.cat([torch.logspace(-30, 30, 100001, dtype=torch.float64), torch.linspace(0, 50, 100001,
                                                                                         dtype=torch.float64)])
    return a.float()


def expm1_inputs() -> torch.Tensor:
    return torch.cat([torch.linspace(-90, 88.7, 200001), torch.logspace(-30, 1, 5000), -torch.logspace(-30, 1, 5000)])


FUNCTIONS = {  # name: (ours, float64 reference, float32 inputs, bound)
    "log1p": (fastmath.log1p, torch.log1p, log1p_inputs, 2.5e-7),
    "log": (fastmath.log, torch.log, lambda: torch.logspace(-37, 38, 200001, dtype=torch.float64).float(), 2.5e-7),
    "expm1": (fastmath.expm1, torch.expm1, expm1_inputs, 2.5e-7),
}


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_relative_error_is_that_of_float32(name):
    ours, reference, inputs, bound = FUNCTIONS[name]
    x = inputs()
    want = reference(x.double())
    assert relative_error(ours(x), want) < bound
    assert relative_error(reference(x), want) < bound  # torch's own float32 function, for scale


def test_cos_2pi_absolute_error():
    u = torch.cat([torch.rand(200000, generator=torch.Generator().manual_seed(0)), torch.tensor([0.0, 0.25, 0.5, 1.0])])
    assert float((fastmath.cos_2pi(u).double() - torch.cos(2 * math.pi * u.double())).abs().max()) < 3e-7


def test_special_values():
    inf, nan = math.inf, math.nan
    assert torch.equal(fastmath.log1p(torch.tensor([0.0, inf])), torch.tensor([0.0, inf]))
    assert fastmath.log1p(torch.tensor([nan])).isnan().all()
    got = fastmath.expm1(torch.tensor([0.0, 89.0, 1000.0, -100.0, -1000.0]))
    assert torch.equal(got, torch.tensor([0.0, inf, inf, -1.0, -1.0]))
    assert fastmath.expm1(torch.tensor([nan])).isnan().all()
    assert math.isfinite(float(fastmath.expm1(torch.tensor(88.7))))  # below float32's overflow


@pytest.mark.slow  # compiles three small functions: ~20 s on 2 cores
def test_compiled_with_contracted_multiply_adds():
    from normkit_normalnorm.compiled import OPTIONS

    for name, (ours, reference, inputs, bound) in FUNCTIONS.items():
        x = inputs()
        compiled = torch.compile(ours, options=dict(OPTIONS), dynamic=False)
        assert relative_error(compiled(x), reference(x.double())) < bound, name
