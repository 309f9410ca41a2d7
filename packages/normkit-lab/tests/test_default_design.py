"""The default design of `normkit compare --norms bn,bnn,gn+pn`, digit-blends': a gradient batch of 16 at
equal steps with the batch-statistics norms normalizing over ghost batches of 2 or the whole batch
(norm_batch); and the bundled digits' own, batch 2 and 16 at equal steps. A user's own length or batch
replaces a design as a whole."""

from __future__ import annotations

import pytest

from normkit.errors import NormkitError
from normkit_lab.models import build_model
from normkit_lab.runs.checks import check_norm_batch, set_norm_batch
from normkit_lab.spec import TrainConfig
from normkit_lab.study.config import resolve
from normkit_lab.study.plan import run_count


def test_digits_by_name_compares_two_batch_sizes_at_equal_steps():
    cfg = resolve({"norms": "bn,bnn,gn+pn", "dataset": "digits"})
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
    cfg = resolve({"norms": "bn,gn+pn", "dataset": "digits", **given})
    assert (cfg.sweep, cfg.train.budget, cfg.train.epochs, cfg.train.batch_size) == (sweep, budget, epochs, batch)


def test_the_users_own_code_never_gets_the_design():
    cfg = resolve({"norms": "bn,gn+pn", "command": "python train.py --norm {norm} --seed {seed}"})
    assert cfg.sweep == {} and cfg.train.budget is None


def test_a_saved_default_config_resumes_as_saved():
    import yaml

    from normkit_lab.study.config import build_config, save_yaml
    saved = resolve({"norms": "bn,gn+pn"})
    assert saved.train.dataset == "digit-blends" and saved.sweep == {"norm_batch": [2, 16]}
    again = build_config(yaml.safe_load(save_yaml(saved)))
    assert (again.sweep, again.train.budget) == (saved.sweep, saved.train.budget)
    assert again.to_dict() == saved.to_dict()


def test_the_default_is_digit_blends_varying_the_normalization_batch_alone():
    cfg = resolve({"norms": "bn,bnn,gn+pn"})
    assert cfg.train.dataset == "digit-blends"
    assert cfg.sweep == {"norm_batch": [2, 16]} and cfg.train.budget == "steps=300" and cfg.train.lr == 0.02
    assert (cfg.train.batch_size, cfg.train.norm_batch) == (16, None)
    assert run_count(cfg) == (0, 30)


@pytest.mark.parametrize(("given", "sweep", "budget", "batch"), [
    ({"batch_size": 8}, {}, None, 8),
    ({"norm_batch": 4}, {}, None, 16),
    ({"seeds": 3, "lr": 0.05}, {"norm_batch": [2, 16]}, "steps=300", 16),  # other keys keep the design
])
def test_a_batch_or_norm_batch_of_ones_own_replaces_digit_blends_design(given, sweep, budget, batch):
    cfg = resolve({"norms": "bn,gn+pn", "dataset": "digit-blends", **given})
    assert (cfg.sweep, cfg.train.budget, cfg.train.batch_size) == (sweep, budget, batch)


def test_norm_batch_sets_ghost_batches_on_the_batch_statistics_norms_only():
    for spec, changed in (("bnn", 3), ("gn+pn", 0)):
        model = build_model("small-cnn", spec, num_classes=10, in_channels=1, image_size=8)
        assert set_norm_batch(model, 2) == changed
        ghosts = {m.partition.ghost for m in model.modules() if getattr(m, "partition", None) is not None}
        assert ghosts == ({2} if changed else {None})


@pytest.mark.parametrize(("values", "ok"), [
    ({"batch_size": 16, "norm_batch": 2}, True), ({"batch_size": 16, "norm_batch": 16}, True),
    ({"batch_size": 16, "norm_batch": 3}, False), ({"batch_size": 16, "norm_batch": 32}, False),
    ({"batch_size": 16, "norm_batch": 0}, False), ({"batch_size": 16, "norm_batch": 8, "nproc_per_node": 4}, False),
])
def test_norm_batch_must_divide_each_processs_batch(values, ok):
    cfg = TrainConfig(**values)
    if ok:
        check_norm_batch(cfg)
    else:
        with pytest.raises(NormkitError, match="norm_batch must divide the batch each process normalizes"):
            check_norm_batch(cfg)
