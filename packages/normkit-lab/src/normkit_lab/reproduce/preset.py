"""A reproduction preset: one published claim, its pre-registered hypotheses and the runs that test it.

A preset is a YAML data file shipped in a plugin's package and registered with the
`normkit_register_presets` hook (see docs/reproduce.md for the format). It is read and checked
whole before anything runs: every hypothesis names its metric, direction, margin and test up front,
so nothing about what counts as "reproduced" is chosen after seeing the data.

    preset = load_preset("proxynorm-pn-rescues-ln")      # by registered name
    preset.scale("cpu").config                           # the comparison's config keys
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import normkit
from normkit.errors import did_you_mean
from normkit_lab import safe_yaml
from normkit_lab.errors import ConfigError, short_repr

KINDS = ("compare", "random-net")
TESTS = ("difference", "equivalence", "interaction", "diagnostic")
DIRECTIONS = {
    "difference": ("better", "worse"),
    "equivalence": ("equivalent",),
    "interaction": ("grows", "shrinks"),
    "diagnostic": ("higher", "lower"),
}
SCALES = ("cpu", "paper")
RANDOM_NET_KEYS = ("norms", "depth", "width", "batch", "image_size", "seeds")
RANDOM_NET_MEASURES = ("dataset_share",)
REPRODUCTION, EXTENSION, PREDICTION = "reproduction", "extension", "prediction"
# What a hypothesis is, relative to its cited source: a result the paper reports (reproduction), one
# it states or expects without measuring it, or a control that tests its stated cause (extension),
# or normkit's own prediction from its earlier runs (prediction).
LABELS = (REPRODUCTION, EXTENSION, PREDICTION)
SINCE = ("init",)  # a diagnostic read as its change from initialization
INIT_MEASURES = "qq_r2, 'qq_r2 depth D' or zeta"
_TOP_KEYS = ("title", "claim", "citation", "kind", "label", "hypotheses", "scales", "notes")
_HYPOTHESIS_KEYS = ("name", "label", "test", "norm", "baseline", "metric", "direction", "margin", "key", "from",
                    "to", "measure", "since", "depth", "cell", "controls")
_SCALE_KEYS = ("config", "expected_runtime_s", "expected_runtime", "machine", "requires", "measured")


@dataclass(frozen=True)
class Hypothesis:
    """One pre-registered prediction. `test` picks the lab's statistics that decide it:

    difference   `norm` vs `baseline` on `metric`, paired by seed (summary verdicts, Holm) -> better/worse
    equivalence  the same pair, TOST with `margin` -> equivalent
    interaction  the gap norm - baseline changes between cells `from` and `to` of swept `key`
                 (interactions.py) -> grows/shrinks in the norm's favour
    diagnostic   a representation measure (`measure`: zeta, qq_r2 or "qq_r2 depth D" from
                 --diagnostics runs, after training or with `since: init` as its change from
                 initialization; or dataset_share of a random net at `depth`) -> higher/lower

    `margin` (required) is the smallest effect that matters: a significant effect smaller than it is
    `below margin`, not `reproduced`. `label` says whether the paper reports it (see LABELS).
    `controls` names the preset's hypotheses that test the cause the claim states (control arms): a
    shown effect is attributed to that cause, and `reproduced`, only when every one of them holds.
    """

    name: str
    test: str
    norm: str
    baseline: str
    direction: str
    margin: float
    label: str = REPRODUCTION
    metric: str | None = None
    key: str | None = None
    from_value: Any = None
    to_value: Any = None
    measure: str | None = None
    since: str | None = None
    depth: int | None = None
    cell: dict[str, Any] = field(default_factory=dict)  # in a sweep: the cell a difference is read in
    controls: tuple[str, ...] = ()  # names of the hypotheses that must hold to attribute this one

    def describe(self) -> str:
        """The prediction in words, e.g. `ln+pn better than ln on test_acc (margin 0.5)`."""
        margin = f" (margin {self.margin:g})"
        at = f" at {', '.join(f'{k}={v}' for k, v in self.cell.items())}" if self.cell else ""
        if self.test == "difference":
            return f"{self.norm} {self.direction} than {self.baseline} on {self.metric}{at}{margin}"
        if self.test == "equivalence":
            return f"{self.norm} equivalent to {self.baseline} on {self.metric}{at} within ±{self.margin:g}"
        if self.test == "interaction":
            moves = "in" if self.direction == "grows" else "against"  # "shrinks in X's favour" read as X gaining
            return (f"{self.norm}'s gap to {self.baseline} on {self.metric} moves {moves} {self.norm}'s favour "
                    f"from {self.key}={self.from_value} to {self.key}={self.to_value}{margin}")
        where = f" at depth {self.depth}" if self.depth is not None else ""
        since = " (change from initialization)" if self.since else ""
        return f"{self.norm} {self.direction} {self.measure}{where}{since} than {self.baseline}{margin}"


@dataclass(frozen=True)
class Scale:
    """One scale of a preset: `config` (keys of `normkit compare`'s config.yaml, or of the random
    net), the expected runtime, and what it needs (`requires`: device, dataset)."""

    name: str
    config: dict[str, Any]
    expected_runtime_s: float | None = None
    expected_runtime: str = ""
    machine: str = ""
    requires: dict[str, Any] = field(default_factory=dict)
    measured: str = ""

    @property
    def runtime_text(self) -> str:
        if self.expected_runtime:
            return self.expected_runtime
        if self.expected_runtime_s is None:
            return "unknown"
        s = self.expected_runtime_s
        return f"about {s:.0f} s" if s < 120 else f"about {s / 60:.0f} min"


@dataclass(frozen=True)
class Preset:
    """A parsed, checked preset; `plugin` is the plugin that registered it."""

    name: str
    title: str
    claim: str
    citation: dict[str, str]
    kind: str
    label: str  # the default label of its hypotheses: reproduction, extension or prediction (LABELS)
    hypotheses: tuple[Hypothesis, ...]
    scales: dict[str, Scale]
    notes: str = ""
    plugin: str = ""
    path: str = ""

    @property
    def labels(self) -> str:
        """Its hypotheses' labels, e.g. `reproduction+prediction` (the preset's label when they agree)."""
        return "+".join(dict.fromkeys(h.label for h in self.hypotheses))

    @property
    def cite(self) -> str:
        """`paper, where`: the paper and the figure or table the claim comes from."""
        return ", ".join(v for v in (self.citation.get("paper", ""), self.citation.get("where", "")) if v)

    def scale(self, name: str) -> Scale:
        if name not in self.scales:
            raise ConfigError(f"preset {self.name!r} has no --scale {name}; it has: {', '.join(self.scales)}")
        return self.scales[name]


def _fail(where: str, message: str) -> ConfigError:
    return ConfigError(f"{where}: {message}")


def _text(value: Any, where: str, key: str, required: bool = True) -> str:
    if value is None and not required:
        return ""
    if not isinstance(value, str) or not value.strip():
        raise _fail(where, f"{key} must be a non-empty text, not {short_repr(value)}")
    return " ".join(value.split())


def _mapping(value: Any, where: str, key: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _fail(where, f"{key} must be a mapping, not {short_repr(value)}")
    return value


def _unknown(raw: dict[str, Any], allowed: tuple[str, ...], where: str) -> None:
    for key in raw:
        if key not in allowed:
            raise _fail(where, f"unknown key {short_repr(key)}{did_you_mean(str(key), list(allowed))}; "
                               f"valid keys: {', '.join(allowed)}")


def _margin(value: Any, where: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise _fail(where, f"margin must be a number > 0 in the metric's unit, not {short_repr(value)}")
    return float(value)


def _label(value: Any, where: str) -> str:
    if value not in LABELS:
        hint = did_you_mean(str(value), list(LABELS)) if isinstance(value, str) else ""
        raise _fail(where, f"label must be one of {', '.join(LABELS)}, not {short_repr(value)}{hint}")
    return value


def parse_hypothesis(raw: Any, where: str, kind: str, label: str = REPRODUCTION) -> Hypothesis:
    """One hypothesis, every key checked against its test; `label` is the preset's, its default."""
    raw = _mapping(raw, where, "a hypothesis")
    _unknown(raw, _HYPOTHESIS_KEYS, where)
    name = _text(raw.get("name"), where, "name")
    where = f"{where} ({name})"
    label = _label(raw.get("label", label), where)
    test = raw.get("test")
    if test not in TESTS:
        raise _fail(where, f"test must be one of {', '.join(TESTS)}, not {short_repr(test)}")
    direction = raw.get("direction", "equivalent" if test == "equivalence" else None)
    if direction not in DIRECTIONS[test]:
        raise _fail(where, f"a {test} hypothesis needs direction {' or '.join(DIRECTIONS[test])}, "
                           f"not {short_repr(direction)}")
    norm, baseline = _text(raw.get("norm"), where, "norm"), _text(raw.get("baseline"), where, "baseline")
    if norm == baseline:
        raise _fail(where, f"norm and baseline are both {norm!r}; a hypothesis compares two arms")
    margin = _margin(raw.get("margin"), where)
    if margin is None:
        article = "an" if test[0] in "aeiou" else "a"
        raise _fail(where, f"{article} {test} hypothesis needs its margin (the smallest effect that matters, in the "
                           f"{'measure' if test == 'diagnostic' else 'metric'}'s unit), fixed before the run")
    metric = raw.get("metric")
    if test in ("difference", "equivalence", "interaction"):
        metric = _text(metric, where, "metric")
        if kind != "compare":
            raise _fail(where, f"a {test} hypothesis needs trained runs (kind: compare), not kind {kind}")
    key = from_value = to_value = None
    if test == "interaction":
        key = _text(raw.get("key"), where, "key")
        if "from" not in raw or "to" not in raw or raw["from"] == raw["to"]:
            raise _fail(where, "an interaction hypothesis needs two different swept values, from: and to:")
        from_value, to_value = raw["from"], raw["to"]
    measure = depth = since = None
    if test == "diagnostic":
        measure = _text(raw.get("measure"), where, "measure")
        if kind == "random-net":
            if measure not in RANDOM_NET_MEASURES:
                raise _fail(where, f"a random-net measure is one of {', '.join(RANDOM_NET_MEASURES)}, "
                                   f"not {measure!r}")
            depth = raw.get("depth")
            if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
                raise _fail(where, f"a random-net measure needs depth: a layer number >= 1, not {short_repr(depth)}")
        elif not (measure in ("zeta", "qq_r2", "lambda") or measure.startswith("qq_r2 depth ")):
            raise _fail(where, f"measure must be zeta, qq_r2 (every depth), 'qq_r2 depth D' or lambda, "
                               f"not {measure!r}")
        since = raw.get("since")
        if since is not None and since not in SINCE:
            raise _fail(where, f"since must be init (the change from initialization) or left out (after "
                               f"training), not {short_repr(since)}")
        if since is not None and measure == "lambda":
            raise _fail(where, f"since: init reads {INIT_MEASURES}, the measures taken at initialization")
    elif "since" in raw:
        raise _fail(where, "since: applies to diagnostic hypotheses only")
    cell = _mapping(raw.get("cell") or {}, where, "cell")
    return Hypothesis(name, test, norm, baseline, direction, margin, label, metric, key, from_value, to_value,
                      measure, since, depth, dict(cell), _controls(raw.get("controls"), where))


