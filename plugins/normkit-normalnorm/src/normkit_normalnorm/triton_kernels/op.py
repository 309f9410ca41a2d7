"""The kernels as `torch.library.triton_op`s with autograd: what torch.compile and torch.export trace.

`normality_forward` returns the output and a small per-group statistics table the backward
reuses; `normality_backward` returns (dx, dweight, dbias). Both are `triton_op`s whose bodies
launch the kernels through `wrap_triton`, so on CUDA torch.compile (AOTAutograd, then Inductor)
sees each kernel launch instead of an opaque call, and torch.export keeps one named op per call
with the body as its fake implementation (shapes and dtypes without running anything). The noise
seed is a one-element int64 tensor the kernels read, so a traced graph draws a fresh seed per call
(None when the call has no noise: nothing is drawn or allocated).

CPU tensors go to a plain (opaque) custom op instead, `normality_forward_cpu` / `..._backward_cpu`:
under `TRITON_INTERPRET=1` it runs the same kernels on the interpreter (whose kernels are not
`JITFunction`s and cannot be captured); otherwise it runs the reference `normality_norm` (the
backward recomputes it under the same seed and differentiates it).
"""

from __future__ import annotations

import os

import torch
from torch import Tensor

from normkit_normalnorm.functional import normality_norm
from normkit_normalnorm.triton_kernels.autograd import kernel_backward, kernel_forward
from normkit_normalnorm.triton_kernels.geometry import LAM, MEAN, NSTAT, VAR, Options, geometry

NAMESPACE = "normkit_normalnorm"


def interpreting() -> bool:
    """True when Triton kernels run on the CPU interpreter (TRITON_INTERPRET set)."""
    return os.environ.get("TRITON_INTERPRET", "").strip().lower() in ("1", "true", "yes", "on")


def runs_kernels(x3: Tensor) -> bool:
    return x3.is_cuda or (x3.device.type == "cpu" and interpreting())


def _on(seed: Tensor | None, x3: Tensor) -> Tensor | None:
    return seed.to(x3.device) if seed is not None else None


def _stat_rows(x3: Tensor, partition: str, groups: int, tokens: bool) -> int:
    """Rows of the statistics table: one per normalization group, on every path."""
    return geometry(x3.shape, partition, groups, tokens).n_groups


# -- forward ------------------------------------------------------------------------------------


@torch.library.triton_op(f"{NAMESPACE}::normality_forward", mutates_args=())
def normality_forward(x3: Tensor, weight: Tensor | None, bias: Tensor | None, running_mean: Tensor | None,
                      running_var: Tensor | None, running_lambda: Tensor | None, seed: Tensor | None,
                      partition: str, groups: int, tokens: bool, training: bool, eps: float, alpha: float,
                      noise: float, lambda_min: float | None, lambda_max: float | None,
                      detach_lambda: bool, out_dtype: torch.dtype | None) -> tuple[Tensor, Tensor]:
    """(output, statistics). Functional (autograd needs that): the caller updates running buffers
    from the statistics' mean/var/lambda columns (`autograd.update_running_from`)."""
    if x3.device.type == "cpu":
        return normality_forward_cpu(x3, weight, bias, running_mean, running_var, running_lambda, seed, partition,
                                     groups, tokens, training, eps, alpha, noise, lambda_min, lambda_max,
                                     detach_lambda, out_dtype)
    geo = geometry(x3.shape, partition, groups, tokens)
    opts = Options(training, eps, alpha, noise, lambda_min, lambda_max, detach_lambda)
    y, stats, _ = kernel_forward(x3, weight, bias, (running_mean, running_var, running_lambda), geo, opts,
                                 _on(seed, x3), out_dtype or x3.dtype, None, traced=True)
    return y, stats


