"""Triton device helpers shared by the row and split kernels: addressing, math, noise, Newton terms.

One algebra runs on the GPU and on the interpreter (`TRITON_INTERPRET=1`, which cannot run libdevice):
log1p and expm1 are written with base-2 primitives, and only those primitives differ, behind the
constexpr `GPU_MATH`: on a GPU the special-function unit's approximations (MUFU lg2, ex2, sin, cos:
libdevice's `fast_*`), on the interpreter `tl.log2`/`tl.exp2`/`tl.sin`/`tl.cos`. Per element there is
one log1p and one expm1, from which psi, dpsi/dh and dpsi/dlambda all follow, and no division except
one reciprocal 1/(1 + |h|) in the backward (the other reciprocals are per group). Arguments of the
exponential are clamped so no intermediate overflows.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra import libdevice

GPU_MATH = tl.constexpr(not triton.knobs.runtime.interpret)  # decided when the kernels are decorated
PHILOX_ROUNDS = tl.constexpr(7)  # Philox-4x32-7 passes BigCrush (Salmon et al., Random123)

# Partition codes (constexpr PART) and statistics columns are defined in `geometry.py`.


@triton.jit
def element(gid, r, t, C, S, G, CG, sn, sc, ss, PART: tl.constexpr):
    """Memory offset and channel of element (row r, column t) of group `gid` (32-bit offsets).

    With PART == 0 (batch) the channel is the group itself, a scalar: load per-channel values with
    `channel_value`, which then reads them once per program."""
    if PART == 0:
        c = gid
        offset = gid * sc + r * sn + t * ss
    elif PART == 1:
        c = r
        offset = gid * sn + r * sc + t * ss
    elif PART == 2:
        c = (gid % G) * CG + r
        offset = (gid // G) * sn + c * sc + t * ss
    else:
        c = r
        offset = (gid // S) * sn + (gid % S) * ss + r * sc
    return offset, c


@triton.jit
def channel_value(ptr, c, mask, other, PART: tl.constexpr):
    """Per-channel parameter as float32: one scalar load on batch partitions, else one per element."""
    if PART == 0:
        value = tl.load(ptr + c)
    else:
        value = tl.load(ptr + c, mask=mask, other=other)
    return value.to(tl.float32)


@triton.jit
def _log2(x):
    if GPU_MATH:
        y = libdevice.fast_log2f(x)  # MUFU.LG2: absolute error about 2^-22
    else:
        y = tl.log2(x)
    return y


@triton.jit
def log1p_pos(a):
    """log1p(a) for a >= 0 as ln 2 * log2(1 + a): absolute error about 1e-7 (the rounding of 1 + a and
    lg2's), which is what every use needs (the transform, its derivatives and the Newton sums are all
    accurate to that absolute error; none divides by log1p)."""
    return 0.6931471805599453 * _log2(1.0 + a)


@triton.jit
def expm1(t):
    """expm1(t): 2^(t log2 e) - 1 for |t| >= 0.5, the Taylor series to t^7 below (relative error below
    3e-7 on both sides, so psi = expm1(mu L) / mu stays accurate for mu near 0)."""
    small = t * (1.0 + t * (1.0 / 2.0 + t * (1.0 / 6.0 + t * (1.0 / 24.0 + t * (1.0 / 120.0 + t * (
        1.0 / 720.0 + t * (1.0 / 5040.0)))))))
    return tl.where(tl.abs(t) < 0.5, small, tl.exp2(t * 1.4426950408889634) - 1.0)


@triton.jit
def group_inverses(lam):
    """1/lambda and 1/(2 - lambda) for a group (0 where mu == 0, which `transform` handles)."""
    inv_pos = tl.where(lam == 0.0, 0.0, 1.0 / tl.where(lam == 0.0, 1.0, lam))
    inv_neg = tl.where(lam == 2.0, 0.0, 1.0 / tl.where(lam == 2.0, 1.0, 2.0 - lam))
    return inv_pos, inv_neg


@triton.jit
def transform(h, log_a, lam, inv_pos, inv_neg):
    """psi(h; lam) and its shared pieces (t = mu L, E = expm1(t), 1/mu), given L = log1p|h|.

    psi = sgn E / mu with mu = lam for h >= 0 and 2 - lam for h < 0 (the Yeo-Johnson transform).
    """
    pos = h >= 0.0
    mu = tl.where(pos, lam, 2.0 - lam)
    inv_mu = tl.where(pos, inv_pos, inv_neg)
    t = tl.minimum(tl.maximum(mu * log_a, -80.0), 80.0)
    em1 = expm1(t)
    mag = tl.where(mu == 0.0, log_a, em1 * inv_mu)
    return tl.where(pos, mag, -mag), t, em1, inv_mu


@triton.jit
def transform_grads(a, log_a, t, em1, inv_mu):
    """(1/(1 + |h|), dpsi/dh, dpsi/dlambda) from `transform`'s pieces, sharing its expm1.

    dpsi/dh = (1 + E) / (1 + |h|). dpsi/dlambda = (L (1 + E) - E / mu) / mu, which cancels near
    t = 0: below |t| = 0.5 it is L^2 times the Taylor series of (t e^t - expm1 t) / t^2,
    sum (k+1) t^k / (k+2)! up to k = 7 (truncation < 1e-8 relative).
    """
    inv_1pa = 1.0 / (1.0 + a)
    grow = 1.0 + em1
    psi_h = grow * inv_1pa
    series = 0.5 + t * (1.0 / 3.0 + t * (1.0 / 8.0 + t * (1.0 / 30.0 + t * (1.0 / 144.0 + t * (
        1.0 / 840.0 + t * (1.0 / 5760.0 + t * (1.0 / 45360.0)))))))
    direct = (log_a * grow - em1 * inv_mu) * inv_mu
    psi_lam = tl.where(tl.abs(t) < 0.5, log_a * log_a * series, direct)
    return inv_1pa, psi_h, psi_lam


@triton.jit
def newton_terms(a, log_a):
    """Per-element pieces of the Newton step at lambda = 1 (see notes/normality-normalization.md):
    d = (1+a)L - a (as L + aL - a, without rounding 1 + a) and e = (1+a)L^2 - 2d (so d2 = sgn * e)."""
    p = log_a + a * log_a
    d = p - a
    e = p * log_a - 2.0 * d
    return d, e


@triton.jit
def _uniform(bits):
    """A uint32 to a float32 in (0, 1): (top 24 bits + 0.5) / 2^24, never 0 (log stays finite)."""
    return ((bits >> 8).to(tl.float32) + 0.5) * (1.0 / 16777216.0)


@triton.jit
def box_muller(bits_r, bits_a):
    """Two standard normals from two uint32s: radius sqrt(-2 ln u1), angle 2 pi u2 - pi; on a GPU on
    the special-function unit (MUFU lg2, sin, cos; about 1e-6 absolute error)."""
    u1 = _uniform(bits_r)
    angle = _uniform(bits_a) * 6.283185307179586 - 3.141592653589793
    radius = tl.sqrt(-1.3862943611198906 * _log2(u1))  # sqrt(-2 ln u1)
    if GPU_MATH:
        cos, sin = libdevice.fast_cosf(angle), libdevice.fast_sinf(angle)
    else:
        cos, sin = tl.cos(angle), tl.sin(angle)
    return radius * cos, radius * sin


@triton.jit
def noise_block(seed, gid, M, BLOCK: tl.constexpr):
    """Standard normals for in-group indices j = 0..BLOCK-1 of group `gid` of M values.

    Element j draws lane j % 4 of Philox-4x32 at counter gid * ceil(M/4) + j // 4, so one Philox
    call serves four neighbouring values (all four outputs used) and the noise depends on the
    partition and shape, not on the memory layout or the path (row, split) that computes it."""
    if BLOCK >= 4:
        r0, r1, r2, r3 = tl.randint4x(seed, gid * ((M + 3) // 4) + tl.arange(0, BLOCK // 4), PHILOX_ROUNDS)
        z0, z1 = box_muller(r0, r1)
        z2, z3 = box_muller(r2, r3)
        z = tl.reshape(tl.join(tl.join(z0, z2), tl.join(z1, z3)), [BLOCK])  # j = 4q + lane
    else:
        z = noise_at(seed, gid, M, tl.arange(0, BLOCK))
    return z


@triton.jit
def noise_at(seed, gid, M, j):
    """The standard normal of in-group index j (any shape), the same numbers `noise_block` gives."""
    r0, r1, r2, r3 = tl.randint4x(seed, gid * ((M + 3) // 4) + j // 4, PHILOX_ROUNDS)
    lane = j % 4
    first = lane < 2
    zc, zs = box_muller(tl.where(first, r0, r2), tl.where(first, r1, r3))
    return tl.where(lane % 2 == 0, zc, zs)


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
    inv_count = 1.0 / count
    coef_d = (0.5 * k1 - dvar * k2) * 2.0 * inv_count
    coef_e = k2 * inv_count
    coef_s = -k1 * inv_count
    return lam, mean_d, coef_d, coef_e, coef_s


@triton.jit
def lambda_grad_direction(h, a, log_a, inv_1pa, mean_d, coef_d, coef_e, coef_s):
    """d lambda / d h_i for every element (see `lambda_from_sums`); inv_1pa = 1 / (1 + |h|)."""
    d, e = newton_terms(a, log_a)
    curv = e + a * log_a * log_a + 2.0 * (d - mean_d) * log_a
    return coef_d * (d + a * log_a) + coef_e * tl.where(h >= 0.0, curv, -curv) + coef_s * inv_1pa


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
def affine_store(y_ptr, offset, x, w_ptr, b_ptr, c, mask, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
                 PART: tl.constexpr):
    """Apply the per-channel affine to x (float32) and store it in y's dtype."""
    if HAS_W:
        x = x * channel_value(w_ptr, c, mask, 1.0, PART)
    if HAS_B:
        x = x + channel_value(b_ptr, c, mask, 0.0, PART)
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


