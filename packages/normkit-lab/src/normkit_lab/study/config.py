"""The resolved configuration of a comparison: norms x seeds plus one `TrainConfig`.

Values come from three places, highest precedence first: CLI flags, a YAML file, defaults. The
YAML file (and the `config.yaml` a comparison saves) is one flat mapping whose keys are the
comparison keys below plus every `TrainConfig` field; '-' and '_' are the same in keys. Unknown
keys are errors, so a typo never silently falls back to a default.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
import types
import typing
from pathlib import Path
from typing import Any

import normkit
from normkit import plugins
from normkit.errors import NormkitError, did_you_mean
from normkit.grammar import expand_lists
from normkit_lab import safe_yaml
from normkit_lab.errors import ConfigError, short_repr
from normkit_lab.limits import MAX_BATCH_SIZE, MAX_EPOCHS, MAX_SEED, MAX_SEEDS, MAX_STEPS
from normkit_lab.metrics import metric_list, metric_named, needs_margin
from normkit_lab.models import model_params
from normkit_lab.records import RUNTIME_KEYS, SELECTIONS
from normkit_lab.runs.template import check_free_values, value_as_written
from normkit_lab.sequential import plan_looks
from normkit_lab.spec import (
    BUDGET_UNITS,
    COMPARE_KEYS,
    DEFAULT_MAX_SEEDS,
    DEFAULT_TUNE_SEEDS,
    EXTERNAL_KEYS,
    CompareConfig,
    TrainConfig,
    defaults,
    own_code_train_keys,
    registered_train_defaults,
)


def known_keys() -> list[str]:
    return [*COMPARE_KEYS, *(f.name for f in dataclasses.fields(TrainConfig))]


_SEEDS_HINT = "seeds must be a count, a list like 0,1,2 or a range like 0-4"


def _seed_count(n: int, value: Any) -> int:
    if n > MAX_SEEDS:
        raise ConfigError(f"seeds {short_repr(value)} asks for {n:,} seeds; at most {MAX_SEEDS:,} "
                          f"per comparison (see Limits in docs/experiments.md)")
    return n


def parse_seeds(value: Any) -> list[int]:
    """Seeds from `3` (= 0,1,2), `"0,1,5"`, `"2-4"` (inclusive) or a YAML list of ints.

    Counts above MAX_SEEDS and seed values above MAX_SEED are refused before any list is built.
    """
    if isinstance(value, bool):
        raise ConfigError(f"{_SEEDS_HINT}, not {short_repr(value)}")
    if isinstance(value, str) and len(value) > 10_000:
        raise ConfigError(f"seeds is a {len(value):,}-character text; {_SEEDS_HINT}")
    if isinstance(value, int) or (isinstance(value, str) and re.fullmatch(r"\s*[0-9]+\s*", value)):
        seeds = list(range(_seed_count(int(value), value)))
    elif isinstance(value, str) and re.fullmatch(r"\s*[0-9]+\s*-\s*[0-9]+\s*", value):
        lo, hi = (int(v) for v in value.split("-"))
        if hi > MAX_SEED:
            raise ConfigError(f"seed {hi} is above {MAX_SEED} (2**32-1), the largest seed normkit accepts")
        seeds = list(range(lo, lo + _seed_count(max(hi - lo + 1, 0), value)))
    elif isinstance(value, str) and re.fullmatch(r"\s*[0-9]+(\s*,\s*[0-9]+)*\s*,?\s*", value):
        seeds = [int(v) for v in value.split(",") if v.strip()]
    elif isinstance(value, list) and value and all(isinstance(v, int) and not isinstance(v, bool)
                                                   and v >= 0 for v in value):
        seeds = list(value)
    else:
        raise ConfigError(f"{_SEEDS_HINT}, not {short_repr(value)}")
    if not seeds:
        raise ConfigError(f"seeds {short_repr(value)} selects no seed; use a count of at least 1, e.g. --seeds 3")
    _seed_count(len(seeds), value)
    too_big = [s for s in seeds if s > MAX_SEED]
    if too_big:
        raise ConfigError(f"seed {too_big[0]} is above {MAX_SEED} (2**32-1), the largest seed normkit accepts")
    if len(set(seeds)) != len(seeds):
        raise ConfigError(f"seeds {short_repr(value)} repeat a seed; each seed runs once per norm")
    return seeds


def parse_norms(value: Any) -> list[str]:
    """Norm specs from "bn,bnn,gn+pn" or a YAML list, validated and in canonical spelling; a value
    list in a spec (`bnn(noise=[0,0.4])`) expands into one norm per value."""
    if isinstance(value, str):
        items = normkit.split_specs(value)
    elif isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        items = list(value)
    else:
        raise ConfigError(f"norms must be a comma list of specs like bn,bnn,gn+pn, not {short_repr(value)}")
    norms = [normkit.parse(spec).text for item in items for spec in expand_lists(item)]
    repeated = sorted({n for n in norms if norms.count(n) > 1})
    if repeated:
        raise ConfigError(f"norm {repeated[0]!r} is listed twice in norms; list each spec once")
    return norms


def parse_key_values(items: list[str], what: str) -> dict[str, Any]:
    """`["width=64", "depth=2"]` -> {"width": 64, "depth": 2} (values typed by YAML rules)."""
    pairs = []
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{what} {short_repr(item)} is not KEY=VALUE, e.g. {what} width=64")
        name = key.strip().replace("-", "_")
        pairs.append((key, safe_yaml.loads(raw, f"{what} {name}=...") if raw.strip() else ""))
    return _distinct_keys(pairs, what)


def _grid_items(value: Any, what: str, free: bool = False) -> dict[str, list[Any]]:
    """key -> values from a YAML mapping, or from "KEY=V1,V2" strings (one or a list of them); `free`
    (the user's program's keys): each value as written (`runs.template.value_as_written`), never by YAML."""
    if isinstance(value, dict):
        return _distinct_keys({str(k): v if isinstance(v, list) else [v] for k, v in value.items()}.items(), what,
                              grid=True)
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
        raise ConfigError(f"{what} must be KEY=V1,V2,... (e.g. lr=0.03,0.1,0.3), not {short_repr(value)}")
    pairs = []
    for item in items:
        key, sep, raw = item.partition("=")
        values = [value_as_written(v.strip()) if free else safe_yaml.loads(v, f"{what} {key.strip()}=...")
                  for v in raw.split(",") if v.strip()]
        if not sep or not key.strip() or not values:
            raise ConfigError(f"{what} {short_repr(item)} is not KEY=V1,V2,..., e.g. lr=0.03,0.1,0.3")
        pairs.append((key, values))
    return _distinct_keys(pairs, what, grid=True)


def _distinct_keys(pairs: Any, what: str, grid: bool = False) -> dict[str, Any]:
    """key -> value with '-' read as '_'; a key given twice (`--tune lr=0.1 --tune lr=0.3`, or `batch_size`
    and `batch-size`) is refused, never silently the last one. `grid`: the values are lists (tune, sweep)."""
    out: dict[str, Any] = {}
    written: dict[str, str] = {}
    for key, value in pairs:
        name = str(key).strip().replace("-", "_")
        if name in out:
            same = "" if written[name] == str(key).strip() else f" (as {written[name]!r} and {str(key).strip()!r})"
            fix = f"give it once with every value, e.g. {name}=V1,V2,V3" if grid else "keep one"
            raise ConfigError(f"{what} gives {name} twice{same}; {fix}")
        out[name], written[name] = value, str(key).strip()
    return out


_NOT_GRIDDABLE = RUNTIME_KEYS | {"model", "dataset", "model_params", "dataset_params", "cpu_threads", "budget"}


def parse_grid(value: Any, what: str, *, numeric: bool, free: bool = False,
               model: str | None = None) -> dict[str, list[Any]]:
    """The values of `tune` or `sweep` (training key -> distinct values), typed and checked. `free`: the
    keys are the user's own program's (any identifier, any plain values), not normkit's training keys.
    `model`: a sweep may also vary a parameter of this model (`placement`, `qk_norm`), typed as the
    model declares it; a run's cell then sets it in `model_params` (`RunId.train_config`)."""
    hints = typing.get_type_hints(TrainConfig)
    out = {}
    for key, values in _grid_items(value, what, free).items():
        if model is not None and key not in hints and key in _model_param_names(model):
            out[key] = _model_grid(model, key, values, what)
            continue
        if free:
            check_free_values(what, key, values)
            if not key.isidentifier():
                raise ConfigError(f"{what} key {key!r} is not a name (an identifier such as lr or width)")
            if not all(isinstance(v, (int, float, str, bool)) for v in values) or not values \
                    or len(set(map(repr, values))) != len(values):
                raise ConfigError(f"{what} {key}={values} must list distinct plain values, e.g. {key}=0.03,0.1,0.3")
            out[key] = list(values)
            continue
        if key not in hints or key in _NOT_GRIDDABLE:
            valid = [k for k in hints if k not in _NOT_GRIDDABLE]
            raise ConfigError(f"{what} key {key!r} is not a training key{did_you_mean(key, valid)}; "
                              f"valid: {', '.join(valid)}")
        if numeric and not any(h in (int, float) for h in _members(hints[key])):
            raise ConfigError(f"{what} key {key!r} is not numeric; tune numbers such as lr or weight_decay")
        hint = typing.Union[tuple(m for m in _members(hints[key]) if m is not type(None))]  # noqa: UP007 - built
        typed = [_check_type(f"{what} value of {key}", v, hint) for v in values]
        if not typed or len(set(map(repr, typed))) != len(typed):
            raise ConfigError(f"{what} {key}={values} must list distinct values, e.g. {key}=0.03,0.1,0.3")
        out[key] = typed
    return out


