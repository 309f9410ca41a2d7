"""Row-style kernels: one program owns a whole normalization group, held in registers.

Forward reads each element once and writes it once; every dependent reduction (moments, the
Newton sums, mean(x), mean|x - mean x|) happens on chip. Backward (one launch) reads x and dy once
and writes dx once, with one reduction stage: dL/dh = A + glam * B is linear in the lambda
gradient glam, so its sums come with glam's. Each backward program loops over several groups of one
channel class and accumulates the weight/bias gradients per element in registers, then writes one
partial row (no atomics, so the result is deterministic). The group size M and row width T are
constexprs (one compile per group shape): the (row, column) split of an in-group index costs no
integer division, and a group that fills its block (M == BLOCK) compiles without masks.
"""

from __future__ import annotations

import triton
import triton.language as tl

from normkit_normalnorm.triton_kernels.jit_common import (
    affine_store,
    channel_value,
    element,
    group_inverses,
    lambda_from_sums,
    lambda_grad_direction,
    log1p_pos,
    newton_terms,
    noise_block,
    store_stats,
    sum_slots,
    transform,
    transform_grads,
    update_running,
)


@triton.jit
def row_forward(x_ptr, y_ptr, w_ptr, b_ptr, stats_ptr, run_mean_ptr, run_var_ptr, run_lam_ptr,
                C, S, G, CG, sn, sc, ss,
                eps, sqrt_eps, alpha, noise, lmin, lmax, momentum, unbias, seed_ptr,
                M: tl.constexpr, T: tl.constexpr, PART: tl.constexpr, BLOCK: tl.constexpr, NSTAT: tl.constexpr,
                HAS_W: tl.constexpr, HAS_B: tl.constexpr, NOISE: tl.constexpr,
                CLAMP_MIN: tl.constexpr, CLAMP_MAX: tl.constexpr, DETACH: tl.constexpr,
                UPDATE: tl.constexpr):
    gid = tl.program_id(0)
    j = tl.arange(0, BLOCK)
    mask = j < M
    offset, c = element(gid, j // T, j % T, C, S, G, CG, sn, sc, ss, PART)
    u = tl.load(x_ptr + offset, mask=mask, other=0.0).to(tl.float32)
    first, _ = element(gid, 0, 0, C, S, G, CG, sn, sc, ss, PART)
    shift = tl.load(x_ptr + first).to(tl.float32)  # statistics of u - u[0]: a constant group gives h == 0
    inv_m = 1.0 / M
    shifted = tl.where(mask, u - shift, 0.0)
    mean_shifted = tl.sum(shifted, axis=0) * inv_m
    centered = tl.where(mask, shifted - mean_shifted, 0.0)
    mean = shift + mean_shifted
    var = tl.sum(centered * centered, axis=0) * inv_m
    rstd = 1.0 / tl.sqrt(var + eps)
    h = centered * rstd
    a = tl.abs(h)
    log_a = log1p_pos(a)
    d, e = newton_terms(a, log_a)
    mean_d = tl.sum(d, axis=0) * inv_m
    dev_d = tl.where(mask, d - mean_d, 0.0)
    signed_log = tl.where(h >= 0.0, log_a, -log_a)
    lam, mean_d, coef_d, coef_e, coef_s = lambda_from_sums(
        tl.sum(signed_log, axis=0), tl.sum(h * d, axis=0), tl.sum(a * e, axis=0), mean_d,
        tl.sum(dev_d * dev_d, axis=0), M * 1.0, alpha, sqrt_eps, lmin, lmax,
        CLAMP_MIN, CLAMP_MAX, DETACH)
    inv_pos, inv_neg = group_inverses(lam)
    x, _t, _em1, _inv_mu = transform(h, log_a, lam, inv_pos, inv_neg)
    scale = 0.0
    if NOISE:
        x_mean = tl.sum(tl.where(mask, x, 0.0), axis=0) * inv_m
        scale = tl.sum(tl.where(mask, tl.abs(x - x_mean), 0.0), axis=0) * inv_m
        x = x + (noise * scale) * noise_block(tl.load(seed_ptr), gid, M, BLOCK)
    affine_store(y_ptr, offset, x, w_ptr, b_ptr, c, mask, HAS_W, HAS_B, PART)
    store_stats(stats_ptr + gid * NSTAT, mean, rstd, lam, scale, mean_d, coef_d, coef_e, coef_s, var)
    if UPDATE:
        update_running(run_mean_ptr, run_var_ptr, run_lam_ptr, gid, mean, var * unbias, lam, momentum)


@triton.jit
def row_backward(x_ptr, dy_ptr, dx_ptr, w_ptr, stats_ptr, dw_part_ptr, db_part_ptr, dw_ptr, db_ptr, count_ptr,
                 C, S, G, CG, K, per_split, n_per_class, set_size, n_sets, sn, sc, ss, noise, seed_ptr,
                 M: tl.constexpr, T: tl.constexpr, PART: tl.constexpr, BLOCK: tl.constexpr, NSTAT: tl.constexpr,
                 HAS_W: tl.constexpr, HAS_B: tl.constexpr, USE_RUNNING: tl.constexpr,
                 NOISE: tl.constexpr, LAMBDA_GRAD: tl.constexpr, DIRECT: tl.constexpr,
                 CPK: tl.constexpr, PV: tl.constexpr, CB: tl.constexpr, PB: tl.constexpr):
    """Program (k, split) handles groups gid = i*K + k for i in its split; all share channels.

    Class k owns channels k*CPK ... k*CPK + CPK - 1, each PV values of a group (in-group index
    j = i*PV + p). Partial rows: row s (< splits) of the part buffers is split s's, row splits + q
    the sum of set q's; count_ptr holds K * (n_sets + 1) zeroed tickets."""
    k = tl.program_id(0)
    split = tl.program_id(1)
    j = tl.arange(0, BLOCK)
    mask = j < M
    r = j // T
    t = j % T
    inv_m = 1.0 / M
    acc_w = tl.zeros([BLOCK], tl.float32)  # DIRECT: only element 0 is used, for the group's total
    acc_b = tl.zeros([BLOCK], tl.float32)
    i_end = tl.minimum(split * per_split + per_split, n_per_class)
    for i in range(split * per_split, i_end):
        gid = i * K + k
        offset, c = element(gid, r, t, C, S, G, CG, sn, sc, ss, PART)
        row = stats_ptr + gid * NSTAT
        mean = tl.load(row + 0)
        rstd = tl.load(row + 1)
        lam = tl.load(row + 2)
        u = tl.load(x_ptr + offset, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + offset, mask=mask, other=0.0).to(tl.float32)
        h = tl.where(mask, (u - mean) * rstd, 0.0)
        inv_pos, inv_neg = group_inverses(lam)
        a = tl.abs(h)
        log_a = log1p_pos(a)
        x, tt, em1, inv_mu = transform(h, log_a, lam, inv_pos, inv_neg)
        inv_1pa, psi_h, psi_lam = transform_grads(a, log_a, tt, em1, inv_mu)
        gx = dy
        if HAS_W:
            gx = dy * channel_value(w_ptr, c, mask, 0.0, PART)
            if NOISE:
                x = x + (noise * tl.load(row + 3)) * noise_block(tl.load(seed_ptr), gid, M, BLOCK)
            if DIRECT:  # the only group of its channel: reduce now, with the other sums
                acc_w += tl.sum(dy * x, axis=0)
            else:
                acc_w += dy * x
        if HAS_B:
            if DIRECT:
                acc_b += tl.sum(dy, axis=0)
            else:
                acc_b += dy
        grad_a = tl.where(mask, gx * psi_h, 0.0)
        if USE_RUNNING:
            dx = rstd * grad_a
        else:
            sum_a = tl.sum(grad_a, axis=0)
            sum_ah = tl.sum(grad_a * h, axis=0)
            if LAMBDA_GRAD:
                direction = tl.where(mask, lambda_grad_direction(h, a, log_a, inv_1pa, tl.load(row + 4),
                                                                 tl.load(row + 5), tl.load(row + 6),
                                                                 tl.load(row + 7)), 0.0)
                glam = tl.sum(gx * psi_lam, axis=0)
                sum_a += glam * tl.sum(direction, axis=0)
                sum_ah += glam * tl.sum(direction * h, axis=0)
                grad_a += glam * direction
            dx = rstd * (grad_a - sum_a * inv_m - h * (sum_ah * inv_m))
        tl.store(dx_ptr + offset, dx.to(dx_ptr.dtype.element_ty), mask=mask)
    if DIRECT:  # this program saw every value of its class's single channel
        if HAS_W:
            tl.store(dw_ptr + k + j, acc_w, mask=j == 0)
        if HAS_B:
            tl.store(db_ptr + k + j, acc_b, mask=j == 0)
    else:  # write this program's partial row; the last program of the set and of the class sum them
        if HAS_W:
            tl.store(dw_part_ptr + (split * K + k) * M + j, acc_w, mask=mask)
        if HAS_B:
            tl.store(db_part_ptr + (split * K + k) * M + j, acc_b, mask=mask)
        tl.debug_barrier()
        _finish_param_grads(dw_part_ptr, db_part_ptr, dw_ptr, db_ptr, count_ptr, k, split, K, set_size, n_sets,
                            M, BLOCK, HAS_W, HAS_B, CPK, PV, CB, PB)


@triton.jit(noinline=True)
def _finish_param_grads(dw_part_ptr, db_part_ptr, dw_ptr, db_ptr, count_ptr, k, split, K, set_size, n_sets,
                        M: tl.constexpr, BLOCK: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
                        CPK: tl.constexpr, PV: tl.constexpr, CB: tl.constexpr, PB: tl.constexpr):
    """After every thread of the program wrote its partial row (the barrier before the call), take a
    ticket of the program's set: the last of the set sums the set's rows, then takes a ticket of the
    class, and the last set sums the sets' rows per channel into dweight/dbias. The acq_rel tickets
    make the rows written before them visible to the program that sums them. A subroutine (noinline):
    its rarely run loops take no registers from the group loop, and the kernel-cost count, which
    does not follow calls, leaves it out of the per-value hot path (docs/performance.md)."""
    splits = tl.num_programs(1)
    tickets = count_ptr + k * (n_sets + 1)
    q = split // set_size
    first = q * set_size
    last = tl.minimum(first + set_size, splits)
    if tl.atomic_add(tickets + q, 1, sem="acq_rel") == last - first - 1:
        level = (splits + q) * K + k
        if HAS_W:
            sum_slots(dw_part_ptr + k * M, first, last, K * M, dw_part_ptr + level * M, M, 1, BLOCK, 1)
        if HAS_B:
            sum_slots(db_part_ptr + k * M, first, last, K * M, db_part_ptr + level * M, M, 1, BLOCK, 1)
        tl.debug_barrier()
        if tl.atomic_add(tickets + n_sets, 1, sem="acq_rel") == n_sets - 1:
            if HAS_W:
                sum_slots(dw_part_ptr + (splits * K + k) * M, 0, n_sets, K * M, dw_ptr + k * CPK, CPK, PV, CB, PB)
            if HAS_B:
                sum_slots(db_part_ptr + (splits * K + k) * M, 0, n_sets, K * M, db_ptr + k * CPK, CPK, PV, CB, PB)
