"""convert() on norm classes whose code repeats a class normkit reads under another name.

Hugging Face copies `LlamaRMSNorm`, `GemmaRMSNorm` and `Olmo2RMSNorm` into each model's file under
the model's name; each copy is converted exactly as the class it repeats (train and eval outputs,
input and parameter gradients, strict checkpoints both ways, bfloat16 bit for bit), on the classes
and on models built from tiny configs. A class that differs in code is refused, naming the known
class whose forward it shares.
"""

from __future__ import annotations

import copy
import importlib
import sys
from pathlib import Path

import pytest
import torch
import transformers
from torch import nn

import normkit
from normkit.interop import clone_of

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_convert_library_classes import TOKENS, C, _randomized, _randomized_all, _step  # noqa: E402

# family: (module folder, class name, the known class its code repeats)
FAMILIES = {
    "Qwen2-MoE": ("qwen2_moe", "Qwen2MoeRMSNorm", "LlamaRMSNorm"),
    "Qwen3-MoE": ("qwen3_moe", "Qwen3MoeRMSNorm", "LlamaRMSNorm"),
    "Qwen3-Next": ("qwen3_next", "Qwen3NextRMSNorm", "GemmaRMSNorm"),
    "DeepSeek-V2": ("deepseek_v2", "DeepseekV2RMSNorm", "LlamaRMSNorm"),
    "DeepSeek-V3": ("deepseek_v3", "DeepseekV3RMSNorm", "LlamaRMSNorm"),
    "Granite": ("granite", "GraniteRMSNorm", "LlamaRMSNorm"),
    "SmolLM3": ("smollm3", "SmolLM3RMSNorm", "LlamaRMSNorm"),
    "GLM-4": ("glm4", "Glm4RMSNorm", "LlamaRMSNorm"),
    "Ministral": ("ministral", "MinistralRMSNorm", "LlamaRMSNorm"),
    "GPT-OSS": ("gpt_oss", "GptOssRMSNorm", "Olmo2RMSNorm"),
    "OLMo 3": ("olmo3", "Olmo3RMSNorm", "Olmo2RMSNorm"),
    "T5Gemma": ("t5gemma", "T5GemmaRMSNorm", "GemmaRMSNorm"),
}


def _class(folder: str, name: str) -> type:
    return getattr(importlib.import_module(f"transformers.models.{folder}.modeling_{folder}"), name)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_hugging_face_copies_convert_exactly_as_the_class_they_repeat(family: str) -> None:
    folder, name, twin = FAMILIES[family]
    cls = _class(folder, name)
    assert clone_of(cls).__name__ == twin
    g = torch.Generator().manual_seed(0)
    source = nn.Sequential(nn.Identity(), _randomized(cls(C), g))
    converted = copy.deepcopy(source)
    summary = normkit.convert(converted, "rms", causal=False)
    assert [(r.old, r.new) for r in summary] == [(name, "rms")]
    for training in (True, True, False):
        source.train(training)
        converted.train(training)
        x = torch.randn(TOKENS, generator=g) * 2 + 0.3
        for got, want in zip(_step(converted, x), _step(source, x), strict=True):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    converted.load_state_dict(source.state_dict(), strict=True)
    source.load_state_dict(converted.state_dict(), strict=True)
    half_source, half = source.to(torch.bfloat16), converted.to(torch.bfloat16)
    x = torch.randn(64, 16, C, dtype=torch.bfloat16) * 3
    assert torch.equal(half(x), half_source(x))  # each copy keeps its twin's rounding order


class CopiedRMSNorm(nn.Module):
    """A user's copy of LlamaRMSNorm: other name, other docstrings, no annotations."""

    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


class ScaledEpsRMSNorm(nn.Module):
    """LlamaRMSNorm's forward with another __init__: what it stores is not known."""

    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size) * 2)
        self.variance_epsilon = eps * 10

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


def test_a_copy_outside_the_library_converts_and_a_near_copy_is_refused_naming_its_twin() -> None:
    model = nn.Sequential(_randomized(CopiedRMSNorm(C), torch.Generator().manual_seed(4)))
    x = torch.randn(TOKENS)
    want = model(x)
    assert normkit.convert(model, "rms").replaced[0].old == "CopiedRMSNorm"
    torch.testing.assert_close(model(x), want)
    near = nn.Sequential(ScaledEpsRMSNorm(C))
    with pytest.raises(normkit.SpecError) as err:
        normkit.convert(near, "rms")
    message = str(err.value)
    assert "ScaledEpsRMSNorm is a norm class normkit does not know" in message and "\n" not in message
    assert ("its forward is the code of transformers.models.llama.modeling_llama.LlamaRMSNorm" in message
            and "normkit.register_source(cls, normkit.interop.read_llama_rms_norm)" in message)
    assert isinstance(near[0], ScaledEpsRMSNorm)
    normkit.register_source(ScaledEpsRMSNorm, normkit.interop.read_llama_rms_norm)  # the one line
    try:
        want = near(x)
        normkit.convert(near, "rms")
        torch.testing.assert_close(near(x), want)
    finally:
        del normkit.interop.sources._TABLE[ScaledEpsRMSNorm]


def _small(**extra) -> dict:
    return {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 2, "num_key_value_heads": 2, **extra}


MOE = {"moe_intermediate_size": 16, "num_experts_per_tok": 2}
MODELS = {
    "olmo3": lambda: transformers.Olmo3ForCausalLM(transformers.Olmo3Config(**_small())),
    "granite": lambda: transformers.GraniteForCausalLM(transformers.GraniteConfig(**_small())),
    "qwen3_moe": lambda: transformers.Qwen3MoeForCausalLM(
        transformers.Qwen3MoeConfig(**_small(num_experts=4, head_dim=16, **MOE))),
    "gpt_oss": lambda: transformers.GptOssForCausalLM(transformers.GptOssConfig(
        **_small(num_local_experts=4, num_experts_per_tok=2, head_dim=16, layer_types=["full_attention"] * 2))),
    "deepseek_v3": lambda: transformers.DeepseekV3ForCausalLM(transformers.DeepseekV3Config(
        **_small(n_routed_experts=4, n_group=1, topk_group=1, kv_lora_rank=8, q_lora_rank=8, qk_rope_head_dim=8,
                 qk_nope_head_dim=8, v_head_dim=8, first_k_dense_replace=1, **MOE))),
}


@pytest.mark.parametrize("kind", [pytest.param(k, marks=[] if k in ("olmo3", "granite") else [pytest.mark.slow])
                                  for k in MODELS])
def test_models_built_from_configs_with_copied_norms_convert_exactly(kind: str) -> None:
    torch.manual_seed(0)
    source = MODELS[kind]()
    _randomized_all(source)
    converted = copy.deepcopy(source)
    summary = normkit.convert(converted, "same")
    assert len(summary) >= 5 and {r.new for r in summary} == {"rms"}
    ids = torch.randint(0, 64, (2, 8))
    for training in (True, False):
        outs = []
        for model in (source, converted):
            model.train(training)
            torch.manual_seed(1)
            logits = model(input_ids=ids).logits
            logits.square().mean().backward()
            outs.append([logits.detach(), *(p.grad.clone() for p in model.parameters() if p.grad is not None)])
            model.zero_grad()
        for got, want in zip(outs[1], outs[0], strict=True):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
    converted.load_state_dict(source.state_dict(), strict=True)
    source.load_state_dict(converted.state_dict(), strict=True)