@torch.library.custom_op(f"{NAMESPACE}::normality_forward_cpu", mutates_args=())
def normality_forward_cpu(x3: Tensor, weight: Tensor | None, bias: Tensor | None, running_mean: Tensor | None,
                          running_var: Tensor | None, running_lambda: Tensor | None, seed: Tensor | None,
                          partition: str, groups: int, tokens: bool, training: bool, eps: float, alpha: float,
                          noise: float, lambda_min: float | None, lambda_max: float | None,
                          detach_lambda: bool, out_dtype: torch.dtype | None) -> tuple[Tensor, Tensor]:
    """`normality_forward` on CPU: the interpreted kernels, or the reference."""
    out_dtype = out_dtype or x3.dtype
    running = (running_mean, running_var, running_lambda)
    if runs_kernels(x3):
        geo = geometry(x3.shape, partition, groups, tokens)
        opts = Options(training, eps, alpha, noise, lambda_min, lambda_max, detach_lambda)
        y, stats, _ = kernel_forward(x3, weight, bias, running, geo, opts, seed, out_dtype, None)
        return y, stats
    return _reference_forward(x3, weight, bias, running, seed, out_dtype,
                              {"partition": partition, "groups": groups, "tokens": tokens, "training": training,
                               "eps": eps, "alpha": alpha, "noise": noise, "lambda_min": lambda_min,
                               "lambda_max": lambda_max, "detach_lambda": detach_lambda})


@normality_forward_cpu.register_fake
def _(x3, weight, bias, running_mean, running_var, running_lambda, seed, partition, groups, tokens,
      training, eps, alpha, noise, lambda_min, lambda_max, detach_lambda, out_dtype):
    rows = _stat_rows(x3, partition, groups, tokens)
    return torch.empty_like(x3, dtype=out_dtype or x3.dtype), x3.new_empty(rows, NSTAT, dtype=torch.float32)


def _reference_forward(x3: Tensor, weight: Tensor | None, bias: Tensor | None,
                       running: tuple[Tensor | None, ...], seed: Tensor | None, out_dtype: torch.dtype,
                       kwargs: dict) -> tuple[Tensor, Tensor]:
    """The reference under the seed; for a tracked training batch, the statistics table carries the
    batch mean/var/lambda (read back from buffer copies updated with factor 1); other entries are 0."""
    rm, rv, rl = (t.detach().clone() if t is not None else None for t in running)
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(int(seed) if seed is not None else 0)  # no seed: no noise, nothing drawn
        y = normality_norm(x3, weight, bias, running_mean=rm, running_var=rv, running_lambda=rl, momentum=1.0,
                           **kwargs)
    stats = torch.zeros(_stat_rows(x3, kwargs["partition"], kwargs["groups"], kwargs["tokens"]), NSTAT,
                        dtype=torch.float32, device=x3.device)
    if kwargs["partition"] == "batch" and rm is not None and kwargs["training"]:
        count = x3.shape[0] * x3.shape[2]
        stats[:, MEAN] = rm.float()
        stats[:, VAR] = rv.float() * ((count - 1) / count)
        stats[:, LAM] = rl.float()
    return torch.empty_like(x3, dtype=out_dtype).copy_(y), stats


# -- backward -----------------------------------------------------------------------------------


@torch.library.triton_op(f"{NAMESPACE}::normality_backward", mutates_args=())
def normality_backward(dy: Tensor, x3: Tensor, weight: Tensor | None, bias: Tensor | None,
                       running_mean: Tensor | None, running_var: Tensor | None,
                       running_lambda: Tensor | None, stats: Tensor, seed: Tensor | None, partition: str,
                       groups: int, tokens: bool, training: bool, eps: float, alpha: float, noise: float,
                       lambda_min: float | None, lambda_max: float | None,
                       detach_lambda: bool) -> tuple[Tensor, Tensor, Tensor]:
    """(dx, dweight, dbias); a missing weight or bias gets an empty gradient."""
    if x3.device.type == "cpu":
        return normality_backward_cpu(dy, x3, weight, bias, running_mean, running_var, running_lambda, stats, seed,
                                      partition, groups, tokens, training, eps, alpha, noise, lambda_min,
                                      lambda_max, detach_lambda)
    return _kernel_backward(dy, x3, weight, bias, running_mean, stats, _on(seed, x3), partition, groups,
                            tokens, Options(training, eps, alpha, noise, lambda_min, lambda_max, detach_lambda),
                            traced=True)


def _kernel_backward(dy: Tensor, x3: Tensor, weight: Tensor | None, bias: Tensor | None,
                     running_mean: Tensor | None, stats: Tensor, seed: Tensor | None, partition: str, groups: int,
                     tokens: bool, opts: Options, traced: bool) -> tuple[Tensor, Tensor, Tensor]:
    geo = geometry(x3.shape, partition, groups, tokens)
    use_running = partition == "batch" and running_mean is not None and not opts.training
    dx, dw, db = kernel_backward(dy, x3, weight, bias, stats, geo, opts, use_running, seed, traced)
    # dw and db are views of one buffer; op outputs must not alias each other.
    return (dx, dw.clone() if dw is not None else x3.new_empty(0),
            db.clone() if db is not None else x3.new_empty(0))


