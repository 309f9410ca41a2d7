"""normkit.convert and normkit.norm_layer on real timm, torchvision and Hugging Face models.

Models are built from their configs (no downloads), at tiny input sizes.
"""

from __future__ import annotations

import copy

import pytest
import timm
import torch
import torchvision
import transformers
from timm.layers import BatchNormAct2d, ConvNormAct
from torch import nn

import normkit

torch.manual_seed(0)


def _image(n: int = 2, size: int = 32) -> torch.Tensor:
    return torch.randn(n, 3, size, size)


def _tokens(n: int = 2, length: int = 8) -> dict:
    return {"input_ids": torch.randint(0, 64, (n, length))}


def _hf(kind: str) -> nn.Module:
    small = {"vocab_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "hidden_size": 32,
             "intermediate_size": 64}
    if kind == "gpt2":
        return transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=64, n_layer=2, n_head=2,
                                                                    n_embd=32, n_positions=16))
    if kind == "llama":
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(num_key_value_heads=2, **small))
    return transformers.BertModel(transformers.BertConfig(max_position_embeddings=16, **small))


def _out(model: nn.Module, x) -> torch.Tensor:
    out = model(**x) if isinstance(x, dict) else model(x)
    if isinstance(out, torch.Tensor):
        return out
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


# (builder, input, same-kind spec, other specs that apply)
MODELS = {
    "timm-resnet18": (lambda: timm.create_model("resnet18", num_classes=10), _image, "bn", ["bnn", "gn(groups=8)"]),
    "timm-efficientnet_b0": (lambda: timm.create_model("efficientnet_b0", num_classes=10), _image, "bn",
                             ["bnn", "gn(groups=8)"]),
    "timm-regnetx_002": (lambda: timm.create_model("regnetx_002", num_classes=10), _image, "bn", ["bnn"]),
    "timm-convnext_atto": (lambda: timm.create_model("convnext_atto", num_classes=10), _image, "ln",
                           ["lnn", "rms"]),
    "timm-vit_tiny": (lambda: timm.create_model("vit_tiny_patch16_224", img_size=32, num_classes=10), _image,
                      "ln", ["lnn", "rms"]),
    "tv-resnet18": (lambda: torchvision.models.resnet18(num_classes=10), _image, "bn", ["bnn", "gn(groups=8)"]),
    "tv-mobilenet_v3_small": (lambda: torchvision.models.mobilenet_v3_small(num_classes=10), _image, "bn",
                              ["bnn"]),
    "tv-convnext_tiny": (lambda: torchvision.models.convnext_tiny(num_classes=10), _image, "ln", ["lnn"]),
    "hf-gpt2": (lambda: _hf("gpt2"), _tokens, "ln", ["lnn", "rms"]),
    "hf-llama": (lambda: _hf("llama"), _tokens, "rms", ["ln"]),
    "hf-bert": (lambda: _hf("bert"), _tokens, "ln", ["rms", "bn"]),
}
SLOW = {"tv-convnext_tiny", "timm-efficientnet_b0", "timm-regnetx_002", "tv-mobilenet_v3_small"}


def _cases(with_other: bool) -> list:
    cases = []
    for name, (_, _, same, others) in MODELS.items():
        slow = name in SLOW or (with_other and not name.startswith(("hf-", "tv-resnet")))
        marks = [pytest.mark.slow] if slow else []
        for spec in (others if with_other else [same]):
            cases.append(pytest.param(name, spec, marks=marks, id=f"{name}-{spec}"))
    return cases


@pytest.mark.parametrize(("name", "spec"), _cases(with_other=False))
def test_same_kind_conversion_is_exact_and_loads_the_source_checkpoint(name: str, spec: str) -> None:
    make, inputs, _, _ = MODELS[name]
    source = make().eval()
    x = inputs()
    with torch.no_grad():
        expected = _out(source, x)
        converted = copy.deepcopy(source)
        summary = normkit.convert(converted, spec)
        assert len(summary) > 0
        assert not any(isinstance(m, (nn.LayerNorm, nn.BatchNorm2d, nn.RMSNorm)) for m in converted.modules())
        torch.testing.assert_close(_out(converted, x), expected, atol=1e-5, rtol=1e-5)
    converted.load_state_dict(source.state_dict(), strict=True)


