"""Row-style kernels: one program owns a whole normalization group, held in registers.

Forward reads each element once and writes it once; every dependent reduction (moments, the
Newton sums, mean(x), mean|x - mean x|) happens on chip. Backward (one launch) reads x and dy once
and writes dx once; each program loops over several groups of one channel class and accumulates
the weight/bias gradients per element in registers, then writes one partial row (no atomics, so
the result is deterministic).
"""

from __future__ import annotations

import triton
import triton.language as tl

from normkit_normalnorm.triton_kernels.jit_common import (
    affine_store,
    element,
    lambda_from_sums,
    lambda_grad_direction,
    newton_terms,
    store_stats,
    update_running,
    yeo_johnson,
)


@triton.jit
def row_forward(x_ptr, y_ptr, w_ptr, b_ptr, stats_ptr, run_mean_ptr, run_var_ptr, run_lam_ptr,
                C, S, G, CG, T, M, sn, sc, ss,
                eps, sqrt_eps, alpha, noise, lmin, lmax, momentum, unbias, seed_ptr,
                PART: tl.constexpr, BLOCK: tl.constexpr, NSTAT: tl.constexpr,
                HAS_W: tl.constexpr, HAS_B: tl.constexpr, NOISE: tl.constexpr,
                CLAMP_MIN: tl.constexpr, CLAMP_MAX: tl.constexpr, DETACH: tl.constexpr,
                UPDATE: tl.constexpr):
    gid = tl.program_id(0)
    j = tl.arange(0, BLOCK)
    mask = j < M
    offset, c, logical = element(gid, j // T, j % T, C, S, G, CG, sn, sc, ss, PART)
    u = tl.load(x_ptr + offset, mask=mask, other=0.0).to(tl.float32)
    first, _, _ = element(gid, 0, 0, C, S, G, CG, sn, sc, ss, PART)
    shift = tl.load(x_ptr + first).to(tl.float32)  # statistics of u - u[0]: a constant group gives h == 0
    shifted = tl.where(mask, u - shift, 0.0)
    mean_shifted = tl.sum(shifted, axis=0) / M
    centered = tl.where(mask, shifted - mean_shifted, 0.0)
    mean = shift + mean_shifted
    var = tl.sum(centered * centered, axis=0) / M
    rstd = 1.0 / tl.sqrt(var + eps)
    h = centered * rstd
    sg, a, log_a, d, e = newton_terms(h)
    mean_d = tl.sum(d, axis=0) / M
    dev_d = tl.where(mask, d - mean_d, 0.0)
    lam, mean_d, coef_d, coef_e, coef_s = lambda_from_sums(
        tl.sum(sg * log_a, axis=0), tl.sum(h * d, axis=0), tl.sum(a * e, axis=0), mean_d,
        tl.sum(dev_d * dev_d, axis=0), M * 1.0, alpha, sqrt_eps, lmin, lmax,
        CLAMP_MIN, CLAMP_MAX, DETACH)
    x, _, _ = yeo_johnson(h, lam)
    scale = 0.0
    if NOISE:
        x_mean = tl.sum(tl.where(mask, x, 0.0), axis=0) / M
        scale = tl.sum(tl.where(mask, tl.abs(x - x_mean), 0.0), axis=0) / M
        x = x + (noise * scale) * tl.randn(tl.load(seed_ptr), logical)
    affine_store(y_ptr, offset, x, w_ptr, b_ptr, c, mask, HAS_W, HAS_B)
    store_stats(stats_ptr + gid * NSTAT, mean, rstd, lam, scale, mean_d, coef_d, coef_e, coef_s, var)
    if UPDATE:
        update_running(run_mean_ptr, run_var_ptr, run_lam_ptr, gid, mean, var * unbias, lam, momentum)


@triton.jit
def row_backward(x_ptr, dy_ptr, dx_ptr, w_ptr, stats_ptr, dw_part_ptr, db_part_ptr,
                 C, S, G, CG, T, M, K, per_split, n_per_class, sn, sc, ss, noise, seed_ptr,
                 PART: tl.constexpr, BLOCK: tl.constexpr, NSTAT: tl.constexpr,
                 HAS_W: tl.constexpr, HAS_B: tl.constexpr, USE_RUNNING: tl.constexpr,
                 NOISE: tl.constexpr, LAMBDA_GRAD: tl.constexpr):
    """Program (k, split) handles groups gid = i*K + k for i in its split; all share channels."""
    k = tl.program_id(0)
    split = tl.program_id(1)
    j = tl.arange(0, BLOCK)
    mask = j < M
    acc_w = tl.zeros([BLOCK], tl.float32)
    acc_b = tl.zeros([BLOCK], tl.float32)
    i_end = tl.minimum(split * per_split + per_split, n_per_class)
    for i in range(split * per_split, i_end):
        gid = i * K + k
        offset, c, logical = element(gid, j // T, j % T, C, S, G, CG, sn, sc, ss, PART)
        row = stats_ptr + gid * NSTAT
        mean = tl.load(row + 0)
        rstd = tl.load(row + 1)
        lam = tl.load(row + 2)
        u = tl.load(x_ptr + offset, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + offset, mask=mask, other=0.0).to(tl.float32)
        h = tl.where(mask, (u - mean) * rstd, 0.0)
        x, psi_h, psi_lam = yeo_johnson(h, lam)
        gx = dy
        if HAS_W:
            gx = dy * tl.load(w_ptr + c, mask=mask, other=0.0).to(tl.float32)
            if NOISE:
                x = x + (noise * tl.load(row + 3)) * tl.randn(tl.load(seed_ptr), logical)
            acc_w += dy * x
        if HAS_B:
            acc_b += dy
        gh = gx * psi_h
        if LAMBDA_GRAD:
            sg, a, log_a, d, e = newton_terms(h)
            direction = lambda_grad_direction(sg, a, log_a, d, e, tl.load(row + 4), tl.load(row + 5),
                                              tl.load(row + 6), tl.load(row + 7))
            gh = gh + tl.sum(gx * psi_lam, axis=0) * direction
        gh = tl.where(mask, gh, 0.0)
        if USE_RUNNING:
            dx = rstd * gh
        else:
            mean_gh = tl.sum(gh, axis=0) / M
            mean_ghh = tl.sum(gh * h, axis=0) / M
            dx = rstd * (gh - mean_gh - h * mean_ghh)
        tl.store(dx_ptr + offset, dx.to(dx_ptr.dtype.element_ty), mask=mask)
    part = (split * K + k) * M + j
    if HAS_W:
        tl.store(dw_part_ptr + part, acc_w, mask=mask)
    if HAS_B:
        tl.store(db_part_ptr + part, acc_b, mask=mask)
