"""fold, to_torch and ONNX export on real third-party models built from their configs (no
downloads): timm resnet18, efficientnet_b0, regnetx_002, LeViT, FastViT, MobileOne and ConvNeXt,
torchvision resnet18 and mobilenet_v3_small converted with normkit."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import normkit

sys.path.insert(0, str(Path(__file__).resolve().parent))
from onnx_check import onnx_and_eager  # noqa: E402

torchvision = pytest.importorskip("torchvision")


def _model(name: str) -> nn.Module:
    torch.manual_seed(0)
    if name.startswith("timm-"):
        timm = pytest.importorskip("timm")
        return timm.create_model(name.removeprefix("timm-"), pretrained=False, num_classes=5)
    return getattr(torchvision.models, name)(num_classes=5)


def _converted(name: str, spec: str) -> tuple[nn.Module, torch.Tensor]:
    """The model converted to `spec`, with running statistics from two batches, in eval."""
    model = _model(name)
    normkit.convert(model, spec)
    with torch.no_grad():
        model.train()
        model(torch.randn(4, 3, 32, 32))
        model(torch.randn(4, 3, 32, 32) * 2 + 1)
    return model.eval(), torch.randn(2, 3, 32, 32)


MODELS = [("timm-resnet18", 20), ("resnet18", 20), ("mobilenet_v3_small", 34),
          # timm norm-act layers (BatchNormAct2d): converted to bn with their activation, folded keeping it
          pytest.param("timm-efficientnet_b0", 49, marks=pytest.mark.slow), ("timm-regnetx_002", 44)]


@pytest.mark.parametrize(("name", "norms"), MODELS)
def test_fold_removes_every_converted_batch_norm(name: str, norms: int) -> None:
    model, x = _converted(name, "bn")
    want = model(x)
    summary = normkit.fold(model)
    assert len(summary.folded) == norms and summary.kept == []
    assert not any(isinstance(m, normkit.NormLayer) for m in model.modules())
    torch.testing.assert_close(model(x), want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(("spec", "why"), [("gn(groups=8)", "per-sample statistics"),
                                           pytest.param("bnn", "not a fixed per-channel affine",
                                                        marks=pytest.mark.slow)])
def test_fold_keeps_norms_that_are_not_foldable_and_says_why(spec: str, why: str) -> None:
    model, x = _converted("resnet18", spec)
    want = model(x)
    summary = normkit.fold(model)
    assert summary.folded == [] and len(summary.kept) == 20
    assert all(why in reason for _, reason in summary.kept)
    torch.testing.assert_close(model(x), want, rtol=0, atol=0)


def test_to_torch_gives_back_torchs_batch_norms() -> None:
    model, x = _converted("resnet18", "bn")
    want = model(x)
    summary = normkit.to_torch(model, x)
    assert len(summary.replaced) == 20 and {cls for _, cls in summary.replaced} == {"BatchNorm2d"}
    torch.testing.assert_close(model(x), want, rtol=0, atol=0)


def _onnx_max_error(model: nn.Module, x: torch.Tensor, tmp_path) -> float:
    pairs = onnx_and_eager(model, lambda n: torch.randn(n, *x.shape[1:]), tmp_path / "model.onnx")
    return max((got - want).abs().max().item() for got, want in pairs)


@pytest.mark.slow
@pytest.mark.parametrize(("name", "spec"), [(n, s) for n in ("timm-resnet18", "resnet18", "mobilenet_v3_small",
                                                              "timm-efficientnet_b0", "timm-regnetx_002")
                                             for s in ("bn", "bnn")])
def test_converted_and_folded_models_export_to_onnx(name: str, spec: str, tmp_path) -> None:
    model, x = _converted(name, spec)
    normkit.fold(model)
    assert _onnx_max_error(model, x, tmp_path) < 1e-4


def _with_statistics(model: nn.Module, size: int = 64) -> nn.Module:
    with torch.no_grad():
        model.train()
        model(torch.randn(4, 3, size, size))
        model(torch.randn(4, 3, size, size) * 2 + 1)
    return model.eval()


def test_levit_folds_every_batch_norm_after_and_before_its_linears() -> None:
    """LeViT's LinearNorm is `bn(linear(x).flatten(0, 1)).reshape_as(x)`; its heads `linear(drop(bn(x)))`."""
    model = _with_statistics(_levit())
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        want = model(x)
        kept_without_example = normkit.fold(copy.deepcopy(model)).kept
        summary = normkit.fold(model, x)
        got = model(x)
    assert len(summary.folded) == 52 and summary.kept == []
    assert ("stages.0.blocks.0.attn.qkv.bn", "stages.0.blocks.0.attn.qkv.linear") in summary.folded
    assert ("head.bn", "head.linear") in summary.folded
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-7)
    assert len(kept_without_example) == 48 and all("(N, C)" in why for _, why in kept_without_example)


