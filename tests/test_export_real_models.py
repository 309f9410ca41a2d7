"""ONNX export of real layer-norm and RMS-norm models converted with normkit, checked in
onnxruntime against eager in eval with a dynamic batch: timm convnext_atto and vit_tiny,
torchvision convnext_tiny, Hugging Face GPT-2, Llama and BERT built from tiny configs (no
downloads). The batch-norm models (timm and torchvision ResNets, EfficientNet, RegNet, MobileNet)
are folded and exported in test_deploy_real_models.py. These norms use per-sample statistics, so
there is nothing to fold (docs/deploy.md)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

import normkit

sys.path.insert(0, str(Path(__file__).resolve().parent))
from onnx_check import onnx_and_eager  # noqa: E402

ort = pytest.importorskip("onnxruntime")
timm = pytest.importorskip("timm")
transformers = pytest.importorskip("transformers")
torchvision = pytest.importorskip("torchvision")

VOCAB = 50


class _Logits(nn.Module):
    """A Hugging Face model as tokens -> one tensor, the way it is exported for inference."""

    def __init__(self, model: nn.Module, field: str) -> None:
        super().__init__()
        self.model, self.field = model, field

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        extra = {"use_cache": False} if self.field == "logits" else {}
        return getattr(self.model(input_ids=ids, **extra), self.field)


def _gpt2() -> nn.Module:
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=16)
    return _Logits(transformers.GPT2LMHeadModel(cfg), "logits")


def _llama() -> nn.Module:
    cfg = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=2,
                                   num_key_value_heads=2, vocab_size=VOCAB)
    return _Logits(transformers.LlamaForCausalLM(cfg), "logits")


def _bert() -> nn.Module:
    cfg = transformers.BertConfig(num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=2,
                                  vocab_size=VOCAB)
    return _Logits(transformers.BertModel(cfg), "last_hidden_state")


def _image(n: int) -> torch.Tensor:
    return torch.randn(n, 3, 32, 32)


def _tokens(n: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (n, 8))


# name -> (builder, input, spec); the first is in the default run, the others under -m slow
MODELS: dict[str, tuple[Callable[[], nn.Module], Callable[[int], torch.Tensor], str]] = {
    "hf-gpt2-rms": (_gpt2, _tokens, "rms"),
    "hf-llama-rms": (_llama, _tokens, "rms"),
    "hf-bert-ln": (_bert, _tokens, "ln"),
    "timm-convnext_atto-ln": (lambda: timm.create_model("convnext_atto", num_classes=5), _image, "ln"),
    "timm-vit_tiny-rms": (lambda: timm.create_model("vit_tiny_patch16_224", num_classes=5, img_size=32,
                                                    patch_size=8), _image, "rms"),
    "tv-convnext_tiny-ln": (lambda: torchvision.models.convnext_tiny(num_classes=5), _image, "ln"),
}


@pytest.mark.parametrize("name", [pytest.param(n, marks=[] if i == 0 else [pytest.mark.slow])
                                  for i, n in enumerate(MODELS)])
def test_converted_model_exports_to_onnx_and_matches_eager(name: str, tmp_path: Path) -> None:
    make, inputs, spec = MODELS[name]
    torch.manual_seed(0)
    model = make()
    summary = normkit.convert(model, spec)  # rms and ln pool no tokens: causal models accept them
    assert len(summary) > 0
    model.eval()
    for got, want in onnx_and_eager(model, inputs, tmp_path / "model.onnx"):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
