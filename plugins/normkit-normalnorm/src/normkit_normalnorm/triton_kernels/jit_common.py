"""Triton device helpers shared by the row and split kernels: addressing, math, Newton terms.

Only `tl.log`, `tl.exp` and `tl.sqrt` are used (no libdevice), so every kernel also runs under
`TRITON_INTERPRET=1`. log1p and expm1 use the Goldberg/Kahan corrections (relative error about
1e-7 in float32); arguments of `exp` are clamped so no intermediate overflows.
"""

from __future__ import annotations

import triton
import triton.language as tl

# Partition codes (constexpr PART) and statistics columns are defined in `geometry.py`.


@triton.jit
def element(gid, r, t, C, S, G, CG, sn, sc, ss, PART: tl.constexpr):
    """Memory offset, channel and logical (n, c, s) index of element (r, t) of group `gid`."""
    if PART == 0:
        n = r
        c = gid + 0 * r
        s = t
    elif PART == 1:
        n = gid
        c = r
        s = t
    elif PART == 2:
        n = gid // G
        c = (gid % G) * CG + r
        s = t
    else:
        n = gid // S
        c = r
        s = gid % S + t
    offset = n * sn + c * sc + s * ss
    logical = (n * C + c) * S + s
    return offset, c, logical


@triton.jit
def log1p_pos(a):
    """log1p(a) for a >= 0 (Goldberg's correction: exact where 1 + a rounds)."""
    u = 1.0 + a
    du = u - 1.0
    safe = tl.where(du == 0.0, 1.0, du)
    return tl.where(du == 0.0, a, tl.log(u) * (a / safe))


@triton.jit
def exprel(t):
    """expm1(t) / t (1 at t = 0), via Kahan's expm1 correction; t clamped to [-80, 80]."""
    t = tl.minimum(tl.maximum(t, -80.0), 80.0)
    e = tl.exp(t)
    em1 = e - 1.0
    log_e = tl.log(e)
    safe_log = tl.where(em1 == 0.0, 1.0, log_e)
    safe_t = tl.where(t == 0.0, 1.0, t)
    kahan = em1 / safe_log  # = expm1(t) / t
    return tl.where(em1 == 0.0, 1.0, tl.where(em1 == -1.0, -1.0 / safe_t, kahan))


@triton.jit
def dpsi_dlam_kernel(t):
    """f(t) = (t e^t - expm1(t)) / t^2, so dpsi/dlambda = log1p(|h|)^2 f(mu log1p|h|).

    The direct form cancels near t = 0; below |t| = 0.5 the Taylor series (k+1) t^k / (k+2)!
    up to k = 7 is used (truncation < 1e-8 relative).
    """
    t = tl.minimum(tl.maximum(t, -80.0), 80.0)
    series = 0.5 + t * (1.0 / 3.0 + t * (1.0 / 8.0 + t * (1.0 / 30.0 + t * (1.0 / 144.0 + t * (
        1.0 / 840.0 + t * (1.0 / 5760.0 + t * (1.0 / 45360.0)))))))
    safe_t = tl.where(tl.abs(t) < 0.5, 1.0, t)
    em1 = exprel(safe_t) * safe_t
    direct = (safe_t * (em1 + 1.0) - em1) / (safe_t * safe_t)
    return tl.where(tl.abs(t) < 0.5, series, direct)


@triton.jit
def yeo_johnson(h, lam):
    """(psi(h; lam), dpsi/dh, dpsi/dlam) in the uniform form psi = sgn * A * exprel(mu * A).

    A = log1p(|h|), mu = lam for h >= 0 and 2 - lam for h < 0.
    """
    a = tl.abs(h)
    log_a = log1p_pos(a)
    sg = tl.where(h >= 0.0, 1.0, -1.0)
    mu = tl.where(h >= 0.0, lam, 2.0 - lam)
    t = mu * log_a
    psi = sg * log_a * exprel(t)
    psi_h = tl.exp(tl.minimum((mu - 1.0) * log_a, 80.0))
    psi_lam = log_a * log_a * dpsi_dlam_kernel(t)
    return psi, psi_h, psi_lam