def _controls(value: Any, where: str) -> tuple[str, ...]:
    """`controls:` as a tuple of hypothesis names (one name, or a list of them)."""
    if value is None:
        return ()
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not names or not all(isinstance(n, str) and n.strip() for n in names):
        raise _fail(where, f"controls must name the preset's control hypotheses (a name or a list of names), "
                           f"not {short_repr(value)}")
    return tuple(n.strip() for n in names)


def _check_controls(hypotheses: tuple[Hypothesis, ...], where: str) -> None:
    """Every control names another hypothesis of the preset, and a control has no controls of its own (one
    level: a control arm tests the cause, it is not itself a claim that needs one)."""
    by_name = {h.name: h for h in hypotheses}
    for h in hypotheses:
        for name in h.controls:
            if name == h.name:
                raise _fail(f"{where} ({h.name})", "a hypothesis cannot be its own control")
            if name not in by_name:
                raise _fail(f"{where} ({h.name})", f"control {name!r} is not a hypothesis of this preset"
                                                   f"{did_you_mean(name, list(by_name))}; hypotheses: "
                                                   f"{', '.join(by_name)}")
            if by_name[name].controls:
                raise _fail(f"{where} ({h.name})", f"control {name!r} has controls of its own; a control arm "
                                                   f"tests the claim's cause and takes none")


