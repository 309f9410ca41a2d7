"""The conformance suite every norm passes, built-in or third-party, in one call.

    from normkit.testing import check_norm
    def test_my_norm_conforms():
        check_norm("mynorm(alpha=2)", num_channels=8)

Each check raises AssertionError naming the check, the spec and what differed. Checks run on
small CPU tensors (a second or two per spec); `skip=("channels_last",)` leaves checks out.
"""

from __future__ import annotations

import copy
import io
import pickle
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from normkit.build import build
from normkit.errors import NormShapeError, first_line
from normkit.plugins import temporary_plugin
from normkit.spec import parse

__all__ = ["CHECKS", "autograd_node_names", "check_norm", "temporary_plugin"]


def autograd_node_names(t: Tensor) -> set[str]:
    """The names of the autograd nodes that produced `t` (e.g. "NativeBatchNormBackward0"): how a test
    shows which path a layer took (a fused function is one node; the reference path is many)."""
    seen, todo = {}, [t.grad_fn]
    while todo:
        node = todo.pop()
        if node is not None and id(node) not in seen:
            seen[id(node)] = node.name()
            todo.extend(next_node for next_node, _ in node.next_functions)
    return set(seen.values())

class _Case:
    """One spec under test: how to build it and which inputs it takes."""

    def __init__(self, spec: str, num_channels: int, channel_dim: int, activation: str | None,
                 build_kwargs: dict[str, Any], shapes: Sequence[tuple[int, ...]] | None,
                 gradcheck_overrides: dict[str, Any] | None = None) -> None:
        self.spec, self.c, self.channel_dim = spec, num_channels, channel_dim
        self.activation, self.build_kwargs = activation, build_kwargs
        self.gradcheck_overrides = gradcheck_overrides or {}
        if shapes is None:
            c = num_channels
            shapes = [(4, c, 5, 5), (4, c, 7), (6, c)] if channel_dim == 1 else [(4, 6, c), (3, 2, 3, c), (6, c)]
        self.shapes = [tuple(s) for s in shapes]

    def build(self, seed: int = 0, **extra: Any) -> nn.Module:
        torch.manual_seed(seed)
        layer = build(self.spec, self.c, channel_dim=self.channel_dim, activation=self.activation,
                      **{**self.build_kwargs, **extra})
        _perturb_parameters(layer, seed)
        return layer

    def input(self, shape: tuple[int, ...] | None = None, seed: int = 1, dtype=torch.float32) -> Tensor:
        g = torch.Generator().manual_seed(seed)
        shape = shape or self.shapes[0]
        return (torch.randn(shape, generator=g, dtype=torch.float64) * 1.5 + 0.3).to(dtype)

    def fail(self, check: str, message: str) -> AssertionError:
        return AssertionError(f"[{check}] {self.spec!r}: {message}")


def _perturb_parameters(layer: nn.Module, seed: int) -> None:
    """Move parameters off their init so checks see a general affine, not the identity."""
    g = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for p in layer.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g, dtype=torch.float64).to(p.dtype))


def _run(layer: nn.Module, x: Tensor, seed: int = 0) -> Tensor:
    torch.manual_seed(seed)
    return layer(x)


def _finite(case: _Case, check: str, t: Tensor, what: str) -> None:
    if not torch.isfinite(t).all():
        bad = (~torch.isfinite(t)).sum().item()
        raise case.fail(check, f"{what} has {bad} non-finite values")


def _close(case: _Case, check: str, a: Tensor, b: Tensor, what: str, rtol: float = 1e-5,
           atol: float = 1e-5) -> None:
    if a.shape != b.shape:
        raise case.fail(check, f"{what}: shapes differ {tuple(a.shape)} vs {tuple(b.shape)}")
    if not torch.allclose(a.double(), b.double(), rtol=rtol, atol=atol):
        diff = (a.double() - b.double()).abs().max().item()
        raise case.fail(check, f"{what}: max abs difference {diff:.3g} (rtol={rtol}, atol={atol})")


# -- the checks -----------------------------------------------------------------------------


