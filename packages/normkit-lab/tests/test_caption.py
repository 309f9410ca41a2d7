"""The caption under every table: what the verdicts show and what they do not, from the config."""

from __future__ import annotations

from normkit_lab.analysis.caption import caption, is_default_recipe, pooling_over_batch
from normkit_lab.spec import default_recipe
from normkit_lab.study import config


def words(values: dict) -> str:
    cfg = config.build_config(values)
    return caption(cfg.to_dict(), seeds=len(cfg.seeds), comparisons=len(cfg.norms) - 1, baseline=cfg.baseline_norm)


def test_the_default_recipe_names_its_regime_and_the_ablation_behind_it():
    text = words({"norms": "bn,bnn,gn+pn"})
    assert text.startswith("Shows: small-cnn on digits, 1 epoch at a batch of 2 samples, every norm at the same "
                           "learning rate (sgd lr 0.02, not tuned per norm), 5 seeds paired by seed")
    assert "Holm's adjustment over 2 comparisons" in text
    assert "bn and bnn normalize over a batch of 2" in text and "gn+pn normalize" not in text
    assert "for this default recipe, docs/experiments.md: with each norm's lr tuned on validation over 10 seeds " \
           "both verdicts hold" in text
    assert text.count("Does not show:") == 1 and text.endswith(".")


def test_other_recipes_do_not_borrow_the_default_ablation():
    assert is_default_recipe(config.build_config({"norms": "bn,gn+pn", "seeds": 3}).to_dict())
    for changed in ({"lr": 0.05}, {"epochs": 2}, {"norms": "bn,ln"}, {"batch_size": 16}, {"dataset": "fake"}):
        values = {"norms": "bn,gn+pn", **changed}
        assert not is_default_recipe(config.build_config(values).to_dict()), changed
        assert "run with --tune lr=..." in words(values)


def test_tuned_and_large_batch_recipes_say_so():
    tuned = words({"norms": "bn,gn+pn", "tune": "lr=0.01,0.05", "tune_seeds": "100"})
    assert "each norm at its own learning rate, tuned on the validation split over 0.01, 0.05" in tuned
    assert "tuned per norm would change" not in tuned
    large = words({"norms": "bn,gn+pn", "batch_size": 64})
    assert "small-batch regime" not in large and "at a batch of 64 samples" in large


def test_batch_pooling_norms_are_found_by_their_stages():
    assert pooling_over_batch(["bn", "bnn", "gn+pn", "ln", "bn+pn", "frn", "not-a-norm("]) == ["bn", "bnn", "bn+pn"]


def test_swept_keys_are_named_as_swept():
    text = words({"norms": "bn,gn+pn", "sweep": "batch_size=2,16"})
    assert "at batches of 2, 16 samples" in text and "(in the batch_size=2 cell), bn normalizes" in text
    assert "Holm's adjustment over 1 comparison" in text  # the caller counts the family
    lrs = words({"norms": "bn,gn+pn", "sweep": "lr=0.01,0.05"})
    assert "learning rates 0.01, 0.05 (one per cell, the same for every norm in a cell)" in lrs
    assert "same learning rate (" not in lrs
    one = words({"norms": "bn,gn+pn", "seeds": 1})
    assert "1 seed; the final epoch" in one


def test_the_reference_recipe_is_the_one_build_config_gives():
    """The caption (analysis) may not import the study's build_config; spec.default_recipe stands in for it."""
    assert default_recipe() == config.build_config({"norms": "bn"}).to_dict()


def test_a_batch_sweep_says_whether_steps_are_held_equal():
    epochs = words({"norms": "bn,gn+pn", "sweep": "batch_size=2,16"})
    assert "steps differ by cell" in epochs and "--budget steps=N" in epochs
    steps = words({"norms": "bn,gn+pn", "sweep": "batch_size=2,16", "budget": "steps=600"})
    assert "600 optimizer steps at batches of 2, 16 samples" in steps and "steps differ" not in steps
