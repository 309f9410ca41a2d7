"""Plan, check and run one preset at one scale with the lab's own code paths.

`kind: compare` presets run exactly what `normkit compare` runs (config -> check -> store ->
run_compare), so their results directory is an ordinary one that `normkit report` reads; `kind:
random-net` presets run the proxy-norm paper's random-net experiment (`normkit diagnose
--random-net`). Either way the outcomes of the hypotheses are written to reproduction.json and shown
beside the claim at the top of report.html.
"""

from __future__ import annotations

import html
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import normkit
from normkit_lab.analysis.report_html import PAGE_STYLE
from normkit_lab.errors import ConfigError, DatasetMissing
from normkit_lab.reproduce.outcomes import Outcome, judge_compare, judge_random_net
from normkit_lab.reproduce.preset import Preset, Scale
from normkit_lab.spec import DEFAULT_SEEDS
from normkit_lab.store.results import atomic_write_text, json_text, new_results_dir
from normkit_lab.study import config as lab_config

REPRODUCTION_JSON = "reproduction.json"
RANDOM_NET_JSON = "random_net.json"  # per_net: {norm: [net (seed 0, 1, ...): [depth: power shares]]}
REPORT_HTML = "report.html"
RANDOM_NET_DEFAULTS = {"depth": 20, "width": 24, "batch": 16, "image_size": 16, "seeds": 3}


@dataclass
class Plan:
    """What a preset runs at one scale: the comparison config (or random-net settings) and its cost."""

    preset: Preset
    scale: Scale
    config: Any  # CompareConfig for kind compare, a dict of random-net settings otherwise
    runs: int
    seeds: int
    expected_s: float | None
    lines: list[str] = field(default_factory=list)
    cost: str = ""


def _seeds_of(values: dict[str, Any]) -> int:
    return len(lab_config.parse_seeds(values.get("seeds", len(DEFAULT_SEEDS))))


def plan(preset: Preset, scale_name: str = "cpu", seeds: str | int | None = None,
         overrides: dict[str, Any] | None = None) -> Plan:
    """The preset's runs at `scale_name`, with `seeds` (a count, list or range) replacing the preset's
    and `overrides` (runtime keys such as data_dir, device) applied; nothing runs or loads data."""
    scale = preset.scale(scale_name)
    values = dict(scale.config)
    preset_seeds = _seeds_of(values) if preset.kind == "compare" else int(values.get("seeds", 3))
    if preset.kind == "compare":
        if seeds is not None:
            values["seeds"] = seeds
        values.update(overrides or {})
        cfg = lab_config.build_config(lab_config.normalize_keys(values, f"preset {preset.name!r}"))
        from normkit_lab.study.plan import run_count

        n_tune, n_compare = run_count(cfg)
        n_seeds = len(cfg.seeds)
        runs = n_tune + n_compare
        what = (f"{cfg.train.model} on {cfg.train.dataset}, norms {', '.join(cfg.norms)}, {n_seeds} seeds, "
                f"{_length(cfg.train)}" + (f", tune {_grid(cfg.tune)}" if cfg.tune else "")
                + (f", sweep {_grid(cfg.sweep)}" if cfg.sweep else "")
                + (f": {n_tune} tuning + {n_compare} comparison runs" if n_tune else f": {n_compare} runs"))
        config: Any = cfg
    else:
        if overrides:
            raise ConfigError(f"preset {preset.name!r} builds random nets; --data-dir and --device do not apply")
        config = {**RANDOM_NET_DEFAULTS, **values}
        config["norms"] = (normkit.split_specs(values["norms"]) if isinstance(values["norms"], str)
                           else list(values["norms"]))
        if seeds is not None:
            config["seeds"] = _seeds_of({"seeds": seeds})
        n_seeds = int(config["seeds"])
        runs = len(config["norms"]) * n_seeds
        what = (f"random conv nets, depth {config['depth']}, width {config['width']}, batch {config['batch']}, "
                f"norms {', '.join(config['norms'])}, {n_seeds} nets each: {runs} forward passes, no training")
    expected = None if scale.expected_runtime_s is None else scale.expected_runtime_s * n_seeds / max(1, preset_seeds)
    cost = (scale.expected_runtime if scale.expected_runtime and expected is None
            else "unknown" if expected is None else _duration(expected))
    cost += f" ({scale.machine})" if scale.machine else ""
    lines = [f"{preset.name} ({preset.labels}, from plugin {preset.plugin or '?'}): {preset.title}",
             f"claim: {preset.claim}", f"source: {preset.cite}",
             f"scale {scale.name}: {what}", f"expected runtime: {cost}",
             "hypotheses (fixed before the run):"]
    lines += [f"  {h.name} [{h.test}, {h.label}]: {h.describe()}" for h in preset.hypotheses]
    return Plan(preset, scale, config, runs, n_seeds, expected, lines, cost)