def check_shapes(case: _Case) -> None:
    """Output shape and dtype equal the input's, for every supported input rank, train and eval."""
    layer = case.build()
    for shape in case.shapes:
        for mode in (True, False):
            layer.train(mode)
            x = case.input(shape)
            y = _run(layer, x)
            if y.shape != x.shape or y.dtype != x.dtype:
                raise case.fail("shapes", f"input {tuple(x.shape)} {x.dtype} gave {tuple(y.shape)} {y.dtype}")
            _finite(case, "shapes", y, f"output for {shape} ({'train' if mode else 'eval'})")


def check_train_eval(case: _Case) -> None:
    """Eval is deterministic and independent of the batch's other samples' order."""
    layer = case.build()
    x = case.input()
    for _ in range(3):
        _run(layer, case.input(seed=7))
    layer.eval()
    y1, y2 = layer(x), layer(x)
    _close(case, "train_eval", y1, y2, "eval output twice", 0, 0)
    perm = torch.arange(x.shape[0] - 1, -1, -1)
    if not _batch_coupled_in_eval(layer):
        _close(case, "train_eval", layer(x[perm]), y1[perm], "eval output of a permuted batch")


def _batch_coupled_in_eval(layer: nn.Module) -> bool:
    return bool(getattr(layer, "batch_coupled_in_eval", False))


def check_autocast(case: _Case) -> None:
    """fp16/bf16 inputs and autocast keep statistics in fp32: close to the fp32 result, finite."""
    layer = case.build()
    for _ in range(2):
        _run(layer, case.input(seed=5))
    layer.eval()
    x = case.input()
    ref = layer(x)
    scale = ref.abs().max().item() + 1.0
    for dtype in (torch.bfloat16, torch.float16):
        y = layer(x.to(dtype))
        if y.dtype != dtype:
            raise case.fail("autocast", f"{dtype} input gave {y.dtype} output")
        _finite(case, "autocast", y, f"{dtype} output")
        tol = (0.05 if dtype == torch.bfloat16 else 0.01) * scale
        _close(case, "autocast", y.float(), ref, f"{dtype} input vs fp32", rtol=0, atol=tol)
        with torch.autocast("cpu", dtype=dtype):
            y = layer(x)
        _finite(case, "autocast", y, f"output under autocast({dtype})")
        _close(case, "autocast", y.float(), ref, f"autocast({dtype}) vs fp32", rtol=0, atol=tol)


def check_state_dict(case: _Case) -> None:
    """state_dict round-trips into a fresh layer: same keys, same eval outputs, same training step."""
    layer = case.build(seed=0)
    for i in range(3):
        _run(layer, case.input(seed=10 + i))
    state = copy.deepcopy(layer.state_dict())
    fresh = case.build(seed=99)
    missing, unexpected = fresh.load_state_dict(state, strict=True)
    if missing or unexpected:
        raise case.fail("state_dict", f"missing {missing}, unexpected {unexpected}")
    layer.eval()
    fresh.eval()
    x = case.input()
    _close(case, "state_dict", fresh(x), layer(x), "eval output after load", 0, 0)
    layer.train()
    fresh.train()
    _close(case, "state_dict", _run(fresh, x), _run(layer, x), "train output after load", 0, 0)


def check_gradients(case: _Case) -> None:
    """Input and parameter gradients match float64 finite differences (train and eval mode)."""
    shape = tuple(min(d, 3) if i != (1 if case.channel_dim == 1 else len(case.shapes[0]) - 1) else d
                  for i, d in enumerate(case.shapes[0]))
    for mode in (True, False):
        layer = case.build(**case.gradcheck_overrides).double()
        for _ in range(2):
            _run(layer, case.input(shape, seed=3, dtype=torch.float64))
        layer.train(mode)
        names = [n for n, p in layer.named_parameters() if p.requires_grad]
        params = [layer.get_parameter(n).detach().clone().requires_grad_(True) for n in names]
        x = case.input(shape, dtype=torch.float64).requires_grad_(True)
        buffers = {n: b.clone() for n, b in layer.named_buffers()}

        def fn(x: Tensor, *ps: Tensor, layer: nn.Module = layer) -> Tensor:
            state = {**dict(zip(names, ps, strict=True)), **{n: b.clone() for n, b in buffers.items()}}
            torch.manual_seed(0)
            return torch.func.functional_call(layer, state, (x,))

        try:
            torch.autograd.gradcheck(fn, (x, *params), eps=1e-6, atol=1e-5, rtol=1e-3, fast_mode=True)
        except Exception as exc:
            raise case.fail("gradients", f"{'train' if mode else 'eval'} mode: {exc}") from None


