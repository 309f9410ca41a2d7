"""convert() on every norm class timm, torchvision and Hugging Face ship: exact or refused by name.

Each known class is built with random parameters, converted to its own kind and compared with the
original in train and eval mode: outputs, input and parameter gradients, running statistics,
trainable parameters and strict checkpoints both ways. Classes normkit does not compute are refused
with one line naming the module path and class, also when other norms in the model are known.
"""

from __future__ import annotations

import copy

import pytest
import timm.layers as tl
import torch
import torchvision
import transformers
from torch import nn

import normkit

C = 8


def _hf(module: str, cls: str):
    return getattr(__import__(f"transformers.models.{module}.modeling_{module}", fromlist=[cls]), cls)


# name -> (constructor, input shape, same-kind spec)
IMAGE, TOKENS = (3, C, 4, 5), (3, 6, C)
TIMM = {
    "BatchNormAct2d": (lambda: tl.BatchNormAct2d(C, act_layer=nn.SiLU), IMAGE, "bn"),
    "SyncBatchNormAct": (lambda: tl.SyncBatchNormAct(C), IMAGE, "bn"),
    "FrozenBatchNormAct2d": (lambda: tl.FrozenBatchNormAct2d(C, act_layer=nn.ReLU), IMAGE, "bn"),
    "tv-FrozenBatchNorm2d": (lambda: torchvision.ops.FrozenBatchNorm2d(C), IMAGE, "bn"),
    "GroupNorm": (lambda: tl.GroupNorm(C, num_groups=4), IMAGE, "gn"),
    "GroupNorm1": (lambda: tl.GroupNorm1(C), IMAGE, "gn"),
    "GroupNormAct": (lambda: tl.GroupNormAct(C, num_groups=2, act_layer=nn.GELU), IMAGE, "gn"),
    "GroupNorm1Act": (lambda: tl.GroupNorm1Act(C), IMAGE, "gn"),
    "LayerNorm": (lambda: tl.LayerNorm(C), TOKENS, "ln"),
    "LayerNormFp32": (lambda: tl.LayerNormFp32(C), TOKENS, "ln"),
    "LayerNormAct": (lambda: tl.LayerNormAct(C, act_layer=nn.GELU), TOKENS, "ln"),
    "LayerNormActFp32": (lambda: tl.LayerNormActFp32(C), TOKENS, "ln"),
    "LayerNorm2d": (lambda: tl.LayerNorm2d(C), IMAGE, "ln"),
    "LayerNorm2dFp32": (lambda: tl.LayerNorm2dFp32(C), IMAGE, "ln"),
    "LayerNormAct2d": (lambda: tl.LayerNormAct2d(C), IMAGE, "ln"),
    "LayerNormAct2dFp32": (lambda: tl.LayerNormAct2dFp32(C), IMAGE, "ln"),
    "tv-LayerNorm2d": (lambda: torchvision.models.convnext.LayerNorm2d(C), IMAGE, "ln"),
    "RmsNorm": (lambda: tl.RmsNorm(C), TOKENS, "rms"),
    "RmsNormFp32": (lambda: tl.RmsNormFp32(C), TOKENS, "rms"),
    "RmsNormAct": (lambda: tl.RmsNormAct(C), TOKENS, "rms"),
    "RmsNormActFp32": (lambda: tl.RmsNormActFp32(C), TOKENS, "rms"),
    "RmsNorm2d": (lambda: tl.RmsNorm2d(C), IMAGE, "rms"),
    "RmsNorm2dFp32": (lambda: tl.RmsNorm2dFp32(C), IMAGE, "rms"),
    "RmsNormAct2d": (lambda: tl.RmsNormAct2d(C), IMAGE, "rms"),
    "RmsNormAct2dFp32": (lambda: tl.RmsNormAct2dFp32(C), IMAGE, "rms"),
}
HF = {name: (lambda m=module, n=name: _hf(m, n)(C), TOKENS, spec) for name, module, spec in [
    ("LlamaRMSNorm", "llama", "rms"), ("MistralRMSNorm", "mistral", "rms"), ("Qwen2RMSNorm", "qwen2", "rms"),
    ("Qwen3RMSNorm", "qwen3", "rms"), ("Phi3RMSNorm", "phi3", "rms"), ("MambaRMSNorm", "mamba", "rms"),
    ("T5LayerNorm", "t5", "rms"), ("Olmo2RMSNorm", "olmo2", "rms"), ("GemmaRMSNorm", "gemma", "rms"),
    ("Gemma2RMSNorm", "gemma2", "rms"), ("Gemma3RMSNorm", "gemma3", "rms"), ("OlmoLayerNorm", "olmo", "ln"),
    ("MixtralRMSNorm", "mixtral", "rms"),
]}
HF["ConvNextLayerNorm-first"] = (lambda: _hf("convnext", "ConvNextLayerNorm")(C, data_format="channels_first"),
                                 IMAGE, "ln")
