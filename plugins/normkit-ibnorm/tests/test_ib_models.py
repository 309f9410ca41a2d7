"""ib steps inside a small conv net: a few SGD steps without NaN, state_dict round-trip."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import normkit

SPECS = ["bn+ib-t", "ln+ib-l(lam=4)", "gn(groups=4)+ib-s", "in+ib-t", "rms+ib-t",
         "ibn-s", "ibn-l", "ibn-t", "ibln-s", "ibln-l", "ibln-t"]


def block_net(spec: str, width: int = 16) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(3, width, 3, padding=1, bias=False), normkit.build(spec, width, activation="relu"),
        nn.Conv2d(width, width, 3, padding=1, bias=False), normkit.build(spec, width, activation="relu"),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, 10),
    )


@pytest.mark.parametrize("spec", SPECS)
def test_trains_without_nan_and_round_trips_state_dict(spec: str) -> None:
    torch.manual_seed(0)
    model = block_net(spec)
    opt = torch.optim.SGD(normkit.param_groups(model, 5e-4), lr=0.1, momentum=0.9)
    x, y = torch.randn(8, 3, 8, 8) * 5, torch.randint(0, 10, (8,))
    losses = []
    for _ in range(5):
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0]
    copy = block_net(spec)
    copy.load_state_dict(model.state_dict())
    model.eval(), copy.eval()
    torch.testing.assert_close(copy(x), model(x))
    if spec.startswith(("bn", "ibn")):
        assert torch.equal(copy[1].ib_running_mean, model[1].ib_running_mean)
        assert model[1].ib_running_mean.abs().sum() > 0
