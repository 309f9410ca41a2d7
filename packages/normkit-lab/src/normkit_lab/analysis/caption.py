"""One paragraph under every comparison's table: what its verdicts show and what they do not.

A verdict is only as general as the recipe that produced it, and a reader of a table sees the
numbers, not the recipe. The caption is built from the saved configuration (so `normkit report`
writes the same words as `normkit compare`) and names: the model, data, length and batch of
training; whether every norm shared one learning rate or had its own, tuned on validation; the
seeds, split and multiplicity adjustment; and, at small batches, that norms pooling over the batch
are measured in the regime that batch-independent norms were made for. The second half says what
the run cannot tell. The default recipe's verdicts were checked against per-norm learning-rate
tuning (docs/experiments.md, "The default and its learning-rate ablation"); the caption says what
that ablation found, only for that recipe and those norms.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from normkit_lab.spec import default_recipe

if TYPE_CHECKING:
    from normkit_lab.analysis.summary import Summary

# norms whose default-recipe verdicts docs/experiments.md checked under per-norm lr tuning
ABLATED_NORMS = frozenset({"bn", "bnn", "gn+pn"})
# what the ablation measured (docs/experiments.md, "The default and its learning-rate ablation")
DEFAULT_ABLATION = ("with each norm's lr tuned on validation over 10 seeds both verdicts hold, bnn -2.65 and gn+pn "
                    "+2.40 points")
SMALL_BATCH = 8  # at or below this many samples per step, batch statistics are noisy
_RECIPE_KEYS = ("model", "dataset", "epochs", "batch_size", "lr", "optimizer", "schedule", "momentum",
                "weight_decay", "weight_decay_policy", "select", "metric")


def pooling_over_batch(norms: Sequence[str]) -> list[str]:
    """The norms among `norms` with a stage whose statistics pool over the batch (bn, bnn, bn+pn...)."""
    import normkit

    out = []
    for spec in norms:
        try:
            layer = normkit.build(spec, 16)
        except Exception:  # a spec that cannot build at 16 channels says nothing here; the run reports it
            continue
        if any(getattr(getattr(m, "partition", None), "uses_batch", False) for m in layer.modules()):
            out.append(spec)
    return out


def is_default_recipe(config: Mapping[str, Any]) -> bool:
    """True for `normkit compare`'s default recipe (any seeds) on norms the ablation covered."""
    reference = default_recipe()
    return (not config.get("tune") and not config.get("sweep") and set(config.get("norms") or ()) <= ABLATED_NORMS
            and all(config.get(k) == reference.get(k) for k in _RECIPE_KEYS))


def _values(values: Sequence[Any]) -> str:
    """Numbers as typed (0.02, not 0.020000); anything else (a missing value: None) as text."""
    return ", ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in values)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def training_length(config: Mapping[str, Any]) -> str:
    """How long each run trained, for titles and captions: "1 epoch", "1, 3 epochs" (swept), "600 optimizer
    steps" or "1200 training examples" (a budget; config.yaml then has no `epochs`)."""
    budget, sweep = config.get("budget"), config.get("sweep") or {}
    if budget:
        unit, _, amount = str(budget).partition("=")
        return f"{amount} optimizer steps" if unit == "steps" else f"{amount} training examples"
    epochs = config.get("epochs")
    if "epochs" in sweep:
        return f"{_values(sweep['epochs'])} epochs"
    return _plural(epochs, "epoch") if isinstance(epochs, int) else f"{epochs} epochs"