def _length(train: Any) -> str:
    """How long each run trains: `3 epochs`, or a budget's `576 steps` (the same in every cell)."""
    unit, amount = train.budget_unit
    return f"{amount} {unit}" + (" in every cell" if train.budget is not None else "")


def _grid(grid: dict[str, list[Any]]) -> str:
    return "; ".join(f"{k}={','.join(map(str, v))}" for k, v in grid.items())


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"about {seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"about {seconds / 60:.0f} min"
    return f"about {seconds / 3600:.0f} h"


def dry_run(p: Plan, emit: Callable[[str], None] | None = None) -> list[str]:
    """Check what a run needs without training: the config (already built), the model and norms (built on
    the meta device), the dataset on disk and the device. Each report line goes to `emit` as soon as it
    is known (and is returned); anything that would stop the run raises a one-line error
    (DatasetMissing, ConfigError, SpecError) after the lines before it were emitted."""
    lines: list[str] = []

    def say(line: str) -> None:
        lines.append(line)
        if emit is not None:
            emit(line)

    say("dry run (nothing is trained):")
    say("  config: valid")
    if p.preset.kind != "compare":
        from normkit_lab.diagnostics import random_net

        c = p.config
        random_net.check_settings(c["norms"], depth=c["depth"], width=c["width"], batch=c["batch"],
                                  image_size=c["image_size"], seeds=c["seeds"])
        say("  norms: every one builds in the random net")
        say("  dataset: none (Gaussian inputs)")
        return lines
    import torch

    from normkit_lab.datasets import load_dataset
    from normkit_lab.runs.checks import check_config

    train = p.config.train
    wanted = str(p.scale.requires.get("device") or train.device)
    if wanted.startswith("cuda") and not torch.cuda.is_available():
        say(f"  device: the preset needs {wanted}; CUDA is not available on this machine, so run it where it is "
            f"(or pass --device cpu to try it here, far slower)")
        train = _on_cpu(train)
    else:
        say(f"  device: {wanted}")
    where = train.data_dir or "(the default data folder)"
    try:
        start = time.perf_counter()
        data = load_dataset(train.dataset, data_dir=train.data_dir, download=False, seed=0, **train.dataset_params)
    except DatasetMissing as exc:
        raise DatasetMissing(f"dry run: {exc}") from None
    say(f"  dataset: {train.dataset} found under {where}: {len(data.train):,} train, {len(data.val):,} val, "
        f"{len(data.test) if data.test is not None else 0:,} test items ({time.perf_counter() - start:.1f} s to read)")
    check_config(train, list(p.config.norms))
    say(f"  model: {train.model} builds with every norm ({', '.join(p.config.norms)})")
    say(f"  cost: {p.runs} runs x {_length(train).removesuffix(' in every cell')}; {p.cost}")
    return lines


def _on_cpu(train: Any) -> Any:
    """The training config with CPU settings, for checks on a machine without the preset's GPU."""
    import dataclasses

    return dataclasses.replace(train, device="cpu", amp=False, channels_last=False, nproc_per_node=1)


@dataclass
class Reproduction:
    """A finished preset run: where it wrote, its outcomes and (compare) the lab's Results."""

    path: Path
    outcomes: list[Outcome]
    seconds: float
    results: Any = None
    store: Any = None
    table: str = ""


def run(p: Plan, out: str | Path | None = None, progress: Any = None,
        on_tuned: Callable[[list[dict[str, Any]]], None] | None = None) -> Reproduction:
    """Run the plan (compare or random net) and judge the hypotheses; `on_tuned` gets the tuning table of
    a preset that tunes (as `normkit compare` prints it)."""
    start = time.perf_counter()
    if p.preset.kind == "compare":
        rep = _run_compare(p, out, progress, on_tuned)
    else:
        rep = _run_random_net(p, out)
    rep.seconds = time.perf_counter() - start
    return rep