@pytest.mark.parametrize(("name", "spec"), _cases(with_other=True))
def test_other_kinds_train_and_round_trip_their_state(name: str, spec: str) -> None:
    make, inputs, _, _ = MODELS[name]
    model = make()
    normkit.convert(model, spec, causal=False)  # bn in BERT is fine; causality is tested below
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = inputs(4)
    for _ in range(2):
        opt.zero_grad()
        out = _out(model, x).float()
        target = torch.zeros(out.shape[:-1], dtype=torch.long)
        nn.functional.cross_entropy(out.flatten(0, -2), target.flatten()).backward()
        # Clipped as training recipes do: efficientnet_b0 on a 32x32 batch of 4 normalizes 4 values per
        # channel in its last stages, and unclipped SGD steps there (gradients ~800 with bn, 30-100x that
        # with bnn) blow the weights up until eval overflows; that is the recipe diverging, not convert.
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    model.eval()
    with torch.no_grad():
        out = _out(model, x)
    assert torch.isfinite(out).all()
    again = make()
    normkit.convert(again, spec, causal=False)
    again.load_state_dict(model.state_dict(), strict=True)
    with torch.no_grad():
        torch.testing.assert_close(_out(again.eval(), x), out)


def test_norm_act_layer_keeps_its_activation_or_hands_it_to_pn() -> None:
    block = nn.Sequential(ConvNormAct(3, 8, 3, act_layer=nn.ReLU), nn.Conv2d(8, 4, 1)).eval()
    x = _image()
    ref = block(x)
    kept = copy.deepcopy(block)
    summary = normkit.convert(kept, "bn")
    assert "kept ReLU" in str(summary)
    torch.testing.assert_close(kept(x), ref)
    proxied = copy.deepcopy(block)
    summary = normkit.convert(proxied, "bn+pn")
    layer = proxied[0].bn
    assert layer.post_name == "pn" and layer.activation_name == "relu"
    assert "owns relu" in str(summary)


def test_layernorm2d_keeps_its_per_position_partition() -> None:
    source = timm.layers.LayerNorm2d(8).eval()
    block = nn.Sequential(nn.Conv2d(3, 8, 1), source)
    x = _image()
    converted = copy.deepcopy(block)
    normkit.convert(converted, "rms")
    y = block[0](x)
    expected = y / y.pow(2).mean(1, keepdim=True).add(1e-6).sqrt()
    torch.testing.assert_close(converted(x), expected, atol=1e-5, rtol=1e-5)
    with_ln2d = copy.deepcopy(block)
    normkit.convert(with_ln2d, "ln2d")
    torch.testing.assert_close(with_ln2d(x), block(x), atol=1e-5, rtol=1e-5)


def test_torch_rmsnorm_converts_exactly() -> None:
    model = nn.Sequential(nn.Linear(4, 16), nn.RMSNorm(16, eps=1e-5)).eval()
    nn.init.normal_(model[1].weight)
    x = torch.randn(3, 5, 4)
    converted = copy.deepcopy(model)
    assert len(normkit.convert(converted, "rms")) == 1
    torch.testing.assert_close(converted(x), model(x), atol=1e-5, rtol=1e-5)


def test_unknown_norm_subclass_is_refused_in_one_line() -> None:
    class ScaledBN(nn.BatchNorm2d):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return 2 * super().forward(x)

    model = nn.Sequential(nn.Conv2d(3, 4, 1), ScaledBN(4))
    with pytest.raises(normkit.SpecError, match=r"cannot convert 1: .*ScaledBN.*register_source") as err:
        normkit.convert(model, "bn")
    assert "\n" not in str(err.value)
    assert isinstance(model[1], ScaledBN)
    normkit.register_source(ScaledBN, normkit.interop.read_batch_norm)
    try:
        assert len(normkit.convert(model, "bn")) == 1
    finally:
        del normkit.interop.sources._TABLE[ScaledBN]


def test_converting_no_layer_is_an_error_unless_allowed() -> None:
    model = nn.Sequential(nn.Linear(3, 3))
    with pytest.raises(normkit.SpecError, match="no norm layer.*allow_empty=True"):
        normkit.convert(model, "bn")
    assert len(normkit.convert(model, "bn", allow_empty=True)) == 0


@pytest.mark.parametrize("spec", ["bnn", "gn(groups=4)", "in"])
def test_token_pooling_norms_are_refused_in_causal_models(spec: str) -> None:
    model = _hf("gpt2")
    with pytest.raises(normkit.SpecError, match="causal.*causal=False"):
        normkit.convert(model, spec)
    assert isinstance(model.transformer.ln_f, nn.LayerNorm)  # nothing changed
    bert = _hf("bert")
    assert len(normkit.convert(bert, spec)) > 0  # an encoder is not causal


def test_causal_false_lets_a_pooling_norm_in_and_outputs_stay_contiguous() -> None:
    model = _hf("gpt2")
    normkit.convert(model, "bn", causal=False)
    model.train()
    _out(model, _tokens()).sum().backward()  # GPT-2's Conv1D .view()s the norm output
    layer = normkit.build("gn(groups=2)", 8, channel_dim=-1)
    assert layer(torch.randn(2, 5, 8)).is_contiguous()
    cl = torch.randn(2, 8, 4, 4).contiguous(memory_format=torch.channels_last)
    assert normkit.build("bn", 8)(cl).is_contiguous(memory_format=torch.channels_last)


