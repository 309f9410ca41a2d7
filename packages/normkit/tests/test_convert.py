"""normkit.convert on torchvision models and on norm-activation blocks."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import normkit


def _randomize_norms(model: nn.Module) -> None:
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.BatchNorm2d, nn.LayerNorm, nn.GroupNorm)):
                m.weight.copy_(1 + 0.2 * torch.randn(m.weight.shape, generator=g))
                m.bias.copy_(0.2 * torch.randn(m.bias.shape, generator=g))
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.copy_(0.1 * torch.randn(m.running_mean.shape, generator=g))
                m.running_var.copy_(1 + torch.rand(m.running_var.shape, generator=g))
                m.num_batches_tracked.fill_(7)


def test_resnet18_to_bn_leaves_eval_outputs_unchanged() -> None:
    tv = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = tv.models.resnet18(num_classes=10).eval()
    _randomize_norms(model)
    x = torch.randn(2, 3, 64, 64)
    before = model(x)
    summary = normkit.convert(model, "bn")
    assert len(summary) == 20
    assert not any(isinstance(m, nn.BatchNorm2d) for m in model.modules())
    assert summary.replaced[0].copied == ["weight", "bias", "running_mean", "running_var", "num_batches_tracked"]
    assert "converted 20 norm layers to 'bn'" in str(summary)
    torch.testing.assert_close(model(x), before, rtol=1e-5, atol=1e-5)
    assert not model.bn1.training and model.bn1.num_batches_tracked.item() == 7


def test_vit_b_16_to_ln_leaves_eval_outputs_unchanged() -> None:
    tv = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = tv.models.vit_b_16(num_classes=10).eval()
    _randomize_norms(model)
    x = torch.randn(1, 3, 224, 224)
    before = model(x)
    summary = normkit.convert(model, "ln")
    assert len(summary) == 25  # 2 per block + the final norm
    layer = model.encoder.ln
    assert isinstance(layer, normkit.NormLayer) and layer.channel_dim == -1
    assert layer.steps[0].eps == 1e-6  # eps carried over from torchvision's LayerNorm(eps=1e-6)
    torch.testing.assert_close(model(x), before, rtol=1e-4, atol=1e-4)


def test_convert_to_another_norm_keeps_channels_and_trains() -> None:
    model = nn.Sequential(nn.Conv2d(3, 64, 3), nn.BatchNorm2d(64), nn.ReLU(), nn.Conv2d(64, 8, 3),
                          nn.GroupNorm(4, 8), nn.SiLU())
    summary = normkit.convert(model, "gn")
    assert [r.path for r in summary] == ["1", "4"]
    assert model[4].partition.groups == 4  # GroupNorm's group count carried over
    assert model[1].partition.groups == 32  # gn's default where the old layer had no group count
    out = model(torch.randn(2, 3, 9, 9))
    out.sum().backward()


def test_convert_with_activation_steps_takes_over_the_following_activation() -> None:
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(inplace=True), nn.Conv2d(8, 8, 3),
                          nn.BatchNorm2d(8), nn.ReLU())
    summary = normkit.convert(model, "gn(groups=2)+relu")
    assert isinstance(model[2], nn.Identity) and isinstance(model[5], nn.Identity)
    assert summary.replaced[0].activation == "relu"
    assert model(torch.randn(2, 3, 9, 9)).min() >= 0


def test_activation_mismatch_and_missing_activation_fail_without_changing_the_model() -> None:
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.SiLU())
    with pytest.raises(normkit.SpecError, match="differs from the model's 'silu'"):
        normkit.convert(model, "bn+relu")
    assert isinstance(model[1], nn.BatchNorm2d)
    tv = pytest.importorskip("torchvision")
    resnet = tv.models.resnet18()
    with pytest.raises(normkit.SpecError, match=r"cannot place 'bn\+relu' at layer1.0.bn2: no activation directly"):
        normkit.convert(resnet, "bn+relu")
    assert isinstance(resnet.bn1, nn.BatchNorm2d)


def test_convert_reports_layers_it_cannot_build() -> None:
    model = nn.Sequential(nn.Conv2d(3, 12, 3), nn.BatchNorm2d(12))
    with pytest.raises(normkit.SpecError, match=r"cannot convert 1 \(BatchNorm2d\(12\)\).*not divisible into 32"):
        normkit.convert(model, "gn")
    with pytest.raises(normkit.SpecError, match="use normkit.build"):
        normkit.convert(nn.BatchNorm2d(4), "bn")
    with pytest.raises(normkit.SpecError, match="only LayerNorm over the last dim"):
        normkit.convert(nn.Sequential(nn.LayerNorm([4, 5])), "ln")


@pytest.mark.parametrize("model", ["model", None, 3, [nn.BatchNorm2d(4)]])
def test_convert_of_something_that_is_not_a_model_is_one_line(model):
    """Issue 41: `normkit.convert("model", ...)` raised AttributeError ('str' object has no attribute 'children')."""
    with pytest.raises(normkit.NormkitError, match=r"convert\(\) takes your model, a torch.nn.Module, not the") as info:
        normkit.convert(model, "gn+pn")
    assert "\n" not in str(info.value)
    with pytest.raises(normkit.NormkitError, match=r"convert_sync\(\) takes your model"):
        normkit.convert_sync(model)
