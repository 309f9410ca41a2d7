"""fold, to_torch and ONNX export on real third-party models built from their configs (no
downloads): timm resnet18, efficientnet_b0 and regnetx_002, torchvision resnet18 and
mobilenet_v3_small converted with normkit."""

from __future__ import annotations

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
