"""Every model builds and trains a step with the norms it can host, and refuses the others clearly."""

from __future__ import annotations

import pytest
import torch

import normkit
from normkit import plugins
from normkit.layer import NormLayer
from normkit_lab.models import build_model

# Tiny versions of every registered model (8x8 inputs, few channels) so a step takes milliseconds.
TINY = {
    "small-cnn": {"width": 8},
    "resnet18": {"width": 4},
    "resnet34": {"width": 4},
    "preact-resnet18": {"width": 4},
    "preact-resnet34": {"width": 4},
    "wrn": {"depth": 10, "width": 1},
    "vit": {"patch": 4, "depth": 1, "heads": 2, "width": 16, "mlp_width": 32},
    "vit-small": {"width": 16, "mlp_width": 32},
    "tv-resnet18": {},
    "tv-resnet50": {},
}
HOSTS_POST_ACTIVATION = ("small-cnn", "preact-resnet18", "preact-resnet34", "wrn")
GN_PN = "gn(groups=4)+pn"


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models run fastest on one thread (and do not fight other processes for cores)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _build(name: str, norm: str, in_channels: int = 1, **params):
    return build_model(name, norm, num_classes=10, in_channels=in_channels, image_size=8, **{**TINY[name], **params})


def _step(model: torch.nn.Module, in_channels: int = 1) -> None:
    torch.manual_seed(0)
    x = torch.randn(4, in_channels, 8, 8)
    out = model(x)
    assert out.shape == (4, 10)
    out.square().mean().backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert grads and all(g is not None and torch.isfinite(g).all() for g in grads)


def _norm_layers(model: torch.nn.Module) -> list[NormLayer]:
    return [m for m in model.modules() if isinstance(m, NormLayer)]


LANGUAGE_MODELS = {"gpt", "gpt-tiny", "gpt2-small"}  # token models, covered in test_gpt.py


def test_every_registered_model_is_covered_here():
    registered = {e.name for e in plugins.registry().of_kind("model") if e.plugin == "lab"}
    assert registered == set(TINY) | LANGUAGE_MODELS


@pytest.mark.parametrize("name", sorted(TINY))
def test_model_with_bn_runs_forward_and_backward(name):
    model = _build(name, "bn")
    _step(model)
    layers = _norm_layers(model)
    assert layers and all(layer.spec == "bn" for layer in layers)
    assert not any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules())


@pytest.mark.parametrize("name", HOSTS_POST_ACTIVATION)
def test_preactivation_models_host_gn_pn_at_every_norm(name):
    model = _build(name, GN_PN)
    _step(model)
    layers = _norm_layers(model)
    assert layers and all(layer.post is not None for layer in layers)
    assert not any(isinstance(m, torch.nn.ReLU) for m in model.modules() if not isinstance(m, NormLayer)
                   and m not in {layer.act for layer in layers})


@pytest.mark.parametrize("name", HOSTS_POST_ACTIVATION)
def test_only_the_norm_before_pooling_drops_proxy_scaling(name):
    layers = _norm_layers(_build(name, GN_PN))
    scales = [layer.post.describe()["scale"] for layer in layers]
    assert scales[-1] is False and all(scales[:-1])


def test_explicit_pn_scale_in_the_spec_wins_over_the_final_layer_default():
    layers = _norm_layers(_build("small-cnn", "gn(groups=4)+pn(scale=true)"))
    assert all(layer.post.describe()["scale"] for layer in layers)


@pytest.mark.parametrize("name", ("resnet18", "resnet34"))
def test_post_activation_norm_in_a_v1_resnet_names_the_preact_model(name):
    message = f"model '{name}' cannot host 'gn.*pn'.*preact-resnet18"
    with pytest.raises(normkit.SpecError, match=message) as info:
        _build(name, GN_PN)
    assert "\n" not in str(info.value)


def test_torchvision_resnet_takes_pn_where_an_activation_follows_and_the_plain_norm_elsewhere():
    """tv-resnet18 goes through normkit.convert, which puts the proxy step on every norm whose
    output feeds an activation and the plain norm on those that feed the residual add."""
    model = _build("tv-resnet18", GN_PN, in_channels=3)
    layers = _norm_layers(model)
    with_pn = [layer for layer in layers if layer.post is not None]
    assert 0 < len(with_pn) < len(layers)
    _step(model, in_channels=3)