def _model_param_names(model: str) -> set[str]:
    """The parameters a registered model declares (none for an unknown model: check() names it)."""
    try:
        return {p.name for p in plugins.registry().lookup_item("model", model).params}
    except NormkitError:
        return set()


def _model_grid(model: str, key: str, values: list[Any], what: str) -> list[Any]:
    """Swept values of model parameter `key`, typed by the model's own declaration."""
    try:
        typed = [model_params(model, {key: v})[key] for v in values]
    except NormkitError as exc:
        raise ConfigError(f"{what} {key}: {exc}") from None
    if not typed or len(set(map(repr, typed))) != len(typed):
        raise ConfigError(f"{what} {key}={values} must list distinct values")
    return typed


def _tune_seeds(value: Any, tune: dict[str, list[Any]], seeds: list[int]) -> list[int]:
    """Tuning seeds, disjoint from the comparison's seeds: a list or range, or a count N (default
    DEFAULT_TUNE_SEEDS) meaning the N seeds after the comparison's seeds."""
    if not tune:
        return []
    if value is None:
        value = DEFAULT_TUNE_SEEDS
    if (isinstance(value, int) and not isinstance(value, bool)) or (
            isinstance(value, str) and re.fullmatch(r"\s*[0-9]+\s*", value)):
        count = int(value)  # a count N: the N seeds after the comparison's seeds
        return list(range(max(seeds) + 1, max(seeds) + 1 + count)) if count > 0 else []
    tune_seeds = parse_seeds(value) if not (isinstance(value, list) and not value) else []
    overlap = sorted(set(tune_seeds) & set(seeds))
    if overlap:
        raise ConfigError(f"tune_seeds {','.join(map(str, overlap))} are also comparison seeds; tuning must "
                          f"use other seeds, e.g. --tune-seeds {max(seeds) + 1},{max(seeds) + 2}")
    if not tune_seeds:
        raise ConfigError("tuning needs at least one tune seed, e.g. --tune-seeds 100")
    return tune_seeds


