"""The built-in workloads' recipes are frozen: a suite result is comparable with another only under
the same recipe, so a change anywhere that moves one (a model's or dataset's registered defaults,
compare's defaults, the workload itself) fails here, once per workload, naming the keys that moved.

Workloads inherit nothing silently on purpose: when gpt-tiny's `normkit compare` recipe changed to a
streamed 4,000-step one without warmup, the `lm` workload, which did not state its warmup, lost it
and its ln score went from 3.42 to 3.64 bits per byte. To change a recipe on purpose, update
suite_recipes.json (`python packages/normkit-lab/tests/test_suite_recipes.py` rewrites it) and rerun
the scorecards in README.md and docs/suite.md.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from normkit_lab.suite import load_workload
from normkit_lab.suite.builtin import WORKLOADS
from normkit_lab.suite.workloads import SUITE_KEYS

FROZEN = Path(__file__).with_name("suite_recipes.json")


def recipes(name: str) -> dict[str, Any]:
    """Every form of a workload (cpu, quick, paper, each held-out variant): its resolved comparison keys
    (those the suite decides aside), its tuning grid and its target."""
    workload = load_workload(name)
    forms = [(scale, None) for scale in ("cpu", "quick", "paper")] + [("cpu", v) for v in workload.variants]
    out = {}
    for scale, variant in forms:
        config = workload.full_config(scale, variant)
        _, tune, target = workload.resolved(scale, variant)
        out[scale if variant is None else f"{scale}/{variant}"] = {
            "config": {k: v for k, v in config.items() if k not in SUITE_KEYS},
            "tune": tune, "target": target}
    return json.loads(json.dumps(out))  # tuples as lists, as the file holds them


def flat(recipe: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"cpu.config.lr": 0.003, "cpu.tune": {...}, ...}: one entry per config key, tune and target."""
    out: dict[str, Any] = {}
    for key, value in recipe.items():
        if isinstance(value, dict) and key not in ("tune", "model_params", "dataset_params"):
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_builtin_workload_recipe_is_frozen(name: str) -> None:
    frozen, now = flat(json.loads(FROZEN.read_text())[name]), flat(recipes(name))
    moved = sorted(key for key in frozen.keys() | now.keys() if frozen.get(key, "absent") != now.get(key, "absent"))
    assert not moved, (f"workload {name!r}'s recipe moved ({', '.join(moved)}): pin the old values in "
                       f"normkit_lab/suite/builtin.py, or rewrite {FROZEN.name} and rerun the scorecards")


if __name__ == "__main__":  # rewrite the frozen recipes after an intended change
    FROZEN.write_text(json.dumps({name: recipes(name) for name in WORKLOADS}, indent=1, sort_keys=True) + "\n")
    sys.stdout.write(f"wrote {FROZEN}\n")
