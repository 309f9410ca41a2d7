"""The caption under every table: what the verdicts show and what they do not, derived from the results
directory (config and runs), never quoted from elsewhere, and naming what to add to test the rest."""

from __future__ import annotations

from normkit_lab.analysis.caption import caption, pooling_over_batch, summary_caption
from normkit_lab.analysis.summary import Run, summarize
from normkit_lab.metrics import metric_named
from normkit_lab.study import config


def words(values: dict) -> str:
    cfg = config.build_config(values)
    return caption(cfg.to_dict(), seeds=len(cfg.seeds), comparisons=len(cfg.norms) - 1, baseline=cfg.baseline_norm)


def test_a_single_cell_names_its_regime_and_what_to_add_instead_of_asserting_it():
    text = words({"dataset": "digits", "norms": "bn,bnn,gn+pn", "batch_size": 2, "epochs": 1, "lr": 0.02})
    assert text.startswith("Shows: small-cnn on digits, 1 epoch at a batch of 2 samples, every norm at the same "
                           "learning rate (sgd lr 0.02, not tuned per norm), 5 seeds paired by seed")
    assert "Holm's adjustment over 2 comparisons" in text
    assert "bn and bnn normalize over a batch of 2" in text and "gn+pn normalize" not in text
    assert "tolerate" not in text  # one batch size cannot say which norms tolerate a small one
    assert "Does not show: how the norms rank on other models" in text
    assert "whether a gap depends on the batch size" in text and "which stage of a norm causes" in text
    assert text.endswith("To test these, add --sweep batch_size=2,16 --budget steps=N, --ablate, "
                         "--tune lr=0.008,0.02,0.05.")
    for canned in ("-2.65", "+2.40", "docs/experiments.md", "10 seeds"):
        assert canned not in text


def test_the_digit_blends_design_says_only_the_normalization_batch_varies():
    text = words({"norms": "bn,bnn,gn+pn", "dataset": "digit-blends"})
    assert text.startswith("Shows: small-cnn on digit-blends, 300 optimizer steps at a batch of 16 samples, bn and bnn "
                           "normalizing over ghost batches of 2 and 16 samples (norm_batch; gn+pn pools no batch, so "
                           "norm_batch leaves it unchanged, its runs trained once and used in every cell)")
    assert "At 2 samples per ghost batch (in the norm_batch=2 cell), bn and bnn normalize over a batch of 2" in text
    assert "whether a gap depends on the gradient batch size" in text and "--sweep batch_size=..." in text


def test_tuned_ablated_and_large_batch_recipes_say_so():
    tuned = words({"dataset": "digits", "norms": "bn,gn+pn", "tune": "lr=0.01,0.05", "tune_seeds": "100"})
    assert "each norm at its own learning rate, tuned on the validation split over 0.01, 0.05" in tuned
    assert "tuned per norm would change" not in tuned and "--tune" not in tuned
    large = words({"dataset": "digits", "norms": "bn,gn+pn", "batch_size": 64})
    assert "small-batch regime" not in large and "at a batch of 64 samples" in large
    assert "--ablate" not in words({"dataset": "digits", "norms": "bn,gn+pn", "ablate": True})
    assert "--ablate" not in words({"dataset": "digits", "norms": "bn,gn"})  # nothing declared to ablate


def test_batch_pooling_norms_are_found_by_their_stages():
    assert pooling_over_batch(["bn", "bnn", "gn+pn", "ln", "bn+pn", "frn", "not-a-norm("]) == ["bn", "bnn", "bn+pn"]


def test_swept_keys_are_named_as_swept():
    text = words({"dataset": "digits", "norms": "bn,gn+pn", "sweep": "batch_size=2,16"})
    assert "at batches of 2, 16 samples" in text and "(in the batch_size=2 cell), bn normalizes" in text
    assert "Holm's adjustment over 1 comparison" in text  # the caller counts the family
    lrs = words({"dataset": "digits", "norms": "bn,gn+pn", "sweep": "lr=0.01,0.05"})
    assert "learning rates 0.01, 0.05 (one per cell, the same for every norm in a cell)" in lrs
    assert "same learning rate (" not in lrs
    one = words({"dataset": "digits", "norms": "bn,gn+pn", "seeds": 1})
    assert "1 seed; the final epoch" in one


def _runs(norm: str, batch: int, values: list[float], steps: int) -> list[Run]:
    return [Run(norm, seed, "ok", 1, cell={"batch_size": batch},
                epochs=[{"epoch": 0, "val_acc": 0.5, "test_acc": v / 100, "steps": steps}])
            for seed, v in enumerate(values)]


def _summary(steps: dict[int, int]):
    runs = (_runs("bn", 2, [95.0, 95.5, 94.8, 96.0, 95.2], steps[2])
            + _runs("gn+pn", 2, [97.9, 98.1, 97.6, 98.4, 97.8], steps[2])
            + _runs("bn", 16, [97.0, 97.2, 96.9, 97.5, 97.1], steps[16])
            + _runs("gn+pn", 16, [97.1, 97.4, 97.0, 97.3, 97.3], steps[16]))
    return summarize(runs, ["bn", "gn+pn"], "bn", metric_named("test_acc"))


def test_a_batch_sweep_says_whether_steps_are_held_equal_from_the_steps_the_runs_took():
    epochs = config.build_config({"dataset": "digits", "norms": "bn,gn+pn", "sweep": "batch_size=2,16"}).to_dict()
    text = summary_caption(epochs, _summary({2: 575, 16: 71}))
    assert "smaller batch took more optimizer steps (575 at batch 2, 71 at batch 16): steps differ by cell" in text
    assert "(at unequal steps)" in text
    assert text.endswith("add --budget steps=575, --ablate, --tune lr=0.008,0.02,0.05.")
    steps = config.build_config({"dataset": "digits", "norms": "bn,gn+pn", "sweep": "batch_size=2,16",
                                 "budget": "steps=600"}).to_dict()
    text = summary_caption(steps, _summary({2: 600, 16: 600}))
    assert "600 optimizer steps at batches of 2, 16 samples" in text and "steps differ" not in text
    assert "Every cell trained the same budget (600 optimizer steps: 600 at batch 2, 600 at batch 16)" in text
    assert "Found: gn+pn's gap to bn changes by -2.58 [-2.80, -2.36] from batch_size=2 to 16, Holm p" in text
    assert "depends on batch_size" in text
    assert "--budget" not in text.split("Does not show")[1]