def _members(hint: Any) -> tuple[Any, ...]:
    """The alternatives of a union type (`float | None` -> (float, NoneType)), else (hint,)."""
    return typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)


def _matches(value: Any, hint: Any) -> bool:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, h) for h in _members(hint))
    if origin is typing.Literal:
        return value in typing.get_args(hint)
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    base = origin or hint
    return isinstance(base, type) and isinstance(value, base)


_TYPE_WORDS = {float: "a number", int: "a whole number", bool: "true or false", str: "a text", dict: "a mapping",
               list: "a list", type(None): "null (the default)"}


def _type_name(hint: Any) -> str:
    """A type annotation in words (`float | None` -> "a number or null (the default)")."""
    if typing.get_origin(hint) is typing.Literal:
        return "one of " + ", ".join(map(str, typing.get_args(hint)))
    members = _members(hint)
    if len(members) > 1:
        return " or ".join(_type_name(m) for m in members)
    origin = typing.get_origin(hint) or hint
    return _TYPE_WORDS.get(origin, getattr(origin, "__name__", str(origin)))


def _check_type(key: str, value: Any, hint: Any) -> Any:
    if not _matches(value, hint):
        raise ConfigError(f"{key} must be {_type_name(hint)}, not {short_repr(value)}")
    if isinstance(value, int) and not isinstance(value, bool) and float in _members(hint) \
            and int not in _members(hint):
        return float(value)
    return value