def _run_compare(p: Plan, out: str | Path | None, progress: Any,
                 on_tuned: Callable[[list[dict[str, Any]]], None] | None) -> Reproduction:
    from normkit_lab.analysis.summary import runs_from_rows
    from normkit_lab.runs import environment
    from normkit_lab.store.results import ResultsDir
    from normkit_lab.study.compare import check, run_compare

    cfg = p.config
    check(cfg)
    store = ResultsDir.create(out, lab_config.save_yaml(cfg), environment.environment(cfg.train.device),
                              kind="reproduce")
    results = run_compare(cfg, store, progress=progress, on_tuned=on_tuned)
    views = [r for r in runs_from_rows(store.rows()) if r.phase == "compare"]
    outcomes = judge_compare(p.preset.hypotheses, views, cfg.norms, cfg.select)
    return Reproduction(store.path, outcomes, 0.0, results=results, store=store)


def _run_random_net(p: Plan, out: str | Path | None) -> Reproduction:
    from normkit_lab.diagnostics import random_net
    from normkit_lab.diagnostics.tables import random_net_table

    c = p.config
    settings = {k: c[k] for k in ("depth", "width", "batch", "image_size", "seeds")}
    runs = random_net.random_net_runs(c["norms"], **settings)
    outcomes = judge_random_net(p.preset.hypotheses, runs)
    path = new_results_dir(out, kind="reproduce")
    mean, spread = random_net.mean_over_nets(runs), random_net.spread_over_nets(runs)
    atomic_write_text(path / RANDOM_NET_JSON, json_text({"settings": {**settings, "norms": c["norms"]},
                                                         "norms": mean, "dataset_share_spread": spread,
                                                         "per_net": runs}))
    table = random_net_table(mean, every=max(1, c["depth"] // 8), spread=spread)
    atomic_write_text(path / REPORT_HTML, _page(p, f"<h2>Dataset-scale power share per depth</h2><pre>"
                                                   f"{html.escape(table)}</pre>"))
    return Reproduction(path, outcomes, 0.0, table=table)


def _page(p: Plan, body: str) -> str:
    title = html.escape(f"normkit reproduce {p.preset.name}")
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{title}</title>'
            f"<style>{PAGE_STYLE}</style></head><body>\n"
            f"<h1>{title}</h1>\n{body}\n</body></html>\n")


def claim_section(p: Plan, outcomes: list[Outcome], seconds: float) -> str:
    """The HTML block that puts the claim, its source and each hypothesis's outcome side by side."""
    e = html.escape
    rows = "".join(f'<tr><td class="l">{e(o.hypothesis.name)}</td><td class="l">{e(o.hypothesis.label)}</td>'
                   f'<td class="l">{e(o.hypothesis.test)}</td>'
                   f'<td class="wrap">{e(o.hypothesis.describe())}</td><td class="l"><b>{e(o.word)}</b></td>'
                   f'<td class="wrap">{e(o.observed)}'
                   f"{e('; ' + o.planning() if o.planning() else '')}</td></tr>"
                   for o in outcomes)
    return (f'<section id="reproduction"><h2>Reproduction: {e(p.preset.title)}</h2>'
            f"<p><b>Claim</b> ({e(p.preset.labels)}): {e(p.preset.claim)}</p>"
            f"<p><b>Source</b>: {e(p.preset.cite)}</p>"
            f"<p><b>Scale</b>: {e(p.scale.name)}, {p.seeds} seeds, {seconds:.0f} s here.</p>"
            '<table><tr><th class="l">hypothesis</th><th class="l">label</th><th class="l">test</th>'
            '<th class="l">prediction (fixed before the run)</th><th class="l">outcome</th>'
            f'<th class="l">result</th></tr>{rows}</table></section>')


def write_reproduction(rep: Reproduction, p: Plan, command: str = "") -> list[Path]:
    """reproduction.json, and the claim beside the outcomes at the top of report.html."""
    data = {"preset": p.preset.name, "plugin": p.preset.plugin, "label": p.preset.labels, "title": p.preset.title,
            "claim": p.preset.claim, "citation": p.preset.citation, "scale": p.scale.name, "seeds": p.seeds,
            "seconds": None if not math.isfinite(rep.seconds) else round(rep.seconds, 1), "command": command,
            "hypotheses": [o.as_dict() for o in rep.outcomes]}
    atomic_write_text(rep.path / REPRODUCTION_JSON, json_text(data))
    page_path = rep.path / REPORT_HTML
    page = page_path.read_text(encoding="utf-8") if page_path.is_file() else _page(p, "")
    section = claim_section(p, rep.outcomes, rep.seconds)
    marker = "</h1>"
    at = page.find(marker)
    page = page[:at + len(marker)] + "\n" + section + page[at + len(marker):] if at >= 0 else page + section
    atomic_write_text(page_path, page)
    return [rep.path / REPRODUCTION_JSON, page_path]