def caption(config: Mapping[str, Any], *, seeds: int, comparisons: int, baseline: str) -> str:
    """The paragraph for a comparison saved with `config` (config.yaml's mapping)."""
    if config.get("command") or config.get("train_function"):
        return _own_code_caption(config, seeds=seeds, comparisons=comparisons, baseline=baseline)
    norms = list(config.get("norms") or ())
    tune, sweep = config.get("tune") or {}, config.get("sweep") or {}
    batch = config.get("batch_size")
    tuned_lr = "lr" in tune
    if tuned_lr:
        lr = f"each norm at its own learning rate, tuned on the validation split over {_values(tune['lr'])}"
    elif "lr" in sweep:
        lr = f"learning rates {_values(sweep['lr'])} (one per cell, the same for every norm in a cell)"
    else:
        lr = (f"every norm at the same learning rate ({config.get('optimizer')} lr {_values([config.get('lr')])}, "
              f"not tuned per norm)")
    budget, length = config.get("budget"), training_length(config)
    size = (f"batches of {_values(sweep['batch_size'])} samples" if "batch_size" in sweep
            else f"a batch of {batch} samples")
    shows = (f"Shows: {config.get('model')} on {config.get('dataset')}, {length} at {size}, {lr}, "
             f"{_plural(seeds, 'seed')}{' paired by seed' if seeds > 1 else ''}; the {config.get('select')} epoch's "
             f"test-split value, each norm against {baseline} with Holm's adjustment over "
             f"{_plural(comparisons, 'comparison')}.")
    batch = min(sweep.get("batch_size") or [batch])
    pooled = pooling_over_batch(norms) if isinstance(batch, int) and batch <= SMALL_BATCH else []
    if pooled:
        names = pooled[0] if len(pooled) == 1 else f"{', '.join(pooled[:-1])} and {pooled[-1]}"
        where = f" (in the batch_size={batch} cell)" if "batch_size" in sweep else ""
        shows += (f" At {batch} samples per step{where}, {names} normalize{'s' if len(pooled) == 1 else ''} "
                  f"over a batch of {batch}: this is the small-batch regime of detection and segmentation, which "
                  f"batch-independent norms (group, layer, proxy) were made for, so the verdicts say which "
                  f"norms tolerate a tiny batch.")
    if "batch_size" in sweep and not budget:
        shows += (" Every cell trains the same epochs, so a smaller batch takes more optimizer steps: steps "
                  "differ by cell, and a gap that changes with batch size may come from training length (hold "
                  "steps equal with --budget steps=N).")
    not_shown = ["how the norms rank at other batch sizes, models, datasets or longer training"]
    if not tuned_lr:
        not_shown.append("whether a learning rate tuned per norm would change the verdicts "
                         + (f"(for this default recipe, docs/experiments.md: {DEFAULT_ABLATION})"
                            if is_default_recipe(config) else "(run with --tune lr=...)"))
    not_shown.append("differences smaller than the MDE column, which an inconclusive verdict cannot exclude")
    return f"{shows} Does not show: {'; '.join(not_shown)}."


def _own_code_caption(config: Mapping[str, Any], *, seeds: int, comparisons: int, baseline: str) -> str:
    """The caption of a comparison of the user's own code: normkit knows its runs, not its recipe."""
    code = f"`{config['command']}`" if config.get("command") else f"{config['train_function']}()"
    tune, sweep = config.get("tune") or {}, config.get("sweep") or {}
    varied = [f"{key} tuned per norm on validation over {_values(values)}" for key, values in tune.items()]
    varied += [f"{key} = {_values(values)} (one cell each)" for key, values in sweep.items()]
    shows = (f"Shows: {code} (its own model, data and recipe){', ' + '; '.join(varied) if varied else ''}, "
             f"{_plural(seeds, 'seed')}{' paired by seed' if seeds > 1 else ''}; the {config.get('select')} "
             f"epoch's {str(config.get('metric')).partition(':')[0]} as the program reported it, each norm against "
             f"{baseline} with Holm's adjustment over {_plural(comparisons, 'comparison')}.")
    not_shown = ["how the norms rank under other recipes, models or data"]
    if "lr" not in tune:
        not_shown.append("whether a learning rate tuned per norm would change the verdicts (--tune lr=... with "
                         "{lr} in the command)")
    not_shown.append("differences smaller than the MDE column, which an inconclusive verdict cannot exclude")
    return f"{shows} Does not show: {'; '.join(not_shown)}."


def summary_caption(config: Mapping[str, Any], summary: Summary) -> str:
    """The caption of a summarized comparison: seeds and the Holm family are read from the summary
    (a merged report may hold more seeds than its first directory's config names)."""
    seeds = len({seed for s in summary.rows for seed in s.values}) or len(config.get("seeds") or ())
    comparisons = sum(1 for s in summary.rows if s.verdict is not None)
    return caption(config, seeds=seeds, comparisons=comparisons, baseline=summary.baseline)
