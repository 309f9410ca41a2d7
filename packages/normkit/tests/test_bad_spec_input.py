"""Bad spec input gets one clear SpecError line: non-finite numbers, absurd sizes, non-ASCII text,
and steps that fail on their input name the spec, the step and the shape."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch

import normkit
from normkit.grammar import split_specs
from normkit.limits import MAX_CHANNELS
from normkit.params import Param
from normkit.stages import Partition, Pipeline, PostActivationStep, RMSScale, Standardize, Step, make_step
from normkit.testing import check_norm, temporary_plugin

# -- non-finite numbers ---------------------------------------------------------------------------


@pytest.mark.parametrize(("spec", "message"), [
    ("bn(eps=nan)", "bn: parameter 'eps' must be a finite number, got nan"),
    ("bn(eps=inf)", "bn: parameter 'eps' must be a finite number, got inf"),
    ("ln(eps=-inf)", "ln: parameter 'eps' must be a finite number, got -inf"),
    ("bn(momentum=nan)", "parameter 'momentum' must be a finite number"),
    ("bnn(noise=inf)", "parameter 'noise' must be a finite number, got inf"),
    ("bnn(alpha=nan)", "parameter 'alpha' must be a finite number"),
    ("bn+nn(lambda_max=inf)", "parameter 'lambda_max' must be a finite number"),
    ("gn(groups=2, eps=NaN)", "parameter 'eps' must be a finite number"),
    ("bn(eps=1e400)", "must be a finite number"),  # overflows to inf when read
    ("rms(eps=nan)", "parameter 'eps' must be a finite number"),
])
def test_non_finite_spec_values_are_refused(spec: str, message: str) -> None:
    with pytest.raises(normkit.SpecError, match=message.replace("(", r"\(").replace(")", r"\)")) as info:
        normkit.build(spec, 8)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -math.inf, np.float32("nan"), np.float64("inf")])
def test_non_finite_python_values_are_refused_too(value: float) -> None:
    with pytest.raises(normkit.SpecError, match="'eps' must be a finite number"):
        normkit.build("bn", 8, eps=value)
    with pytest.raises(normkit.SpecError, match="my-model: parameter 'lr' must be a finite number"):
        Param("lr", float, 0.1).coerce(value, "my-model")  # model/dataset parameters use the same Param


def test_finite_values_still_pass_and_stay_typed() -> None:
    assert Param("eps", float, 1e-5).coerce(3, "bn") == 3.0
    assert Param("eps", float | None, None).coerce(None, "bn") is None
    assert Param("n", int, 1).coerce(2.0, "x") == 2
    assert normkit.build("bn(eps=1e-3)", 4).steps[0].eps == 1e-3


@pytest.mark.parametrize("make", [
    lambda: Standardize(eps=float("nan")), lambda: Standardize(eps=0.0), lambda: Standardize(momentum=float("nan")),
    lambda: RMSScale(eps=float("inf")), lambda: RMSScale(eps=-1.0)])
def test_step_constructors_check_their_ranges(make) -> None:
    with pytest.raises(normkit.SpecError, match="must be"):
        make()


# -- absurd sizes ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("spec", "channels", "message"), [
    ("bn", 10_000_000_000, "num_channels=10000000000 is above normkit's limit of 16,777,216"),
    ("gn(groups=7)", 10**12, "above normkit's limit"),
    ("bnn", MAX_CHANNELS + 1, "above normkit's limit"),
    ("bn", 0, "num_channels must be a positive int"),
    ("ln", True, "num_channels must be a positive int"),
    ("ln", 8.0, "num_channels must be a positive int"),
])
def test_channel_counts_are_checked_before_any_allocation(spec: str, channels: object, message: str) -> None:
    with pytest.raises(normkit.SpecError, match=message):  # not a MemoryError or an endless loop
        normkit.build(spec, channels)


def test_group_suggestions_are_fast_for_large_channel_counts() -> None:
    with pytest.raises(normkit.SpecError, match=r"16777216 channels are not divisible into 7 groups; use groups=2 or "
                                                r"groups=4 or groups=8"):
        Partition("group", 7).check(MAX_CHANNELS, "gn(groups=7)")
    with pytest.raises(normkit.SpecError, match="use groups=1 or groups=9999991$"):  # a prime: only 1 and itself
        Partition("group", 4).check(9_999_991, "gn(groups=4)")
    with pytest.raises(normkit.SpecError, match="use groups=10 or groups=12 or groups=15"):
        Partition("group", 13).check(60, "gn")


def test_factory_norms_get_the_channel_check_before_their_factory_runs() -> None:
    calls = []

    class Huge(torch.nn.Module):
        def __init__(self, num_channels: int) -> None:
            calls.append(num_channels)
            super().__init__()

    class Plugin:
        @normkit.hookimpl
        def normkit_register_norms(self, register):
            register("huge-test", factory=Huge)

    with temporary_plugin(Plugin(), "huge"):
        with pytest.raises(normkit.SpecError, match="above normkit's limit"):
            normkit.build("huge-test", 2**40)
    assert calls == []


# -- non-ASCII text -------------------------------------------------------------------------------


@pytest.mark.parametrize(("spec", "char", "position"), [
    ("gn(groups=\u0668)", "U+0668 ARABIC-INDIC DIGIT EIGHT", 10),
    ("bn(eps=1e-\u0665)", "U+0665 ARABIC-INDIC DIGIT FIVE", 10),
    ("\uff42n", "U+FF42 FULLWIDTH LATIN SMALL LETTER B", 0),
    ("b\u043dn", "U+043D CYRILLIC SMALL LETTER EN", 1),
    ("gn(groups=\uff18)", "U+FF18 FULLWIDTH DIGIT EIGHT", 10),
    ("bn+\u0440n", "U+0440 CYRILLIC SMALL LETTER ER", 3),
    ("bn\u200b", "U+200B ZERO WIDTH SPACE", 2),
])
def test_non_ascii_characters_are_named_with_their_position(spec: str, char: str, position: int) -> None:
    with pytest.raises(normkit.SpecError, match=re.escape(f"{char}) at position {position} of")) as info:
        normkit.parse(spec)
    assert "\n" not in str(info.value)


def test_norm_lists_refuse_non_ascii_and_ascii_whitespace_still_works() -> None:
    with pytest.raises(normkit.SpecError, match=re.escape("U+0661")):
        split_specs("bn,gn(groups=\u0661)")
    assert normkit.parse(" gn(groups=2,\teps=1e-3)\n").text == "gn(groups=2,eps=0.001)"


# -- steps that fail on their input ---------------------------------------------------------------


class WrongShape(Step):
    name = "wrong-shape"

    def forward(self, x, groups, layer):
        return x.reshape(x.shape[0], 8, 25)


class FailingPost(PostActivationStep):
    name = "failing-post"

    def forward(self, x, groups, layer):
        raise IndexError("index 9 is out of bounds\nsecond line")


class NotAStep:
    pass


def wrong_shape(ctx) -> WrongShape:
    return WrongShape()


def failing_post(ctx) -> FailingPost:
    return FailingPost()


def not_a_step(ctx) -> NotAStep:
    return NotAStep()


def not_a_pipeline() -> str:
    return "bn"


class Failing:
    @normkit.hookimpl
    def normkit_register_stages(self, register):
        register("wrong-shape", wrong_shape)
        register("failing-post", failing_post, kind="post_activation")
        register("not-a-step", not_a_step)

    @normkit.hookimpl
    def normkit_register_norms(self, register):
        register("not-a-pipeline", pipeline=not_a_pipeline)
        register("ln-plain", pipeline=ln_plain)


def ln_plain() -> Pipeline:
    return Pipeline(Partition("layer"), [make_step(Standardize)])


@pytest.fixture(scope="module")
def failing_plugin():
    with temporary_plugin(Failing(), "failing"):
        yield


@pytest.mark.parametrize(("spec", "shape", "message"), [
    ("ln-plain+wrong-shape", (4, 8, 3, 3), r"ln-plain\+wrong-shape: step wrong-shape failed on input of shape "
                                           r"\(4, 8, 3, 3\): RuntimeError: shape '\[4, 8, 25\]' is invalid"),
    ("bn+wrong-shape", (2, 8, 3), r"bn\+wrong-shape: step wrong-shape failed on input of shape \(2, 8, 3\)"),
    ("ln-plain+relu+failing-post", (4, 8), r"post-activation step failing-post failed on input of shape "
                                           r"\(4, 8, 1\): IndexError: index 9 is out of bounds second line$"),
])
def test_a_failing_step_names_spec_step_and_shape(failing_plugin, spec: str, shape, message: str) -> None:
    layer = normkit.build(spec, 8)
    with pytest.raises(normkit.StepError, match=message) as info:
        layer(torch.randn(shape))
    assert isinstance(info.value, normkit.NormShapeError) and info.value.__cause__ is not None


def test_check_norm_reports_the_step_too(failing_plugin) -> None:
    with pytest.raises(AssertionError, match=r"\[shapes\] 'ln-plain\+wrong-shape': raised StepError: "
                                             r"ln-plain\+wrong-shape: step wrong-shape failed"):
        check_norm("ln-plain+wrong-shape", 8)


def test_factories_returning_the_wrong_type_fail_at_build(failing_plugin) -> None:
    with pytest.raises(normkit.PluginError, match="plugin 'failing': step 'not-a-step' returned NotAStep, "
                                                  "not a normkit Step"):
        normkit.build("bn+not-a-step", 8)
    with pytest.raises(normkit.PluginError, match=r"plugin 'failing': norm 'not-a-pipeline' \(pipeline=\) "
                                                  "returned str, not a normkit Pipeline"):
        normkit.build("not-a-pipeline", 8)


def test_normkit_errors_from_steps_pass_through_unwrapped() -> None:
    layer = normkit.build("bn", 4)
    with pytest.raises(normkit.NormShapeError, match="needs more than 1 value per channel when training") as info:
        layer(torch.randn(1, 4))
    assert not isinstance(info.value, normkit.StepError)


def test_check_norm_passes_a_bad_spec_through_as_spec_error() -> None:
    with pytest.raises(normkit.SpecError, match="must be a finite number"):
        check_norm("bn(eps=nan)", 8)
