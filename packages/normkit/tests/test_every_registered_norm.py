"""Every registered norm (whatever plugin added it, now or later) pickles, takes an empty batch in
eval, and compiles with torch.compile matching eager; models from normkit.convert pickle too."""

from __future__ import annotations

import copy
import io
import pickle

import pytest
import torch
from torch import nn

import normkit
from normkit.testing import check_norm

C = 32  # divisible by gn's default 32 groups, small enough for a quick run
SHAPES = [(3, C, 3, 3)]  # each plugin's own conformance tests cover the other ranks and layouts


def _norms() -> list[str]:
    return [e["name"] for e in normkit.available() if e["kind"] == "norm"]


def test_the_list_covers_the_built_in_norms() -> None:
    assert {"bn", "ln", "in", "gn", "rms", "none", "bnn", "gnn", "ibn-t"} <= set(_norms())


@pytest.mark.parametrize("name", _norms())
def test_every_norm_pickles_and_takes_an_empty_batch(name: str) -> None:
    check_norm(name, C, shapes=SHAPES, only=["pickle", "empty_batch"])


@pytest.mark.parametrize("name", _norms())
def test_every_norm_compiles_and_matches_eager(name: str) -> None:
    check_norm(name, C, shapes=SHAPES, only=["compile"])  # backend aot_eager: train/eval, forward/backward


def _compile_matches_eager(spec: str, activation: str | None = None) -> None:
    import torch._dynamo
    import torch._inductor.config

    for training in (True, False):
        torch._dynamo.reset()
        torch.manual_seed(0)
        eager = normkit.build(spec, C, activation=activation)
        compiled_layer = copy.deepcopy(eager)
        eager.train(training)
        compiled_layer.train(training)
        compiled = torch.compile(compiled_layer, backend="inductor", fullgraph=True)
        x = torch.randn(4, C, 5, 5)
        xe, xc = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
        with torch._inductor.config.patch(fallback_random=True):  # the same noise as eager
            torch.manual_seed(1)
            yc = compiled(xc)
            yc.square().sum().backward()
        torch.manual_seed(1)
        ye = eager(xe)
        ye.square().sum().backward()
        torch.testing.assert_close(yc, ye, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(xc.grad, xe.grad, rtol=1e-4, atol=1e-4)
    torch._dynamo.reset()


@pytest.mark.parametrize(("spec", "activation"), [("rms", None), ("gn(groups=2)+pn", "relu")])
def test_inductor_compiles_a_few_norms(spec: str, activation: str | None) -> None:
    _compile_matches_eager(spec, activation)


@pytest.mark.slow
@pytest.mark.parametrize("name", _norms())
def test_inductor_compiles_every_norm(name: str) -> None:
    """Full inductor for each norm at its defaults (bnn's compile alone takes ~30 s on CPU); C channels
    take every grouped norm's default of 32 groups (gn, gnn, the zoo's bgn and evonorm-s0)."""
    _compile_matches_eager(name)


def _model() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 3))


@pytest.mark.parametrize("spec", ["bnn", "ibn-t", "gn(groups=2)+pn", "rms"])
def test_converted_models_pickle_whole(spec: str) -> None:
    model = _model()
    assert len(normkit.convert(model, spec)) == 2
    x = torch.randn(2, 3, 6, 6)
    model(x)
    model.eval()
    ref = model(x)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    for other in (torch.load(buffer, weights_only=False), pickle.loads(pickle.dumps(model)), copy.deepcopy(model)):
        torch.testing.assert_close(other(x), ref, rtol=0, atol=0)


@pytest.mark.parametrize("spec", ["in", "gn(groups=8)", "inn", "in(affine=false)"])
@pytest.mark.parametrize("shape", [(1, 8), (1, 8, 1), (5, 8)])
def test_one_value_per_group_works_in_train_and_eval_for_any_batch_size(spec: str, shape: tuple) -> None:
    """`in` on (N, C) has one value per group: the output is the bias, for N=1 too (no 'when training' error)."""
    layer = normkit.build(spec, 8)
    for training in (True, False):
        layer.train(training)
        x = torch.randn(shape, requires_grad=True)
        y = layer(x)
        expected = layer.bias.detach().view(1, 8, *([1] * (len(shape) - 2))).expand(shape) \
            if layer.bias is not None else torch.zeros(shape)
        torch.testing.assert_close(y.detach(), expected, rtol=0, atol=1e-4)
        y.sum().backward()
        assert torch.isfinite(x.grad).all()
