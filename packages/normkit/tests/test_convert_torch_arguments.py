"""convert() on torch's own norm modules, over every constructor argument and input they accept.

Each case builds the torch module with random affine and running statistics (some parameters
frozen), converts a copy to the same kind and compares with torch: outputs and gradients (input
and parameters) over two training steps, the running statistics they leave, eval outputs, which
parameters train, and strict checkpoints both ways. What normkit cannot compute exactly is refused.
"""

from __future__ import annotations

import copy
import itertools

import pytest
import torch
from torch import nn

import normkit

C = 4


def _affine_options(cls: type) -> list[dict]:
    key = "elementwise_affine" if cls in (nn.LayerNorm, nn.RMSNorm) else "affine"
    options = [{key: True}, {key: False}]
    if cls is not nn.RMSNorm:
        options.append({key: True, "bias": False})
    return options


def _batch_cases() -> list:
    shapes = {nn.BatchNorm1d: [(5, C), (3, C, 6)], nn.BatchNorm2d: [(3, C, 3, 3)],
              nn.BatchNorm3d: [(2, C, 2, 3, 2)], nn.SyncBatchNorm: [(3, C, 5), (3, C, 2, 3)]}
    cases = []
    for cls, cls_shapes in shapes.items():
        for affine, stats, momentum, shape in itertools.product(
                _affine_options(cls), (True, False), (0.1, None), cls_shapes):
            kwargs = {**affine, "track_running_stats": stats, "momentum": momentum, "eps": 1e-3}
            cases.append((cls, (C,), kwargs, shape, "bn"))
        cases.append((cls, (C,), {}, (0, *cls_shapes[0][1:]), "bn"))  # an empty batch
    return cases


def _other_cases() -> list:
    cases = []
    for groups, affine, shape in itertools.product((1, 2, 4), _affine_options(nn.GroupNorm),
                                                   [(3, C), (3, C, 5), (2, C, 3, 3)]):
        cases.append((nn.GroupNorm, (groups, C), {**affine, "eps": 1e-4}, shape, f"gn(groups={groups})"))
    for affine, shape in itertools.product(_affine_options(nn.LayerNorm), [(3, C), (2, 5, C), (2, 3, 2, C)]):
        cases.append((nn.LayerNorm, (C,), {**affine, "eps": 1e-4}, shape, "ln"))
    ranks = {nn.InstanceNorm1d: (3, C, 5), nn.InstanceNorm2d: (2, C, 3, 3), nn.InstanceNorm3d: (2, C, 2, 2, 3)}
    for (cls, shape), affine in itertools.product(ranks.items(), _affine_options(nn.InstanceNorm1d)):
        for batched in (shape, shape[1:]):  # torch also takes one sample without its batch dim
            cases.append((cls, (C,), {**affine, "eps": 1e-4}, batched, "in"))
    for eps, affine, shape in itertools.product((None, 1e-5), _affine_options(nn.RMSNorm), [(3, C), (2, 5, C)]):
        cases.append((nn.RMSNorm, (C,), {**affine, "eps": eps}, shape, "rms"))
    return cases


def _case_id(case: tuple) -> str:
    cls, args, kwargs, shape, _ = case
    settings = ",".join(f"{k}={v}" for k, v in kwargs.items())
    return f"{cls.__name__}{args}-{settings}-{'x'.join(map(str, shape))}"


def _with_dtypes(cases: list) -> list:
    """float32 for every case; float64 too where the dtype changes what torch computes (RMSNorm's
    eps=None) and for one class per kind of statistics."""
    out = []
    for case in cases:
        dtypes = [torch.float32]
        if case[0] in (nn.RMSNorm, nn.BatchNorm2d, nn.GroupNorm):
            dtypes.append(torch.float64)
        out += [pytest.param(case, dtype, id=f"{_case_id(case)}-{str(dtype)[6:]}") for dtype in dtypes]
    return out


CASES = _with_dtypes(_batch_cases() + _other_cases())


def _randomized(module: nn.Module, generator: torch.Generator, dtype: torch.dtype) -> nn.Module:
    module = module.to(dtype)
    with torch.no_grad():
        for name, tensor in [*module.named_parameters(), *module.named_buffers()]:
            if name == "running_var":
                tensor.copy_(0.5 + torch.rand(tensor.shape, generator=generator))
            elif name == "num_batches_tracked":
                tensor.fill_(3)
            elif tensor.is_floating_point():
                tensor.copy_(torch.randn(tensor.shape, generator=generator) * 0.5 + (name == "weight"))
    bias = getattr(module, "bias", None)
    if isinstance(bias, nn.Parameter):
        bias.requires_grad_(False)  # a frozen parameter stays frozen
    return module


def _step(model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, list]:
    x = x.clone().requires_grad_(True)
    out = model(x)
    (out * torch.linspace(-1, 2, out.numel(), dtype=out.dtype).view(out.shape)).sum().backward()
    grads = [p.grad.clone() if p.grad is not None else None for p in model.parameters()]
    model.zero_grad()
    return out.detach(), x.grad, grads


