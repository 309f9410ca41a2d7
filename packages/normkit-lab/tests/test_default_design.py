"""The default design of `normkit compare --norms bn,bnn,gn+pn`: batch 2 and 16 at equal steps, which a
user's own length or batch replaces as a whole."""

from __future__ import annotations

import pytest

from normkit_lab.study.config import resolve
from normkit_lab.study.plan import run_count


def test_the_default_compares_two_batch_sizes_at_equal_steps():
    cfg = resolve({"norms": "bn,bnn,gn+pn"})
    assert cfg.sweep == {"batch_size": [2, 16]} and cfg.train.budget == "steps=500" and cfg.train.lr == 0.02
    assert run_count(cfg) == (0, 30)


@pytest.mark.parametrize(("given", "sweep", "budget", "epochs", "batch"), [
    ({"epochs": 3}, {}, None, 3, 2),
    ({"batch_size": 16}, {}, None, 1, 16),
    ({"budget": "steps=100"}, {}, "steps=100", 1, 2),
    ({"sweep": ["lr=0.01,0.02"]}, {"lr": [0.01, 0.02]}, None, 1, 2),
    ({"seeds": 3, "lr": 0.05}, {"batch_size": [2, 16]}, "steps=500", 1, 2),  # other keys keep the design
])
def test_a_length_or_batch_of_ones_own_replaces_the_design(given, sweep, budget, epochs, batch):
    cfg = resolve({"norms": "bn,gn+pn", **given})
    assert (cfg.sweep, cfg.train.budget, cfg.train.epochs, cfg.train.batch_size) == (sweep, budget, epochs, batch)


def test_the_users_own_code_never_gets_the_design():
    cfg = resolve({"norms": "bn,gn+pn", "command": "python train.py --norm {norm} --seed {seed}"})
    assert cfg.sweep == {} and cfg.train.budget is None


def test_a_saved_default_config_resumes_as_saved():
    import yaml

    from normkit_lab.study.config import build_config, save_yaml
    saved = resolve({"norms": "bn,gn+pn"})
    again = build_config(yaml.safe_load(save_yaml(saved)))
    assert (again.sweep, again.train.budget) == (saved.sweep, saved.train.budget)
    assert again.to_dict() == saved.to_dict()