HF["ConvNextLayerNorm-last"] = (lambda: _hf("convnext", "ConvNextLayerNorm")(C), TOKENS, "ln")
KNOWN = {**TIMM, **HF}

REFUSED = {
    "SimpleNorm": lambda: tl.SimpleNorm(C), "SimpleNorm2d": lambda: tl.SimpleNorm2d(C),
    "EvoNorm2dB0": lambda: tl.EvoNorm2dB0(C), "EvoNorm2dS0": lambda: tl.EvoNorm2dS0(C, groups=2),
    "FilterResponseNormTlu2d": lambda: tl.FilterResponseNormTlu2d(C),
    "FilterResponseNormAct2d": lambda: tl.FilterResponseNormAct2d(C),
    "SplitBatchNorm2d": lambda: tl.SplitBatchNorm2d(C, num_splits=2),
}


def _randomized(module: nn.Module, generator: torch.Generator) -> nn.Module:
    with torch.no_grad():
        for name, tensor in [*module.named_parameters(), *module.named_buffers()]:
            if name.endswith("running_var"):
                tensor.copy_(0.5 + torch.rand(tensor.shape, generator=generator))
            elif tensor.is_floating_point():
                centre = name.endswith("weight") and "Gemma" not in type(module).__name__  # Gemma's gain is 1 + w
                tensor.copy_(torch.randn(tensor.shape, generator=generator) * 0.3 + centre)
    return module


