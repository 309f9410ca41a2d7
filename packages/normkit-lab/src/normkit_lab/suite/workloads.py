"""A workload of the suite: one model, data and recipe, its tuning budget, its target, its variants.

Workloads are plain mappings registered through the `normkit_register_workloads` plugin hook, as
norms are, and checked here before anything runs (see docs/suite.md, "Adding a workload"):

    register("cnn", {
        "question": "an ordinary batch, the same steps as small-batch",
        "config": {"model": "small-cnn", "dataset": "digits", "batch_size": 32, "budget": "steps=1080"},
        "tune": {"lr": [0.03, 0.1, 0.3]},        # every norm gets these candidates, chosen on validation
        "target": 97.0,                          # on the validation counterpart of the metric, its unit
        "variants": {"narrow": {"model_params": {"width": 16}}},   # held out: run by --holdout
        "quick": {"budget": "steps=40"},         # --quick, a smoke test
        "paper": {"dataset": "cifar10", ..., "needs": "a GPU and CIFAR-10 on disk"},  # --scale paper
    })

An override mapping (a variant, quick, paper) replaces config keys (model_params and dataset_params
are merged key by key) and may replace `tune` and `target`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from normkit import plugins
from normkit_lab.errors import ConfigError, short_repr
from normkit_lab.metrics import Metric, metric_named
from normkit_lab.study.config import build_config, normalize_keys

SCALES = ("cpu", "quick", "paper")
_KEYS = ("question", "config", "tune", "target", "variants", "quick", "paper")
_OVERRIDE_EXTRA = ("tune", "target")
_PAPER_EXTRA = ("needs",)
# what the suite itself decides for every workload alike
SUITE_KEYS = ("norms", "seeds", "baseline", "tune", "tune_seeds", "sweep", "looks", "max_seeds", "max_cpu_minutes")
_MERGED = ("model_params", "dataset_params")


@dataclass(frozen=True)
class Workload:
    """A registered workload, checked. `config`: its comparison keys at CPU scale; `tune`: the tuning
    budget every norm gets; `target`: the value of the metric's validation counterpart a run must reach."""

    name: str
    plugin: str
    question: str
    config: dict[str, Any]
    tune: dict[str, list[Any]]
    target: float
    variants: dict[str, dict[str, Any]] = field(default_factory=dict)
    quick: dict[str, Any] = field(default_factory=dict)
    paper: dict[str, Any] = field(default_factory=dict)

    @property
    def metric(self) -> Metric:
        return metric_named(self.full_config()["metric"])

    def full_config(self, scale: str = "cpu", variant: str | None = None) -> dict[str, Any]:
        """Every comparison key at `scale`, defaults resolved as `normkit compare` resolves them (the model's
        and dataset's registered defaults included: a language model's metric is bits per byte)."""
        config, _, _ = self.resolved(scale, variant)
        return build_config({**config, "norms": "bn"}).to_dict()

    def resolved(self, scale: str = "cpu", variant: str | None = None) -> tuple[dict[str, Any], dict[str, list[Any]],
                                                                                 float]:
        """(config keys, tuning budget, target) at `scale`, of held-out `variant` (None: the visible one)."""
        if scale not in SCALES:
            raise ConfigError(f"scale must be one of {', '.join(SCALES)}, not {scale!r}")
        if variant is not None and variant not in self.variants:
            raise ConfigError(f"workload {self.name!r} has no variant {variant!r}; its variants: "
                              f"{', '.join(self.variants) or 'none'}")
        config, tune, target = dict(self.config), dict(self.tune), self.target
        layers = [{"cpu": {}, "quick": self.quick, "paper": self.paper}[scale]]
        layers.append(self.variants[variant] if variant is not None else {})
        for layer in layers:
            for key, value in layer.items():
                if key == "tune":
                    tune = dict(value)
                elif key == "target":
                    target = float(value)
                elif key in _MERGED:
                    config[key] = {**config.get(key, {}), **value}
                elif key not in _PAPER_EXTRA:
                    config[key] = value
        return config, tune, target

    def recipe(self, scale: str = "cpu", variant: str | None = None) -> str:
        """`small-cnn on digit-blends, sgd, batch 16 (norm batch 2), budget steps=300` for --list and the scorecard."""
        c = self.full_config(scale, variant)
        params = ", ".join(f"{k}={v}" for k, v in c["model_params"].items())
        model = c["model"] + (f"({params})" if params else "")
        length = f"budget {c['budget']}" if c.get("budget") else f"{c['epochs']} epoch{'s' if c['epochs'] != 1 else ''}"
        ghost = f" (norm batch {c['norm_batch']})" if c.get("norm_batch") else ""
        return f"{model} on {c['dataset']}, {c['optimizer']}, batch {c['batch_size']}{ghost}, {length}"

    def budget_text(self, scale: str = "cpu", variant: str | None = None) -> str:
        """`3 trials (lr=0.01,0.02,0.05)`: the tuning budget each norm gets."""
        _, tune, _ = self.resolved(scale, variant)
        trials = math.prod(len(v) for v in tune.values())
        grid = "; ".join(f"{k}={','.join(map(str, v))}" for k, v in tune.items())
        return f"{trials} trial{'s' if trials != 1 else ''} ({grid})"

    def target_text(self, scale: str = "cpu", variant: str | None = None) -> str:
        """`val_acc >= 95 %`: the target on the metric's validation counterpart."""
        m, (_, _, target) = self.metric, self.resolved(scale, variant)
        return f"{m.select_by} {'>=' if m.higher_is_better else '<='} {target:g}{' ' + m.unit if m.unit else ''}"


