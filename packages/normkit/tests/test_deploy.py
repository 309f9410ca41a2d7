"""Deployment paths for every built-in norm: fx tracing (norms as leaves), jit.trace, jit.script
refused in one line, torch.export and the dynamo ONNX exporter run in onnxruntime, fold, to_torch."""

from __future__ import annotations

import copy
import logging
import warnings

import pytest
import torch
from torch import nn

import normkit

C = 8
ONNX_ATOL = 1e-5  # measured max abs error is below 1.1e-6 for every norm (docs/deploy.md)


def _norms() -> list[str]:
    return [e["name"] for e in normkit.available() if e["kind"] == "norm"]


def _spec(name: str) -> str:
    return f"{name}(groups=2)" if name in ("gn", "gnn", "bgn", "evonorm-s0") else name


def _trained(spec: str, channel_dim: int = 1) -> tuple[nn.Module, torch.Tensor]:
    """conv -> norm with random affine and running statistics from two training batches, in eval."""
    torch.manual_seed(0)
    norm = normkit.build(spec, C, channel_dim=channel_dim)
    model = nn.Sequential(nn.Conv2d(3, C, 3, padding=1), norm)
    with torch.no_grad():
        for name, p in norm.named_parameters():
            p.copy_(torch.randn_like(p) * 0.3 + (1.0 if name == "weight" else 0.0))
        x = torch.randn(4, 3, 6, 6)
        model.train()
        model(x)
        model(x * 2 + 1)
    return model.eval(), torch.randn(3, 3, 6, 6)


@pytest.mark.parametrize("name", _norms())
def test_fx_traces_every_norm_as_a_leaf_and_jit_trace_matches_eager(name: str) -> None:
    model, x = _trained(_spec(name))
    traced = normkit.symbolic_trace(model)
    assert [n.target for n in traced.graph.nodes if n.op == "call_module"] == ["0", "1"]
    torch.testing.assert_close(traced(x), model(x), rtol=0, atol=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        warnings.simplefilter("ignore", FutureWarning)  # jit.trace is deprecated, still used
        jitted = torch.jit.trace(model, x)  # check_trace re-runs it: fails when graphs differ per call
    torch.testing.assert_close(jitted(x[:2]), model(x[:2]), rtol=1e-6, atol=1e-6)


def test_create_feature_extractor_takes_normkit_leaf_modules() -> None:
    torchvision = pytest.importorskip("torchvision")
    from torchvision.models.feature_extraction import create_feature_extractor

    model = torchvision.models.resnet18(num_classes=4)
    normkit.convert(model, "bnn")
    model.eval()
    extractor = create_feature_extractor(model, {"layer1": "l1", "fc": "out"},
                                         tracer_kwargs={"leaf_modules": normkit.leaf_modules(model)})
    x = torch.randn(2, 3, 32, 32)
    feats = extractor(x)
    assert feats["l1"].shape == (2, 64, 8, 8)
    torch.testing.assert_close(feats["out"], model(x))


def test_jit_script_is_refused_in_one_line_naming_what_works() -> None:
    model = nn.Sequential(nn.Conv2d(3, C, 1), normkit.build("bn", C))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        with pytest.raises(normkit.NormkitError, match="torch.jit.trace") as err:
            torch.jit.script(model)
    assert "\n" not in str(err.value) and "torch.export" in str(err.value)


def _onnx_parity(model: nn.Module, tmp_path, channels_last_tokens: bool = False) -> float:
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    shape = (4, 5, C) if channels_last_tokens else (4, 3, 6, 6)
    example = torch.randn(*shape)
    batch = torch.export.Dim("batch", min=1)
    path = tmp_path / "model.onnx"
    logging.disable(logging.WARNING)  # the exporter logs each step
    try:
        torch.onnx.export(model, (example,), str(path), dynamo=True, dynamic_shapes=({0: batch},))
    finally:
        logging.disable(logging.NOTSET)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    worst = 0.0
    for n in (1, 3, 7):  # batch sizes other than the example's: the batch dim is dynamic
        x = torch.randn(n, *shape[1:])
        (got,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
        with torch.no_grad():
            want = model(x)
        torch.testing.assert_close(torch.from_numpy(got), want, rtol=0, atol=ONNX_ATOL)
        worst = max(worst, (torch.from_numpy(got) - want).abs().max().item())
    return worst


@pytest.mark.parametrize("name", ["bn", "bnn"])  # every norm: test_onnx_export_of_every_norm (slow)
def test_onnx_export_runs_in_onnxruntime_like_eager(name: str, tmp_path) -> None:
    model, _ = _trained(_spec(name))
    _onnx_parity(model, tmp_path)


@pytest.mark.parametrize("name", ["rms", pytest.param("ln", marks=pytest.mark.slow)])
def test_onnx_export_of_channels_last_tokens(name: str, tmp_path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(C, C), normkit.build(name, C, channel_dim=-1)).eval()
    _onnx_parity(model, tmp_path, channels_last_tokens=True)


@pytest.mark.slow
@pytest.mark.parametrize("name", _norms())
def test_onnx_export_of_every_norm(name: str, tmp_path) -> None:
    model, _ = _trained(_spec(name))
    _onnx_parity(model, tmp_path)


# -- fold ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("spec", ["bn", "brn", "bn(affine=false)", "bn(momentum=none)"])
def test_fold_removes_batch_norms_and_keeps_the_function(spec: str) -> None:
    model, x = _trained(spec)
    want = model(x)
    summary = normkit.fold(model)
    assert summary.folded == [("1", "0")] and summary.kept == []
    assert isinstance(model[1], nn.Identity)
    torch.testing.assert_close(model(x), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("spec", "why"), [
    ("gn(groups=2)", "per-sample statistics"),
    ("sn", "per-sample statistics"),
    ("dbn", "not a fixed per-channel affine"),
    ("iternorm", "not a fixed per-channel affine"),
    ("bgn(groups=2)", "not a fixed per-channel affine"),
    ("evonorm-b0", "not a fixed per-channel affine"),
    ("ln", "per-sample statistics"),
    ("bnn", "not a fixed per-channel affine"),
    ("frn", "per-sample statistics"),
])
def test_fold_keeps_what_is_not_a_fixed_affine_and_says_why(spec: str, why: str) -> None:
    model, x = _trained(spec)
    want = model(x)
    summary = normkit.fold(model)
    assert summary.folded == [] and summary.kept[0][0] == "1" and why in summary.kept[0][1]
    torch.testing.assert_close(model(x), want, rtol=0, atol=0)


def test_fold_keeps_a_proxy_normalized_norm_act_layer() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, C, 1), normkit.build("gn(groups=2)+pn", C, activation="relu")).eval()
    summary = normkit.fold(model)
    assert summary.folded == [] and "nonlinearity" in summary.kept[0][1]


