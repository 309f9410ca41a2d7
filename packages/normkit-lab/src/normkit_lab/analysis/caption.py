"""One paragraph under every comparison's table: what its verdicts show, what they do not, and what to
add to a run to test what it cannot.

A verdict is only as general as the design that produced it, and a reader of a table sees the
numbers, not the design. Every sentence here is derived from the results directory itself: the
saved configuration (model, data, length, batch, learning rates, seeds, selection, multiplicity) and
the summary of its runs (the optimizer steps each cell took, the interaction tests of a sweep, the
stage ablations). Nothing is quoted from another run. A claim the design cannot test is not made:
where it would need an arm or a cell that was not run (a batch dependence at equal training length,
a mechanism, robustness to tuning), the caption names the option that adds it (`--sweep batch_size=...
--budget steps=N`, `--ablate`, `--tune lr=...`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from normkit_lab.ablations import ablations_of

if TYPE_CHECKING:
    from normkit_lab.analysis.summary import Summary

SMALL_BATCH = 8  # at or below this many samples per step, batch statistics are noisy


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


def _norm_batch_phrase(config: Mapping[str, Any], norms: Sequence[str]) -> str:
    """", bn and bnn normalizing over ghost batches of 2 and 16 samples (norm_batch; gn+pn pools no
    batch, so norm_batch leaves it unchanged, its runs trained once and used in every cell)" for a run
    that sets or sweeps norm_batch."""
    values = (config.get("sweep") or {}).get("norm_batch") or (
        [config["norm_batch"]] if config.get("norm_batch") is not None else [])
    if not values:
        return ""
    pooled = pooling_over_batch(norms)
    others = [n for n in norms if n not in pooled]
    if not pooled:
        return f" (norm_batch {_values(values)} changes none of these norms: none pools over the batch)"
    swept = "norm_batch" in (config.get("sweep") or {}) and config.get("command") is None \
        and config.get("train_function") is None  # the built-in trainer records such a run once (study/twins.py)
    once = f", {'its' if len(others) == 1 else 'their'} runs trained once and used in every cell" if swept else ""
    rest = (f"; {_names(others)} {'pools' if len(others) == 1 else 'pool'} no batch, so norm_batch leaves "
            f"{'it' if len(others) == 1 else 'them'} unchanged{once}" if others else "")
    noun = "samples" if len(values) > 1 or values[0] != 1 else "sample"
    return (f", {_names(pooled)} normalizing over ghost batches of {' and '.join(map(str, values))} {noun} "
            f"(norm_batch{rest})")


def _values(values: Sequence[Any]) -> str:
    """Numbers as typed (0.02, not 0.020000); anything else (a missing value: None) as text."""
    return ", ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in values)


def plural(n: int, word: str) -> str:
    """'1 seed', '3 seeds'."""
    return f"{n} {word}{'' if n == 1 else 's'}"


def _names(items: Sequence[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


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
    return plural(epochs, "epoch") if isinstance(epochs, int) else f"{epochs} epochs"


def _steps_by_batch(summary: Summary | None) -> dict[Any, int]:
    """batch_size -> the optimizer steps a finished run of that cell took (from the runs' rows)."""
    out: dict[Any, int] = {}
    for s in summary.rows if summary is not None else ():
        if s.steps is not None and "batch_size" in s.cell:
            out.setdefault(s.cell["batch_size"], s.steps)
    return out


def _length_sentence(config: Mapping[str, Any], summary: Summary | None) -> str:
    """For a batch sweep: whether every cell trained the same number of steps, with the steps it took."""
    sweep = config.get("sweep") or {}
    if "batch_size" not in sweep:
        return ""
    steps = _steps_by_batch(summary)
    taken = ", ".join(f"{steps[b]} at batch {b}" for b in sweep["batch_size"] if b in steps)
    if config.get("budget"):
        return f" Every cell trained the same budget ({training_length(config)}{f': {taken}' if taken else ''})."
    return (f" Every cell trained the same epochs, so a smaller batch took more optimizer steps"
            f"{f' ({taken})' if taken else ''}: steps differ by cell, and a gap that changes with batch size "
            f"may come from training length (hold steps equal with --budget steps=N).")


def _interaction_sentences(config: Mapping[str, Any], summary: Summary | None) -> list[str]:
    """What the sweep's interaction tests found, one sentence per norm and tested key."""
    if summary is None or not summary.interactions:
        return []
    confounded = "batch_size" in (config.get("sweep") or {}) and not config.get("budget")
    out = []
    for i in summary.interactions:
        t = i.test
        if i.mean is None or t.low is None or t.high is None:
            continue
        caveat = " (at unequal steps)" if confounded and i.key == "batch_size" else ""
        out.append(f"{i.norm}'s gap to {summary.baseline} changes by {i.mean:+.2f} [{t.low:+.2f}, {t.high:+.2f}] "
                   f"from {i.key}={i.cell_a[i.key]} to {i.cell_b[i.key]}{caveat}, Holm p "
                   f"{'-' if t.p_holm is None else f'{t.p_holm:.3g}'}, {i.verdict}")
    return out


def _ablation_sentences(summary: Summary | None) -> list[str]:
    """Which stages carry a norm's difference, from the stage ablations (none without --ablate)."""
    if summary is None or not summary.ablations:
        return []
    from normkit_lab.analysis.ablations import carries
    from normkit_lab.analysis.summary import cell_key, cell_label

    gaps = {(s.norm, cell_key(s.cell)): s.verdict for s in summary.rows}
    out = []
    for t in summary.ablations:
        where = f" at {cell_label(t.cell)}" if t.cell else ""
        gap = gaps.get((t.ablation.norm, cell_key(t.cell)))
        if carries(t, gap):
            out.append(f"{t.ablation.stage} carries {t.ablation.norm}'s difference to {summary.baseline}{where}")
        else:
            out.append(f"{t.ablation.norm}'s {t.ablation.stage}{where}: {t.role}")
    return out


def _steps_hint(summary: Summary | None) -> str:
    """The steps this run's smallest batch took, as the N to hold equal (or N when unknown)."""
    steps = [s.steps for s in summary.rows if s.steps is not None] if summary is not None else []
    return str(max(steps)) if steps else "N"


def _tune_hint(config: Mapping[str, Any]) -> str:
    lr = config.get("lr")
    if isinstance(lr, (int, float)) and lr > 0:
        return f"--tune lr={','.join(f'{v:.3g}' for v in (lr / 2.5, lr, lr * 2.5))}"
    return "--tune lr=..."


def _seeds_text(config: Mapping[str, Any], seeds: int) -> str:
    """'5 seeds paired by seed', or with sequential seeds the design that chose how many."""
    paired = f"{plural(seeds, 'seed')}{' paired by seed' if seeds > 1 else ''}"
    looks = config.get("looks")
    if not looks:
        return paired
    return (f"{paired}, added in looks at {', '.join(map(str, looks))} seeds to the comparisons still undecided "
            f"(alpha spent across the looks, so stopping early keeps the error rates)")


def caption(config: Mapping[str, Any], *, seeds: int, comparisons: int, baseline: str,
            summary: Summary | None = None) -> str:
    """The paragraph for a comparison saved with `config` (config.yaml's mapping); `summary` adds what its
    runs measured (steps per cell, interaction tests, stage ablations)."""
    if config.get("command") or config.get("train_function"):
        return _own_code_caption(config, seeds=seeds, comparisons=comparisons, baseline=baseline)
    norms = list(config.get("norms") or ())
    tune, sweep = config.get("tune") or {}, config.get("sweep") or {}
    tuned_lr = "lr" in tune
    if tuned_lr:
        lr = f"each norm at its own learning rate, tuned on the validation split over {_values(tune['lr'])}"
    elif "lr" in sweep:
        lr = f"learning rates {_values(sweep['lr'])} (one per cell, the same for every norm in a cell)"
    else:
        lr = (f"every norm at the same learning rate ({config.get('optimizer')} lr {_values([config.get('lr')])}, "
              f"not tuned per norm)")
    batch = config.get("batch_size")
    size = (f"batches of {_values(sweep['batch_size'])} samples" if "batch_size" in sweep
            else f"a batch of {batch} samples")
    size += _norm_batch_phrase(config, norms)
    shows = (f"Shows: {config.get('model')} on {config.get('dataset')}, {training_length(config)} at {size}, {lr}, "
             f"{_seeds_text(config, seeds)}; the {config.get('select')} epoch's "
             f"test-split value, each norm against {baseline} with Holm's adjustment over "
             f"{plural(comparisons, 'comparison')}.")
    shows += _length_sentence(config, summary)
    smallest = min(sweep.get("batch_size") or [batch])
    if "norm_batch" in sweep or config.get("norm_batch") is not None:
        smallest = min(sweep.get("norm_batch") or [config.get("norm_batch")])
    pooled = pooling_over_batch(norms) if isinstance(smallest, int) and smallest <= SMALL_BATCH else []
    if pooled:
        key = "norm_batch" if "norm_batch" in sweep else "batch_size"
        where = f" (in the {key}={smallest} cell)" if key in sweep else ""
        verb = "normalizes" if len(pooled) == 1 else "normalize"
        per = "ghost batch" if key == "norm_batch" or config.get("norm_batch") is not None else "step"
        shows += (f" At {smallest} samples per {per}{where}, {_names(pooled)} {verb} over a batch of {smallest}, "
                  f"the small-batch regime of detection and segmentation that batch-independent norms (group, layer, "
                  f"proxy) were made for.")
    found = _interaction_sentences(config, summary) + _ablation_sentences(summary)
    if found:
        shows += f" Found: {'; '.join(found)}."
    not_shown, add = ["how the norms rank on other models, datasets or at other training lengths"], []
    if "batch_size" not in sweep and "norm_batch" in sweep:
        not_shown.append("whether a gap depends on the gradient batch size (norm_batch varies only the batch the "
                         "norms normalize over, at a fixed gradient batch, steps and examples)")
        add.append(f"--sweep batch_size=... --budget steps={_steps_hint(summary)}")
    elif "batch_size" not in sweep:
        not_shown.append("whether a gap depends on the batch size")
        add.append(f"--sweep batch_size={smallest},{max(16, 8 * smallest) if isinstance(smallest, int) else 16} "
                   f"--budget steps={_steps_hint(summary)}")
    elif not config.get("budget"):
        not_shown.append("whether a gap depends on the batch size at equal training length")
        add.append(f"--budget steps={_steps_hint(summary)}")
    if not config.get("ablate") and any(_ablatable(n) for n in norms):
        not_shown.append("which stage of a norm causes its difference")
        add.append("--ablate")
    if not tuned_lr:
        not_shown.append("whether a learning rate tuned per norm would change the verdicts")
        add.append(_tune_hint(config))
    not_shown.append("differences smaller than the MDE column, which an inconclusive verdict cannot exclude")
    to_test = f" To test {'these' if len(add) > 1 else 'it'}, add {', '.join(add)}." if add else ""
    return f"{shows} Does not show: {'; '.join(not_shown)}.{to_test}"


def _ablatable(norm: str) -> bool:
    try:
        return bool(ablations_of(norm))
    except Exception:  # noqa: BLE001 - a norm that no longer parses has nothing to ablate
        return False


def _own_code_caption(config: Mapping[str, Any], *, seeds: int, comparisons: int, baseline: str) -> str:
    """The caption of a comparison of the user's own code: normkit knows its runs, not its recipe."""
    code = f"`{config['command']}`" if config.get("command") else f"{config['train_function']}()"
    tune, sweep = config.get("tune") or {}, config.get("sweep") or {}
    varied = [f"{key} tuned per norm on validation over {_values(values)}" for key, values in tune.items()]
    varied += [f"{key} = {_values(values)} (one cell each)" for key, values in sweep.items()]
    shows = (f"Shows: {code} (its own model, data and recipe){', ' + '; '.join(varied) if varied else ''}, "
             f"{_seeds_text(config, seeds)}; the {config.get('select')} "
             f"epoch's {', '.join(m.partition(':')[0] for m in str(config.get('metric')).split(','))} as the "
             f"program reported it, each norm against "
             f"{baseline} with Holm's adjustment over {plural(comparisons, 'comparison')}.")
    not_shown = ["how the norms rank under other recipes, models or data"]
    if "lr" not in tune:
        not_shown.append("whether a learning rate tuned per norm would change the verdicts (--tune lr=... with "
                         "{lr} in the command)")
    not_shown.append("differences smaller than the MDE column, which an inconclusive verdict cannot exclude")
    return f"{shows} Does not show: {'; '.join(not_shown)}."


def summary_caption(config: Mapping[str, Any], summary: Summary) -> str:
    """The caption of a summarized comparison: seeds and the Holm family are read from the summary
    (a merged report may hold more seeds than its first directory's config names), and so is what the
    runs measured."""
    seeds = len({seed for s in summary.rows for seed in s.values}) or len(config.get("seeds") or ())
    comparisons = sum(1 for s in summary.rows if s.verdict is not None)
    return caption(config, seeds=seeds, comparisons=comparisons, baseline=summary.baseline, summary=summary)