def _step(model: nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    x = x.clone().requires_grad_(True)
    out = model(x)
    (out.float() * torch.linspace(-1, 2, out.numel()).view(out.shape)).sum().backward()
    grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    model.zero_grad()
    state = sorted(model.state_dict().items())  # running statistics (and frozen affine) after the step
    return [out.detach(), x.grad, *grads, *(t.clone() for _, t in state)]


@pytest.mark.parametrize("name", list(KNOWN))
def test_known_library_class_converts_exactly_in_train_and_eval(name: str) -> None:
    make, shape, spec = KNOWN[name]
    g = torch.Generator().manual_seed(0)
    source = nn.Sequential(nn.Identity(), _randomized(make(), g))
    converted = copy.deepcopy(source)
    assert len(normkit.convert(converted, spec, causal=False)) == 1
    assert isinstance(converted[1], normkit.NormLayer)
    source_params = dict(source.named_parameters())  # FrozenBatchNorm2d's affine are buffers: frozen
    assert {n: p.requires_grad for n, p in converted.named_parameters()} == \
        {n: n in source_params and source_params[n].requires_grad for n, _ in converted.named_parameters()}
    for training in (True, True, False):
        source.train(training)
        converted.train(training)
        x = torch.randn(shape, generator=g) * 2 + 0.3
        for got, want in zip(_step(converted, x), _step(source, x), strict=True):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    converted.load_state_dict(source.state_dict(), strict=True)
    source.load_state_dict(converted.state_dict(), strict=True)


@pytest.mark.parametrize("name", [n for n, (_, shape, _) in HF.items() if shape == TOKENS and "ConvNext" not in n])
def test_hugging_face_norms_keep_their_bfloat16_rounding(name: str) -> None:
    """The RMS norms (and OLMo's float32 LayerNorm) round in their own order; ConvNextLayerNorm is torch's
    LayerNorm, whose bfloat16 kernel differs from normkit's float32 path by up to one bfloat16 ulp."""
    make, _, spec = HF[name]
    source = nn.Sequential(_randomized(make(), torch.Generator().manual_seed(1))).to(torch.bfloat16)
    converted = copy.deepcopy(source)
    normkit.convert(converted, spec, causal=False)
    x = torch.randn(64, 16, C, dtype=torch.bfloat16) * 3
    assert torch.equal(converted(x), source(x))  # bit for bit, whichever order the class rounds in


def test_frozen_batch_norm_stays_frozen_and_refuses_other_specs() -> None:
    model = nn.Sequential(nn.Conv2d(3, C, 1), torchvision.ops.FrozenBatchNorm2d(C))
    with pytest.raises(normkit.SpecError, match="cannot convert 1: FrozenBatchNorm2d has frozen statistics"):
        normkit.convert(model, "gn(groups=2)")
    summary = normkit.convert(model, "bn")
    assert "FrozenBatchNorm2d -> bn" in str(summary)
    model.train()
    assert not model[1].training and not model[1].weight.requires_grad


@pytest.mark.parametrize("name", list(REFUSED))
def test_unknown_library_norms_are_refused_by_path_and_class_even_beside_known_ones(name: str) -> None:
    unknown = REFUSED[name]()
    model = nn.Sequential(nn.Conv2d(3, C, 1), nn.BatchNorm2d(C), nn.Sequential(nn.ReLU(), unknown))
    with pytest.raises(normkit.SpecError) as err:
        normkit.convert(model, "bn")
    cls = type(unknown)
    assert str(err.value).startswith(f"cannot convert 2.1: {cls.__module__}.{cls.__name__} is a norm class "
                                     "normkit does not know")
    assert "\n" not in str(err.value)
    assert isinstance(model[1], nn.BatchNorm2d) and model[2][1] is unknown  # nothing changed


def test_containers_named_like_norms_are_visited_not_refused() -> None:
    block = nn.Sequential(tl.ConvNormAct(3, C, 3, act_layer=nn.ReLU))
    assert [r.path for r in normkit.convert(block, "bn")] == ["0.bn"]


def test_register_source_can_say_how_the_stored_weight_maps_to_the_gain() -> None:
    class OnePlusRMSNorm(nn.Module):  # Gemma's function under another name
        def __init__(self, dim: int) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.randn(dim) * 0.1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * (1 + self.weight)

    def reader(module: nn.Module) -> normkit.interop.sources.Source:
        return normkit.interop.sources.Source("rms", module.weight.shape[0], -1, {"eps": 1e-6}, gain_offset=1.0)

    model = nn.Sequential(OnePlusRMSNorm(C))
    x = torch.randn(2, 3, C)
    want = model(x)
    with pytest.raises(normkit.SpecError, match="OnePlusRMSNorm is a norm class normkit does not know"):
        normkit.convert(model, "rms")
    normkit.register_source(OnePlusRMSNorm, reader)  # or normkit.interop.read_gemma_rms_norm with `eps`
    try:
        normkit.convert(model, "rms")
    finally:
        del normkit.interop.sources._TABLE[OnePlusRMSNorm]
    torch.testing.assert_close(model(x), want)
    model.load_state_dict({"0.weight": torch.zeros(C)}, strict=True)
    torch.testing.assert_close(model(x), x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))


def _gemma(kind: str) -> nn.Module:
    small = {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
             "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16}
    config, model = {"gemma": (transformers.GemmaConfig, transformers.GemmaForCausalLM),
                     "gemma2": (transformers.Gemma2Config, transformers.Gemma2ForCausalLM),
                     "gemma3": (transformers.Gemma3TextConfig, transformers.Gemma3ForCausalLM)}[kind]
    torch.manual_seed(0)
    built = model(config(**small))
    _randomized_all(built)
    return built


def _randomized_all(model: nn.Module) -> None:
    g = torch.Generator().manual_seed(2)
    for module in model.modules():
        if "Norm" in type(module).__name__ and getattr(module, "weight", None) is not None:
            with torch.no_grad():
                module.weight.copy_(torch.randn(module.weight.shape, generator=g) * 0.3)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["gemma", "gemma2", "gemma3"])