class _DataDependent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv, self.bn = nn.Conv2d(3, C, 1), normkit.build("bn", C)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.conv(x)) if x.sum() > 0 else x


def test_fold_of_a_model_fx_cannot_trace_is_one_line() -> None:
    with pytest.raises(normkit.NormkitError, match="torch.fx cannot trace _DataDependent") as err:
        normkit.fold(_DataDependent().eval())
    assert "\n" not in str(err.value)


def test_fold_keeps_norms_with_no_conv_before_or_in_training_and_keeps_a_folded_norms_activation() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(normkit.build("bn", 3), nn.Conv2d(3, C, 1),
                          normkit.build("bn", C, activation="relu"), nn.Conv2d(C, C, 1), normkit.build("bn", C))
    kept = dict(normkit.fold(model.train()).kept)
    assert all("training mode" in why for why in kept.values()) and len(kept) == 3
    model(torch.randn(8, 3, 4, 4) * 3 + 1)  # running statistics that are not the identity
    model.eval()
    x = torch.randn(2, 3, 4, 4)
    want = model(x)
    summary = normkit.fold(model)
    assert "no conv/linear right before it" in dict(summary.kept)["0"] and len(summary.kept) == 1
    assert summary.folded == [("2", "1"), ("4", "3")]
    assert isinstance(model[2], nn.ReLU) and isinstance(model[4], nn.Identity)  # the activation stays
    torch.testing.assert_close(model(x), want, rtol=1e-5, atol=1e-6)


class _LinearThenConv1d(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc, self.bn = nn.Linear(5, C, bias=False), normkit.build("bn", C)
        self.conv, self.torch_bn = nn.Conv1d(C, C, 1), nn.BatchNorm1d(C)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.bn(self.fc(x)))
        return self.torch_bn(self.conv(h.unsqueeze(-1)))


