"""Split-reduction kernels for groups too large for one program (BatchNorm-style channels).

Each group is cut into tiles of `BR` rows x `BT` columns of its `R x T` values (T a constexpr,
one compile per row width); a launch has one program per (group, tile). A pass writes one small partial row per tile; the next pass combines the partials of its
group itself (every program of a group combines them in the same order, so all agree bit for bit)
instead of launching a separate combine kernel. The forward needs one pass per dependent
reduction: moments -> Newton sums -> mean(x) -> mean|x - mean x| -> output (the middle two only
with noise; the mean(x) pass writes x to a float32 workspace, so the last two read it instead of
recomputing the transform). The backward needs two: one reduction pass (lambda gradient, weight/bias partials
and the four sums that make dx's mean terms linear in the lambda gradient) and one dx pass, which also
finishes the weight/bias gradients: the partials are complete when it starts, so its programs share
the channels and each sums one channel's partials in a fixed order (deterministic, no atomics).
"""

from __future__ import annotations

import triton
import triton.language as tl

from normkit_normalnorm.triton_kernels.jit_common import (
    affine_store,
    channel_sum,
    channel_value,
    element,
    group_inverses,
    lambda_from_sums,
    lambda_grad_direction,
    log1p_pos,
    newton_terms,
    noise_at,
    store_stats,
    transform,
    transform_grads,
    update_running,
)