def check_channels_last(case: _Case) -> None:
    """A channels_last (NHWC-strided) 4D input gives the same values and gradients as contiguous."""
    shape = next((s for s in case.shapes if len(s) == 4), None)
    if shape is None or case.channel_dim != 1:
        return
    layer = case.build()
    x = case.input(shape)
    xc = x.clone().requires_grad_(True)
    xl = x.clone().to(memory_format=torch.channels_last).requires_grad_(True)
    yc, yl = _run(copy.deepcopy(layer), xc), _run(layer, xl)
    _close(case, "channels_last", yl, yc, "output")
    g = case.input(shape, seed=4)
    yc.backward(g)
    yl.backward(g)
    _close(case, "channels_last", xl.grad, xc.grad, "input gradient")


def check_edge_cases(case: _Case) -> None:
    """Constant channels, a batch of one, and huge outliers give finite outputs and gradients."""
    layer = case.build()
    shape = case.shapes[0]
    cdim = 1 if case.channel_dim == 1 else len(shape) - 1
    x = case.input(shape)
    x.select(cdim, 0).fill_(3.0)
    outlier = case.input(shape)
    outlier.view(-1)[0] = 1e4
    inputs = {"constant channel": x, "constant input": torch.full(shape, 2.5), "outlier 1e4": outlier,
              "zeros": torch.zeros(shape)}
    for mode in (True, False):
        layer.train(mode)
        for what, inp in inputs.items():
            inp = inp.clone().requires_grad_(True)
            y = _run(layer, inp)
            _finite(case, "edge_cases", y, f"{what} output ({'train' if mode else 'eval'})")
            y.backward(torch.ones_like(y))
            _finite(case, "edge_cases", inp.grad, f"{what} input gradient ({'train' if mode else 'eval'})")
        one = case.input((1, *shape[1:]))
        try:
            y = _run(layer, one)
        except NormShapeError:
            if not mode:
                raise case.fail("edge_cases", "a batch of one fails in eval mode") from None
            continue  # batch statistics of a single value per channel are undefined in training
        _finite(case, "edge_cases", y, f"batch of one output ({'train' if mode else 'eval'})")


def check_determinism(case: _Case) -> None:
    """Same seed, same output (including any training noise); two fresh builds agree."""
    a, b = case.build(seed=3), case.build(seed=3)
    x = case.input()
    _close(case, "determinism", _run(a, x, seed=11), _run(b, x, seed=11), "train output", 0, 0)
    a.eval()
    b.eval()
    _close(case, "determinism", a(x), b(x), "eval output", 0, 0)


def check_empty_batch(case: _Case) -> None:
    """An empty batch (N=0) in eval gives an empty output of the same shape and dtype, and backward
    runs; in training it either works the same way or raises NormShapeError (batch statistics of
    no values are undefined)."""
    for shape in case.shapes:
        empty = (0, *shape[1:])
        for mode in (False, True):
            layer = case.build()
            for _ in range(2):
                _run(layer, case.input(shape, seed=6))
            layer.train(mode)
            x = torch.zeros(empty, requires_grad=True)
            try:
                y = _run(layer, x)
            except NormShapeError:
                if not mode:
                    raise case.fail("empty_batch", f"an empty batch {empty} fails in eval mode") from None
                continue
            if y.shape != x.shape or y.dtype != x.dtype:
                raise case.fail("empty_batch", f"input {empty} gave {tuple(y.shape)} {y.dtype}")
            if y.requires_grad:
                y.sum().backward()