def test_vit_cannot_host_post_activation_norms():
    with pytest.raises(normkit.SpecError, match="cannot host 'ln\\+pn'.*attention and linear"):
        _build("vit-small", "ln+pn")


@pytest.mark.parametrize("norm", ("ln", "bn", "gn(groups=4)", "rms"))
def test_vit_norms_work_on_channels_last_tokens(norm):
    model = _build("vit-small", norm)
    _step(model)
    assert all(layer.channel_dim == -1 for layer in _norm_layers(model))


@pytest.mark.parametrize(("placement", "qk_norm", "count"),
                         [("pre", False, 5), ("post", False, 4), ("peri", False, 9), ("peri", True, 13)])
def test_vit_placements_and_qk_norm(placement, qk_norm, count):
    """The ViT takes GPT's placements (models/placement.py) and QK-norm: the norms each adds, built from the
    spec on tokens (QK-norm over each head's channels), and a training step through them."""
    if qk_norm:
        pytest.importorskip("normkit_zoo")  # derf: a factory norm (no NormLayer) as the QK-norm
    model = _build("vit-small", "derf" if qk_norm else "rms", **{"placement": placement, "qk_norm": qk_norm})
    norms = [m for m in model.modules() if isinstance(m, NormLayer) or type(m).__name__ == "DynamicErf"]
    assert len(norms) == count
    if qk_norm:
        attn = model.blocks[0].attn
        assert attn.q_norm.num_channels == 16 // 4 and type(attn.k_norm).__name__ == "DynamicErf"
    _step(model)


def test_bnn_on_every_model():
    pytest.importorskip("normkit_normalnorm")
    for name in TINY:  # torchvision's blocks also modify the norm's output in place (`out += identity`)
        _step(_build(name, "bnn"))


def test_tv_resnet_takes_three_channel_images_without_a_new_stem():
    model = _build("tv-resnet18", "gn(groups=8)", in_channels=3)
    _step(model, in_channels=3)


@pytest.mark.parametrize("name", ("wrn", "resnet18", "vit-small"))
def test_gn_with_too_many_groups_says_which_groups_fit_without_unrelated_hints(name):
    with pytest.raises(normkit.SpecError, match="cannot host 'gn'.*use groups=") as info:
        _build(name, "gn")
    assert "preact" not in str(info.value) and "attention" not in str(info.value)


def test_unknown_model_parameter_lists_the_valid_ones():
    with pytest.raises(normkit.SpecError, match="no parameter 'widht'.*did you mean 'width'"):
        build_model("small-cnn", "bn", num_classes=10, in_channels=1, image_size=8, widht=4)


def test_model_parameter_is_type_checked():
    with pytest.raises(normkit.SpecError, match="expects int"):
        build_model("small-cnn", "bn", num_classes=10, in_channels=1, image_size=8, width="wide")


@pytest.mark.parametrize(("name", "params", "message"), [
    ("wrn", {"depth": 12}, "6n\\+4"),
    ("vit-small", {"patch": 3}, "does not divide"),
    ("vit-small", {"heads": 3}, "not divisible by heads"),
    ("vit-small", {"placement": "after"}, "placement must be one of pre, post, peri"),
    ("small-cnn", {"depth": 0}, ">= 1"),
])
def test_bad_architecture_numbers_are_spec_errors(name, params, message):
    with pytest.raises(normkit.SpecError, match=message):
        build_model(name, "bn", num_classes=10, in_channels=1, image_size=8, **params)


def test_unknown_model_suggests_close_names():
    with pytest.raises(normkit.SpecError, match="unknown model 'resnet19'.*resnet18"):
        build_model("resnet19", "bn", num_classes=10, in_channels=1, image_size=8)


def test_same_seed_gives_the_same_initialization():
    def weights():
        torch.manual_seed(3)
        return torch.cat([p.detach().flatten() for p in _build("preact-resnet18", "bn").parameters()])

    assert torch.equal(weights(), weights())