def parse_scale(name: str, raw: Any, where: str, kind: str) -> Scale:
    raw = _mapping(raw, where, f"scales.{name}")
    _unknown(raw, _SCALE_KEYS, where)
    config = dict(_mapping(raw.get("config"), where, "config"))
    if kind == "random-net":
        _unknown(config, RANDOM_NET_KEYS, f"{where} config")
    if not config.get("norms"):
        raise _fail(where, "config needs norms, the arms the hypotheses compare")
    runtime = raw.get("expected_runtime_s")
    if runtime is not None and (isinstance(runtime, bool) or not isinstance(runtime, (int, float)) or runtime <= 0):
        raise _fail(where, f"expected_runtime_s must be a number of seconds > 0, not {short_repr(runtime)}")
    if runtime is None and not raw.get("expected_runtime"):
        raise _fail(where, "give the expected runtime (expected_runtime_s: seconds, or expected_runtime: text)")
    requires = _mapping(raw.get("requires") or {}, where, "requires")
    return Scale(name, config, None if runtime is None else float(runtime),
                 _text(raw.get("expected_runtime"), where, "expected_runtime", required=False),
                 _text(raw.get("machine"), where, "machine", required=False), dict(requires),
                 _text(raw.get("measured"), where, "measured", required=False))


def parse_preset(name: str, raw: Any, source: str, plugin: str = "") -> Preset:
    """A Preset from the YAML value `raw` of file `source`; a ConfigError names the file and the problem."""
    where = f"preset {name!r} ({source})"
    raw = _mapping(raw, where, "the file")
    _unknown(raw, _TOP_KEYS, where)
    kind = raw.get("kind", "compare")
    if kind not in KINDS:
        raise _fail(where, f"kind must be one of {', '.join(KINDS)}, not {short_repr(kind)}")
    citation = _mapping(raw.get("citation"), where, "citation")
    cite = {"paper": _text(citation.get("paper"), where, "citation.paper"),
            "where": _text(citation.get("where"), where, "citation.where")}
    label = _label(raw.get("label", REPRODUCTION), where)
    items = raw.get("hypotheses")
    if not isinstance(items, list) or not items:
        raise _fail(where, "hypotheses must be a non-empty list, fixed before any run")
    hypotheses = tuple(parse_hypothesis(h, f"{where} hypothesis {i + 1}", kind, label)
                       for i, h in enumerate(items))
    names = [h.name for h in hypotheses]
    if len(set(names)) != len(names):
        raise _fail(where, "two hypotheses share a name; name each one once")
    _check_controls(hypotheses, where)
    scales_raw = _mapping(raw.get("scales"), where, "scales")
    _unknown(scales_raw, SCALES, f"{where} scales")
    if "cpu" not in scales_raw:
        raise _fail(where, "scales needs a cpu scale (the one that runs here)")
    scales = {s: parse_scale(s, scales_raw[s], f"{where} scales.{s}", kind) for s in SCALES if s in scales_raw}
    preset = Preset(name, _text(raw.get("title"), where, "title"), _text(raw.get("claim"), where, "claim"), cite,
                    kind, label, hypotheses, scales, _text(raw.get("notes"), where, "notes", required=False),
                    plugin, source)
    for scale in scales.values():
        _check_arms(preset, scale, where)
    return preset