def normalize_keys(raw: dict[Any, Any], source: str) -> dict[str, Any]:
    """Map '-' to '_' in keys and refuse keys a comparison does not know."""
    valid = known_keys()
    out = _distinct_keys(raw.items(), source)
    for key, name in zip(raw, out, strict=True):
        if name not in valid:
            raise ConfigError(f"unknown key {short_repr(key)} in {source}{did_you_mean(name, valid)}; "
                              f"valid keys: {', '.join(valid)}")
    return out


def load_yaml(path: str | Path, saved: bool = False) -> dict[str, Any]:
    """The mapping in a YAML config file, with keys checked; unreadable or invalid files raise ConfigError.
    `saved`: a results directory's config.yaml (`safe_yaml.loads`)."""
    raw = safe_yaml.read(path, "config", saved)
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"config {str(path)!r} must be a mapping of keys to values, "
                          f"not a {type(raw).__name__}")
    return normalize_keys(raw, f"config {str(path)!r}")


# A model's or dataset's registered `sweep` and `budget` are a default design (digits: batch 2 and 16 at
# equal steps; digit-blends: normalization batch 2 and 16 at a gradient batch of 16 and equal steps): it
# stands only while the user gives none of these keys, which choose a design of their own (`design_note`
# says so when that drops the design's cells). A registered budget without a sweep is a recipe's length
# (gpt-tiny: 4,000 steps): it stays when the user sweeps or changes the batch, and gives way to a length
# of the user's (epochs or budget).
DESIGN_KEYS = ("epochs", "budget", "batch_size", "norm_batch", "sweep")