@pytest.mark.parametrize(("case", "dtype"), CASES)
def test_same_kind_conversion_equals_torch_for_every_argument(case: tuple, dtype: torch.dtype) -> None:
    cls, args, kwargs, shape, spec = case
    g = torch.Generator().manual_seed(len(_case_id(case)))
    source = nn.Sequential(_randomized(cls(*args, **kwargs), g, dtype))
    converted = copy.deepcopy(source)
    summary = normkit.convert(converted, spec)
    assert len(summary) == 1 and isinstance(converted[0], normkit.NormLayer)
    assert [(n, p.requires_grad) for n, p in converted.named_parameters()] == \
        [(n, p.requires_grad) for n, p in source.named_parameters()]
    assert list(converted.state_dict()) == list(source.state_dict())
    tol = {"atol": 1e-4, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 1e-10, "rtol": 1e-10}
    for mode in ("train", "train", "eval"):
        source.train(mode == "train")
        converted.train(mode == "train")
        x = torch.randn(shape, generator=g, dtype=dtype) * 2 + 0.5
        for got, want in zip(_step(converted, x), _step(source, x), strict=True):
            if isinstance(want, list):
                for gp, wp in zip(got, want, strict=True):
                    assert (gp is None) == (wp is None)
                    if wp is not None:
                        torch.testing.assert_close(gp, wp, **tol)
            else:
                torch.testing.assert_close(got, want, **tol)
        for (name, got), (_, want) in zip(converted.state_dict().items(), source.state_dict().items(), strict=True):
            torch.testing.assert_close(got, want, **tol, msg=f"{name} after a {mode} step")
    converted.load_state_dict(source.state_dict(), strict=True)
    source.load_state_dict(converted.state_dict(), strict=True)


@pytest.mark.parametrize(("module", "why"), [
    (nn.InstanceNorm2d(C, track_running_stats=True), r"InstanceNorm2d\(track_running_stats=True\)"),
    (nn.LayerNorm([C, 3]), r"LayerNorm over \(4, 3\)"),
    (nn.RMSNorm([C, 3]), r"RMSNorm over \(4, 3\)"),
])
def test_arguments_normkit_cannot_compute_exactly_are_refused(module: nn.Module, why: str) -> None:
    model = nn.Sequential(nn.Conv2d(3, C, 1), module)
    with pytest.raises(normkit.SpecError, match=f"cannot convert 1 \\({why}") as err:
        normkit.convert(model, "in")
    assert "\n" not in str(err.value) and model[1] is module


def test_forward_hooks_and_pre_hooks_are_carried_over_in_order() -> None:
    calls = []
    source = nn.Sequential(nn.InstanceNorm1d(C, affine=True))
    source[0].register_forward_pre_hook(lambda m, a: calls.append(("pre", a[0].dim())) or (a[0] * 2,))
    handle = source[0].register_forward_hook(lambda m, a, out: calls.append(("post", out.dim())) or out + 1)
    x = torch.randn(C, 6)  # unbatched: the hooks see what they saw on torch's module
    want = source(x)
    converted = copy.deepcopy(source)
    normkit.convert(converted, "in")
    assert calls == [("pre", 2), ("post", 2)]
    torch.testing.assert_close(converted(x), want)
    assert calls[2:] == [("pre", 2), ("post", 2)]
    handle.remove()  # the handle from the source's module removes the hook from the converted one
    converted2 = copy.deepcopy(source)
    normkit.convert(converted2, "in")
    torch.testing.assert_close(converted2(x), want - 1)


def test_hooks_a_new_layer_cannot_keep_are_refused() -> None:
    model = nn.Sequential(nn.BatchNorm1d(C))
    model[0].register_full_backward_hook(lambda m, gi, go: None)
    with pytest.raises(normkit.SpecError, match="cannot convert 0: BatchNorm1d has backward_hooks"):
        normkit.convert(model, "bn")
    assert isinstance(model[0], nn.BatchNorm1d)


def test_a_refused_conversion_leaves_the_hooks_of_every_layer_alone() -> None:
    import timm

    model = nn.Sequential(nn.Conv2d(3, C, 1), timm.layers.LayerNorm2d(C), nn.Sequential(nn.BatchNorm2d(C)))
    model[1].register_forward_hook(lambda m, a, out: out * 2)
    model[1].register_forward_pre_hook(lambda m, a: (a[0] + 1,))
    model[2][0].register_full_backward_hook(lambda m, gi, go: None)  # refused, after model[1] was built
    x = torch.randn(2, 3, 4, C)
    want = model(x)
    with pytest.raises(normkit.SpecError, match="cannot convert 2.0: BatchNorm2d has backward_hooks"):
        normkit.convert(model, "ln")
    assert len(model[1]._forward_hooks) == len(model[1]._forward_pre_hooks) == 1
    torch.testing.assert_close(model(x), want)
    del model[2]
    converted = copy.deepcopy(model)
    normkit.convert(converted, "ln")  # LayerNorm2d: per-position layout hooks inside the carried ones
    torch.testing.assert_close(converted(x), model(x))
