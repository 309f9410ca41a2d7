"""convert() choosing what to replace: a spec per source kind or class, "same", leave=, classes
registered as not norms, readers that fail, and the causal guard on parts of causal models.

Models are real timm, torchvision and Hugging Face models built from tiny configs (no downloads).
"""

from __future__ import annotations

import copy

import pytest
import timm
import torch
import torchvision
import transformers
from timm.layers import BatchNormAct2d
from timm.layers.grn import GlobalResponseNorm
from torch import nn

import normkit


def _exact(source: nn.Module, converted: nn.Module, x: torch.Tensor) -> None:
    """Outputs and every gradient equal in train and eval; checkpoints load strictly both ways."""
    for training in (True, False):
        outs = []
        for model in (source, converted):
            model.train(training)
            out = model(x)
            (out * torch.linspace(-1, 1, out.numel()).view(out.shape)).sum().backward()
            outs.append([out.detach(), *(p.grad.clone() for p in model.parameters() if p.grad is not None)])
            model.zero_grad()
        assert len(outs[0]) == len(outs[1])
        for got, want in zip(outs[1], outs[0], strict=True):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
    converted.load_state_dict(source.state_dict(), strict=True)
    source.load_state_dict(converted.state_dict(), strict=True)


def _mobilevit() -> nn.Module:
    torch.manual_seed(0)
    return timm.create_model("mobilevit_xxs", num_classes=5)  # BatchNormAct2d and LayerNorm


def test_same_converts_each_norm_of_a_hybrid_model_to_its_own_kind_exactly() -> None:
    source = _mobilevit()
    converted = copy.deepcopy(source)
    summary = normkit.convert(converted, "same")
    assert {(r.old, r.new) for r in summary} == {("BatchNormAct2d", "bn"), ("LayerNorm", "ln")}
    assert str(summary).startswith("converted 53 norm layers to 'same'")
    _exact(source, converted, torch.randn(2, 3, 64, 64))


def test_a_mapping_converts_each_kind_to_its_spec_and_leaves_unnamed_kinds() -> None:
    model = _mobilevit()
    summary = normkit.convert(model, {"batch": "gn(groups=8)+pn", "layer": "rms"})
    kinds = {r.old: {x.new for x in summary if x.old == r.old} for r in summary}
    assert kinds == {"BatchNormAct2d": {"gn(groups=8)+pn", "gn(groups=8)"}, "LayerNorm": {"rms"}}
    assert str(summary).startswith("converted 53 norm layers to {batch: gn(groups=8)+pn, layer: rms}")
    out = model.train()(torch.randn(2, 3, 64, 64))
    out.square().mean().backward()
    again = _mobilevit()
    normkit.convert(again, {"batch": "gn(groups=8)+pn", "layer": "rms"})
    again.load_state_dict(model.state_dict(), strict=True)

    only_layers = _mobilevit().eval()
    batch_norms = [m for m in only_layers.modules() if isinstance(m, BatchNormAct2d)]
    summary = normkit.convert(only_layers, {"layer": "rms", BatchNormAct2d: "same"}, leave=["stages.4"])
    assert all(isinstance(only_layers.get_submodule(r.path), normkit.NormLayer) for r in summary)
    assert {r.new for r in summary} == {"rms", "bn"} and not any(r.path.startswith("stages.4.") for r in summary)
    assert ("stages.4", "leave= names its path") in summary.left
    assert isinstance(only_layers.get_submodule("stages.4.1.conv_kxk.bn"), BatchNormAct2d)
    assert len(batch_norms) > sum(r.new == "bn" for r in summary)

    bn_only = _mobilevit()
    summary = normkit.convert(bn_only, {"batch": "bn"})
    assert {r.old for r in summary} == {"BatchNormAct2d"}
    assert sum(why == "its kind 'layer' is not in the mapping" for _, why in summary.left) == 21
    assert sum(isinstance(m, nn.LayerNorm) for m in bn_only.modules()) == 21


def test_wrong_mappings_and_leave_entries_are_refused_in_one_line() -> None:
    model = torchvision.models.resnet18(num_classes=5)
    for spec, leave, match in [({"batchnorm": "gn"}, (), "neither a source kind"),
                               ({"batch": 3}, (), "not a spec"),
                               ("bn", ["layer9"], "leave='layer9' is no module path"),
                               ("bn", [3], "leave= takes classes and module paths")]:
        with pytest.raises(normkit.SpecError, match=match) as err:
            normkit.convert(model, spec, leave=leave)
        assert "\n" not in str(err.value)
    assert isinstance(model.bn1, nn.BatchNorm2d)


