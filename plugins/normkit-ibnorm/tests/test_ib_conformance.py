"""ib steps and the paper's names pass normkit's shared conformance suite."""

from __future__ import annotations

import pytest

from normkit.testing import check_norm


@pytest.mark.parametrize("spec", ["bn+ib-t", "ln+ib-l", "ln+ib-l(lam=4)", "gn(groups=4)+ib-s", "in+ib-t",
                                  "rms+ib-t", "rms+ib-s(centre=true)", "bn(momentum=none)+ib-l",
                                  "ibn-s", "ibn-l", "ibn-t", "ibln-s", "ibln-l", "ibln-t"])
def test_conforms(spec: str) -> None:
    check_norm(spec, num_channels=8)


@pytest.mark.parametrize("spec", ["ln+ib-t", "rms+ib-l", "ibln-s(lam=2)"])
def test_conforms_on_channels_last_tokens(spec: str) -> None:
    check_norm(spec, num_channels=8, channel_dim=-1)


def test_conforms_with_an_owned_activation() -> None:
    check_norm("gn(groups=2)+ib-t", num_channels=8, activation="relu")
