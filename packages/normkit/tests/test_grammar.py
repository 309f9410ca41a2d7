"""The spec grammar: syntax, typing of values, alias expansion, composition errors."""

from __future__ import annotations

import pytest

import normkit
from normkit.grammar import parse_raw, parse_value, split_specs


def test_split_specs_ignores_commas_inside_parentheses() -> None:
    assert split_specs("bn, bnn(noise=0.6,alpha=2),gn(groups=8)+pn") == [
        "bn", "bnn(noise=0.6,alpha=2)", "gn(groups=8)+pn"]


@pytest.mark.parametrize("text", ["bn,,ln", "bn(", "bn)", ",bn"])
def test_split_specs_rejects_malformed_lists(text: str) -> None:
    with pytest.raises(normkit.SpecError):
        split_specs(text)


@pytest.mark.parametrize(("text", "value"), [
    ("8", 8), ("-3", -3), ("0.5", 0.5), ("1e-3", 1e-3), ("true", True), ("False", False),
    ("none", None), ("relu", "relu"), ("leaky-relu", "leaky-relu")])
def test_values(text: str, value: object) -> None:
    assert parse_value(text) == value and type(parse_value(text)) is type(value)


def test_parse_raw_parts() -> None:
    parts = parse_raw("GN(Groups=8, eps=1e-6) + relu")
    assert [(p.name, p.params) for p in parts] == [("GN", {"groups": 8, "eps": 1e-6}), ("relu", {})]


@pytest.mark.parametrize(("spec", "message"), [
    ("", "empty norm spec"), ("bn+", "empty part"), ("gn(groups)", "key=value"),
    ("gn(groups=8", "unbalanced"), ("gn(groups=8, groups=4)", "given twice"), ("bn(eps=@)", "cannot read value"),
])
def test_syntax_errors(spec: str, message: str) -> None:
    with pytest.raises(normkit.SpecError, match=message):
        normkit.parse(spec)


def test_names_are_case_insensitive_and_typed() -> None:
    spec = normkit.parse("GN(groups=8)+ReLU")
    assert spec.text == "gn(groups=8)+relu"
    assert spec.parts[0].params == {"groups": 8}
    assert normkit.parse("bn(eps=1)").parts[0].params["eps"] == 1.0  # int typed to float
    assert isinstance(normkit.parse("bn(eps=1)").parts[0].params["eps"], float)
    assert normkit.parse("batchnorm").norm.name == "bn"
    assert normkit.parse("bn(momentum=none)").parts[0].params["momentum"] is None


@pytest.mark.parametrize(("spec", "message"), [
    ("bx", "unknown norm or stage 'bx'; did you mean 'bn'"),
    ("gn(grups=8)", "unknown parameter 'grups' for 'gn'; did you mean 'groups'"),
    ("gn(groups=2.5)", "'groups' expects int, got 2.5"),
    ("gn(groups=true)", "'groups' expects int"),
    ("bn(affine=1)", "'affine' expects bool"),
    ("bn+ln", "names 2 norms"),
    ("relu", "starts with activation 'relu'"),
    ("bn+relu+silu", "two activations"),
    ("bn(eps=0)", "eps must be > 0"),
    ("bn(momentum=2)", "momentum must be in"),
])
def test_semantic_errors_name_the_problem(spec: str, message: str) -> None:
    with pytest.raises(normkit.SpecError, match=message.replace("(", r"\(").replace(")", r"\)")):
        normkit.build(spec, 8)


def test_overrides_apply_unless_spec_sets_them() -> None:
    assert normkit.build("bn", 4, eps=1e-3).steps[0].eps == 1e-3
    assert normkit.build("bn(eps=1e-2)", 4, eps=1e-3).steps[0].eps == 1e-2
    with pytest.raises(normkit.SpecError, match="unknown parameter 'grups'"):
        normkit.build("gn", 64, grups=4)


def test_parameter_keys_accept_dashes_and_text_is_typed() -> None:
    assert normkit.parse("bn(track-running-stats=false)").parts[0].params == {"track_running_stats": False}
    assert normkit.parse("gn(groups=8.0)").text == normkit.parse("gn(groups=8)").text == "gn(groups=8)"


def test_value_lists_expand_into_one_spec_per_combination() -> None:
    from normkit.grammar import expand_lists

    assert normkit.split_specs("bn,bnn(noise=[0,0.4]),gn(groups=[2,8])+pn") == [
        "bn", "bnn(noise=[0,0.4])", "gn(groups=[2,8])+pn"]
    assert expand_lists("bnn(noise=[0,0.4,0.8])") == ["bnn(noise=0)", "bnn(noise=0.4)", "bnn(noise=0.8)"]
    assert expand_lists("gn(groups=[2,8])+pn(eps=[1e-5,1e-3])") == [
        "gn(groups=2)+pn(eps=1e-5)", "gn(groups=2)+pn(eps=1e-3)",
        "gn(groups=8)+pn(eps=1e-5)", "gn(groups=8)+pn(eps=1e-3)"]
    assert expand_lists("bn") == ["bn"]


def test_parse_refuses_a_value_list_with_a_hint() -> None:
    with pytest.raises(normkit.SpecError, match="only `normkit compare --norms` expands"):
        normkit.parse("bnn(noise=[0,0.4])")
