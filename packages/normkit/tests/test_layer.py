"""NormLayer behaviour: layouts, recording/probes, weight-decay groups, activation placement."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import normkit
import normkit.testing
from normkit.stages import Partition, PostActivationStep
from normkit.testing import temporary_plugin


def test_tokens_layout_equals_channels_first_after_transpose() -> None:
    x = torch.randn(3, 10, 8)  # N, L, C
    for spec in ("bn", "gn(groups=4)", "in"):
        tok = normkit.build(spec, 8, channel_dim=-1)
        cf = normkit.build(spec, 8)
        torch.testing.assert_close(tok(x), cf(x.transpose(1, 2)).transpose(1, 2))


def test_recording_keeps_post_norm_values_only_when_asked() -> None:
    layer = normkit.build("gn(groups=2)", 4)
    x = torch.randn(2, 4, 3, 3)
    layer(x)
    assert layer.records == {}
    layer.recording = True
    layer(x)
    post = layer.records["post_norm"]
    assert post.shape == (2, 4, 9) and not post.requires_grad
    g = post.reshape(2, 2, 18)
    torch.testing.assert_close(g.mean(-1), torch.zeros(2, 2), atol=1e-5, rtol=0)


def test_probe_can_replace_post_norm_values() -> None:
    layer = normkit.build("bn", 4).eval()
    x = torch.randn(2, 4, 3, 3)
    remove = layer.add_probe(lambda layer, v: torch.zeros_like(v))
    with torch.no_grad():
        layer.bias.fill_(0.5)
    torch.testing.assert_close(layer(x), torch.full_like(x, 0.5))
    remove()
    assert not torch.allclose(layer(x), torch.full_like(x, 0.5))


class Proxyish(PostActivationStep):
    """A post-activation step that owns recovery and declares a decayed parameter."""

    name = "toy-post"
    owns_recovery = True

    def setup(self, layer):
        layer.register_parameter("toy_shift", nn.Parameter(torch.zeros(layer.num_channels)))

    def forward(self, y3, groups, layer):
        z = layer.act(y3 * layer.weight.view(1, -1, 1) + layer.bias.view(1, -1, 1))
        return z - layer.toy_shift.view(1, -1, 1)

    def decay(self):
        return {"toy_shift": True, "weight": False, "bias": False}


class WholeLayerProxyish(Proxyish):
    """Proxyish whose fused path computes the whole layer (group statistics included) on the raw input."""

    name = "toy-whole"
    fused_calls = 0

    def fused_forward(self, x, layer):
        if len(layer.steps) != 1:
            return None
        WholeLayerProxyish.fused_calls += 1
        y = nn.functional.group_norm(x, layer.partition.groups, eps=layer.steps[0].eps)
        return self.forward(y.reshape(*y.shape[:2], -1), None, layer).reshape(x.shape)


class PostPlugin:
    @normkit.hookimpl
    def normkit_register_stages(self, register):
        def factory(ctx, act: str = "relu"):
            return Proxyish()

        register("toy-post", factory, kind="post_activation", activation_param="act")
        register("needs-act", lambda ctx: Proxyish(), kind="post_activation")
        register("toy-whole", lambda ctx, act="relu": WholeLayerProxyish(), kind="post_activation",
                 activation_param="act")


@pytest.fixture
def post_plugin():
    with temporary_plugin(PostPlugin(), "post"):
        yield


def test_post_activation_step_brings_its_activation_and_owns_recovery(post_plugin) -> None:
    layer = normkit.build("gn(groups=2)+toy-post", 4)
    assert layer.activation_name == "relu" and isinstance(layer.act, nn.ReLU)
    assert layer.describe()["recovery"] == "none (affine moved into toy-post)"
    assert layer(torch.randn(2, 4, 3)).min() >= 0
    silu = normkit.build("gn(groups=2)+toy-post(act=silu)", 4)
    assert isinstance(silu.act, nn.SiLU)
    assert isinstance(normkit.build("gn(groups=2)+toy-post", 4, activation="silu").act, nn.SiLU)
    with pytest.raises(normkit.SpecError, match="conflicts with the activation 'relu'"):
        normkit.build("gn(groups=2)+toy-post(act=silu)", 4, activation="relu")


def test_post_activation_steps_fused_path_is_offered_the_whole_layer_first(post_plugin) -> None:
    """A post step's fused_forward gets the raw input before the steps' own fused paths, and what it returns is
    the layer's output (no second activation or post step applied after it); recording takes the generic path."""
    layer = normkit.build("gn(groups=2)+toy-whole", 4)
    with torch.no_grad():
        layer.toy_shift.fill_(0.25)
        layer.bias.fill_(-0.5)
    x = torch.randn(2, 4, 3, 3, requires_grad=True)
    before = WholeLayerProxyish.fused_calls
    out = layer(x)
    assert WholeLayerProxyish.fused_calls == before + 1
    layer.recording = True  # the generic path: group statistics, then the post step once
    torch.testing.assert_close(out, layer(x))
    assert WholeLayerProxyish.fused_calls == before + 1


def test_post_activation_step_without_activation_fails(post_plugin) -> None:
    with pytest.raises(normkit.SpecError, match="needs an activation before it, e.g. 'gn\\+relu\\+needs-act'"):
        normkit.build("gn(groups=2)+needs-act", 4)
    assert isinstance(normkit.build("gn(groups=2)+relu+needs-act", 4).act, nn.ReLU)
    with pytest.raises(normkit.SpecError, match="must come before 'toy-post'"):
        normkit.parse("gn+toy-post+relu")
    with pytest.raises(normkit.SpecError, match="two post-activation steps"):
        normkit.parse("gn+toy-post+needs-act")


