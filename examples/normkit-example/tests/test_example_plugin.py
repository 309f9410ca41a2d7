"""The example plugin passes the conformance suite and composes with other norms."""

import pytest
import torch

import normkit
from normkit.testing import check_norm


@pytest.mark.parametrize("spec", ["scbn", "gn(groups=4)+softclip(limit=2)", "ln+softclip", "scgn(groups=4)"])
def test_conformance(spec: str) -> None:
    check_norm(spec, num_channels=8)


def test_values_are_bounded() -> None:
    layer = normkit.build("scbn(limit=1.5)", 4)
    assert layer(torch.randn(16, 4, 3, 3) * 100).abs().max() < 1.5  # weight 1, bias 0 at init


def test_bad_limit() -> None:
    with pytest.raises(normkit.SpecError, match="limit must be > 0"):
        normkit.build("bn+softclip(limit=0)", 4)


def test_scgn_is_gn_then_softclip() -> None:
    x = torch.randn(4, 8, 3, 3) * 5
    torch.testing.assert_close(normkit.build("scgn(groups=4,limit=2)", 8)(x),
                               normkit.build("gn(groups=4)+softclip(limit=2)", 8)(x))
