"""The resolved configuration of a comparison: norms x seeds plus one `TrainConfig`.

Values come from three places, highest precedence first: CLI flags, a YAML file, defaults. The
YAML file (and the `config.yaml` a comparison saves) is one flat mapping whose keys are the
comparison keys below plus every `TrainConfig` field; '-' and '_' are the same in keys. Unknown
keys are errors, so a typo never silently falls back to a default.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

import normkit
from normkit import plugins
from normkit.errors import did_you_mean
from normkit_lab.errors import ConfigError
from normkit_lab.training import TrainConfig

# Defaults that make `normkit compare --norms bn,bnn,gn+pn` meaningful and finish in under three
# minutes on two CPU cores (measured, see docs/experiments.md); other keys keep TrainConfig's defaults.
TRAIN_DEFAULTS: dict[str, Any] = {"epochs": 5, "batch_size": 128}
DEFAULT_SEEDS = (0, 1, 2, 3, 4)

# Keys that may differ between result directories that `normkit report` merges: they change where
# or how fast runs execute, not what they compute.
RUNTIME_KEYS = frozenset({"device", "data_dir", "download", "num_workers", "diagnostics"})


@dataclass
class CompareConfig:
    """Everything a comparison needs; `train` is shared by every (norm, seed) run."""

    norms: list[str]
    train: TrainConfig
    seeds: list[int] = field(default_factory=lambda: list(DEFAULT_SEEDS))
    baseline: str | None = None
    diagnostics: bool = False

    @property
    def baseline_norm(self) -> str:
        """The norm every other norm is compared to (the first one unless chosen)."""
        return self.baseline or self.norms[0]

    def plan(self) -> list[tuple[str, int]]:
        """Every (norm, seed) run, seed-major so an interrupted comparison already holds full pairs."""
        return [(norm, seed) for seed in self.seeds for norm in self.norms]

    def to_dict(self) -> dict[str, Any]:
        """The flat mapping saved as config.yaml (and accepted by `--config`)."""
        return {"norms": list(self.norms), "seeds": list(self.seeds), "baseline": self.baseline,
                "diagnostics": self.diagnostics, **dataclasses.asdict(self.train)}


_COMPARE_KEYS = ("norms", "seeds", "baseline", "diagnostics")


def known_keys() -> list[str]:
    return [*_COMPARE_KEYS, *(f.name for f in dataclasses.fields(TrainConfig))]


def defaults() -> dict[str, Any]:
    """Default value of every key except `norms`, which has none."""
    out: dict[str, Any] = {"seeds": list(DEFAULT_SEEDS), "baseline": None, "diagnostics": False}
    for f in dataclasses.fields(TrainConfig):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    out.update(TRAIN_DEFAULTS)
    return out


def parse_seeds(value: Any) -> list[int]:
    """Seeds from `3` (= 0,1,2), `"0,1,5"`, `"2-4"` (inclusive) or a YAML list of ints."""
    if isinstance(value, bool):
        raise ConfigError(f"seeds must be a count, a list like 0,1,2 or a range like 0-4, not {value!r}")
    if isinstance(value, int):
        seeds = list(range(value))
    elif isinstance(value, str) and re.fullmatch(r"\s*\d+\s*", value):
        seeds = list(range(int(value)))
    elif isinstance(value, str) and re.fullmatch(r"\s*\d+\s*-\s*\d+\s*", value):
        lo, hi = (int(v) for v in value.split("-"))
        seeds = list(range(lo, hi + 1))
    elif isinstance(value, str) and re.fullmatch(r"\s*\d+(\s*,\s*\d+)*\s*,?\s*", value):
        seeds = [int(v) for v in value.split(",") if v.strip()]
    elif isinstance(value, list) and value and all(isinstance(v, int) and not isinstance(v, bool)
                                                   and v >= 0 for v in value):
        seeds = list(value)
    else:
        raise ConfigError(f"seeds must be a count, a list like 0,1,2 or a range like 0-4, not {value!r}")
    if not seeds:
        raise ConfigError(f"seeds {value!r} selects no seed; use a count of at least 1, e.g. --seeds 3")
    if len(set(seeds)) != len(seeds):
        raise ConfigError(f"seeds {value!r} repeat a seed; each seed runs once per norm")
    return seeds


def parse_norms(value: Any) -> list[str]:
    """Norm specs from "bn,bnn,gn+pn" or a YAML list, validated and in canonical spelling."""
    if isinstance(value, str):
        items = normkit.split_specs(value)
    elif isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        items = list(value)
    else:
        raise ConfigError(f"norms must be a comma list of specs like bn,bnn,gn+pn, not {value!r}")
    norms = [normkit.parse(item).text for item in items]
    repeated = sorted({n for n in norms if norms.count(n) > 1})
    if repeated:
        raise ConfigError(f"norm {repeated[0]!r} is listed twice in norms; list each spec once")
    return norms


def parse_key_values(items: list[str], what: str) -> dict[str, Any]:
    """`["width=64", "depth=2"]` -> {"width": 64, "depth": 2} (values typed by YAML rules)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{what} {item!r} is not KEY=VALUE, e.g. {what} width=64")
        out[key.strip().replace("-", "_")] = yaml.safe_load(raw) if raw.strip() else ""
    return out


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