def _registered(values: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(global defaults, the dataset's registered training values, the model's) for `values`."""
    base = defaults()
    of_model = registered_train_defaults("model", values.get("model", base["model"]))
    of_dataset = registered_train_defaults("dataset", values.get("dataset", of_model.get("dataset", base["dataset"])))
    return base, of_dataset, of_model


def design_note(values: dict[str, Any]) -> str | None:
    """One line when keys the user gave (DESIGN_KEYS, but no sweep) end a registered default design that has
    cells: which cells no longer run and how to keep them (a newcomer adding `--budget steps=N` to the
    default lost its batch-16 cell without a word). None otherwise."""
    given = [key for key in DESIGN_KEYS if key in values]
    if not given or "sweep" in values or values.get("command") is not None \
            or values.get("train_function") is not None:
        return None
    base, of_dataset, of_model = _registered(values)
    design = {**of_dataset, **of_model}
    if not design.get("sweep"):
        return None
    cells = " ".join(f"{key}={','.join(map(str, vals))}" for key, vals in design["sweep"].items())
    length = f" at {design['budget']} each" if design.get("budget") else ""
    now = ", ".join(f"{key}={values.get(key, design.get(key, base.get(key)))}" for key in design["sweep"])
    flags = ", ".join(f"--{key.replace('_', '-')}" for key in given)
    dataset = values.get("dataset", base["dataset"])
    return (f"{flags} {'replace' if len(given) > 1 else 'replaces'} the default design of {dataset} "
            f"({cells}{length}), so every run trains at {now}; to keep its cells, add --sweep {cells}")

# the largest amount of each budget unit; an examples budget is checked against steps again once the batch is known
_BUDGET_LIMITS = {"epochs": MAX_EPOCHS, "steps": MAX_STEPS, "examples": MAX_STEPS * MAX_BATCH_SIZE}
_BUDGET_HINT = "budget must be UNIT=N with UNIT epochs, steps or examples, e.g. --budget steps=600"


def parse_budget(value: Any) -> tuple[str, int]:
    """(unit, amount) from "steps=600" (or YAML's `{steps: 600}`); one unit, a positive integer."""
    if isinstance(value, dict) and len(value) == 1:
        (unit, amount), = value.items()
    elif isinstance(value, str) and "=" in value:
        unit, _, amount = value.partition("=")
        amount = amount.strip()
        amount = int(amount) if re.fullmatch(r"[0-9]{1,30}", amount) else amount
    else:
        raise ConfigError(f"{_BUDGET_HINT}, not {short_repr(value)}")
    unit = str(unit).strip()
    if unit not in BUDGET_UNITS:
        raise ConfigError(f"budget unit {short_repr(unit)} is not one of {', '.join(BUDGET_UNITS)}"
                          f"{did_you_mean(unit, list(BUDGET_UNITS))}; e.g. --budget steps=600")
    written = amount if isinstance(amount, str) else repr(amount)
    try:
        number = float(amount) if not isinstance(amount, bool) else math.nan
    except (TypeError, ValueError, OverflowError):
        number = math.nan
    limit = _BUDGET_LIMITS[unit]
    if number > limit:  # said before the form, so 1e14 is "too large", not "must be a whole number"
        raise ConfigError(f"budget {unit}={written} is too large: at most {limit:,} {unit} (see Limits in "
                          f"docs/experiments.md)")
    if not (isinstance(amount, int) and not isinstance(amount, bool) and amount >= 1):
        raise ConfigError(f"budget {unit}={written} must be a whole number >= 1 written with digits, "
                          f"e.g. {unit}=600")
    return unit, amount


def _resolve_budget(merged: dict[str, Any], given: dict[str, Any]) -> None:
    """Turn `budget` into the TrainConfig's: an epoch budget sets `epochs` (budget None), a steps or
    examples budget is kept as canonical "unit=N" text; the length is given once, never both ways."""
    raw = merged.get("budget")
    if raw is None:
        return
    unit, amount = parse_budget(raw)
    if unit == "epochs":
        if "epochs" in given and given["epochs"] != amount:
            raise ConfigError(f"epochs {short_repr(given['epochs'])} and budget epochs={amount} disagree; give the "
                              f"training length once")
        merged["epochs"], merged["budget"] = amount, None
        return
    if "epochs" in given:
        raise ConfigError(f"budget {unit}={amount} sets the training length, so epochs "
                          f"{short_repr(given['epochs'])} would be unused; give the length once (drop epochs)")
    merged["budget"] = f"{unit}={amount}"


def build_config(values: dict[str, Any]) -> CompareConfig:
    """A CompareConfig from a flat mapping of known keys (model defaults, then global defaults
    fill what is missing)."""
    base, of_dataset, of_model = _registered(values)
    merged = {**base, **of_dataset, **of_model, **values}
    own_code = values.get("command") is not None or values.get("train_function") is not None
    if own_code or (any(key in values for key in DESIGN_KEYS) and {**of_dataset, **of_model}.get("sweep")):
        merged.update({key: values.get(key, base[key]) for key in ("sweep", "budget")})
    elif "epochs" in values:  # a recipe's length without cells (gpt-tiny's steps) gives way to the user's
        merged["budget"] = values.get("budget", base["budget"])
    _resolve_budget(merged, values)
    if merged.get("norms") is None:
        raise ConfigError("no norms to compare; pass --norms, e.g. --norms bn,bnn,gn+pn")
    norms = parse_norms(merged.pop("norms"))
    seeds, looks, max_cpu_minutes = _sequential(merged.pop("seeds"), merged.pop("max_seeds"), merged.pop("looks"),
                                                merged.pop("max_cpu_minutes"))
    baseline = _check_type("baseline", merged.pop("baseline"), str | None)
    diagnostics = _check_type("diagnostics", merged.pop("diagnostics"), bool)
    ablate = _check_type("ablate", merged.pop("ablate"), bool)
    select = merged.pop("select")
    if select not in SELECTIONS:
        raise ConfigError(f"select must be one of {', '.join(SELECTIONS)}, not {select!r}")
    metric, *further_metrics = metric_list(_check_type("metric", merged.pop("metric"), str))
    margin = _check_type("margin", merged.pop("margin"), float | None)
    if margin is not None and not (math.isfinite(margin) and margin > 0):
        raise ConfigError(f"margin must be a finite number > 0 in the metric's unit, not {margin!r}")
    if margin is None and needs_margin(metric_named(metric)):
        raise ConfigError(f"metric {metric} is your program's own, so normkit does not know its unit: give the "
                          f"equivalence margin in it, e.g. --margin 0.01")
    own = {key: merged.pop(key) for key in EXTERNAL_KEYS}
    own_types = {"command": str | None, "command_dir": str | None, "timeout": float | None,
                 "train_function": str | None, "code_files": dict | None}
    own = {key: _check_type(key, value, own_types[key]) for key, value in own.items()}
    if own["timeout"] is not None and not (math.isfinite(own["timeout"]) and own["timeout"] > 0):
        raise ConfigError(f"timeout must be a number of seconds > 0, not {own['timeout']!r}")
    if own["command"] is not None and own["train_function"] is not None:
        raise ConfigError("give either a command or a train function, not both")
    external = own["command"] is not None or own["train_function"] is not None
    if own["timeout"] is not None and own["command"] is None:
        raise ConfigError("timeout stops a --command program that runs too long; it needs --command")
    tune = parse_grid(merged.pop("tune"), "tune", numeric=not external, free=external)
    sweep = parse_grid(merged.pop("sweep"), "sweep", numeric=False, free=external,
                       model=None if external else merged.get("model"))
    both = sorted(set(tune) & set(sweep))
    if both:
        raise ConfigError(f"{both[0]!r} is both tuned and swept; use it in --tune or --sweep, not both")
    tune_seeds = _tune_seeds(merged.pop("tune_seeds"), tune, seeds)
    if merged["budget"] is not None and "epochs" in {*tune, *sweep}:
        raise ConfigError(f"budget {merged['budget']} sets the training length, so epochs would change nothing; "
                          f"tune or sweep another key (batch_size, lr), or drop the budget")
    if baseline is not None:
        baseline = normkit.parse(baseline).text
        if baseline not in norms:
            raise ConfigError(f"baseline {baseline!r} is not one of the compared norms "
                              f"({', '.join(norms)}); add it to --norms or pick one of those")
    hints = typing.get_type_hints(TrainConfig)
    train_values = {key: _check_type(key, value, hints[key]) for key, value in merged.items()}
    try:
        train = TrainConfig(**train_values)
    except TypeError as exc:
        raise ConfigError(f"incomplete training config: {exc}") from None
    if own["command"] is not None and not 1 <= train.epochs <= MAX_EPOCHS:  # own loop: runs.checks does it
        raise ConfigError(f"epochs {train.epochs} is not in [1, {MAX_EPOCHS:,}]; the command gets it as {{epochs}} "
                          f"(and NORMKIT_EPOCHS), so give the epochs each run trains")
    if external and diagnostics:
        raise ConfigError("diagnostics measure normkit's own models during its own training; they are not "
                          "available for a command or train function: drop --diagnostics")
    return CompareConfig(norms=norms, train=train, seeds=seeds, baseline=baseline, diagnostics=diagnostics,
                         select=select, metric=metric, further_metrics=further_metrics, margin=margin, tune=tune,
                         tune_seeds=tune_seeds, sweep=sweep, ablate=ablate, looks=looks,
                         max_cpu_minutes=max_cpu_minutes, **own)


_AUTO_HINT = "seeds auto adds seeds in rounds; give --max-seeds N (at least 3) and optionally --max-cpu-minutes M"


def _sequential(seeds_value: Any, max_seeds: Any, looks: Any, max_cpu_minutes: Any
                ) -> tuple[list[int], list[int] | None, float | None]:
    """Seeds, looks and CPU budget: `seeds: auto` (optionally `max_seeds`) plans the looks of sequential seeds
    (normkit_lab.sequential.plan_looks) over seeds 0..max_seeds-1; a config.yaml saved by such a run gives
    the seeds and `looks` themselves; any other seeds are fixed (no looks, no max_seeds or budget)."""
    auto = isinstance(seeds_value, str) and seeds_value.strip().lower() == "auto"
    max_seeds = _check_type("max_seeds", max_seeds, int | None)
    budget = _check_type("max_cpu_minutes", max_cpu_minutes, float | None)
    if budget is not None and not (math.isfinite(budget) and budget > 0):
        raise ConfigError(f"max_cpu_minutes must be a number of minutes > 0, not {budget!r}")
    if auto:
        if looks is not None:
            raise ConfigError("seeds auto plans the looks itself; give either seeds auto or looks, not both")
        count = DEFAULT_MAX_SEEDS if max_seeds is None else max_seeds
        if not 3 <= count <= MAX_SEEDS:
            raise ConfigError(f"max_seeds must be between 3 and {MAX_SEEDS:,}, not {count}; {_AUTO_HINT}")
        return list(range(count)), list(plan_looks(count)), budget
    if max_seeds is not None or (budget is not None and looks is None):
        raise ConfigError(f"max_seeds and max_cpu_minutes apply to --seeds auto, not to fixed seeds "
                          f"{short_repr(seeds_value)}; {_AUTO_HINT}")
    seeds = parse_seeds(seeds_value)
    if looks is None:
        return seeds, None, None
    if not (isinstance(looks, list) and looks and all(isinstance(n, int) and not isinstance(n, bool) for n in looks)
            and all(b > a for a, b in itertools.pairwise(looks)) and looks[0] >= 3
            and looks[-1] == len(seeds)):
        raise ConfigError(f"looks must be increasing seed counts from at least 3 up to the number of seeds "
                          f"({len(seeds)}), not {short_repr(looks)}; {_AUTO_HINT}")
    return seeds, list(looks), budget


def _refuse_builtin_keys(values: dict[str, Any]) -> None:
    """With the user's own code, a key of normkit's own loop (lr, model, ...) would be silently ignored:
    refuse it, saying how the program gets such a value."""
    if values.get("command") is None and values.get("train_function") is None:
        return
    kept = own_code_train_keys(values.get("command") is not None)
    unused = sorted(k for k in values if k in {f.name for f in dataclasses.fields(TrainConfig)} and k not in kept)
    if unused:
        key = unused[0]
        if key == "epochs":
            raise ConfigError("epochs reaches a command as {epochs}; a train function is given none, so it would be "
                              "unused: drop it (your function trains its own epochs, or sweep or tune them: "
                              "--sweep epochs=... reaches it in cell)")
        raise ConfigError(f"{key} is a setting of normkit's own training loop, which your code replaces; pass it "
                          f"to your program instead (in the command, or swept or tuned: --sweep {key}=... with "
                          f"{{cell.{key}}}, --tune {key}=... with {{{key}}})")


def given_values(cli_values: dict[str, Any], config_file: str | Path | None = None) -> dict[str, Any]:
    """The values the user gave: CLI values (only those typed) over the YAML file's, keys checked."""
    from_file = load_yaml(config_file) if config_file is not None else {}
    values = {**from_file, **normalize_keys(cli_values, "command-line options")}
    _refuse_builtin_keys(values)
    return values


def resolve(cli_values: dict[str, Any], config_file: str | Path | None = None) -> CompareConfig:
    """CLI values (only those the user typed) over the YAML file over defaults."""
    return build_config(given_values(cli_values, config_file))


def save_yaml(cfg: CompareConfig) -> str:
    """config.yaml text: the resolved config, loadable again with `--config` or `--resume`."""
    return safe_yaml.dumps(cfg.to_dict())