@torch.library.custom_op(f"{NAMESPACE}::normality_backward_cpu", mutates_args=())
def normality_backward_cpu(dy: Tensor, x3: Tensor, weight: Tensor | None, bias: Tensor | None,
                           running_mean: Tensor | None, running_var: Tensor | None,
                           running_lambda: Tensor | None, stats: Tensor, seed: Tensor | None, partition: str,
                           groups: int, tokens: bool, training: bool, eps: float, alpha: float, noise: float,
                           lambda_min: float | None, lambda_max: float | None,
                           detach_lambda: bool) -> tuple[Tensor, Tensor, Tensor]:
    """`normality_backward` on CPU: the interpreted kernels, or the reference's gradients."""
    if runs_kernels(x3):
        return _kernel_backward(dy, x3, weight, bias, running_mean, stats, seed, partition, groups, tokens,
                                Options(training, eps, alpha, noise, lambda_min, lambda_max, detach_lambda),
                                traced=False)
    return _reference_backward(dy, x3, weight, bias, (running_mean, running_var, running_lambda), seed,
                               {"partition": partition, "groups": groups, "tokens": tokens, "training": training,
                                "eps": eps, "alpha": alpha, "noise": noise, "lambda_min": lambda_min,
                                "lambda_max": lambda_max, "detach_lambda": detach_lambda})


@normality_backward_cpu.register_fake
def _(dy, x3, weight, bias, running_mean, running_var, running_lambda, stats, seed, partition, groups,
      tokens, training, eps, alpha, noise, lambda_min, lambda_max, detach_lambda):
    def like(p: Tensor | None) -> Tensor:
        return torch.empty_like(p) if p is not None else x3.new_empty(0)

    return torch.empty_like(x3), like(weight), like(bias)


def _reference_backward(dy: Tensor, x3: Tensor, weight: Tensor | None, bias: Tensor | None,
                        running: tuple[Tensor | None, ...], seed: Tensor | None,
                        kwargs: dict) -> tuple[Tensor, Tensor, Tensor]:
    """Differentiate the reference, recomputed under the forward's seed (buffers left untouched)."""
    leaves = [t.detach().requires_grad_() if t is not None else None for t in (x3, weight, bias)]
    with torch.random.fork_rng(devices=[]), torch.enable_grad():
        torch.manual_seed(int(seed) if seed is not None else 0)
        rm, rv, rl = (t.detach().clone() if t is not None else None for t in running)
        y = normality_norm(leaves[0], leaves[1], leaves[2], running_mean=rm, running_var=rv,
                           running_lambda=rl, momentum=0.0, **kwargs)
        wanted = [t for t in leaves if t is not None]
        grads = iter(torch.autograd.grad(y, wanted, dy.to(y.dtype)))
    out = [next(grads) if t is not None else x3.new_empty(0) for t in leaves]
    return torch.empty_like(x3).copy_(out[0]), out[1], out[2]


# -- autograd -----------------------------------------------------------------------------------


def _setup_context(ctx, inputs, output) -> None:
    (x3, weight, bias, running_mean, running_var, running_lambda, seed, partition, groups, tokens,
     training, eps, alpha, noise, lambda_min, lambda_max, detach_lambda, _out_dtype) = inputs
    ctx.save_for_backward(x3, weight, bias, output[1], seed)
    ctx.running = (running_mean, running_var, running_lambda)  # read only by the CPU reference path
    ctx.settings = (partition, groups, tokens, training, eps, alpha, noise, lambda_min, lambda_max,
                    detach_lambda)


def _backward(ctx, grad_out: Tensor, grad_stats: Tensor):
    x3, weight, bias, stats, seed = ctx.saved_tensors
    dx, dw, db = normality_backward(grad_out, x3, weight, bias, *ctx.running, stats, seed, *ctx.settings)
    return (dx, dw if weight is not None else None, db if bias is not None else None,
            None, None, None, None, *([None] * 11))


normality_forward.register_autograd(_backward, setup_context=_setup_context)