def _mapping(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where} must be a mapping, not {short_repr(value)}")
    return {str(k): v for k, v in value.items()}


def _config(value: Any, where: str, extra: tuple[str, ...] = ()) -> dict[str, Any]:
    """Config keys (checked against the comparison's keys), the suite's own keys refused."""
    raw = _mapping(value, where)
    own = {k: raw.pop(k) for k in list(raw) if k in extra}
    keys = normalize_keys(raw, where)
    fixed = sorted(set(keys) & set(SUITE_KEYS))
    if fixed:
        raise ConfigError(f"{where} sets {fixed[0]!r}, which the suite sets alike for every workload; drop it")
    for key in _MERGED:
        if key in keys:
            keys[key] = _mapping(keys[key], f"{where} {key}")
    return {**keys, **own}


def _tune(value: Any, where: str) -> dict[str, list[Any]]:
    tune = _mapping(value, where)
    if not tune or not all(isinstance(v, list) and v for v in tune.values()):
        raise ConfigError(f"{where} must map training keys to lists of candidates, e.g. {{'lr': [0.03, 0.1]}}")
    return tune


def _target(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{where} must be a number in the metric's unit, not {short_repr(value)}")
    return float(value)


def parse_workload(name: str, plugin: str, raw: Mapping[str, Any]) -> Workload:
    """A Workload from its registered mapping; a one-line ConfigError naming the workload when it is wrong."""
    where = f"workload {name!r} (plugin {plugin!r})"
    data = _mapping(raw, where)
    unknown = sorted(set(data) - set(_KEYS))
    if unknown:
        raise ConfigError(f"{where} has unknown key {unknown[0]!r}; keys: {', '.join(_KEYS)}")
    for key in ("question", "config", "tune", "target"):
        if key not in data:
            raise ConfigError(f"{where} needs {key!r} (see docs/suite.md, 'Adding a workload')")
    if not isinstance(data["question"], str) or not data["question"].strip():
        raise ConfigError(f"{where}: question must be a sentence saying what the workload asks")
    variants = {str(v): _override(o, f"{where} variant {v!r}", _OVERRIDE_EXTRA)
                for v, o in _mapping(data.get("variants", {}), f"{where} variants").items()}
    workload = Workload(name=name, plugin=plugin, question=data["question"].strip(),
                        config=_config(data["config"], f"{where} config"), tune=_tune(data["tune"], f"{where} tune"),
                        target=_target(data["target"], f"{where} target"), variants=variants,
                        quick=_override(data.get("quick", {}), f"{where} quick", _OVERRIDE_EXTRA),
                        paper=_override(data.get("paper", {}), f"{where} paper", _OVERRIDE_EXTRA + _PAPER_EXTRA))
    try:  # the values' types and the metric, as `normkit compare` checks them
        workload.full_config()
    except ConfigError as exc:
        raise ConfigError(f"{where} config: {exc}") from None
    return workload


def _override(value: Any, where: str, extra: tuple[str, ...]) -> dict[str, Any]:
    out = _config(value, where, extra)
    if "tune" in out:
        out["tune"] = _tune(out["tune"], f"{where} tune")
    if "target" in out:
        out["target"] = _target(out["target"], f"{where} target")
    return out


def available() -> list[Workload]:
    """Every registered workload, in registration order (normkit's own first)."""
    reg = plugins.registry()
    return [parse_workload(e.name, e.plugin, e.meta["workload"]) for e in reg.entries if e.kind == "workload"]


def load_workload(name: str) -> Workload:
    """The registered workload `name` (a one-line error with the known names when there is none)."""
    entry = plugins.registry().lookup_item("workload", name)
    return parse_workload(entry.name, entry.plugin, entry.meta["workload"])