@triton.jit
def _tile(gid, ch, R, C, S, G, CG, sn, sc, ss,
          T: tl.constexpr, PART: tl.constexpr, BR: tl.constexpr, BT: tl.constexpr):
    """Offsets, channels, in-group indices j = r*T + t, mask and rows of tile `ch` of group `gid`."""
    n_tb: tl.constexpr = (T + BT - 1) // BT
    r = (ch // n_tb) * BR + tl.arange(0, BR)[:, None]
    t = (ch % n_tb) * BT + tl.arange(0, BT)[None, :]
    mask = (r < R) & (t < T)
    offset, c = element(gid, r, t, C, S, G, CG, sn, sc, ss, PART)
    return offset, c, r * T + t, mask, r


@triton.jit
def _total(part_ptr, gid, col, width, n_ch, BLOCK_CH: tl.constexpr):
    """Sum of column `col` of a group's partial rows."""
    acc = tl.zeros([BLOCK_CH], tl.float32)
    for start in range(0, n_ch, BLOCK_CH):
        i = start + tl.arange(0, BLOCK_CH)
        acc += tl.load(part_ptr + (gid * n_ch + i) * width + col, mask=i < n_ch, other=0.0)
    return tl.sum(acc, axis=0)


@triton.jit
def _chan_combine(cnt_ptr, cnt_col, cnt_width, part_ptr, mean_col, m2_col, width, gid, n_ch, total,
                  BLOCK_CH: tl.constexpr):
    """Mean and M2 of a group from per-tile (count, mean, M2) rows (Chan et al.)."""
    acc = tl.zeros([BLOCK_CH], tl.float32)
    for start in range(0, n_ch, BLOCK_CH):
        i = start + tl.arange(0, BLOCK_CH)
        m = i < n_ch
        cnt = tl.load(cnt_ptr + (gid * n_ch + i) * cnt_width + cnt_col, mask=m, other=0.0)
        acc += cnt * tl.load(part_ptr + (gid * n_ch + i) * width + mean_col, mask=m, other=0.0)
    mean = tl.sum(acc, axis=0) / total
    acc = tl.zeros([BLOCK_CH], tl.float32)
    for start in range(0, n_ch, BLOCK_CH):
        i = start + tl.arange(0, BLOCK_CH)
        m = i < n_ch
        cnt = tl.load(cnt_ptr + (gid * n_ch + i) * cnt_width + cnt_col, mask=m, other=0.0)
        dev = tl.load(part_ptr + (gid * n_ch + i) * width + mean_col, mask=m, other=0.0) - mean
        acc += tl.load(part_ptr + (gid * n_ch + i) * width + m2_col, mask=m, other=0.0) + cnt * dev * dev
    return mean, tl.sum(acc, axis=0)


@triton.jit
def _shift(x_ptr, gid, C, S, G, CG, sn, sc, ss, PART: tl.constexpr):
    """The group's first element: moments are taken of u - shift, so a constant group has h == 0."""
    offset, _ = element(gid, 0, 0, C, S, G, CG, sn, sc, ss, PART)
    return tl.load(x_ptr + offset).to(tl.float32)


@triton.jit
def _moments(moments_ptr, gid, n_ch, M, eps, BLOCK_CH: tl.constexpr):
    """(mean of u - shift, var, rstd) of a group from its tiles' rows."""
    mean, m2 = _chan_combine(moments_ptr, 0, 3, moments_ptr, 1, 2, 3, gid, n_ch, M * 1.0, BLOCK_CH)
    var = m2 * (1.0 / M)
    return mean, var, 1.0 / tl.sqrt(var + eps)


@triton.jit
def _lambda(moments_ptr, newton_ptr, gid, n_ch, M, alpha, sqrt_eps, lmin, lmax,
            BLOCK_CH: tl.constexpr, CLAMP_MIN: tl.constexpr, CLAMP_MAX: tl.constexpr,
            DETACH: tl.constexpr):
    mean_d, m2_d = _chan_combine(moments_ptr, 0, 3, newton_ptr, 3, 4, 5, gid, n_ch, M * 1.0, BLOCK_CH)
    return lambda_from_sums(_total(newton_ptr, gid, 0, 5, n_ch, BLOCK_CH),
                            _total(newton_ptr, gid, 1, 5, n_ch, BLOCK_CH),
                            _total(newton_ptr, gid, 2, 5, n_ch, BLOCK_CH),
                            mean_d, m2_d, M * 1.0, alpha, sqrt_eps, lmin, lmax,
                            CLAMP_MIN, CLAMP_MAX, DETACH)


@triton.jit
def split_moments(x_ptr, moments_ptr, R, C, S, G, CG, sn, sc, ss,
                  T: tl.constexpr, PART: tl.constexpr, BR: tl.constexpr, BT: tl.constexpr):
    """Pass 1: per tile (count, mean, M2) of u - shift, two-pass on registers."""
    gid = tl.program_id(0)
    ch = tl.program_id(1)
    offset, _c, _j, mask, _r = _tile(gid, ch, R, C, S, G, CG, sn, sc, ss, T, PART, BR, BT)
    u = tl.load(x_ptr + offset, mask=mask, other=0.0).to(tl.float32)
    u = tl.where(mask, u - _shift(x_ptr, gid, C, S, G, CG, sn, sc, ss, PART), 0.0)
    cnt = tl.sum(tl.sum(mask.to(tl.float32), axis=1), axis=0)
    mean = tl.sum(tl.sum(u, axis=1), axis=0) / cnt
    dev = tl.where(mask, u - mean, 0.0)
    out = moments_ptr + (gid * tl.num_programs(1) + ch) * 3
    tl.store(out + 0, cnt)
    tl.store(out + 1, mean)
    tl.store(out + 2, tl.sum(tl.sum(dev * dev, axis=1), axis=0))


@triton.jit
def split_newton(x_ptr, moments_ptr, newton_ptr, R, M, C, S, G, CG, sn, sc, ss, eps,
                 T: tl.constexpr, PART: tl.constexpr, BR: tl.constexpr, BT: tl.constexpr, BLOCK_CH: tl.constexpr):
    """Pass 2: per tile sums of sgn*L, h*d, |h|*e and the (mean, M2) of d."""
    gid = tl.program_id(0)
    ch = tl.program_id(1)
    n_ch = tl.num_programs(1)
    mean, _var, rstd = _moments(moments_ptr, gid, n_ch, M, eps, BLOCK_CH)
    shift = _shift(x_ptr, gid, C, S, G, CG, sn, sc, ss, PART)
    offset, _c, _j, mask, _r = _tile(gid, ch, R, C, S, G, CG, sn, sc, ss, T, PART, BR, BT)
    u = tl.load(x_ptr + offset, mask=mask, other=0.0).to(tl.float32)
    h = tl.where(mask, (u - shift - mean) * rstd, 0.0)
    a = tl.abs(h)
    log_a = log1p_pos(a)
    d, e = newton_terms(a, log_a)
    cnt = tl.load(moments_ptr + (gid * n_ch + ch) * 3)
    mean_d = tl.sum(tl.sum(d, axis=1), axis=0) / cnt
    dev = tl.where(mask, d - mean_d, 0.0)
    out = newton_ptr + (gid * n_ch + ch) * 5
    tl.store(out + 0, tl.sum(tl.sum(tl.where(h >= 0.0, log_a, -log_a), axis=1), axis=0))
    tl.store(out + 1, tl.sum(tl.sum(h * d, axis=1), axis=0))
    tl.store(out + 2, tl.sum(tl.sum(a * e, axis=1), axis=0))
    tl.store(out + 3, mean_d)
    tl.store(out + 4, tl.sum(tl.sum(dev * dev, axis=1), axis=0))


@triton.jit
def _group(x_ptr, moments_ptr, newton_ptr, gid, n_ch, M, C, S, G, CG, sn, sc, ss, eps, sqrt_eps, alpha, lmin, lmax,
           PART: tl.constexpr, BLOCK_CH: tl.constexpr, CLAMP_MIN: tl.constexpr, CLAMP_MAX: tl.constexpr,
           DETACH: tl.constexpr):
    """A group's statistics from the partials of passes 1 and 2: (shift, mean of u - shift, var, rstd,
    lambda and the lambda-gradient coefficients)."""
    mean, var, rstd = _moments(moments_ptr, gid, n_ch, M, eps, BLOCK_CH)
    shift = _shift(x_ptr, gid, C, S, G, CG, sn, sc, ss, PART)
    lam, mean_d, coef_d, coef_e, coef_s = _lambda(moments_ptr, newton_ptr, gid, n_ch, M, alpha, sqrt_eps,
                                                  lmin, lmax, BLOCK_CH, CLAMP_MIN, CLAMP_MAX, DETACH)
    return shift, mean, var, rstd, lam, mean_d, coef_d, coef_e, coef_s


@triton.jit
def _transformed(x_ptr, offset, mask, shift, mean, rstd, lam):
    """psi(h; lambda) of a tile (0 outside the mask)."""
    u = tl.load(x_ptr + offset, mask=mask, other=0.0).to(tl.float32)
    h = tl.where(mask, (u - shift - mean) * rstd, 0.0)
    inv_pos, inv_neg = group_inverses(lam)
    x, _t, _em1, _inv_mu = transform(h, log1p_pos(tl.abs(h)), lam, inv_pos, inv_neg)
    return tl.where(mask, x, 0.0)


@triton.jit
def split_transform(x_ptr, moments_ptr, newton_ptr, xt_ptr, sum_x_ptr, R, M, C, S, G, CG,
                    sn, sc, ss, eps, sqrt_eps, alpha, lmin, lmax,
                    T: tl.constexpr, PART: tl.constexpr, BR: tl.constexpr, BT: tl.constexpr, BLOCK_CH: tl.constexpr,
                    CLAMP_MIN: tl.constexpr, CLAMP_MAX: tl.constexpr):
    """Pass 3 (noise only): x = psi(h; lambda) into the float32 workspace `xt` (group-major, index
    gid * M + j) and per tile sum(x); the next two passes read x there instead of recomputing it."""
    gid = tl.program_id(0)
    ch = tl.program_id(1)
    n_ch = tl.num_programs(1)
    shift, mean, _var, rstd, lam, _, _, _, _ = _group(x_ptr, moments_ptr, newton_ptr, gid, n_ch, M, C, S, G, CG,
                                                      sn, sc, ss, eps, sqrt_eps, alpha, lmin, lmax, PART, BLOCK_CH,
                                                      CLAMP_MIN, CLAMP_MAX, True)
    offset, _c, j, mask, _r = _tile(gid, ch, R, C, S, G, CG, sn, sc, ss, T, PART, BR, BT)
    x = _transformed(x_ptr, offset, mask, shift, mean, rstd, lam)
    tl.store(xt_ptr + gid * M + j, x, mask=mask)
    tl.store(sum_x_ptr + gid * n_ch + ch, tl.sum(tl.sum(x, axis=1), axis=0))


@triton.jit
def split_spread(xt_ptr, sum_x_ptr, spread_ptr, R, M, C, S, G, CG, sn, sc, ss,
                 T: tl.constexpr, PART: tl.constexpr, BR: tl.constexpr, BT: tl.constexpr, BLOCK_CH: tl.constexpr):
    """Pass 4 (noise only): per tile sum|x - mean x| of the workspace's x."""
    gid = tl.program_id(0)
    ch = tl.program_id(1)
    n_ch = tl.num_programs(1)
    _offset, _c, j, mask, _r = _tile(gid, ch, R, C, S, G, CG, sn, sc, ss, T, PART, BR, BT)
    x = tl.load(xt_ptr + gid * M + j, mask=mask, other=0.0)
    x_mean = _total(sum_x_ptr, gid, 0, 1, n_ch, BLOCK_CH) * (1.0 / M)
    tl.store(spread_ptr + gid * n_ch + ch, tl.sum(tl.sum(tl.where(mask, tl.abs(x - x_mean), 0.0), axis=1), axis=0))


@triton.jit
def split_output(x_ptr, y_ptr, w_ptr, b_ptr, stats_ptr, moments_ptr, newton_ptr, spread_ptr, xt_ptr,
                 run_mean_ptr, run_var_ptr, run_lam_ptr,
                 R, M, C, S, G, CG, sn, sc, ss, eps, sqrt_eps, alpha, noise, lmin, lmax,
                 momentum, unbias, seed_ptr,
                 T: tl.constexpr, PART: tl.constexpr, BR: tl.constexpr, BT: tl.constexpr, BLOCK_CH: tl.constexpr,
                 NSTAT: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr, NOISE: tl.constexpr,
                 CLAMP_MIN: tl.constexpr, CLAMP_MAX: tl.constexpr, DETACH: tl.constexpr,
                 UPDATE: tl.constexpr):
    """Last forward pass: x (with noise: read from the workspace pass 3 wrote, plus noise; without:
    the transform), affine, store; tile 0 stores the group's statistics (and, with UPDATE, moves the
    channel's running buffers)."""
    gid = tl.program_id(0)
    ch = tl.program_id(1)
    n_ch = tl.num_programs(1)
    offset, c, j, mask, _r = _tile(gid, ch, R, C, S, G, CG, sn, sc, ss, T, PART, BR, BT)
    if NOISE:
        scale = _total(spread_ptr, gid, 0, 1, n_ch, BLOCK_CH) * (1.0 / M)
        x = tl.load(xt_ptr + gid * M + j, mask=mask, other=0.0)
        x = x + (noise * scale) * noise_at(tl.load(seed_ptr), gid, M, j)
    else:
        scale = 0.0
        shift, mean, var, rstd, lam, mean_d, coef_d, coef_e, coef_s = _group(
            x_ptr, moments_ptr, newton_ptr, gid, n_ch, M, C, S, G, CG, sn, sc, ss, eps, sqrt_eps, alpha, lmin, lmax,
            PART, BLOCK_CH, CLAMP_MIN, CLAMP_MAX, DETACH)
        x = _transformed(x_ptr, offset, mask, shift, mean, rstd, lam)
    affine_store(y_ptr, offset, x, w_ptr, b_ptr, c, mask, HAS_W, HAS_B, PART)
    if ch == 0:
        if NOISE:  # only tile 0 needs the statistics: the other tiles skip combining them
            shift, mean, var, rstd, lam, mean_d, coef_d, coef_e, coef_s = _group(
                x_ptr, moments_ptr, newton_ptr, gid, n_ch, M, C, S, G, CG, sn, sc, ss, eps, sqrt_eps, alpha, lmin,
                lmax, PART, BLOCK_CH, CLAMP_MIN, CLAMP_MAX, DETACH)
        store_stats(stats_ptr + gid * NSTAT, shift + mean, rstd, lam, scale, mean_d, coef_d, coef_e, coef_s,
                    var)
        if UPDATE:
            update_running(run_mean_ptr, run_var_ptr, run_lam_ptr, gid, shift + mean, var * unbias, lam,
                           momentum)


@triton.jit
def split_backward_reduce(x_ptr, dy_ptr, w_ptr, stats_ptr, sums_ptr, dw_part_ptr, db_part_ptr,
                          R, M, C, S, G, CG, sn, sc, ss, noise, seed_ptr,
                          T: tl.constexpr, PART: tl.constexpr, BR: tl.constexpr, BT: tl.constexpr, NSTAT: tl.constexpr,
                          HAS_W: tl.constexpr, HAS_B: tl.constexpr, NOISE: tl.constexpr,
                          LAMBDA_GRAD: tl.constexpr):
    """Backward pass 1: per tile sum(gx*dpsi/dlam), sum(A), sum(A h), sum(B), sum(B h) and
    per-row weight/bias partials, where dL/dh = A + glam * B (A = gx*dpsi/dh, B = dlam/dh)."""
    gid = tl.program_id(0)
    ch = tl.program_id(1)
    n_ch = tl.num_programs(1)
    row = stats_ptr + gid * NSTAT
    mean = tl.load(row + 0)
    rstd = tl.load(row + 1)
    lam = tl.load(row + 2)
    offset, c, j, mask, r = _tile(gid, ch, R, C, S, G, CG, sn, sc, ss, T, PART, BR, BT)
    u = tl.load(x_ptr + offset, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(dy_ptr + offset, mask=mask, other=0.0).to(tl.float32)
    h = tl.where(mask, (u - mean) * rstd, 0.0)
    a = tl.abs(h)
    log_a = log1p_pos(a)
    inv_pos, inv_neg = group_inverses(lam)
    x, tt, em1, inv_mu = transform(h, log_a, lam, inv_pos, inv_neg)
    inv_1pa, psi_h, psi_lam = transform_grads(a, log_a, tt, em1, inv_mu)
    n_tb: tl.constexpr = (T + BT - 1) // BT
    part_rows = (gid * R + r) * n_tb + ch % n_tb
    row_mask = r < R
    gx = dy
    if HAS_W:
        gx = dy * channel_value(w_ptr, c, mask, 0.0, PART)
        if NOISE:
            x = x + (noise * tl.load(row + 3)) * noise_at(tl.load(seed_ptr), gid, M, j)
        tl.store(dw_part_ptr + part_rows, tl.sum(dy * x, axis=1)[:, None], mask=row_mask)
    if HAS_B:
        tl.store(db_part_ptr + part_rows, tl.sum(dy, axis=1)[:, None], mask=row_mask)
    grad_a = gx * psi_h
    out = sums_ptr + (gid * n_ch + ch) * 5
    tl.store(out + 1, tl.sum(tl.sum(grad_a, axis=1), axis=0))
    tl.store(out + 2, tl.sum(tl.sum(grad_a * h, axis=1), axis=0))
    if LAMBDA_GRAD:
        direction = tl.where(mask, lambda_grad_direction(h, a, log_a, inv_1pa, tl.load(row + 4),
                                                         tl.load(row + 5), tl.load(row + 6),
                                                         tl.load(row + 7)), 0.0)
        tl.store(out + 0, tl.sum(tl.sum(gx * psi_lam, axis=1), axis=0))
        tl.store(out + 3, tl.sum(tl.sum(direction, axis=1), axis=0))
        tl.store(out + 4, tl.sum(tl.sum(direction * h, axis=1), axis=0))


@triton.jit(noinline=True)
def _finish_channels(dw_part_ptr, db_part_ptr, dw_ptr, db_ptr, first, step, C, n_slots, PV,
                     HAS_W: tl.constexpr, HAS_B: tl.constexpr, SB: tl.constexpr, PB: tl.constexpr):
    """dweight/dbias of channels first, first + step, ... from (n_slots, C, PV) partials, each in a fixed
    order. A subroutine (noinline), so its loop takes no registers from the dx pass."""
    for c in range(first, C, step):
        if HAS_W:
            tl.store(dw_ptr + c, channel_sum(dw_part_ptr, c, n_slots, C, PV, SB, PB))
        if HAS_B:
            tl.store(db_ptr + c, channel_sum(db_part_ptr, c, n_slots, C, PV, SB, PB))


@triton.jit
def split_backward_input(x_ptr, dy_ptr, dx_ptr, w_ptr, stats_ptr, sums_ptr, dw_part_ptr, db_part_ptr, dw_ptr, db_ptr,
                         R, M, C, S, G, CG, sn, sc, ss, n_slots, PV,
                         T: tl.constexpr, PART: tl.constexpr, BR: tl.constexpr, BT: tl.constexpr, BLOCK_CH: tl.constexpr,
                         NSTAT: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr, USE_RUNNING: tl.constexpr,
                         LAMBDA_GRAD: tl.constexpr, SB: tl.constexpr, PB: tl.constexpr):
    """Backward pass 2: dx = rstd (gh - mean(gh) - h mean(gh h)) with gh = A + glam B; and the weight/bias
    gradients from pass 1's partials, laid out (n_slots, C, PV): program p sums channels p, p + programs, ..."""
    gid = tl.program_id(0)
    ch = tl.program_id(1)
    n_ch = tl.num_programs(1)
    _finish_channels(dw_part_ptr, db_part_ptr, dw_ptr, db_ptr, gid * n_ch + ch, tl.num_programs(0) * n_ch, C,
                     n_slots, PV, HAS_W, HAS_B, SB, PB)
    row = stats_ptr + gid * NSTAT
    mean = tl.load(row + 0)
    rstd = tl.load(row + 1)
    lam = tl.load(row + 2)
    offset, c, _j, mask, _r = _tile(gid, ch, R, C, S, G, CG, sn, sc, ss, T, PART, BR, BT)
    u = tl.load(x_ptr + offset, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(dy_ptr + offset, mask=mask, other=0.0).to(tl.float32)
    h = tl.where(mask, (u - mean) * rstd, 0.0)
    a = tl.abs(h)
    log_a = log1p_pos(a)
    inv_pos, inv_neg = group_inverses(lam)
    _x, tt, em1, inv_mu = transform(h, log_a, lam, inv_pos, inv_neg)
    inv_1pa, psi_h, _psi_lam = transform_grads(a, log_a, tt, em1, inv_mu)
    gx = dy
    if HAS_W:
        gx = dy * channel_value(w_ptr, c, mask, 0.0, PART)
    gh = gx * psi_h
    if USE_RUNNING:
        dx = rstd * gh
    else:
        sum_a = _total(sums_ptr, gid, 1, 5, n_ch, BLOCK_CH)
        sum_ah = _total(sums_ptr, gid, 2, 5, n_ch, BLOCK_CH)
        inv_m = 1.0 / M
        mean_gh = sum_a * inv_m
        mean_ghh = sum_ah * inv_m
        if LAMBDA_GRAD:
            glam = _total(sums_ptr, gid, 0, 5, n_ch, BLOCK_CH)
            mean_gh += glam * _total(sums_ptr, gid, 3, 5, n_ch, BLOCK_CH) * inv_m
            mean_ghh += glam * _total(sums_ptr, gid, 4, 5, n_ch, BLOCK_CH) * inv_m
            gh += glam * lambda_grad_direction(h, a, log_a, inv_1pa, tl.load(row + 4), tl.load(row + 5),
                                               tl.load(row + 6), tl.load(row + 7))
        dx = rstd * (gh - mean_gh - h * mean_ghh)
    tl.store(dx_ptr + offset, dx.to(dx_ptr.dtype.element_ty), mask=mask)
