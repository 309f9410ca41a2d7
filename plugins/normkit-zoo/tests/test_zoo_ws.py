"""`+ws`: the conv feeding the norm standardizes its weight (convert and normkit-lab models)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import normkit
from normkit.testing import check_norm
from normkit_lab.models import build_model
from normkit_zoo.ws import WSConv2d, standardize_weight


def test_gn_ws_layer_conforms() -> None:
    check_norm("gn(groups=4)+ws", num_channels=8)


def test_standardized_weight_has_mean_0_std_1_per_filter_and_gradients_flow() -> None:
    model = nn.Sequential(nn.Conv2d(3, 8, 3, bias=False), nn.GroupNorm(4, 8), nn.ReLU())
    with torch.no_grad():
        model[0].weight.mul_(5).add_(2)
    normkit.convert(model, "gn(groups=4)+ws")
    conv = model[0]
    assert isinstance(conv, WSConv2d)
    w = standardize_weight(conv.weight.double(), 0.0)
    torch.testing.assert_close(w.mean(dim=(1, 2, 3)), torch.zeros(8, dtype=torch.float64), atol=1e-9, rtol=0)
    torch.testing.assert_close(w.std(dim=(1, 2, 3), unbiased=False), torch.ones(8, dtype=torch.float64))
    x = torch.randn(2, 3, 6, 6, dtype=torch.float64)
    ref = nn.functional.conv2d(x, (conv.weight.double() - conv.weight.double().mean(dim=(1, 2, 3), keepdim=True))
                               / (conv.weight.double().var(dim=(1, 2, 3), unbiased=False, keepdim=True)
                                  + 1e-5).sqrt())
    torch.testing.assert_close(copy.deepcopy(conv).double()(x), ref)
    model(torch.randn(2, 3, 6, 6)).square().sum().backward()
    g = conv.weight.grad
    assert g is not None and torch.isfinite(g).all() and g.abs().sum() > 0
    # the standardization is differentiated: the gradient is orthogonal to a per-filter shift
    torch.testing.assert_close(g.sum(dim=(1, 2, 3)), torch.zeros(8), atol=1e-4, rtol=0)


def test_state_dict_keys_are_unchanged() -> None:
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU())
    keys = set(model.state_dict()) - {"1.running_mean", "1.running_var", "1.num_batches_tracked"}
    normkit.convert(model, "gn(groups=4)+ws")
    assert set(model.state_dict()) == keys


def test_lab_models_and_torchvision_standardize_every_conv_before_a_norm() -> None:
    model = build_model("small-cnn", "gn(groups=8)+ws", num_classes=10, in_channels=1, image_size=8)
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    assert convs and all(isinstance(m, WSConv2d) for m in convs)
    models = pytest.importorskip("torchvision.models")
    tv = models.resnet18(num_classes=10)
    normkit.convert(tv, "gn(groups=16)+ws")
    tv_convs = [n for n, m in tv.named_modules() if isinstance(m, nn.Conv2d)]
    assert len(tv_convs) == 20 and all(isinstance(tv.get_submodule(n), WSConv2d) for n in tv_convs)
    tv(torch.randn(2, 3, 32, 32)).sum().backward()


def test_a_norm_without_a_conv_before_it_is_refused() -> None:
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8))
    with pytest.raises(normkit.SpecError, match="no conv directly feeds this norm"):
        normkit.convert(model, "bn+ws")


def test_a_refused_conversion_changes_nothing() -> None:
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(), nn.Linear(8, 8),
                          nn.BatchNorm1d(8))
    before = [type(m) for m in model.modules()]
    with pytest.raises(normkit.SpecError, match="5: no conv directly feeds this norm"):
        normkit.convert(model, "bn+ws")
    assert [type(m) for m in model.modules()] == before


def test_gn_ws_keeps_the_native_kernel_and_gn_values() -> None:
    gn, gn_ws = normkit.build("gn(groups=4)", 8), normkit.build("gn(groups=4)+ws", 8)
    gn_ws.load_state_dict(gn.state_dict())
    x = torch.randn(2, 8, 4, 4)
    assert gn_ws.steps[0].fused_forward(x, gn_ws) is not None
    torch.testing.assert_close(gn_ws(x), gn(x), rtol=0, atol=0)
