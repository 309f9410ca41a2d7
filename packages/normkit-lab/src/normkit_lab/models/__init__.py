"""Models for experiments: each a factory `factory(ctx: ModelContext, **params)` in the registry.

    from normkit_lab.models import build_model
    model = build_model("preact-resnet18", "gn+pn", num_classes=10, in_channels=3, image_size=32)
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from torch import nn

import normkit
from normkit import plugins
from normkit_lab.item_params import typed_params
from normkit_lab.models import gpt, preact_resnet, resnet, small_cnn, torchvision_models, vit
from normkit_lab.models.context import MissingActivation, ModelContext, NormHostError

__all__ = ["MissingActivation", "ModelContext", "NormHostError", "build_model", "model_params",
           "register_builtin_models"]

_PREACT_HINT = ("use 'preact-resnet18', 'preact-resnet34' or 'wrn', where every norm is followed by an "
                "activation")

_GPT_HINT = "its norms feed attention and linear layers; use a per-token norm without post-activation steps"
# Language models default to the offline byte corpus, test bits per byte as the primary metric and
# AdamW at small batches (more steps for the same tokens); the user's values win.
_GPT_TRAIN = {"dataset": "pysrc", "metric": "test_bpb", "optimizer": "adamw", "lr": 3e-3, "weight_decay": 0.1,
              "batch_size": 32}
_GPT2_TRAIN = {**_GPT_TRAIN, "lr": 6e-4}
# gpt-tiny's CPU recipe (docs/experiments.md, "Language models"): 4,000 AdamW steps of 16 windows of 32
# bytes streamed from the whole train split (no window seen twice: 2 MB of text), without warmup, so
# that every ln run ends below the trigram table (2.69 bits/byte on pysrc; 2.37 measured) in about
# 50 s of CPU time per run, the ln arm's five seeds in about four minutes (docs/reproduce.md).
_GPT_TINY_TRAIN = {**_GPT_TRAIN, "lr": 3e-3, "batch_size": 16, "budget": "steps=4000", "warmup_epochs": 0,
                   "dataset_params": {"seq_len": 32, "stream": True, "test_windows": 512}}


def _defaults(factory: Callable[..., Any]) -> dict[str, Any]:
    """A factory's parameter defaults: model summaries are built from them, so `normkit list` never
    disagrees with what the factory builds."""
    return {name: p.default for name, p in inspect.signature(factory).parameters.items()
            if p.default is not inspect.Parameter.empty}


def _vit_shape(factory: Callable[..., Any]) -> str:
    d = _defaults(factory)
    return (f"patch {d['patch']}, {d['depth']} layers, {d['heads']} heads, width {d['width']}, "
            f"MLP {d['mlp_width']}")


def register_builtin_models(register: Callable[..., Any]) -> None:
    """Register the lab's models (called from the `normkit_register_models` hook)."""
    register("small-cnn", small_cnn.small_cnn, skip=1, citation="",
             summary=f"{_defaults(small_cnn.small_cnn)['depth']} conv-norm-ReLU blocks for tiny images (8x8 digits); "
                     "seconds per epoch on CPU")
    register("resnet18", resnet.resnet18, skip=1, citation=resnet.CITATION, host_hint=_PREACT_HINT,
             summary="CIFAR-style ResNet-18 (3x3 stem, norm in the downsample shortcut)")
    register("resnet34", resnet.resnet34, skip=1, citation=resnet.CITATION, host_hint=_PREACT_HINT,
             summary="CIFAR-style ResNet-34 (3x3 stem, norm in the downsample shortcut)")
    register("preact-resnet18", preact_resnet.preact_resnet18, skip=1, citation=preact_resnet.CITATION,
             summary="pre-activation ResNet-18 (v2): every activation follows a norm; hosts gn+pn")
    register("preact-resnet34", preact_resnet.preact_resnet34, skip=1, citation=preact_resnet.CITATION,
             summary="pre-activation ResNet-34 (v2): every activation follows a norm; hosts gn+pn")
    register("wrn", preact_resnet.wide_resnet, skip=1, aliases=("wide-resnet",),
             citation=preact_resnet.WRN_CITATION,
             summary="pre-activation WideResNet-depth-width (default WRN-{depth}-{width})".format(
                 **_defaults(preact_resnet.wide_resnet)))
    register("vit", vit.vit, skip=1, citation=vit.CITATION,
             host_hint="its norms feed attention and linear layers; use a norm without post-activation steps",
             summary=f"pre-norm ViT ({_vit_shape(vit.vit)} as in the paper)")
    register("vit-small", vit.vit_small, skip=1, citation=vit.CITATION,
             host_hint="its norms feed attention and linear layers; use a norm without post-activation steps",
             summary=f"CPU-sized ViT ({_vit_shape(vit.vit_small)})")
    register("gpt", gpt.gpt, skip=1, inputs="tokens", citation=gpt.CITATION, host_hint=_GPT_HINT,
             train_defaults=_GPT_TRAIN,
             summary="decoder-only byte-level transformer (default width 64, 2 layers, 4 heads, context 128)")
    register("gpt-tiny", gpt.gpt_tiny, skip=1, inputs="tokens", citation=gpt.CITATION, host_hint=_GPT_HINT,
             train_defaults=_GPT_TINY_TRAIN,
             summary="CPU-sized GPT (width 64, 2 layers, 4 heads, context 128): seconds per run on 2 CPU cores")
    register("gpt2-small", gpt.gpt2_small, skip=1, inputs="tokens", citation=gpt.CITATION, host_hint=_GPT_HINT,
             train_defaults=_GPT2_TRAIN,
             summary="GPT-2 small shape (width 768, 12 layers, 12 heads, context 1024) for a GPU")
    register("tv-resnet18", torchvision_models.tv_resnet18, skip=1, citation=torchvision_models.CITATION,
             host_hint=_PREACT_HINT, summary="torchvision resnet18, norms swapped by normkit.convert")
    register("tv-resnet50", torchvision_models.tv_resnet50, skip=1, citation=torchvision_models.CITATION,
             host_hint=_PREACT_HINT, summary="torchvision resnet50, norms swapped by normkit.convert")