def _type_name(hint: Any) -> str:
    text = str(hint).replace("typing.", "").replace("<class '", "").replace("'>", "")
    return text.replace("NoneType", "null")


def _check_type(key: str, value: Any, hint: Any) -> Any:
    if not _matches(value, hint):
        raise ConfigError(f"{key} must be {_type_name(hint)}, not {value!r}")
    if isinstance(value, int) and not isinstance(value, bool) and float in _members(hint) \
            and int not in _members(hint):
        return float(value)
    return value


def normalize_keys(raw: dict[Any, Any], source: str) -> dict[str, Any]:
    """Map '-' to '_' in keys and refuse keys a comparison does not know."""
    valid = known_keys()
    out = {}
    for key, value in raw.items():
        name = str(key).strip().replace("-", "_")
        if name not in valid:
            raise ConfigError(f"unknown key {key!r} in {source}{did_you_mean(name, valid)}; "
                              f"valid keys: {', '.join(valid)}")
        out[name] = value
    return out


def load_yaml(path: str | Path) -> dict[str, Any]:
    """The mapping in a YAML config file, with keys checked; unreadable or invalid files raise ConfigError."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read config {str(path)!r}: {exc.strerror or exc}") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise ConfigError(f"config {str(path)!r} is not valid YAML{where}; fix it or drop --config") from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"config {str(path)!r} must be a mapping of keys to values, "
                          f"not a {type(raw).__name__}")
    return normalize_keys(raw, str(path))


def model_train_defaults(model: Any) -> dict[str, Any]:
    """The training values a model registers as its defaults (`train_defaults=` at registration).

    They sit between the global defaults and the user's values: e.g. the GPT models train with
    AdamW at batch 32 unless the user says otherwise. An unknown model has none (check() names it).
    """
    if not isinstance(model, str):
        return {}
    try:
        entry = plugins.registry().lookup_item("model", model)
    except normkit.NormkitError:
        return {}
    return dict(entry.meta.get("train_defaults") or {})


def build_config(values: dict[str, Any]) -> CompareConfig:
    """A CompareConfig from a flat mapping of known keys (model defaults, then global defaults
    fill what is missing)."""
    base = defaults()
    merged = {**base, **model_train_defaults(values.get("model", base["model"])), **values}
    if merged.get("norms") is None:
        raise ConfigError("no norms to compare; pass --norms, e.g. --norms bn,bnn,gn+pn")
    norms = parse_norms(merged.pop("norms"))
    seeds = parse_seeds(merged.pop("seeds"))
    baseline = _check_type("baseline", merged.pop("baseline"), str | None)
    diagnostics = _check_type("diagnostics", merged.pop("diagnostics"), bool)
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
    return CompareConfig(norms=norms, train=train, seeds=seeds, baseline=baseline, diagnostics=diagnostics)


def resolve(cli_values: dict[str, Any], config_file: str | Path | None = None) -> CompareConfig:
    """CLI values (only those the user typed) over the YAML file over defaults."""
    from_file = load_yaml(config_file) if config_file is not None else {}
    return build_config({**from_file, **normalize_keys(cli_values, "command-line options")})


def save_yaml(cfg: CompareConfig) -> str:
    """config.yaml text: the resolved config, loadable again with `--config` or `--resume`."""
    return yaml.safe_dump(cfg.to_dict(), sort_keys=False)