def test_gemma_models_built_from_configs_convert_exactly(kind: str) -> None:
    source = _gemma(kind)
    converted = copy.deepcopy(source)
    summary = normkit.convert(converted, "rms")
    assert len(summary) >= 5 and all(r.old.endswith("RMSNorm") for r in summary)
    ids = torch.randint(0, 64, (2, 8))
    for training in (True, False):
        source.train(training)
        converted.train(training)
        outs = []
        for model in (source, converted):
            logits = model(input_ids=ids).logits
            logits.square().mean().backward()
            outs.append([logits.detach(), *(p.grad.clone() for p in model.parameters() if p.grad is not None)])
            model.zero_grad()
        for got, want in zip(outs[1], outs[0], strict=True):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
    converted.load_state_dict(source.state_dict(), strict=True)
    bf16_source, bf16_converted = source.to(torch.bfloat16).eval(), converted.to(torch.bfloat16).eval()
    with torch.no_grad():
        assert torch.equal(bf16_converted(input_ids=ids).logits, bf16_source(input_ids=ids).logits)


def _hf_model(kind: str) -> tuple[nn.Module, dict]:
    small = {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
             "num_attention_heads": 2, "num_key_value_heads": 2}
    ids = {"input_ids": torch.randint(0, 64, (2, 8))}
    torch.manual_seed(0)
    if kind == "olmo2":
        return transformers.Olmo2ForCausalLM(transformers.Olmo2Config(**small)), ids
    if kind == "olmo":
        return transformers.OlmoForCausalLM(transformers.OlmoConfig(**small)), ids
    if kind == "mamba":
        return transformers.MambaForCausalLM(transformers.MambaConfig(vocab_size=64, hidden_size=32, state_size=4,
                                                                      num_hidden_layers=2)), ids
    if kind == "t5":
        config = transformers.T5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=2)
        return transformers.T5EncoderModel(config), ids
    config = transformers.ConvNextConfig(num_channels=3, hidden_sizes=[8, 16], depths=[1, 1], num_stages=2)
    return transformers.ConvNextModel(config), {"pixel_values": torch.randn(2, 3, 32, 32)}


def _first_output(out) -> torch.Tensor:
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "spec"), [("olmo2", "rms"), ("olmo", "ln"), ("mamba", "rms"), ("t5", "rms"),
                                            ("convnext", "ln")])
def test_hugging_face_models_built_from_configs_convert_exactly(kind: str, spec: str) -> None:
    source, inputs = _hf_model(kind)
    _randomized_all(source)
    converted = copy.deepcopy(source)
    assert len(normkit.convert(converted, spec, causal=False)) >= 3
    for training in (True, False):
        outs = []
        for model in (source, converted):
            model.train(training)
            torch.manual_seed(1)  # the same dropout masks
            out = _first_output(model(**inputs))
            out.square().mean().backward()
            outs.append([out.detach(), *(p.grad.clone() for p in model.parameters() if p.grad is not None)])
            model.zero_grad()
        for got, want in zip(outs[1], outs[0], strict=True):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
    converted.load_state_dict(source.state_dict(), strict=True)


def test_frozen_batch_norm_backbone_converts_exactly() -> None:
    """Detection backbones are torchvision ResNets built with FrozenBatchNorm2d."""
    source = torchvision.models.resnet18(num_classes=10, norm_layer=torchvision.ops.FrozenBatchNorm2d)
    for module in source.modules():
        if isinstance(module, torchvision.ops.FrozenBatchNorm2d):
            _randomized(module, torch.Generator().manual_seed(3))
    converted = copy.deepcopy(source)
    assert len(normkit.convert(converted, "bn")) == 20
    x = torch.randn(2, 3, 32, 32)
    for training in (True, False):
        source.train(training)
        converted.train(training)
        torch.testing.assert_close(converted(x), source(x), atol=1e-5, rtol=1e-5)
    converted.load_state_dict(source.state_dict(), strict=True)