@triton.jit
def newton_terms(h):
    """Per-element pieces of the Newton step at lambda = 1 (see notes/normality-normalization.md).

    Returns sgn, |h|, L = log1p|h|, d = (1+a)L - a and e = (1+a)L^2 - 2d (so d2 = sgn * e).
    """
    a = tl.abs(h)
    log_a = log1p_pos(a)
    sg = tl.where(h >= 0.0, 1.0, -1.0)
    d = (1.0 + a) * log_a - a
    e = (1.0 + a) * log_a * log_a - 2.0 * d
    return sg, a, log_a, d, e


@triton.jit
def lambda_from_sums(sum_sl, sum_hd, sum_ae, mean_d, m2_d, count, alpha, sqrt_eps, lmin, lmax,
                     CLAMP_MIN: tl.constexpr, CLAMP_MAX: tl.constexpr, DETACH: tl.constexpr):
    """lambda_hat and the coefficients of d(lambda)/d(h_i) used by the backward.

    d lambda / d h_i = cD (d + a L) + cE sgn (e + a L^2 + 2 (d - mean d) L) + cS / (1 + a).
    The coefficients are zero when lambda is detached or clamped (as torch's clamp gradient).
    """
    s1 = sum_sl / count
    dvar = 2.0 * sum_hd / count
    d2var = 2.0 * (sum_ae + m2_d) / count
    g1 = 0.5 * dvar - s1
    g2 = -0.5 * dvar * dvar + 0.5 * d2var
    den = g2 + sqrt_eps
    raw = 1.0 - alpha * g1 / den
    lam = raw
    live = 1.0
    if CLAMP_MIN:
        live = tl.where(raw < lmin, 0.0, live)
        lam = tl.maximum(lam, lmin)
    if CLAMP_MAX:
        live = tl.where(raw > lmax, 0.0, live)
        lam = tl.minimum(lam, lmax)
    if DETACH:
        live = 0.0
    k1 = -alpha / den * live  # d lambda / d g1
    k2 = alpha * g1 / (den * den) * live  # d lambda / d g2
    coef_d = (0.5 * k1 - dvar * k2) * 2.0 / count
    coef_e = k2 / count
    coef_s = -k1 / count
    return lam, mean_d, coef_d, coef_e, coef_s


@triton.jit
def lambda_grad_direction(sg, a, log_a, d, e, mean_d, coef_d, coef_e, coef_s):
    """d lambda / d h_i for every element (see `lambda_from_sums`)."""
    return (coef_d * (d + a * log_a)
            + coef_e * sg * (e + a * log_a * log_a + 2.0 * (d - mean_d) * log_a)
            + coef_s / (1.0 + a))


@triton.jit
def _lerp(start, end, weight):
    """torch.lerp's formula (exact at weight 1)."""
    return tl.where(weight < 0.5, start + weight * (end - start), end - (end - start) * (1.0 - weight))


@triton.jit
def update_running(mean_ptr, var_ptr, lam_ptr, c, mean, unbiased_var, lam, momentum):
    """EMA of channel c's running buffers (float32), as `functional.update_running` does."""
    tl.store(mean_ptr + c, _lerp(tl.load(mean_ptr + c), mean, momentum))
    tl.store(var_ptr + c, _lerp(tl.load(var_ptr + c), unbiased_var, momentum))
    tl.store(lam_ptr + c, _lerp(tl.load(lam_ptr + c), lam, momentum))


@triton.jit
def affine_store(y_ptr, offset, x, w_ptr, b_ptr, c, mask, HAS_W: tl.constexpr, HAS_B: tl.constexpr):
    """Apply the per-channel affine to x (float32) and store it in y's dtype."""
    if HAS_W:
        x = x * tl.load(w_ptr + c, mask=mask, other=1.0).to(tl.float32)
    if HAS_B:
        x = x + tl.load(b_ptr + c, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + offset, x.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def store_stats(row, mean, rstd, lam, scale, mean_d, coef_d, coef_e, coef_s, var):
    """A group's forward table for backward: the layout every backward kernel reads (NSTAT = 9)."""
    tl.store(row + 0, mean)
    tl.store(row + 1, rstd)
    tl.store(row + 2, lam)
    tl.store(row + 3, scale)
    tl.store(row + 4, mean_d)
    tl.store(row + 5, coef_d)
    tl.store(row + 6, coef_e)
    tl.store(row + 7, coef_s)
    tl.store(row + 8, var)