def _check_arms(preset: Preset, scale: Scale, where: str) -> None:
    """Every hypothesis's norms are arms of every scale, and an interaction's key is swept there."""
    norms = scale.config["norms"]
    arms = normkit.split_specs(norms) if isinstance(norms, str) else list(norms)

    canonical = set()
    for arm in arms:
        try:
            canonical.add(normkit.parse(arm).text)
        except normkit.NormkitError as exc:
            raise _fail(f"{where} scales.{scale.name}", f"norm {arm!r}: {exc}") from None
    for h in preset.hypotheses:
        for spec in (h.norm, h.baseline):
            try:
                text = normkit.parse(spec).text
            except normkit.NormkitError as exc:
                raise _fail(f"{where} ({h.name})", str(exc)) from None
            if text not in canonical:
                raise _fail(f"{where} ({h.name})", f"{spec!r} is not an arm of scale {scale.name} "
                                                   f"(norms: {', '.join(arms)})")
        sweep = scale.config.get("sweep") or {}
        if not isinstance(sweep, dict):
            raise _fail(f"{where} scales.{scale.name}", "sweep must be a mapping of key to values in a preset")
        if h.test in ("difference", "equivalence", "diagnostic") and set(h.cell) != set(sweep):
            raise _fail(f"{where} ({h.name})", f"scale {scale.name} sweeps {', '.join(sweep) or 'nothing'}; "
                                               f"give the hypothesis the cell it is read in, cell: {{...}} with "
                                               f"exactly those keys" if sweep else
                        f"scale {scale.name} sweeps nothing, so the hypothesis takes no cell")
        for key, value in h.cell.items():
            if value not in (sweep.get(key) or []):
                raise _fail(f"{where} ({h.name})", f"cell {key}={value} is not swept in scale {scale.name}")
        if h.test == "interaction":
            values = sweep.get(h.key)
            if not values or h.from_value not in values or h.to_value not in values:
                raise _fail(f"{where} ({h.name})", f"scale {scale.name} must sweep {h.key} over both "
                                                   f"{h.from_value} and {h.to_value}")


def read_preset(name: str, path: Any, plugin: str = "") -> Preset:
    """Read and check a preset file (a path, or an importlib.resources file of a plugin's package)."""
    if isinstance(path, (str, Path)):
        raw = safe_yaml.read(path, f"preset {name!r}")
    else:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read preset {name!r} ({path}): {exc}") from None
        raw = safe_yaml.loads(text, f"preset {name!r}")
    return parse_preset(name, raw, str(path), plugin)
