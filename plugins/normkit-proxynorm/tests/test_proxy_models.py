"""pn inside models: convert, weight-decay groups, a few training steps, state_dict round-trip."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import normkit
from normkit_proxynorm import ProxyNorm

SPECS = ["gn+pn", "ln+pn", "gn(groups=8)+pn", "bn+pn"]


def block_net(spec: str, width: int = 32) -> nn.Sequential:
    """A small conv net of norm-activation blocks, the last pn unscaled before global pooling."""
    last = spec if spec.startswith("bn") else f"{spec}(scale=false)"
    return nn.Sequential(
        nn.Conv2d(3, width, 3, padding=1, bias=False),
        normkit.build(spec, width, activation="relu"),
        nn.Conv2d(width, width, 3, padding=1, bias=False),
        normkit.build(last, width, activation="relu"),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, 10),
    )


def torch_net() -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                         nn.Conv2d(16, 16, 3, padding=1), nn.GroupNorm(4, 16), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))


@pytest.mark.parametrize("spec", SPECS)
def test_trains_without_nan_and_round_trips_state_dict(spec: str) -> None:
    torch.manual_seed(0)
    model = block_net(spec)
    opt = torch.optim.SGD(normkit.param_groups(model, 5e-4), lr=0.1, momentum=0.9)
    x, y = torch.randn(8, 3, 8, 8), torch.randint(0, 10, (8,))
    losses = []
    for _ in range(5):
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < losses[0]
    copy = block_net(spec)
    copy.load_state_dict(model.state_dict())
    model.eval(), copy.eval()
    torch.testing.assert_close(copy(x), model(x))
    assert {"1.proxy_beta", "1.proxy_gamma", "1.weight", "1.bias"} <= set(model.state_dict())


def test_param_groups_decay_every_pn_parameter_by_default() -> None:
    model = block_net("gn+pn")
    groups = normkit.param_groups(model, 5e-4)
    assert [g["weight_decay"] for g in groups] == [5e-4]
    assert len(groups[0]["params"]) == len(list(model.parameters()))


def test_gn_plus_pn_defaults_to_few_groups_unless_given() -> None:
    assert normkit.parse("gn+pn").expanded() == "gn(groups=8)+pn"
    assert normkit.parse("gn+pn").text == "gn+pn"
    assert normkit.parse("gn(groups=2)+pn").expanded() == "gn(groups=2)+pn"
    assert normkit.parse("gn").expanded() == "gn" and normkit.parse("ln+pn").expanded() == "ln+pn"


def test_plugin_policy_decays_proxy_parameters_but_not_the_moved_affine() -> None:
    model = block_net("gn(groups=8)+pn")
    groups = normkit.param_groups(model, 5e-4, plugin_policy=True)
    decay_of = {id(p): g["weight_decay"] for g in groups for p in g["params"]}
    moved_affine = {"1.weight", "1.bias", "3.weight", "3.bias"}
    for name, p in model.named_parameters():
        assert decay_of[id(p)] == (0.0 if name in moved_affine else 5e-4), name
    proxy = {"1.proxy_beta", "1.proxy_gamma", "3.proxy_beta", "3.proxy_gamma"}
    assert proxy <= set(dict(model.named_parameters()))
    torch.optim.SGD(groups, lr=0.1, momentum=0.9)


def test_convert_takes_over_the_activation_after_each_norm() -> None:
    model = torch_net()
    with torch.no_grad():
        model[1].weight.uniform_(0.5, 1.5)
    bn_weight = model[1].weight.detach().clone()
    summary = normkit.convert(model, "gn(groups=8)+pn")
    torch.testing.assert_close(model[1].weight.detach(), bn_weight)
    assert [r.activation for r in summary] == ["relu", "relu"]
    assert isinstance(model[2], nn.Identity) and isinstance(model[5], nn.Identity)
    assert isinstance(model[1].post, ProxyNorm) and isinstance(model[4].post, ProxyNorm)
    out = model(torch.randn(2, 3, 8, 8))
    assert out.shape == (2, 10) and torch.isfinite(out).all()


def test_convert_keeps_pn_eps() -> None:
    model = torch_net()
    normkit.convert(model, "gn(groups=8)+pn")
    assert model[1].post.eps == 0.03


def test_convert_with_an_explicit_pn_eps_keeps_it() -> None:
    model = torch_net()
    normkit.convert(model, "gn(groups=8)+pn(eps=0.03)")
    assert model[1].post.eps == model[4].post.eps == 0.03
    assert model[1].steps[0].eps == 1e-5


def test_convert_leaves_a_norm_without_a_following_activation_plain() -> None:
    model = nn.Sequential(nn.Conv2d(3, 16, 3), nn.GroupNorm(4, 16), nn.Conv2d(16, 16, 3), nn.ReLU())
    summary = normkit.convert(model, "gn+pn")
    assert model[1].spec == "gn(groups=8)" and model[1].post is None and isinstance(model[3], nn.ReLU)
    assert "1: GroupNorm -> gn(groups=8) (copied weight, bias, plain: no activation directly after it)" in str(summary)
    with pytest.raises(normkit.SpecError, match="cannot place 'gn\\+relu' at 1: no activation directly follows"):
        normkit.convert(nn.Sequential(nn.Conv2d(3, 16, 3), nn.GroupNorm(4, 16)), "gn+relu")


def _reference_basic_block(block: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """torchvision's BasicBlock.forward with the first ReLU left to the pn layer that owns it."""
    out = block.bn2(block.conv2(block.bn1(block.conv1(x))))
    identity = block.downsample(x) if block.downsample is not None else x
    return block.relu(out + identity)


def test_pn_in_a_post_activation_resnet_owns_each_activation_after_a_norm_and_leaves_the_rest_plain() -> None:
    torchvision = pytest.importorskip("torchvision")
    from torchvision.models.feature_extraction import create_feature_extractor

    model = torchvision.models.resnet18(num_classes=10)
    summary = normkit.convert(model, "gn(groups=8)+pn")
    with_pn = [r.path for r in summary if r.new == "gn(groups=8)+pn"]
    plain = [r.path for r in summary if r.note]
    assert with_pn == ["bn1"] + [f"layer{i}.{j}.bn1" for i in range(1, 5) for j in range(2)]
    assert sorted(plain) == sorted([f"layer{i}.{j}.bn2" for i in range(1, 5) for j in range(2)]
                                   + [f"layer{i}.0.downsample.1" for i in range(2, 5)])
    assert "(11 of them to 'gn(groups=8)': no activation directly after them" in str(summary)
    x = torch.randn(2, 3, 32, 32)
    for training in (True, False):
        model.train(training)
        block = model.layer2[0]
        h = torch.randn(2, 64, 8, 8)
        torch.testing.assert_close(block(h), _reference_basic_block(block, h))
        out = model(x)
        out.square().mean().backward()
        assert all(p.grad is not None for p in model.layer1[0].bn1.parameters())
        model.zero_grad()
    features = create_feature_extractor(model.eval(), {"layer1.0.bn1": "pn", "layer4": "last"})(x)
    assert features["pn"].shape == (2, 64, 8, 8) and features["last"].shape == (2, 512, 1, 1)

