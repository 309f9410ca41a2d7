"""Norms that include their nonlinearity (frn, evonorm-s0/b0): the activation after them is dropped."""

from __future__ import annotations

import copy
import io

import pytest
import torch
from torch import nn

import normkit
from normkit_lab.models import build_model
from normkit_zoo.frn import TLU


def _modules_after(model: nn.Module, kind: type) -> list[str]:
    return [n for n, m in model.named_modules() if isinstance(m, kind)]


@pytest.mark.parametrize("spec", ["frn", "evonorm-s0(groups=4)", "evonorm-b0"])
def test_build_drops_the_models_activation(spec: str) -> None:
    owned, plain = normkit.build(spec, 8, activation="relu"), normkit.build(spec, 8)
    plain.load_state_dict(owned.state_dict())
    x = torch.randn(4, 8, 3, 3) - 1.0  # mostly negative: a second ReLU would change the output
    torch.testing.assert_close(owned(x), plain(x))
    assert not any(isinstance(m, nn.ReLU) for m in owned.modules())
    assert normkit.parse(spec).norm.entry.includes_activation
    assert not normkit.parse("bn").norm.entry.includes_activation


@pytest.mark.parametrize("spec", ["frn+relu", "evonorm-s0+silu", "frn+pn"])
def test_a_second_activation_stage_is_refused(spec: str) -> None:
    with pytest.raises(normkit.SpecError, match="includes its own activation"):
        normkit.build(spec, 8, activation="relu")


def test_listed_with_the_flag() -> None:
    rows = {r["name"]: r for r in normkit.available()}
    assert rows["frn"]["includes_activation"] and rows["evonorm-s0"]["includes_activation"]
    assert "includes_activation" not in rows["brn"] and rows["frn"]["plugin"] == "zoo"


def test_convert_sequential_replaces_the_following_relu() -> None:
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 4, 1))
    summary = normkit.convert(model, "frn")
    assert isinstance(model[2], nn.Identity) and isinstance(model[1].act, TLU)
    assert "relu dropped" in str(summary)


def test_convert_torchvision_resnet18_leaves_no_relu_after_tlu() -> None:
    models = pytest.importorskip("torchvision.models")
    model = models.resnet18(num_classes=10)
    summary = normkit.convert(model, "frn")
    assert len(summary) == 20
    assert isinstance(model.relu, nn.Identity)  # stem: bn1 -> relu -> maxpool
    for stage in (model.layer1, model.layer2, model.layer3, model.layer4):
        for block in stage:
            graph = block.graph
            bn1 = next(n for n in graph.nodes if n.op == "call_module" and n.target == "bn1")
            assert [u.target for u in bn1.users] == ["conv2"]  # TLU feeds the conv directly
            relus = [n for n in graph.nodes if n.op == "call_module" and n.target == "relu"]
            assert len(relus) == 1 and relus[0].args[0].name == "add"  # post-residual ReLU kept
    x = torch.randn(2, 3, 32, 32)
    y = model(x)
    y.sum().backward()
    buf = io.BytesIO()
    torch.save(model, buf)
    twin = copy.deepcopy(model).eval()
    model.eval()
    torch.testing.assert_close(twin(x), model(x))


def test_convert_torchvision_resnet18_with_bn_is_unchanged_in_structure() -> None:
    models = pytest.importorskip("torchvision.models")
    model = models.resnet18(num_classes=10)
    normkit.convert(model, "brn")
    assert isinstance(model.relu, nn.ReLU) and type(model.layer1[0]).__name__ == "BasicBlock"


@pytest.mark.parametrize("model_name", ["small-cnn", "preact-resnet18"])
def test_lab_models_do_not_double_the_activation(model_name: str) -> None:
    model = build_model(model_name, "frn", num_classes=10, in_channels=1, image_size=8)
    norms = [m for m in model.modules() if isinstance(m, normkit.NormLayer)]
    assert norms and all(m.activation_name == "tlu" and isinstance(m.act, TLU) for m in norms)
    model(torch.randn(2, 1, 8, 8)).sum().backward()


class _SharedReluAtRoot(nn.Module):
    """The root's own forward uses one ReLU after the norm and after the add."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.relu(self.bn(self.conv(x))) + x)


def test_convert_refuses_a_shared_activation_in_the_roots_forward_and_changes_nothing() -> None:
    model = _SharedReluAtRoot()
    with pytest.raises(normkit.SpecError, match="shares it"):
        normkit.convert(model, "frn")
    assert isinstance(model.bn, nn.BatchNorm2d) and isinstance(model.relu, nn.ReLU)
    wrapped = nn.Sequential(_SharedReluAtRoot())
    normkit.convert(wrapped, "frn")
    x = torch.randn(2, 4, 5, 5)
    block = wrapped[0]
    expected = torch.relu(block.bn(block.conv(x)) + x)  # TLU output, no ReLU, then add and ReLU
    torch.testing.assert_close(wrapped(x), expected)