def check_pickle(case: _Case) -> None:
    """The whole module survives torch.save/torch.load, pickle and copy.deepcopy, outputs unchanged
    (so it can be checkpointed whole and sent to worker processes)."""
    layer = case.build()
    for i in range(2):
        _run(layer, case.input(seed=20 + i))
    layer.eval()
    x = case.input()
    ref = layer(x)
    buffer = io.BytesIO()
    try:
        torch.save(layer, buffer)
        buffer.seek(0)
        copies = {"torch.save/load": torch.load(buffer, weights_only=False),
                  "pickle": pickle.loads(pickle.dumps(layer)), "deepcopy": copy.deepcopy(layer)}
    except Exception as exc:
        raise case.fail("pickle", f"the module does not pickle ({first_line(exc)}); keep lambdas and "
                                  "closures out of modules: use module-level functions and "
                                  "functools.partial") from None
    for how, other in copies.items():
        _close(case, "pickle", other(x), ref, f"eval output after {how}", 0, 0)


def check_compile(case: _Case) -> None:
    """torch.compile (backend aot_eager: dynamo + autograd functionalization, no codegen) matches
    eager in training and eval, forward and backward, with the same seed."""
    import torch._dynamo

    shape = case.shapes[0]
    for mode in (True, False):
        torch._dynamo.reset()
        eager, compiled_layer = case.build(), case.build()
        eager.train(mode)
        compiled_layer.train(mode)
        compiled = torch.compile(compiled_layer, backend="aot_eager")
        x = case.input(shape)
        xe, xc = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
        what = "train" if mode else "eval"
        try:
            yc = _run(compiled, xc, seed=5)
            yc.square().sum().backward()
        except Exception as exc:
            raise case.fail("compile", f"torch.compile fails in {what} mode: {first_line(exc)}") from None
        ye = _run(eager, xe, seed=5)
        ye.square().sum().backward()
        _close(case, "compile", yc, ye, f"{what} output", rtol=1e-4, atol=1e-5)
        _close(case, "compile", xc.grad, xe.grad, f"{what} input gradient", rtol=1e-4, atol=1e-4)
    torch._dynamo.reset()


CHECKS: dict[str, Callable[[_Case], None]] = {
    "shapes": check_shapes,
    "train_eval": check_train_eval,
    "autocast": check_autocast,
    "state_dict": check_state_dict,
    "gradients": check_gradients,
    "channels_last": check_channels_last,
    "edge_cases": check_edge_cases,
    "determinism": check_determinism,
    "empty_batch": check_empty_batch,
    "pickle": check_pickle,
    "compile": check_compile,
}


def check_norm(spec: str, num_channels: int = 8, *, channel_dim: int = 1, activation: str | None = None,
               shapes: Sequence[tuple[int, ...]] | None = None, skip: Sequence[str] = (),
               only: Sequence[str] | None = None, gradcheck_overrides: dict[str, Any] | None = None,
               **build_kwargs: Any) -> None:
    """Run the conformance checks on the layer `spec` builds; raise AssertionError on the first failure.

    shapes: input shapes to try (default: 4D, 3D and 2D for channel_dim=1; tokens for -1).
    skip / only: names from CHECKS to leave out / to run alone.
    gradcheck_overrides: extra parameter overrides for the gradient check only, for terms that are
        gradient-free by design (e.g. `{"noise": 0}` for the normality norm, whose noise scale is
        detached, so finite differences cannot match autograd while it is on).
    build_kwargs: passed to normkit.build (parameter overrides).
    """
    unknown = (set(skip) | set(only or ())) - set(CHECKS)
    if unknown:
        raise ValueError(f"unknown checks {sorted(unknown)}; known: {', '.join(CHECKS)}")
    parse(spec)  # a spec that does not parse is the caller's SpecError, not a failed check
    case = _Case(spec, num_channels, channel_dim, activation, build_kwargs, shapes, gradcheck_overrides)
    for name, check in CHECKS.items():
        if name in skip or (only is not None and name not in only):
            continue
        try:
            check(case)
        except AssertionError:
            raise
        except Exception as exc:  # a norm that raises is a failed check, named like the others
            raise case.fail(name, f"raised {first_line(exc)}") from exc