def test_leave_keeps_classes_and_paths_as_they_are() -> None:
    model = torchvision.models.resnet18(num_classes=5)
    kept = model.layer4[1].bn2
    summary = normkit.convert(model, "gn(groups=8)", leave=["layer4"])
    assert len(summary) == 15 and model.layer4[1].bn2 is kept
    assert summary.left == [("layer4", "leave= names its path")]


def _convnextv2() -> nn.Module:
    torch.manual_seed(0)
    model = timm.create_model("convnextv2_atto", num_classes=5)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, GlobalResponseNorm):  # zero-initialized: make it compute something
                module.weight.normal_(0, 0.5)
                module.bias.normal_(0, 0.5)
    return model


def test_convnext_v2_converts_with_its_global_response_norms_left_alone() -> None:
    source = _convnextv2()
    converted = copy.deepcopy(source)
    summary = normkit.convert(converted, "ln")
    assert {r.old for r in summary} == {"LayerNorm2d"} and len(summary) == 17
    grn = [(p, why) for p, why in summary.left if "GlobalResponseNorm" in why]
    assert len(grn) == 12 and grn[0][1] == "GlobalResponseNorm is registered as not a norm to replace"
    assert "left 12" in str(summary).splitlines()[0]
    assert sum(isinstance(m, GlobalResponseNorm) for m in converted.modules()) == 12
    _exact(source, converted, torch.randn(2, 3, 32, 32))


def test_register_not_norm_leaves_a_class_and_readers_must_return_a_source() -> None:
    class GatedNorm(nn.Module):
        def __init__(self, c: int) -> None:
            super().__init__()
            self.gate = nn.Parameter(torch.ones(c))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * self.gate

    model = nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4), GatedNorm(4))
    with pytest.raises(normkit.SpecError, match="GatedNorm is a norm class normkit does not know.*register_not_norm"):
        normkit.convert(model, "bn")
    for reader, match in [(lambda m: None, "returned NoneType, not a normkit.interop.Source"),
                          (lambda m: m.num_features, r"failed \(AttributeError: .*num_features")]:
        normkit.register_source(GatedNorm, reader)
        with pytest.raises(normkit.SpecError, match=match) as err:
            normkit.convert(model, "bn")
        message = str(err.value)
        assert message.startswith("cannot convert 2: the reader registered for ") and "GatedNorm" in message
        assert "\n" not in str(err.value) and isinstance(model[1], nn.BatchNorm2d)
    normkit.register_not_norm(GatedNorm)
    try:
        summary = normkit.convert(model, "bn")
    finally:
        normkit.interop.sources._NOT_NORMS.discard(GatedNorm)
    assert [r.path for r in summary] == ["1"] and summary.left == [("2", "GatedNorm is registered as not a norm to "
                                                                         "replace")]


def _llama() -> nn.Module:
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=2)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config)


def test_parts_of_a_causal_model_are_refused_like_the_whole_model() -> None:
    llama = _llama()
    for part in (llama, llama.model, llama.model.layers, llama.model.layers[0]):
        with pytest.raises(normkit.SpecError, match=r"is causal \(or part of a causal model\).*causal=False"):
            normkit.convert(part, "bn")
    assert not any(isinstance(m, normkit.NormLayer) for m in llama.modules())
    assert len(normkit.convert(llama.model.layers, "rms")) == 4  # per-token norms keep it causal


def test_a_model_that_cannot_tell_is_asked_and_same_pooling_is_allowed() -> None:
    tokens = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8))
    with pytest.raises(normkit.SpecError, match="nothing in Sequential says whether it is causal.*causal=True or"):
        normkit.convert(tokens, "bn")
    assert len(normkit.convert(copy.deepcopy(tokens), "bn", causal=False)) == 1
    assert len(normkit.convert(tokens, "rms")) == 1

    class CausalConvNet(nn.Sequential):
        causal = True  # a causal sequence model whose BatchNorm1d already pools over time

    model = CausalConvNet(nn.Conv1d(4, 8, 3), nn.BatchNorm1d(8), nn.Conv1d(8, 8, 1), nn.GroupNorm(2, 8))
    with pytest.raises(normkit.SpecError, match="cannot convert 1: CausalConvNet is causal"):
        normkit.convert(model, "gn(groups=2)")
    summary = normkit.convert(model, "same")  # bn over what BatchNorm1d pooled, gn over GroupNorm's groups
    assert [r.new for r in summary] == ["bn", "gn"] and model[3].partition.groups == 2
    assert len(normkit.convert(CausalConvNet(nn.Conv1d(4, 8, 3), nn.BatchNorm1d(8)), "bnn")) == 1
