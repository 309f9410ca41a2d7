"""The fused torch path: standardize + lambda + transform + noise + affine in one autograd.Function.

Why it is faster than autograd on the reference: the standardization's backward (and the row
partitions' forward) runs on torch's native norm kernels; every per-element temporary is built in
place in a few scratch buffers (fresh activation-sized allocations cost page faults on CPU); the
four Newton means take one stacked reduction; log1p(|h|) is computed once; and the forward, which
has every per-element Newton term at hand, also builds the three per-element derivatives backward
needs, so backward is a handful of passes: gh = g * dx/dh + (sum g * dx/dlam) * dlam/dh per group.
The saved tensors (dx/dh, dx/dlam, dlam/dh and the noisy values) are borrowed from a pool that
backward refills (`workspace.borrow`), and none is built when no input needs a gradient.

Derivation (per group, n elements, a = |h|, L = log1p(a), sg = sign(h), E = expm1(mu L)):
  x = psi(h; lam) = E sg / mu,  mu = lam (h >= 0) or 2 - lam (h < 0),  sg / mu = c0 sg + c1;
  dx/dh = (1 + a)^(mu - 1) = (E + 1) / (1 + a);  dx/dlam = (sg L (E + 1) - x) sg / mu;
  lam = 1 - alpha * g1 / (g2 + sqrt(eps)), g1 = dvar / 2 - s1, g2 = (d2var - dvar^2) / 2, with
  d(dvar)/dh_i = 2/n * (d + a L),  d(s1)/dh_i = 1/n / (1 + a),
  d(d2var)/dh_i = 2/n * sg * (q + a L^2 + 2 (d - mean d) L),  d = (1+a)L - a,  q = (1+a)L^2 - 2d.
The standardization's own backward is torch's (native_*_norm_backward). Checked against autograd
of the reference (`yeojohnson.py`) in float64 by the tests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from normkit.autograd import once_differentiable
from normkit.stages import Groups, Partition
from torch import Tensor

from normkit_normalnorm.workspace import (
    borrow,
    give_back,
    graph_freed_after_this_backward,
    scratch,
    scratch_contiguous,
    scratch_stack,
)
from normkit_normalnorm.yeojohnson import standard_normal_like

STACK_SLOT = 6  # scratch slot of the stacked temporaries (five activations; slots 0, 1, 3, 4, 5 hold one each)
_TINY_MU = 1e-20  # stands in for mu == 0 (lam exactly 0 or 2): expm1(tiny * L) / tiny == L in float


@dataclass(frozen=True)
class FusedConfig:
    """Everything but the tensors: partition, mode and hyper-parameters of one call."""

    partition: str
    groups: int
    tokens: bool
    training: bool
    eps: float
    alpha: float
    noise: float
    momentum: float
    lambda_min: float | None
    lambda_max: float | None
    detach_lambda: bool
    grad_enabled: bool = True  # torch.is_grad_enabled() at the call (inside forward it is always off)

    def native_groups(self, num_channels: int) -> int | None:
        """Group count for native_group_norm; None for batch or per-token layer statistics."""
        if self.partition == "batch" or (self.partition == "layer" and self.tokens):
            return None
        return Partition(self.partition, self.groups).groups_per_sample(num_channels)


class NormalityFunction(torch.autograd.Function):
    """y3 = affine(psi(standardize(x3); lam_hat) + noise); see the module docstring for backward."""

    @staticmethod
    def forward(ctx: Any, x3: Tensor, weight: Tensor | None, bias: Tensor | None, cfg: FusedConfig,
                running_mean: Tensor | None, running_var: Tensor | None,
                running_lambda: Tensor | None) -> Tensor:
        use_running = cfg.partition == "batch" and running_mean is not None and not cfg.training
        h, groups, stats = _standardize(x3, cfg, running_mean, running_var, use_running)
        if use_running:
            lam = _clamp(groups.per_channel(running_lambda.to(h.dtype)), cfg)
            newton = None
            a = torch.abs(h, out=scratch(0, h))
            log1p_a = torch.log1p(a, out=scratch(1, h))
            signed_log = torch.copysign(log1p_a, h, out=scratch_stack(STACK_SLOT, h, 5)[4])
            x = borrow(h)
        else:
            newton, a, signed_log, log1p_a, x = _newton(h, groups, cfg)
            lam = newton.lam
            if running_lambda is not None and cfg.training and cfg.partition == "batch":
                running_lambda.lerp_(groups.channel_stat(lam).to(running_lambda), cfg.momentum)
        grads = cfg.grad_enabled and ctx.needs_input_grad[0]
        lam_grads = grads and newton is not None and not cfg.detach_lambda
        c0, c1 = _inverse_mu(lam)
        torch.addcmul(log1p_a, signed_log, lam - 1, out=x).expm1_()  # E = expm1(mu * L)
        free = scratch_stack(STACK_SLOT, h, 3)[1:]  # the Newton terms h d and d^2 are spent
        sign = torch.sign(h, out=free[0])  # sign(0) = 0 is harmless: E = 0 there
        dx_dh = dx_dlam = dlam_dh = None
        if grads:
            inverse_u = torch.add(a, 1, out=free[1]).reciprocal_()  # 1 / (1 + a)
            dx_dh = torch.addcmul(inverse_u, x, inverse_u, out=borrow(h))  # (E + 1) / (1 + a) = (1 + a)^(mu - 1)
            if lam_grads:  # sign(h) L exp(mu L), times sign(h) / mu below
                dx_dlam = torch.addcmul(signed_log, signed_log, x, out=borrow(h))
                dlam_dh = _lambda_jacobian(newton, a, log1p_a, signed_log, sign, inverse_u, cfg)
        inverse_mu = sign.mul_(c0).add_(c1)  # sign(h) / mu (mul, add: about 3x faster than where)
        x.mul_(inverse_mu)
        if dx_dlam is not None:
            dx_dlam.sub_(x).mul_(inverse_mu)
        y = _add_noise(x, x3, groups, cfg)
        out = _affine(groups.ungroup(y), weight, bias)  # a fresh (N, C, S) tensor, not a view
        if not (cfg.grad_enabled and any(ctx.needs_input_grad)):  # inference: y was only a temporary
            give_back(y)
            return out
        ctx.cfg, ctx.groups, ctx.stats = cfg, groups, stats
        ctx.lam_scale = newton.in_range if lam_grads else None
        ctx.save_for_backward(x3, dx_dh, dx_dlam, dlam_dh, y, weight, bias)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad3: Tensor) -> tuple[Tensor | None, ...]:
        x3, dx_dh, dx_dlam, dlam_dh, y, weight, bias = ctx.saved_tensors
        cfg, groups = ctx.cfg, ctx.groups
        gv = grad3.reshape(y.shape)
        grad_weight = grad_bias = None
        if bias is not None and ctx.needs_input_grad[2]:
            grad_bias = grad3.sum((0, 2))
        if weight is not None and ctx.needs_input_grad[1]:
            grad_weight = groups.ungroup(torch.mul(gv, y, out=scratch(4, y))).sum((0, 2))
        grad_x3 = None
        if ctx.needs_input_grad[0]:
            gx = torch.mul(gv, groups.per_channel(weight), out=scratch(0, y)) if weight is not None else gv
            gh = torch.mul(gx, dx_dh, out=scratch(3, y))
            if dx_dlam is not None:  # gh += dLoss/dlam * dlam/dh
                grad_lam = torch.mul(gx, dx_dlam, out=scratch(1, y)).sum(groups.dims, keepdim=True)
                gh.addcmul_(dlam_dh, grad_lam.mul_(ctx.lam_scale))
            grad_x3 = _standardize_backward(groups.ungroup(gh), x3, cfg, ctx.stats)
        if graph_freed_after_this_backward():  # no second backward can read them
            give_back(dx_dh, dx_dlam, dlam_dh, y)
        return grad_x3, grad_weight, grad_bias, None, None, None, None


# -- standardization on torch's native kernels --------------------------------------------------


def _standardize(x3: Tensor, cfg: FusedConfig, running_mean: Tensor | None, running_var: Tensor | None,
                 use_running: bool) -> tuple[Tensor, Groups, tuple[Tensor, ...]]:
    """Grouped h (a temporary) and what backward needs: (mean, rstd) in the native layout, or the eval scale.

    A constant group gives exactly h = 0 and lambda = 1 (torch's native batch norm does not: its
    float32 mean of a constant channel can be off by an ulp, so batch statistics use var_mean).
    A running batch update uses the unbiased variance, as torch's BatchNorm.
    """
    n, c = x3.shape[:2]
    partition = Partition(cfg.partition, cfg.groups)
    if use_running:
        scale = torch.rsqrt(running_var.to(x3.dtype) + cfg.eps)
        h3 = torch.sub(x3, running_mean.to(x3.dtype).view(1, c, 1), out=scratch(3, x3)).mul_(scale.view(1, c, 1))
        h, groups = partition.group(h3, cfg.tokens)
        return h, groups, (scale,)
    if cfg.partition != "batch":  # rows: torch's native kernels (exact zeros for constant rows, fast)
        g = cfg.native_groups(c)
        if g is None:  # per-token rows over C, native_layer_norm's (N, S, 1) statistics
            h, mean, rstd = torch.native_layer_norm(x3.transpose(1, 2), [c], None, None, cfg.eps)
            h3 = h.transpose(1, 2)
        else:
            # contiguous: torch 2.11's CUDA/CPU group norm refuses a channels-last (N, C, S) view
            # (seen on an H100 with torch 2.11); later versions copy it themselves
            h3, mean, rstd = torch.native_group_norm(x3.contiguous(), None, None, n, c, x3.shape[2], g, cfg.eps)
        h, groups = partition.group(h3, cfg.tokens)
        return h, groups, (mean, rstd)
    g, groups = partition.group(x3, cfg.tokens)  # batch: Welford, so a constant channel gives h = 0 exactly
    var, mean = torch.var_mean(g, dim=groups.dims, unbiased=False, keepdim=True)
    rstd = torch.rsqrt(var + cfg.eps)
    h = torch.sub(g, mean, out=scratch(3, g)).mul_(rstd)  # (g - mean) first: exactly 0 for a constant
    if running_mean is not None and cfg.training:
        count = groups.count
        running_mean.lerp_(groups.channel_stat(mean).to(running_mean), cfg.momentum)
        unbiased = groups.channel_stat(var) * (count / max(count - 1, 1))
        running_var.lerp_(unbiased.to(running_var), cfg.momentum)
    return h, groups, (groups.channel_stat(mean), groups.channel_stat(rstd))


def _standardize_backward(gh3: Tensor, x3: Tensor, cfg: FusedConfig, stats: tuple[Tensor, ...]) -> Tensor:
    n, c, s = x3.shape
    mask = [True, False, False]
    if len(stats) == 1:
        return gh3 * stats[0].view(1, c, 1)
    mean, rstd = stats
    if cfg.partition == "batch":
        return torch.ops.aten.native_batch_norm_backward(gh3, x3, None, None, None, mean, rstd, True,
                                                         cfg.eps, mask)[0]
    g = cfg.native_groups(c)
    if g is None:
        gx = torch.ops.aten.native_layer_norm_backward(gh3.transpose(1, 2), x3.transpose(1, 2), [c], mean,
                                                       rstd, None, None, mask)[0]
        return gx.transpose(1, 2)
    return torch.ops.aten.native_group_norm_backward(gh3.contiguous(), x3.contiguous(), mean, rstd, None, n, c, s,
                                                     g, mask)[0]


# -- lambda_hat ---------------------------------------------------------------------------------


@dataclass
class _Newton:
    """Per-group quantities of the Newton step that backward reuses."""

    lam: Tensor
    in_range: Tensor  # 1 where the clamp let the gradient through
    g1: Tensor
    den: Tensor
    dvar: Tensor
    mean_d: Tensor
    count: int
    d: Tensor  # (1 + a) L - a per element (scratch)
    q: Tensor  # (1 + a) L^2 - 2 d per element (scratch)


def _newton(h: Tensor, groups: Groups, cfg: FusedConfig) -> tuple[_Newton, Tensor, Tensor, Tensor, Tensor]:
    """lambda_hat per group, |h|, sign(h) * log1p(|h|), log1p(|h|) and a fresh buffer for x.

    The Newton step's per-element terms d and q stay in `_Newton` (scratch) for dlam/dh.
    """
    dims, n = groups.dims, groups.count
    a = torch.abs(h, out=scratch(0, h))
    log1p_a = torch.log1p(a, out=scratch(1, h))
    terms = scratch_stack(STACK_SLOT, h, 5)  # d, h d, d^2, h d2, sign(h) L: one reduction for the means
    signed_log = torch.copysign(log1p_a, h, out=terms[4])
    p = torch.addcmul(log1p_a, a, log1p_a, out=borrow(h))  # (1 + a) L; its buffer becomes x
    d = torch.sub(p, a, out=terms[0])  # (1 + a) L - a
    torch.mul(h, d, out=terms[1])
    torch.square(d, out=terms[2])
    q = torch.mul(p, log1p_a, out=scratch(4, h))
    q.sub_(d, alpha=2)  # (1 + a) L^2 - 2 d
    torch.mul(q, a, out=terms[3])  # a q = h d2
    mean_d, mean_hd, mean_dd, mean_aq, s1 = terms.sum(tuple(k + 1 for k in dims), keepdim=True).div_(n)
    dvar = 2 * mean_hd
    d2var = 2 * (mean_aq + mean_dd - mean_d * mean_d)
    g1 = 0.5 * dvar - s1
    den = 0.5 * (d2var - dvar * dvar) + math.sqrt(cfg.eps)
    raw = 1 - cfg.alpha * g1 / den
    lam = _clamp(raw, cfg)
    in_range = (lam == raw).to(raw.dtype)
    newton = _Newton(lam, in_range, g1, den, dvar, mean_d, n, terms[0], q)
    return newton, a, signed_log, log1p_a, p


def _clamp(lam: Tensor, cfg: FusedConfig) -> Tensor:
    if cfg.lambda_min is None and cfg.lambda_max is None:
        return lam
    return lam.clamp(min=cfg.lambda_min, max=cfg.lambda_max)


def _inverse_mu(lam: Tensor) -> tuple[Tensor, Tensor]:
    """(c0, c1) with sign(h) / mu = c0 * sign(h) + c1, mu = lam (h >= 0) or 2 - lam (h < 0)."""
    inv_pos = 1 / torch.where(lam == 0, _TINY_MU, lam)
    inv_neg = 1 / torch.where(lam == 2, _TINY_MU, 2 - lam)
    return (inv_pos + inv_neg) / 2, (inv_pos - inv_neg) / 2


def _lambda_jacobian(newton: _Newton, a: Tensor, log1p_a: Tensor, signed_log: Tensor, sign: Tensor,
                     inverse_u: Tensor, cfg: FusedConfig) -> Tensor:
    """dlam/dh per element (a fresh tensor); backward scales it by dLoss/dlam, one value per group.

    With w = d + a L:  dlam/dh = c1 w + c2 (sign q + sL (w + d - 2 mean d)) + c3 / (1 + a).
    Consumes `a`, d and q (scratch).
    """
    n, alpha, den = newton.count, cfg.alpha, newton.den
    c1 = (2 / n) * (-0.5 * alpha / den - newton.dvar * alpha * newton.g1 / (den * den))
    c2 = alpha * newton.g1 / (n * den * den)
    c3 = alpha / (n * den)
    jac = torch.mul(a, log1p_a, out=borrow(a))
    jac.add_(newton.d)  # w
    r = newton.d.add_(jac).sub_(2 * newton.mean_d).mul_(signed_log)  # sL (w + d - 2 mean d)
    r.addcmul_(newton.q, sign)
    return jac.mul_(c1).addcmul_(r, c2).addcmul_(inverse_u, c3)


# -- noise and affine ---------------------------------------------------------------------------


def _add_noise(x: Tensor, x3: Tensor, groups: Groups, cfg: FusedConfig) -> Tensor:
    """x + xi * s * z with s = mean |x - mean x| per group (a constant for autograd); x itself if off."""
    if not (cfg.training and cfg.noise):
        return x
    dims, n = groups.dims, groups.count
    centred = torch.sub(x, x.sum(dims, keepdim=True).div_(n), out=scratch(0, x))
    s = centred.abs_().sum(dims, keepdim=True).div_(n)  # (vector_norm with ord 1 is 2x slower)
    n3, c3, s3 = x3.shape
    buffer = scratch_contiguous(5, (n3, s3, c3) if cfg.tokens else (n3, c3, s3), x3)
    z = standard_normal_like(x3, cfg.tokens, buffer).reshape(x.shape)
    return x.addcmul_(z, s * cfg.noise)


def _affine(y3: Tensor, weight: Tensor | None, bias: Tensor | None) -> Tensor:
    """gamma * y + beta: a fresh tensor in y3's memory layout.

    A channels-last (N, C, S) view is computed on its (N, S, C) memory; given the (1, C, 1) operands
    first, torch would write a contiguous (N, C, S) result instead (a transposing pass, about 4x the
    time), and the layer and the incoming gradient would then carry the wrong layout.
    """
    if y3.stride(1) == 1 and y3.shape[2] > 1:
        return affine_on(y3.transpose(1, 2), weight, bias, (1, 1, -1)).transpose(1, 2)
    return affine_on(y3, weight, bias, (1, -1, 1))


def affine_on(y: Tensor, weight: Tensor | None, bias: Tensor | None, shape: tuple[int, ...]) -> Tensor:
    if weight is not None and bias is not None:
        return torch.addcmul(bias.view(shape), y, weight.view(shape))
    if weight is not None:
        return y * weight.view(shape)
    if bias is not None:
        return y + bias.view(shape)
    return y.clone()
