"""Every normality-norm variant passes normkit's conformance suite.

The paper's noise scale s = mean|x - mean x| is a stop-gradient constant, so in training mode with
noise the finite differences of `check_gradients` see s move while the analytic gradient (rightly)
does not; the gradient check therefore runs with noise=0 (check_norm's gradcheck_overrides), every
other check with the noise on.
"""

from __future__ import annotations

import pytest
from normkit.testing import check_norm

VARIANTS = [
    ("bnn", {}),
    ("lnn", {}),
    ("lnn", {"channel_dim": -1}),
    ("gnn(groups=4)", {}),
    ("gnn(groups=2)", {"channel_dim": -1}),
    ("inn", {}),
    ("bn+nn(lambda_min=0, lambda_max=2)", {}),
]


@pytest.mark.parametrize(("spec", "options"), VARIANTS)
def test_conforms(spec: str, options: dict) -> None:
    check_norm(spec, gradcheck_overrides={"noise": 0.0}, **options)


def test_noise_free_variant_passes_every_check() -> None:
    check_norm("bn+nn(noise=0)")
