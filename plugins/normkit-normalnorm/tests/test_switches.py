"""The plugin's environment switches: read at every call, like os.environ.get, without its exception path."""

from __future__ import annotations

import os

import pytest

from normkit_normalnorm import compiled, rows, switches


def test_unset_gives_the_default_and_set_values_are_stripped_and_lower_cased(monkeypatch):
    monkeypatch.delenv("NORMKIT_NN_ROWS", raising=False)
    assert switches.setting("NORMKIT_NN_ROWS", "1") == "1"
    assert rows.enabled()
    monkeypatch.setenv("NORMKIT_NN_ROWS", " Off ")
    assert switches.setting("NORMKIT_NN_ROWS", "1") == "off"
    assert not rows.enabled()
    monkeypatch.setenv("NORMKIT_NN_COMPILE", "EAGER")
    assert compiled._setting() == "eager"
    monkeypatch.delenv("NORMKIT_NN_ROWS")
    assert rows.enabled()  # read again at the next call, not cached


def test_an_empty_value_is_a_value_not_unset(monkeypatch):
    monkeypatch.setenv("NORMKIT_NN_COMPILE", "")
    assert switches.setting("NORMKIT_NN_COMPILE", "1") == os.environ.get("NORMKIT_NN_COMPILE", "1") == ""


@pytest.mark.parametrize("value", [None, "0"])
def test_a_replaced_os_environ_is_read_as_it_is(monkeypatch, value):
    """Code that swaps os.environ for a plain dict (no `_data` store) still gets os.environ.get's answer."""
    replaced = {} if value is None else {"NORMKIT_NN_ROWS": value}
    monkeypatch.setattr(os, "environ", replaced)
    assert switches.setting("NORMKIT_NN_ROWS", "1") == ("1" if value is None else "0")
