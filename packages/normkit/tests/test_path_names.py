"""Registry names that become a directory or a link (a suite's workload and held-out variant names:
`DIR/cnn`, `DIR/cnn@narrow`, the scorecard's `<a href>`) are checked at registration: a name that could
climb out of the directory (`../../x`), be absolute, split a path, name a URL scheme or collide with a
suite's files is refused in one line naming the plugin, and nothing of the plugin is registered."""

from __future__ import annotations

import pytest

import normkit
from normkit.errors import PluginError
from normkit.testing import temporary_plugin

GOOD = {"question": "q?", "config": {"model": "small-cnn"}, "tune": {"lr": [0.1]}, "target": 50.0}
BAD_NAMES = ["../../x", "..", "/tmp/x", "a/b", "a\\b", "javascript:alert(1)", "x y", ".hidden", "suite.json",
             "cnn@narrow", "-x", "x" * 65, "caf\u00e9", "a\nb"]


def workload_plugin(name, variants=None):
    class Plugin:
        @normkit.hookimpl
        def normkit_register_workloads(self, register):
            register(name, {**GOOD, **({"variants": variants} if variants is not None else {})})

    return Plugin()


@pytest.mark.parametrize("name", BAD_NAMES)
def test_a_workload_name_that_is_not_a_plain_name_is_refused_naming_the_plugin(name: str) -> None:
    with pytest.raises(PluginError) as info, temporary_plugin(workload_plugin(name), "paths"):
        pass
    message = str(info.value)
    assert "plugin 'paths'" in message and "workload name" in message and "\n" not in message
    assert "letters, digits, '-' or '_'" in message
    assert not any(e.name == name for e in normkit.plugins.registry().entries)


@pytest.mark.parametrize("variant", ["../up", "/abs", "w:x", "a.b", "."])
def test_a_variant_name_that_is_not_a_plain_name_is_refused_naming_the_plugin_and_workload(variant: str) -> None:
    with pytest.raises(PluginError) as info, temporary_plugin(workload_plugin("fine", {variant: {}}), "paths"):
        pass
    assert "plugin 'paths' failed: workload 'fine': variant name" in str(info.value)


def test_variants_differing_only_in_case_are_refused_and_plain_names_register() -> None:
    with pytest.raises(PluginError, match="differ only in case"), \
            temporary_plugin(workload_plugin("fine", {"Wide": {}, "wide": {}}), "paths"):
        pass
    with temporary_plugin(workload_plugin("My_workload-2", {"depth16": {}}), "paths"):
        entry = normkit.plugins.registry().lookup_item("workload", "my-workload-2")
        assert entry.name == "My_workload-2"