def test_param_groups_decay_every_norm_parameter_alike_by_default(post_plugin) -> None:
    model = nn.Sequential(nn.Conv2d(3, 4, 3), normkit.build("gn(groups=2)+toy-post", 4), nn.Conv2d(4, 4, 1),
                          normkit.build("bn", 4))
    groups = normkit.param_groups(model, 5e-4)
    assert [g["weight_decay"] for g in groups] == [5e-4]  # the declared policy is not applied
    assert {id(p) for p in groups[0]["params"]} == {id(p) for p in model.parameters()}
    norm_groups = normkit.param_groups(model, 5e-4, norm_weight_decay=1e-5)
    small = {id(p) for g in norm_groups if g["weight_decay"] == 1e-5 for p in g["params"]}
    assert small == {id(p) for i in (1, 3) for p in model[i].parameters()}


def test_param_groups_follow_declared_policies_when_asked(post_plugin) -> None:
    model = nn.Sequential(nn.Conv2d(3, 4, 3), normkit.build("gn(groups=2)+toy-post", 4), nn.Conv2d(4, 4, 1),
                          normkit.build("bn", 4))
    groups = {g["weight_decay"]: {id(p) for p in g["params"]}
              for g in normkit.param_groups(model, 5e-4, plugin_policy=True)}
    assert id(model[1].toy_shift) in groups[5e-4]
    assert id(model[1].weight) in groups[0.0] and id(model[1].bias) in groups[0.0]
    assert id(model[0].weight) in groups[5e-4] and id(model[3].weight) in groups[5e-4]
    no_norm_decay = normkit.param_groups(model, 5e-4, norm_weight_decay=0.0, plugin_policy=True)
    zero = next(g for g in no_norm_decay if g["weight_decay"] == 0.0)
    assert any(p is model[3].weight for p in zero["params"])
    torch.optim.SGD(normkit.param_groups(model, 5e-4), lr=0.1, momentum=0.9)


def test_none_is_identity_and_takes_no_steps() -> None:
    x = torch.randn(2, 4, 3)
    assert torch.equal(normkit.build("none", 4)(x), x)
    assert torch.equal(normkit.build("none+relu", 4)(x), x.relu())

    class Centring:
        @normkit.hookimpl
        def normkit_register_stages(self, register):
            register("centre-test", lambda ctx: Centre())

    from normkit.stages import Centre

    with temporary_plugin(Centring(), "centring"):
        with pytest.raises(normkit.SpecError, match="'none' has no normalizing step to place 'centre-test'"):
            normkit.parse("none+centre-test")
        layer = normkit.build("rms+centre-test", 4, channel_dim=-1)
        assert [s.name for s in layer.steps] == ["rms-scale", "centre"]


def test_bad_constructor_arguments() -> None:
    with pytest.raises(normkit.SpecError, match="channel_dim must be 1"):
        normkit.build("bn", 4, channel_dim=2)
    with pytest.raises(normkit.SpecError, match="num_channels must be a positive int"):
        normkit.build("bn", 0)


@pytest.mark.parametrize(("partition", "shape", "tokens", "groups", "values"), [
    (Partition("layer"), (2, 8, 3, 5), False, 1, 8 * 15),
    (Partition("layer"), (2, 3, 5, 8), True, 1, 8),  # per token: its channels only
    (Partition("instance"), (2, 8, 3, 5), False, 8, 15),
    (Partition("instance"), (2, 3, 5, 8), True, 8, 15),
    (Partition("group", groups=4), (2, 8, 3, 5), False, 4, 2 * 15),
    (Partition("group", groups=4), (2, 8), False, 4, 2),
    (Partition("instance"), (2, 8), False, 8, 1),  # one value per group: no variance
])
def test_partition_counts_its_groups_and_their_values(partition, shape, tokens, groups, values):
    assert partition.groups_per_sample(8) == groups
    assert partition.values_per_group(shape, 8, tokens) == values


def test_a_batch_partition_has_no_groups_per_sample():
    with pytest.raises(ValueError, match="pools samples"):
        Partition("batch").groups_per_sample(8)


def test_registered_reads_parameters_and_buffers_as_getattr_does_reparametrized_ones_included():
    """`registered` skips nn.Module's slow attribute fallback on the per-call paths; a parametrized weight
    (torch.nn.utils.parametrize moves it out of `_parameters`) still reads as its computed value, so the
    fused paths apply what the layer's `weight` attribute says."""
    from torch.nn.utils import parametrize

    class Double(nn.Module):
        def forward(self, w: torch.Tensor) -> torch.Tensor:
            return 2 * w

    layer = normkit.build("bn", 4)
    weight, bias, mean = layer.registered("weight", "bias", "running_mean")
    assert weight is layer.weight and bias is layer.bias and mean is layer.running_mean
    parametrize.register_parametrization(layer, "weight", Double())
    with torch.no_grad():
        layer.parametrizations.weight.original.copy_(torch.tensor([1.0, 2.0, 3.0, 4.0]))
    assert torch.equal(layer.registered("weight")[0], torch.tensor([2.0, 4.0, 6.0, 8.0]))
    assert torch.equal(layer.recovery_params()[0], torch.tensor([2.0, 4.0, 6.0, 8.0]))
    x = torch.randn(3, 4, 5).abs() + 1
    layer.eval()
    expected = torch.nn.functional.batch_norm(x, layer.running_mean, layer.running_var, layer.weight, layer.bias)
    torch.testing.assert_close(layer(x), expected)