def model_params(name: str, params: dict[str, Any]) -> dict[str, Any]:
    """Type-check `params` against the model's declared parameters; unknown keys raise SpecError."""
    entry = plugins.registry().lookup_item("model", name)
    return typed_params(f"model {entry.name!r}", entry.params, params)


def _check_inputs(name: str, takes: str, in_channels: int) -> None:
    """A model registered with `inputs="tokens"` needs token data (in_channels 0), any other images."""
    gives = "tokens" if in_channels == 0 else "images"
    if takes == gives:
        return
    if takes == "tokens":
        raise normkit.SpecError(f"model {name!r} takes token sequences, but the dataset gives images; "
                                f"use a text dataset (pysrc, text, hf)")
    raise normkit.SpecError(f"model {name!r} takes images, but the dataset gives token sequences; "
                            f"use a language model (gpt-tiny, gpt, gpt2-small)")


def build_model(name: str, norm: str, *, num_classes: int, in_channels: int, image_size: int,
                **params: Any) -> nn.Module:
    """Build registered model `name` with every norm built from spec `norm`.

    `in_channels` 0 means token data (a text dataset): only models registered with
    `inputs="tokens"` take it, and they take nothing else.

    Raises normkit.SpecError with one line for an unknown model, bad parameters, or a norm the
    model cannot host (e.g. a post-activation spec at a norm that feeds a residual add).
    """
    entry = plugins.registry().lookup_item("model", name)
    typed = model_params(name, params)
    _check_inputs(entry.name, entry.meta.get("inputs", "images"), in_channels)
    spec = normkit.parse(norm).text
    ctx = ModelContext(spec, num_classes, in_channels, image_size)
    try:
        model = entry.factory(ctx, **typed)
    except NormHostError as exc:
        hint = entry.meta.get("host_hint") if isinstance(exc, MissingActivation) else None
        raise normkit.SpecError(f"model {entry.name!r} cannot host {spec!r}: {exc}"
                                + (f"; {hint}" if hint else "")) from exc
    normkit.prepare_feeding_convs(model)  # steps such as `ws` act on the conv feeding their norm
    return model
