"""The GPT model: causal for every per-token norm, refuses token-pooling norms, trains, and takes diagnostics."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import normkit
from normkit import plugins
from normkit.layer import NormLayer
from normkit_lab.diagnostics import DiagnosticsCallback, DiagnosticsSettings
from normkit_lab.errors import ConfigError
from normkit_lab.models import build_model
from normkit_lab.models.causality import token_pooling
from normkit_lab.runs.training import train_run
from normkit_lab.spec import TrainConfig

T = 16
TINY = {"width": 16, "depth": 2, "heads": 2, "context": T}
POOLING = ("bn", "bnn", "in", "inn", "gn(groups=4)", "gnn(groups=4)")


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _gpt(norm: str, name: str = "gpt-tiny", **params):
    return build_model(name, norm, num_classes=256, in_channels=0, image_size=T, **{**TINY, **params})


def _allowed_token_norms() -> list[str]:
    """Every registered norm the GPT accepts (per-token partition or no statistics), plus ln+ib-l."""
    allowed = []
    for entry in plugins.registry().of_kind("norm"):
        try:
            _gpt(entry.name)
        except normkit.SpecError:
            continue
        allowed.append(entry.name)
    return [*allowed, "ln+ib-l"]


ALLOWED = _allowed_token_norms()


def test_the_usual_token_norms_are_allowed():
    assert {"ln", "rms", "lnn", "none", "ln+ib-l"} <= set(ALLOWED)
    assert not set(POOLING) & set(ALLOWED)
    registered = {e.name for e in plugins.registry().of_kind("norm")}
    assert "dyt" not in registered or "dyt" in ALLOWED  # the refusal message recommends it


def _outputs(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    torch.manual_seed(7)  # the same noise draws (lnn) for both inputs
    with torch.no_grad():
        return model(x)


@pytest.mark.parametrize(("placement", "qk_norm"), [("pre", False), ("post", False), ("peri", False),
                                                    ("pre", True)])
@pytest.mark.parametrize("norm", ALLOWED)
def test_a_change_at_position_t_never_changes_earlier_outputs(norm, placement, qk_norm):
    torch.manual_seed(0)
    model = _gpt(norm, placement=placement, qk_norm=qk_norm)
    x = torch.randint(0, 256, (3, T))
    for mode in ("train", "eval"):
        model.train(mode == "train")
        for t in (0, 5, T - 1):
            changed = x.clone()
            changed[:, t] = (changed[:, t] + 1 + torch.arange(3)) % 256
            before, after = _outputs(model, x), _outputs(model, changed)
            assert torch.allclose(before[:, :t], after[:, :t], atol=1e-5), (mode, t)
            assert not torch.allclose(before[:, t], after[:, t], atol=1e-5), (mode, t)  # the change arrives


def test_an_allowed_token_pooling_norm_does_leak_the_future():
    """Why bn is refused: with the flag it builds, and a later token changes earlier outputs in training."""
    torch.manual_seed(0)
    model = _gpt("bn", allow_token_pooling=True).train()
    x = torch.randint(0, 256, (3, T))
    changed = x.clone()
    changed[:, -1] = (changed[:, -1] + 1) % 256
    assert not torch.allclose(_outputs(model, x)[:, :-1], _outputs(model, changed)[:, :-1], atol=1e-5)


@pytest.mark.parametrize("norm", POOLING)
def test_token_pooling_norms_are_refused_with_one_line(norm):
    with pytest.raises(normkit.SpecError, match="gpt-tiny is causal: .* would leak future tokens; .*"
                                                 "allow_token_pooling=true") as info:
        _gpt(norm)
    assert "\n" not in str(info.value)
    assert _gpt(norm, allow_token_pooling=True) is not None


def test_refusal_names_the_preset():
    with pytest.raises(normkit.SpecError, match="^gpt2-small is causal: 'bn' pools statistics over the batch"):
        with torch.device("meta"):
            build_model("gpt2-small", "bn", num_classes=256, in_channels=0, image_size=T)


class _TokenwiseScale(nn.Module):
    def __init__(self, per_token: bool) -> None:
        super().__init__()
        if per_token:
            self.per_token = True

    def forward(self, x):
        return x / x.norm(dim=-1, keepdim=True)


def test_factory_norms_must_declare_per_token():
    assert "unknown kind" in token_pooling(_TokenwiseScale(per_token=False))
    assert token_pooling(_TokenwiseScale(per_token=True)) is None
    assert token_pooling(nn.LayerNorm(8)) is None and token_pooling(nn.Identity()) is None
    assert token_pooling(nn.LayerNorm((4, 8))) is not None
    assert token_pooling(normkit.build("ln", 8)) is not None  # channels-first ln pools the whole sequence


@pytest.mark.parametrize(("placement", "qk_norm", "count"),
                         [("pre", False, 5), ("post", False, 4), ("peri", False, 9), ("sandwich", False, 9),
                          ("pre", True, 9), ("peri", True, 13)])
def test_every_norm_is_built_from_the_spec_on_channels_last_tokens(placement, qk_norm, count):
    model = _gpt("rms", placement=placement, qk_norm=qk_norm)
    layers = [m for m in model.modules() if isinstance(m, NormLayer)]
    assert len(layers) == count
    assert all(layer.spec == "rms" and layer.channel_dim == -1 for layer in layers)
    assert model.head.weight is model.tok.weight  # tied embeddings
    assert model(torch.randint(0, 256, (2, T))).shape == (2, T, 256)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"image_size": 32}, "sequences have 32 tokens, more than context=16"),
    ({"in_channels": 1}, "model 'gpt-tiny' takes token sequences, but the dataset gives images; use a text"),
    ({"heads": 3}, "not divisible by heads"),
    ({"placement": "middle"}, r"placement must be one of pre, post, peri \(sandwich = peri\)"),
    ({"mlp_ratio": 0.0}, "mlp_ratio must be"),
])
def test_bad_settings_are_one_line_spec_errors(kwargs, message):
    shape = {"num_classes": 256, "in_channels": 0, "image_size": T}
    params = {**TINY, **{k: v for k, v in kwargs.items() if k not in shape}}
    shape.update({k: v for k, v in kwargs.items() if k in shape})
    with pytest.raises(normkit.SpecError, match=message):
        build_model("gpt-tiny", "ln", **shape, **params)


def test_gpt2_small_has_the_gpt2_shape():
    with torch.device("meta"):
        model = build_model("gpt2-small", "ln", num_classes=256, in_channels=0, image_size=T)
    blocks = list(model.blocks)
    assert len(blocks) == 12 and model.tok.embedding_dim == 768 and model.context == 1024
    assert blocks[0].attn.heads == 12 and blocks[0].mlp.fc.out_features == 3072


def _cfg(**overrides) -> TrainConfig:
    values = {"model": "gpt-tiny", "model_params": dict(TINY), "dataset": "pysrc",
              "dataset_params": {"seq_len": T, "train_windows": 256, "eval_windows": 32, "max_files": 40},
              "epochs": 2, "batch_size": 32, "optimizer": "adamw", "lr": 1e-2, **overrides}
    return TrainConfig(**values)


def test_gpt_tiny_learns_bytes_and_reports_bits_per_byte():
    result = train_run(_cfg(), "ln", seed=0)
    first, last = result.epochs
    assert result.status == "ok"
    assert last.val_loss < first.val_loss < math.log(256)  # better than uniform bytes, and improving
    assert last.val_bpb == pytest.approx(last.val_loss / math.log(2))
    assert last.throughput > 0 and last.peak_mem_mb > 0
    assert len(result.extras["dataset"]["sha256"]) == 64


@pytest.mark.parametrize("norm", ["ln", "lnn"])
def test_diagnostics_run_on_the_gpt(norm):
    settings = DiagnosticsSettings(channels=4, batches=2, batch_size=8, draws=1, sources=2)
    result = train_run(_cfg(epochs=1), norm, seed=0, callbacks=[DiagnosticsCallback(settings)])
    diag = result.extras["diagnostics"]
    assert len(diag["final"]) == 5 and all(row["qq_r2"] is not None for row in diag["final"])
    assert diag["noise_robustness"]["table"]
    if norm == "lnn":  # lambda per token: a trajectory of the estimated lambdas (init and each epoch)
        assert [e["epoch"] for e in diag["lambda"]] == [0, 1]
        assert all(row["source"] == "estimated" and math.isfinite(row["mean"]) for row in diag["lambda"][0]["layers"])
    else:
        assert diag["lambda"] == []


def test_an_image_model_refuses_token_data():
    with pytest.raises(normkit.SpecError, match="model 'small-cnn' takes images, but the dataset gives token "
                                                 "sequences; use a language model"):
        build_model("small-cnn", "bn", num_classes=256, in_channels=0, image_size=T)


def test_gpt_tiny_recipe_streams_the_train_split_under_a_steps_budget() -> None:
    """The CPU recipe trains 4,000 steps on fresh windows of the whole train split (no window twice),
    and a user's own budget replaces the recipe's."""
    from normkit_lab.study import config as lab_config

    cfg = lab_config.build_config({"model": "gpt-tiny", "norms": "ln"})
    assert cfg.train.budget == "steps=4000" and cfg.train.warmup_epochs == 0
    assert cfg.train.dataset_params == {"seq_len": 32, "stream": True, "test_windows": 512}
    mine = lab_config.build_config({"model": "gpt-tiny", "norms": "ln", "budget": "steps=50"})
    assert mine.train.budget == "steps=50"


def test_placements_compute_what_their_names_say():
    """pre: x + f(norm(x)); post: norm(x + f(x)); peri: x + norm_out(f(norm(x))); QK-norm normalizes each
    head's queries and keys over the head's channels before attention (checked against a hand computation)."""
    torch.manual_seed(0)
    x = torch.randn(2, T, TINY["width"])
    for placement in ("pre", "post", "peri"):
        block = _gpt("rms", placement=placement).blocks[0]
        a = x + block.attn(block.norm1(x)) if placement == "pre" else (
            block.norm1(x + block.attn(x)) if placement == "post" else x + block.norm1_out(block.attn(block.norm1(x))))
        b = a + block.mlp(block.norm2(a)) if placement == "pre" else (
            block.norm2(a + block.mlp(a)) if placement == "post" else a + block.norm2_out(block.mlp(block.norm2(a))))
        torch.testing.assert_close(block(x), b)
    attn = _gpt("rms", qk_norm=True).blocks[0].attn
    with torch.no_grad():
        attn.q_norm.weight.uniform_(0.5, 1.5)
    n, t, d = x.shape
    q, k, v = attn.qkv(x).reshape(n, t, 3, attn.heads, d // attn.heads).permute(2, 0, 3, 1, 4)
    rms = lambda z, w: z * torch.rsqrt(z.pow(2).mean(-1, keepdim=True) + 1e-6) * w  # noqa: E731
    ref = nn.functional.scaled_dot_product_attention(rms(q, attn.q_norm.weight), rms(k, attn.k_norm.weight), v,
                                                     is_causal=True)
    torch.testing.assert_close(attn(x), attn.proj(ref.transpose(1, 2).reshape(n, t, d)))
    assert attn.q_norm.num_channels == d // attn.heads


def test_a_sweep_over_placement_and_qk_norm_sets_each_cells_model_params():
    """`--sweep placement=pre,peri --sweep qk_norm=false,true`: model parameters are swept like training keys,
    typed by the model's declaration, and each run builds its cell's model."""
    from normkit_lab.records import RunId
    from normkit_lab.study import config as lab_config

    cfg = lab_config.build_config({"model": "gpt-tiny", "norms": "rms",
                                   "sweep": {"placement": ["pre", "peri"], "qk_norm": [False, True]}})
    assert cfg.sweep == {"placement": ["pre", "peri"], "qk_norm": [False, True]}
    train = RunId.of("rms", 0, "compare", {"placement": "peri", "qk_norm": True}).train_config(cfg.train)
    assert train.model_params == {**cfg.train.model_params, "placement": "peri", "qk_norm": True}
    assert "placement" not in {f for f in vars(train)}
    with pytest.raises(ConfigError, match="sweep qk_norm: model 'gpt-tiny': parameter 'qk_norm' expects bool"):
        lab_config.build_config({"model": "gpt-tiny", "norms": "rms", "sweep": {"qk_norm": ["maybe", "true"]}})
    with pytest.raises(ConfigError, match="'widht' is not a training key"):
        lab_config.build_config({"model": "gpt-tiny", "norms": "rms", "sweep": {"widht": [16, 32]}})