def test_non_reentrant_checkpointing_passes_through_normkit() -> None:
    model = _hf("llama")
    normkit.convert(model, "rms")
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    _out(model, _tokens()).sum().backward()
    assert all(p.grad is not None for p in model.model.norm.parameters())


def test_torch_batchnorm_checkpoint_loads_strictly_into_bnn() -> None:
    source = torchvision.models.resnet18(num_classes=10)
    converted = torchvision.models.resnet18(num_classes=10)
    normkit.convert(converted, "bnn")
    fresh = converted.bn1.running_lambda.clone()
    converted.bn1.running_lambda.fill_(3.0)
    converted.load_state_dict(source.state_dict(), strict=True)
    torch.testing.assert_close(converted.bn1.running_lambda, fresh)  # its documented initial value
    with pytest.raises(RuntimeError, match="Unexpected key"):
        converted.load_state_dict({**source.state_dict(), "bn1.extra": torch.zeros(1)}, strict=True)


def test_norm_layer_factory_in_timm_computes_the_default_model() -> None:
    default = timm.create_model("efficientnet_b0", num_classes=10).eval()
    ours = timm.create_model("efficientnet_b0", num_classes=10, norm_layer=normkit.norm_layer("bn")).eval()
    assert isinstance(default.bn1, BatchNormAct2d)
    ours.load_state_dict(default.state_dict(), strict=True)
    x = _image()
    with torch.no_grad():
        torch.testing.assert_close(ours(x), default(x), atol=1e-5, rtol=1e-5)


def test_norm_layer_factory_in_torchvision() -> None:
    default = torchvision.models.resnet18(num_classes=10).eval()
    ours = torchvision.models.resnet18(num_classes=10, norm_layer=normkit.norm_layer("bn")).eval()
    ours.load_state_dict(default.state_dict(), strict=True)
    x = _image()
    with torch.no_grad():
        torch.testing.assert_close(ours(x), default(x), atol=1e-5, rtol=1e-5)
    timm_vit = timm.create_model("vit_tiny_patch16_224", img_size=32, num_classes=10,
                                 norm_layer=normkit.norm_layer("rms", channel_dim=-1))
    assert torch.isfinite(timm_vit(x)).all()


PN_MODELS = {
    "tv-resnet18": lambda: torchvision.models.resnet18(num_classes=10),
    "timm-resnet18d": lambda: timm.create_model("resnet18d", num_classes=10),
    "timm-regnety_002": lambda: timm.create_model("regnety_002", num_classes=10),
    "timm-efficientnet_b0": lambda: timm.create_model("efficientnet_b0", num_classes=10),
    "timm-cspresnet50": lambda: timm.create_model("cspresnet50", num_classes=10),
}


@pytest.mark.parametrize("name", [pytest.param(n, marks=[pytest.mark.slow] if n != "tv-resnet18" else [])
                                  for n in PN_MODELS])
def test_pn_converts_ordinary_residual_cnns(name: str) -> None:
    model = PN_MODELS[name]()
    summary = normkit.convert(model, "gn(groups=8)+pn")
    owned = [r for r in summary if r.new == "gn(groups=8)+pn"]
    plain = [r for r in summary if r.note == "plain: no activation directly after it"]
    assert owned and plain and len(owned) + len(plain) == len(summary)
    for record in owned:
        layer = model.get_submodule(record.path)
        assert layer.post_name == "pn" and record.activation == layer.activation_name
    model.train()
    out = model(_image())
    out.square().mean().backward()
    assert all(p.grad is not None for r in owned for p in model.get_submodule(r.path).parameters())
    model.eval()
    with torch.no_grad():
        assert torch.isfinite(model(_image())).all()
    again = PN_MODELS[name]()
    normkit.convert(again, "gn(groups=8)+pn")
    again.load_state_dict(model.state_dict(), strict=True)


@pytest.mark.parametrize(("name", "spec"), [("tv-resnet18", "bn"), ("tv-resnet18", "bnn"), ("tv-resnet18", "in"),
                                            ("tv-resnet18", "frn"), ("timm-convnext_atto", "ln")])
def test_plain_fx_tracing_and_feature_extraction_work_on_converted_models(name: str, spec: str) -> None:
    from torchvision.models.feature_extraction import create_feature_extractor

    model = MODELS[name][0]().eval()
    normkit.convert(model, spec)
    x = _image()
    traced = torch.fx.symbolic_trace(model)
    with torch.no_grad():
        torch.testing.assert_close(traced(x), model(x))
    norms = [path for path, m in model.named_modules() if isinstance(m, normkit.NormLayer)]
    assert any(node.op == "call_module" and node.target == norms[0] for node in traced.graph.nodes)
    features = create_feature_extractor(model, {norms[1]: "norm"})(x)
    assert features["norm"].shape[0] == 2
