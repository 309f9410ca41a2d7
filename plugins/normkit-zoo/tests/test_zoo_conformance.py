"""Every zoo norm passes normkit's conformance suite, pickles, compiles and takes empty eval batches."""

from __future__ import annotations

import copy
import io

import pytest
import torch

import normkit
from normkit.layer import NormLayer
from normkit.testing import check_norm

# brn's r and d carry no gradient by design, so finite differences only match autograd when the
# clip makes them constant (r_max=1, d_max=0): the same layer is then BN in the gradient check.
SPECS = {
    "brn": {"gradcheck_overrides": {"r_max": 1.0, "d_max": 0.0}},
    "brn(warmup=2)": {"gradcheck_overrides": {"r_max": 1.0, "d_max": 0.0}},
    "bgn(groups=4)": {},
    "sn": {},
    "evonorm-s0(groups=4)": {},
    "evonorm-b0": {},
    "frn": {},
    "dyt": {},
    "derf": {},
    "derf(alpha=0.3,shift=0.1)": {},
    "ln2d": {},
}
TOKENS = ["dyt", "derf", "ln2d", "evonorm-s0(groups=2)", "sn"]


@pytest.mark.parametrize("spec", list(SPECS))
def test_conforms(spec: str) -> None:
    check_norm(spec, num_channels=8, **SPECS[spec])


@pytest.mark.parametrize("spec", TOKENS)
def test_conforms_on_channels_last_tokens(spec: str) -> None:
    check_norm(spec, num_channels=8, channel_dim=-1)


@pytest.mark.parametrize("spec", ["frn", "evonorm-s0(groups=4)", "evonorm-b0"])
def test_conforms_where_the_model_hands_over_an_activation(spec: str) -> None:
    check_norm(spec, num_channels=8, activation="relu", only=("shapes", "state_dict", "edge_cases"))


SMALL = [s.replace("groups=4", "groups=2") for s in SPECS]


@pytest.mark.parametrize("spec", SMALL)
def test_pickles_and_takes_an_empty_eval_batch(spec: str) -> None:
    layer = normkit.build(spec, 4)
    layer(torch.randn(3, 4, 5, 5))
    buf = io.BytesIO()
    torch.save(layer, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    twin = copy.deepcopy(layer)
    for m in (layer, loaded, twin):
        m.eval()
    x = torch.randn(2, 4, 5, 5)
    torch.testing.assert_close(loaded(x), layer(x), rtol=0, atol=0)
    torch.testing.assert_close(twin(x), layer(x), rtol=0, atol=0)
    empty = torch.randn(0, 4, 5, 5)
    if isinstance(layer, NormLayer):  # the steps themselves (the layer's N=0 reshape is core's)
        g, groups = layer.partition.group(empty.reshape(0, 4, 25), tokens=False)
        for step in layer.steps:
            g = step.forward(g, groups, layer)
        assert groups.ungroup(g).shape == (0, 4, 25)
    else:
        assert layer(empty).shape == (0, 4, 5, 5)


@pytest.mark.slow
@pytest.mark.parametrize("spec", SMALL)
def test_compiles_in_training_and_eval(spec: str) -> None:
    eager, layer = normkit.build(spec, 4), normkit.build(spec, 4)
    layer.load_state_dict(eager.state_dict())
    compiled = torch.compile(layer, fullgraph=False)
    for training in (True, False):
        eager.train(training)
        layer.train(training)
        x = torch.randn(3, 4, 5, 5)
        xe, xc = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
        ye, yc = eager(xe), compiled(xc)
        torch.testing.assert_close(yc, ye, rtol=1e-4, atol=1e-5)
        ye.square().sum().backward()
        yc.square().sum().backward()
        torch.testing.assert_close(xc.grad, xe.grad, rtol=1e-4, atol=1e-4)
    for name, buf in eager.named_buffers():
        torch.testing.assert_close(layer.get_buffer(name), buf)
