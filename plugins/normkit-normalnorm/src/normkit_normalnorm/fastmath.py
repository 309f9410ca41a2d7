"""float32 log, log1p, expm1 and cos(2 pi u) written as plain torch arithmetic that Inductor vectorizes.

Why: in the compiled CPU path (`compiled.py`) the transcendentals, not memory, set the time of a
training step: Inductor calls SLEEF's 1-ulp `log1pf8`/`expm1f8`/`logf8`/`cosf8`, and one thread
spent about 3.3, 4.8, 3.1 and 1.6 ms per 8M values on them (AMD EPYC, AVX2), more than
BatchNorm's whole forward. The forms here are the classic Cephes ones (exponent from the float's
bits, a short polynomial on the reduced argument) in integer and float tensor ops, which Inductor
turns into straight-line AVX2 code with no calls and no branches.

Accuracy (float32, checked against float64 torch in `tests/test_fastmath.py`): within 2.5e-7
relative for log and log1p, 2.5e-7 relative for expm1, 3e-7 absolute for cos_2pi; the same order as
torch's own float32 functions (1-2 ulp). Special values: log1p(inf) = inf, expm1 overflows to inf
above 88.72 and saturates at -1, NaN stays NaN. Only float32: callers keep torch's functions for
float64 (whose tests compare at 1e-10).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

_LN2_HI = 0.693359375  # ln 2 split so that k * _LN2_HI is exact for the exponents that occur
_LN2_LO = -2.12194440e-4
_SQRT_HALF = 0.707106781186547524
_SQRT_2 = 1.41421356237309505
_LOG_POLY = (7.0376836292e-2, -1.1514610310e-1, 1.1676998740e-1, -1.2420140846e-1, 1.4249322787e-1,
             -1.6668057665e-1, 2.0000714765e-1, -2.4999993993e-1, 3.3333331174e-1)  # Cephes logf
_EXPM1_POLY = tuple(1 / math.factorial(k) for k in range(8, 1, -1))  # 1/8! ... 1/2!
_EXP_MAX = 88.72283935546875  # above: expm1 overflows to inf in float32
_SIN_POLY = tuple((-1) ** k / math.factorial(2 * k + 1) for k in range(5, 0, -1))  # -1/11! ... -1/3!


def _horner(x: Tensor, coefficients: tuple[float, ...]) -> Tensor:
    result = x * coefficients[0] + coefficients[1]
    for c in coefficients[2:]:
        result = result * x + c
    return result


def _log_parts(u: Tensor) -> tuple[Tensor, Tensor]:
    """(f, e) with u = (1 + f) 2^e, f in [sqrt(1/2) - 1, sqrt 2 - 1) exactly, e a float32 integer."""
    bits = u.view(torch.int32)
    exponent = ((bits >> 23) & 0xFF) - 126  # u = m 2^exponent with m in [0.5, 1)
    m = ((bits & 0x7FFFFF) | 0x3F000000).view(torch.float32)
    small = m < _SQRT_HALF
    f = torch.where(small, m + m, m) - 1.0
    return f, (exponent - small.to(torch.int32)).to(torch.float32)


def _log_of_parts(f: Tensor, e: Tensor) -> Tensor:
    """log((1 + f) 2^e) (Cephes logf): f - f^2/2 + f^3 P(f) + e ln 2, ln 2 in two parts."""
    z = f * f
    y = _horner(f, _LOG_POLY) * f * z + e * _LN2_LO - 0.5 * z
    return f + y + e * _LN2_HI


def log(u: Tensor) -> Tensor:
    """Natural log of positive finite normal float32 values."""
    return _log_of_parts(*_log_parts(u))


def log1p(a: Tensor) -> Tensor:
    """log(1 + a) for float32 a >= 0, without a division.

    Below sqrt 2 - 1 the polynomial takes a itself (f = a, e = 0: no rounding of 1 + a at all);
    above, log(1 + a) of the rounded 1 + a, whose rounding error (at most 2^-24 relative) is then
    below 1.7e-7 of the result, since log1p(a) >= 0.34. inf gives inf and NaN gives NaN.
    """
    u = a + 1.0
    f, e = _log_parts(u)
    small = a < _SQRT_2 - 1.0
    result = _log_of_parts(torch.where(small, a, f), torch.where(small, 0.0, e))
    return torch.where(u < math.inf, result, u)


def expm1(t: Tensor) -> Tensor:
    """exp(t) - 1 in float32: t = k ln 2 + r with |r| <= ln 2 / 2, expm1(r) by its Taylor polynomial,
    then 2^k expm1(r) + (2^k - 1) (exact at k = 0, so no cancellation for small t)."""
    clamped = t.clamp(-87.0, _EXP_MAX)
    k = torch.round(clamped * (1 / math.log(2))).clamp(max=127.0)  # 2^128 is not a float32 (|r| then < ln 2)
    r = (clamped - k * _LN2_HI) - k * _LN2_LO
    p = r + r * r * _horner(r, _EXPM1_POLY)  # r + r^2/2! + ... + r^8/8!
    scale = ((k.to(torch.int32) + 127) << 23).view(torch.float32)  # 2^k
    result = scale * p + (scale - 1.0)
    return torch.where(t > _EXP_MAX, math.inf, result)


def cos_2pi(u: Tensor) -> Tensor:
    """cos(2 pi u) for u in [0, 1]: sin(2 pi v) with v = |u - 1/2| - 1/4 in [-1/4, 1/4], odd polynomial."""
    w = ((u - 0.5).abs() - 0.25) * (2 * math.pi)
    w2 = w * w
    return (_horner(w2, _SIN_POLY) * w2 + 1.0) * w
