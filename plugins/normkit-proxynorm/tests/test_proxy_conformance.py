"""pn passes normkit's shared conformance suite in every combination it supports."""

from __future__ import annotations

import pytest

from normkit.testing import check_norm


@pytest.mark.parametrize("spec", ["gn+pn", "ln+pn", "gn(groups=8)+pn", "bn+pn", "gn(groups=2)+pn(act=silu)",
                                  "ln+pn(proxy_params=false)", "gn(groups=4)+pn(scale=false)"])
def test_conforms(spec: str) -> None:
    check_norm(spec, num_channels=32 if spec == "gn+pn" else 8)


@pytest.mark.parametrize("spec", ["ln+pn", "gn(groups=8)+pn"])
def test_conforms_owning_the_models_relu(spec: str) -> None:
    check_norm(spec, num_channels=8, activation="relu")


def test_conforms_on_channels_last_tokens() -> None:
    check_norm("ln+pn(act=gelu)", num_channels=8, channel_dim=-1)