def _levit() -> nn.Module:
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    return timm.create_model("levit_128s", num_classes=5, img_size=64)


def test_fold_follows_reshapes_that_keep_the_linear_features_last_only() -> None:
    class LinearNorm(nn.Module):
        def __init__(self, moves_features: bool) -> None:
            super().__init__()
            self.linear, self.bn, self.moves_features = nn.Linear(4, 6), nn.BatchNorm1d(6), moves_features

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.linear(x)
            if self.moves_features:  # (N, 6, L) -> rows that mix the linear's features: not foldable
                return self.bn(y.transpose(1, 2).reshape(-1, 6))
            return self.bn(y.reshape(-1, 6)).view_as(y)

    x = torch.randn(3, 6, 4)
    kept = _with_statistics_1d(LinearNorm(moves_features=False))
    want = kept(x)
    summary = normkit.fold(kept, x)
    assert summary.folded == [("bn", "linear")]
    torch.testing.assert_close(kept(x), want, rtol=1e-5, atol=1e-6)
    summary = normkit.fold(_with_statistics_1d(LinearNorm(moves_features=True)), x)
    assert summary.folded == [] and "no conv/linear right before it" in summary.kept[0][1]


def _with_statistics_1d(model: nn.Module) -> nn.Module:
    with torch.no_grad():
        model.train()(torch.randn(5, 6, 4))
    return model.eval()


def test_to_torch_gives_back_library_modules_that_timm_reparameterizes() -> None:
    timm = pytest.importorskip("timm")
    from timm.layers import BatchNormAct2d, ConvNormAct, LayerNorm2d
    from timm.utils.model import reparameterize_model

    torch.manual_seed(0)
    model = _with_statistics(timm.create_model("fastvit_t8", num_classes=5), 32)  # 32 px: 1x1 after the last stage
    normkit.convert(model, "bn")
    _with_statistics(model, 32)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        want = model(x)
    with pytest.raises(AssertionError):  # timm's fuser checks isinstance(..., nn.BatchNorm2d)
        reparameterize_model(copy.deepcopy(model))
    summary = normkit.to_torch(model, x)
    assert len(summary.replaced) == 70 and summary.kept == []
    fused = reparameterize_model(model)
    with torch.no_grad():
        torch.testing.assert_close(fused(x), want, rtol=1e-4, atol=1e-6)

    block = nn.Sequential(ConvNormAct(3, 8, 3, act_layer=nn.SiLU), ConvNormAct(8, 8, 1, apply_act=False))
    block = _with_statistics(block, 32)
    convnext = timm.create_model("convnext_atto", num_classes=5).eval()
    for module, spec in ((block, "bn"), (convnext, "ln")):
        normkit.convert(module, spec)
        module.eval()
        with torch.no_grad():
            want = module(x)
        summary = normkit.to_torch(module, x)
        assert summary.kept == []
        with torch.no_grad():
            torch.testing.assert_close(module(x), want, rtol=1e-5, atol=1e-6)
    assert isinstance(block[0].bn, BatchNormAct2d) and isinstance(block[0].bn.act, nn.SiLU)
    assert isinstance(block[0].bn, nn.BatchNorm2d) and type(block[1].bn) is nn.BatchNorm2d
    assert isinstance(convnext.stem[1], LayerNorm2d) and isinstance(convnext.stages[0].blocks[0].norm, LayerNorm2d)


def test_normkits_own_layer_norm_2d_is_timms_function() -> None:
    timm = pytest.importorskip("timm")
    from normkit.interop.to_torch import LayerNorm2d

    ours, theirs = LayerNorm2d(8, eps=1e-6), timm.layers.LayerNorm2d(8)
    with torch.no_grad():
        ours.weight.normal_()
        ours.bias.normal_()
    theirs.load_state_dict(ours.state_dict(), strict=True)
    x = torch.randn(2, 8, 5, 3)
    torch.testing.assert_close(ours(x), theirs(x))


@pytest.mark.slow
def test_mobileone_reparameterizes_after_to_torch() -> None:
    timm = pytest.importorskip("timm")
    from timm.utils.model import reparameterize_model

    torch.manual_seed(0)
    model = timm.create_model("mobileone_s0", num_classes=5)
    normkit.convert(model, "bn")
    _with_statistics(model, 32)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        want = model(x)
    assert normkit.to_torch(model, x).kept == []
    fused = reparameterize_model(model)
    with torch.no_grad():
        torch.testing.assert_close(fused(x), want, rtol=1e-4, atol=1e-6)