@triton.jit
def sum_slots(src_ptr, first, last, slot_stride, dst_ptr, n_out, PV, CB: tl.constexpr, PB: tl.constexpr):
    """dst[i] = sum over slots s in [first, last) and p < PV of src[s * slot_stride + i * PV + p], i < n_out,
    CB outputs at a time. Every output is summed in the same order whichever program runs this and
    whenever, so weight/bias gradients finished with it are deterministic (no float atomics)."""
    for i0 in range(0, n_out, CB):
        i = i0 + tl.arange(0, CB)
        acc = tl.zeros([CB, PB], tl.float32)
        for s in range(first, last):
            for p0 in range(0, PV, PB):
                p = p0 + tl.arange(0, PB)
                acc += tl.load(src_ptr + s * slot_stride + i[:, None] * PV + p[None, :],
                               mask=(i[:, None] < n_out) & (p[None, :] < PV), other=0.0, cache_modifier=".cg")
        tl.store(dst_ptr + i, tl.sum(acc, axis=1), mask=i < n_out)


@triton.jit
def channel_sum(src_ptr, c, n_slots, C, PV, SB: tl.constexpr, PB: tl.constexpr):
    """sum over slots s < n_slots and p < PV of src[(s * C + c) * PV + p]: one channel's total of a
    (slots, C, PV) partial array, SB slots x PB values at a time, in a fixed order."""
    acc = tl.zeros([SB, PB], tl.float32)
    for s0 in range(0, n_slots, SB):
        s = s0 + tl.arange(0, SB)
        for p0 in range(0, PV, PB):
            p = p0 + tl.arange(0, PB)
            acc += tl.load(src_ptr + (s[:, None] * C + c) * PV + p[None, :],
                           mask=(s[:, None] < n_slots) & (p[None, :] < PV), other=0.0)
    return tl.sum(tl.sum(acc, axis=1), axis=0)
