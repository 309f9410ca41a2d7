"""Eval-mode kernel for batch partitions with running statistics: one fused elementwise pass."""

from __future__ import annotations

import triton
import triton.language as tl

from normkit_normalnorm.triton_kernels.jit_common import affine_store, group_inverses, log1p_pos, transform


@triton.jit
def eval_pointwise(x_ptr, y_ptr, w_ptr, b_ptr, mean_ptr, var_ptr, lam_ptr, numel, C, S, sn, sc, ss,
                   eps, lmin, lmax, BLOCK: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
                   CHANNELS_LAST: tl.constexpr, CLAMP_MIN: tl.constexpr, CLAMP_MAX: tl.constexpr):
    """y = w * psi((x - running_mean) * rstd; running_lambda) + b, walking memory order.

    Reads the running buffers themselves (any float dtype), so eval needs no host-side work.
    """
    idx = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = idx < numel
    if CHANNELS_LAST:
        c = idx % C
        s = (idx // C) % S
        n = idx // (C * S)
    else:
        s = idx % S
        c = (idx // S) % C
        n = idx // (C * S)
    offset = n * sn + c * sc + s * ss
    mean = tl.load(mean_ptr + c, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.load(var_ptr + c, mask=mask, other=1.0).to(tl.float32) + eps)
    lam = tl.load(lam_ptr + c, mask=mask, other=1.0).to(tl.float32)
    if CLAMP_MIN:
        lam = tl.maximum(lam, lmin)
    if CLAMP_MAX:
        lam = tl.minimum(lam, lmax)
    u = tl.load(x_ptr + offset, mask=mask, other=0.0).to(tl.float32)
    h = (u - mean) * rstd
    inv_pos, inv_neg = group_inverses(lam)
    x, _t, _em1, _inv_mu = transform(h, log1p_pos(tl.abs(h)), lam, inv_pos, inv_neg)
    affine_store(y_ptr, offset, x, w_ptr, b_ptr, c, mask, HAS_W, HAS_B, 1)