def test_fold_of_linear_then_batch_norm_and_of_torch_batch_norm() -> None:
    torch.manual_seed(0)
    model = _LinearThenConv1d()
    x = torch.randn(6, 5)
    with torch.no_grad():
        model.train()(x)
    model.eval()
    want = model(x)
    assert "pass fold(model, example) to check" in dict(normkit.fold(copy.deepcopy(model)).kept)["bn"]
    summary = normkit.fold(model, x)
    assert summary.folded == [("bn", "fc"), ("torch_bn", "conv")] and model.fc.bias is not None
    assert isinstance(model.bn, nn.Identity) and isinstance(model.torch_bn, nn.Identity)
    torch.testing.assert_close(model(x), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("spec", ["bn", "brn"])
def test_torch_fuse_conv_bn_eval_accepts_batch_statistics_layers(spec: str) -> None:
    from torch.nn.utils.fusion import fuse_conv_bn_eval

    model, x = _trained(spec)
    norm = model[1]
    assert (norm.num_features, norm.affine, norm.momentum) == (C, True, 0.1) and norm.eps == 1e-5
    assert norm.running_mean.shape == norm.running_var.shape == (C,)
    fused = fuse_conv_bn_eval(model[0], norm)
    torch.testing.assert_close(fused(x), model(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("spec", ["gn(groups=2)", "bnn", "sn", "dbn", "bgn(groups=2)", "evonorm-b0"])
def test_layers_that_are_not_plain_batch_norms_have_no_eps_so_torch_fusers_skip_them(spec: str) -> None:
    assert not hasattr(normkit.build(spec, C), "eps")
    assert not hasattr(normkit.build("bn", C, activation="relu"), "eps")
    assert normkit.build("gn(groups=2)", C).num_features == C


# -- to_torch -----------------------------------------------------------------------------------

@pytest.mark.parametrize(("spec", "channel_dim", "shape", "torch_cls"), [
    ("bn", 1, (4, C, 5, 5), nn.BatchNorm2d),
    ("bn", 1, (4, C), nn.BatchNorm1d),
    ("bn", 1, (4, C, 2, 3, 3), nn.BatchNorm3d),
    ("bn(affine=false)", 1, (4, C, 5, 5), nn.BatchNorm2d),
    ("ln", -1, (4, 5, C), nn.LayerNorm),
    ("ln", 1, (4, C, 5, 5), nn.GroupNorm),
    ("gn(groups=2)", 1, (4, C, 5, 5), nn.GroupNorm),
    ("rms", -1, (4, 5, C), nn.RMSNorm),
])
def test_to_torch_gives_torchs_module_with_the_same_function(spec, channel_dim, shape, torch_cls) -> None:
    torch.manual_seed(0)
    layer = normkit.build(spec, C, channel_dim=channel_dim)
    x = torch.randn(*shape)
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_()
        layer.train()
        layer(x)
    layer.eval()
    model = nn.Sequential(nn.Identity(), layer)
    want = model(x)
    summary = normkit.to_torch(model, x)
    assert type(model[1]) is torch_cls and summary.replaced == [("1", torch_cls.__name__)]
    assert not model[1].training
    torch.testing.assert_close(model(x), want, rtol=1e-6, atol=1e-6)
    trained = copy.deepcopy(model).train()
    trained(x)  # torch's module trains like the normkit layer it replaced


@pytest.mark.parametrize(("spec", "why"), [("bnn", "not a plain"), ("rms", "no torch module"),
                                          ("gn(groups=2)", "activation")])
def test_to_torch_keeps_other_specs_and_says_why(spec: str, why: str) -> None:
    layer = normkit.build(spec, C, activation="relu" if why == "activation" else None)
    model = nn.Sequential(layer)
    summary = normkit.to_torch(model)
    assert model[0] is layer and summary.replaced == [] and why in summary.kept[0][1]


class _SharedConvOutput(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv, self.after_add, self.beside = nn.Conv2d(3, C, 1), normkit.build("bn", C), normkit.build("bn", C)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        return self.after_add(y + 1) + self.beside(y)


def test_fold_keeps_norms_whose_conv_output_is_shared_or_transformed() -> None:
    kept = dict(normkit.fold(_SharedConvOutput().eval()).kept)
    assert kept == {"after_add": "no conv/linear right before it (its input comes from add)",
                    "beside": "conv's output is also used elsewhere"}


@pytest.mark.parametrize("norm", [nn.BatchNorm1d(C), normkit.build("bn", C)], ids=["torch", "normkit"])
def test_fold_keeps_a_channels_first_norm_after_a_linear_on_3d_inputs(norm: nn.Module) -> None:
    model = nn.Sequential(nn.Linear(C, C), norm)
    x = torch.randn(4, C, C)  # N, L, C with L == C: it runs, and the norm reads L, not the Linear's C
    model.train()(x)
    model.eval()
    want = model(x)
    kept = dict(normkit.fold(model, x).kept)
    assert "on (N, C) inputs (it sees 3 dims)" in kept["1"]
    torch.testing.assert_close(model(x), want)


def test_to_torch_gives_back_a_converted_layernorm2d_and_carries_hooks() -> None:
    import timm

    source = nn.Sequential(nn.Conv2d(3, C, 1), timm.layers.LayerNorm2d(C)).eval()
    source[1].register_forward_hook(lambda m, a, out: out * 3)  # sees N,C,H,W before and after
    converted = copy.deepcopy(source)
    normkit.convert(converted, "ln")
    x = torch.randn(2, 3, C, C)  # W == C: a LayerNorm(C) without the move would run, and be wrong
    summary = normkit.to_torch(converted, x)
    assert summary.replaced == [("1", "LayerNorm2d")] and type(converted[1]) is timm.layers.LayerNorm2d
    assert len(converted[1]._forward_hooks) == 1 and not converted[1]._forward_pre_hooks  # layout hooks gone
    torch.testing.assert_close(converted(x), source(x))
    hooked = nn.Sequential(nn.Conv2d(3, C, 1), normkit.build("bn", C)).eval()
    hooked[1].register_forward_hook(lambda m, a, out: out * 3)
    want = hooked(x)
    assert normkit.to_torch(hooked, x).replaced == [("1", "BatchNorm2d")]
    torch.testing.assert_close(hooked(x), want)


def test_fold_keeps_a_norm_with_forward_hooks() -> None:
    model, x = _trained("bn")
    model[1].register_forward_hook(lambda m, a, out: out * 2)
    want = model(x)
    assert dict(normkit.fold(model).kept)["1"] == "has forward hooks, which folding it away would drop"
    torch.testing.assert_close(model(x), want)
