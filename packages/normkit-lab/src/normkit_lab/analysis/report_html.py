"""report.html: one self-contained page with a comparison's verdicts, table, figures and provenance.

Self-contained means no external file or network access: the figures are embedded as base64 PNG and
the style is inline, so the file can be mailed or attached as it is. Every piece of text that comes
from results, configs or the environment goes through html.escape.
"""

from __future__ import annotations

import base64
import html
import json
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from normkit_lab.analysis.caption import plural
from normkit_lab.analysis.metric_family import family_caption
from normkit_lab.analysis.summary import NormSummary, Summary, cell_key, cell_label, interval_text
from normkit_lab.analysis.tuning import score_label, tuned_norms
from normkit_lab.analysis.verdicts import BASELINE, LOOK_P, Verdict, p_column, reading

# Shared by every normkit page (report.html, the random-net reproduction page).
PAGE_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; padding: 0 1.5em; max-width: 1400px; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 1.6em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; font-size: 0.85em; }
th, td { padding: 3px 8px; text-align: right; } td { white-space: nowrap; }
th { background: #f0f0f0; vertical-align: bottom; } td.l, th.l { text-align: left; } th.long { min-width: 7.5em; }
td.wrap { white-space: normal; text-align: left; min-width: 14em; } tr:nth-child(even) td { background: #fafafa; }
.v-better { color: #1a7f37; font-weight: bold; } .v-worse { color: #cf222e; font-weight: bold; }
.v-equivalent { color: #0550ae; font-weight: bold; } .v-inconclusive, .v-no { color: #7a6a00; }
.note { background: #fff8c5; padding: 6px 10px; border-left: 4px solid #d4a72c; }
.caption { max-width: 62em; color: #333; font-size: 0.95em; }
pre { background: #f6f8fa; padding: 8px; overflow-x: auto; font-size: 0.8em; }
img { max-width: 100%; display: block; margin: 1em 0; } .wide { overflow-x: auto; }
"""
LONG_HEAD = 20  # characters: a header longer than this gets a column at least 7.5em wide


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _num(value: float | None, fmt: str, signed: bool = False) -> str:
    if value is None:
        return "-"
    return format(value, ("+" if signed else "") + fmt)


def _p(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def _verdict_class(verdict: str) -> str:
    return "v-" + verdict.split()[0]


def _name(s: NormSummary, many: bool) -> str:
    return f"{s.norm} [{cell_label(s.cell)}]" if many and s.cell else s.norm


def _head(heads: Sequence[Any], left: Sequence[str]) -> str:
    """A table's header row; the columns named in `left` are left-aligned, a long header (one that says
    what its column counts) wraps in a column wide enough to read it."""
    def cls(h: Any) -> str:
        return " ".join(c for c in ("l" if h in left else "", "long" if len(str(h)) > LONG_HEAD else "") if c)

    return "<tr>" + "".join(f'<th class="{cls(h)}">{_e(h)}</th>' for h in heads) + "</tr>"


def _tuned_keys(summary: Summary) -> list[str]:
    return list(dict.fromkeys(k for s in summary.rows for k in s.tuned))


def _tuned_text(tuned: Mapping[str, Any], keys: list[str]) -> str:
    if not tuned:
        return "-"
    return str(tuned[keys[0]]) if len(keys) == 1 else ", ".join(f"{k}={v}" for k, v in tuned.items())


def _table(summary: Summary, many: bool) -> str:
    unit, m = summary.metric.unit, f"±{summary.margin:g} {summary.metric.unit}".rstrip()
    keys = _tuned_keys(summary)
    tuned_head = ([f"tuned {keys[0]} (chosen on validation)" if len(keys) == 1 else "tuned (chosen on validation)"]
                  if keys else [])
    sequential = p_column(s.verdict for s in summary.rows) == LOOK_P
    p_heads = ([LOOK_P, "TOST look p (α spent) (equivalence)"] if sequential
               else ["Holm p", "TOST Holm p (equivalence)"])
    heads = ["norm", *tuned_head, "seeds (n)", f"{summary.label} ({unit}) ± s.e.", f"Δ vs {summary.baseline}",
             "adjusted CI of Δ (Holm, looks)", "p", *p_heads, "verdict",
             f"MDE ({unit}): smallest Δ these seeds detect", f"seeds to detect a Δ of the margin ({m})",
             f"seeds to show equivalence within {m}", "steps", "s/epoch", "CPU s/epoch", "samples/s", "peak MB",
             "params", "diverged", "failed"]
    out = ['<div class="wide"><table>' + _head(heads, ("norm", *tuned_head, "verdict"))]
    for s in summary.rows:
        d, v = s.vs_baseline, s.verdict
        mean = "-" if s.primary.mean is None else (
            f"{s.primary.mean:.2f} ± {s.primary.sem:.2f}" if s.primary.sem is not None else f"{s.primary.mean:.2f}")
        ci = "" if d is None else interval_text(*(s.interval or (None, None)), missing=d.note)
        verdict = v.verdict if v else BASELINE
        needed = "" if v is None else (str(v.seeds_needed) if v.seeds_needed is not None else v.seeds_note)
        cells = [_name(s, many), *([_tuned_text(s.tuned, keys)] if keys else []), str(s.primary.n), mean,
                 "baseline" if d is None else _num(d.mean, ".2f", True),
                 ci, _p(d.p_value if d else None), *_decision_ps(v, sequential), verdict,
                 _num(v.mde if v else None, ".3g"), needed,
                 "" if v is None or v.seeds_equivalence is None else str(v.seeds_equivalence),
                 _num(s.steps, ","), _num(s.time_per_epoch_s, ".2f"), _num(s.cpu_time_per_epoch_s, ".2f"),
                 _num(s.throughput, ",.0f"), _num(s.peak_mem_mb, ",.0f"),
                 _num(s.params, ","), str(s.diverged), str(s.failed)]
        tds = []
        for head, cell in zip(heads, cells, strict=True):
            cls = "l" if head == "norm" or head in tuned_head else ""
            if head == "verdict":
                cls = f"l {_verdict_class(cell)}"
            tds.append(f'<td class="{cls}">{_e(cell)}</td>')
        out.append("<tr>" + "".join(tds) + "</tr>")
    out.append("</table></div>")
    return "\n".join(out)


def _decision_ps(v: Verdict | None, sequential: bool) -> list[str]:
    """The difference and equivalence tests' p the verdicts are decided on: Holm p-values of fixed seeds; the
    look's p and the alpha it spent, in brackets, with sequential seeds (the CLI table's p column, see
    normkit_lab.analysis.verdicts.decision_p, shows the one the verdict rests on)."""
    if v is None:
        return ["", ""]
    if not sequential:
        return [_p(v.p_holm), _p(v.p_tost_holm)]
    pairs = ((v.look_p, v.look_alpha), (v.look_tost_p, v.look_tost_alpha))
    return ["" if p is None or a is None else f"{p:.3g} ({a:.3g})" for p, a in pairs]


def _tuning(table: Sequence[Mapping[str, Any]]) -> str:
    """--tune: per (cell, norm) every value tried with its validation score, the choice in bold, and a
    warning where the choice is the smallest or largest value of its grid."""
    if not table:
        return ""
    tuned = tuned_norms(table)
    many = len({cell_key(t.cell) for t in tuned}) > 1
    candidates = list(dict.fromkeys(json.dumps(c.values, sort_keys=True, default=str) for t in tuned
                                    for c in t.candidates))
    labels = [", ".join(f"{k}={v}" for k, v in json.loads(c).items()) for c in candidates]
    seeds = table[0].get("seeds") or []
    out = ["<h2>Tuning</h2>",
           f"<p>Before the comparison, each norm ran every value below on {len(seeds)} tuning seed"
           f"{'' if len(seeds) == 1 else 's'} ({_e(', '.join(map(str, seeds)))}), disjoint from the comparison "
           f"seeds; the value with the best {_e(score_label(table))} (bold) is the one its comparison runs used. "
           f"Only the validation split is read here, never test. A choice at the smallest or largest value tried "
           f"may be limited by the grid, not by the norm: the best value may lie beyond it.</p>",
           '<div class="wide"><table>' + _head([*(["cell"] if many else []), "norm", *labels, "chosen",
                                                 "edge of the grid?"], ("cell", "norm", "chosen", "edge of the grid?"))]
    for t in tuned:
        by_label = {json.dumps(c.values, sort_keys=True, default=str): c for c in t.candidates}
        tds = [*([f'<td class="l">{_e(cell_label(t.cell) or "-")}</td>'] if many else []),
               f'<td class="l">{_e(t.norm)}</td>']
        for key in candidates:
            c = by_label.get(key)
            text = "" if c is None else ("failed or diverged" if c.score is None else f"{c.score:.4g}")
            tds.append(f"<td><b>{_e(text)}</b></td>" if c is not None and c.chosen else f"<td>{_e(text)}</td>")
        tds.append(f'<td class="l">{_e(", ".join(f"{k}={v}" for k, v in t.chosen.items()))}</td>')
        edge = t.edge_text()
        tds.append(f'<td class="l v-inconclusive">{_e(edge)}</td>' if edge else '<td class="l">no</td>')
        out.append("<tr>" + "".join(tds) + "</tr>")
    out.append("</table></div>")
    return "\n".join(out)


def _readings(summary: Summary, many: bool) -> str:
    items = []
    for s in summary.rows:
        if s.verdict is None:
            continue
        text = reading(s.verdict, _name(s, many), summary.baseline, summary.label, summary.metric.unit, s.interval)
        items.append(f'<li><span class="{_verdict_class(s.verdict.verdict)}">{_e(s.verdict.verdict)}</span>: '
                     f"{_e(text)}</li>")
    if not items:
        return "<p>Only the baseline was run: there is nothing to compare.</p>"
    return "<ul>\n" + "\n".join(items) + "\n</ul>"


def _how_to_read(summary: Summary) -> str:
    m = summary.metric
    direction = "higher" if m.higher_is_better else "lower"
    return (
        f"<p>Primary metric: <b>{_e(summary.label)}</b> ({_e(m.unit)}, {direction} is better), read from the "
        f"<code>{_e(summary.source)}</code> field at the <b>{_e(summary.select)}</b> epoch of every finished "
        f"run. Δ is norm minus {_e(summary.baseline)} on the same seed, averaged over seeds where both "
        f"finished, with its adjusted interval: the t interval at the Holm level the comparison was last tested "
        f"at (and, with sequential seeds, at the alpha its look spent), the interval the verdict is decided on, "
        f"so it excludes 0 exactly when a difference is shown (summary.csv also has the unadjusted 95% "
        f"interval). With sequential seeds (<code>--seeds auto</code>) p-values are not Holm-adjusted: the "
        f"looks decide, see docs/experiments.md. Verdicts: Holm-adjusted paired t-test p &lt; 0.05 gives "
        f"<i>better</i> or <i>worse</i>; otherwise a Holm-adjusted two one-sided test (TOST) against the "
        f"margin ±{summary.margin:g} {_e(m.unit)} gives <i>equivalent</i>; otherwise <i>inconclusive</i>. "
        f"A significant difference whose whole adjusted interval lies inside the margin is marked "
        f"<i>(within margin)</i>. When every seed gives the same difference the exact sign test replaces "
        f"the t-test. Planning numbers use the level of the strictest Holm step, alpha / m (Bonferroni, m = "
        f"the number of comparisons): MDE is the difference this number of seeds detects with 80% power; "
        f"<i>seeds to detect</i> is the number of seeds whose MDE reaches the margin, and <i>seeds for "
        f"equivalence</i> the number whose TOST shows equivalence with 80% power if the true difference is 0 "
        f"(both from the observed spread of the differences). Fewer than 3 paired seeds give no verdict.</p>")


def _interactions(summary: Summary) -> str:
    """Sweeps: the interaction tests (does a norm's gap to the baseline depend on the swept key?)."""
    if not summary.interactions:
        return ""
    heads = ["norm", "key", "from", "to", "n", "Δ gap (to − from)", "Holm-adjusted CI", "p", "Holm p", "TOST Holm p",
             "verdict"]
    out = ["<h2>Interactions</h2>",
           f"<p>For every norm and every pair of cells that differ in one swept key, the per-seed difference "
           f"of its gaps to {_e(summary.baseline)} (gap at <i>to</i> minus gap at <i>from</i>; + means the "
           f"norm gains on the baseline), with a t interval at its Holm step's level (it excludes 0 exactly when a "
           f"dependence is shown) and paired t-test, Holm-adjusted over all "
           f"{len(summary.interactions)} interaction tests. <i>depends on KEY</i>: Holm p &lt; 0.05; <i>same "
           f"gap (within margin)</i>: TOST shows the gaps differ by less than ±{summary.margin:g} "
           f"{_e(summary.metric.unit)}; otherwise <i>no evidence that it depends</i>, which is not evidence "
           f"that it does not.</p>",
           '<div class="wide"><table>' + _head(heads, ("norm", "key", "verdict"))]
    for i in summary.interactions:
        t = i.test
        ci = interval_text(t.low, t.high)
        cells = [i.norm, i.key, i.cell_a[i.key], i.cell_b[i.key], t.n, _num(i.mean, ".2f", True), ci, _p(t.p),
                 _p(t.p_holm), _p(t.p_tost_holm), i.verdict]
        cls = "v-worse" if i.verdict.startswith("depends") else "v-equivalent" if i.verdict.startswith(
            "same") else "v-inconclusive"
        tds = [f'<td class="{"l" if k in (0, 1) else ""}">{_e(c)}</td>' for k, c in enumerate(cells[:-1])]
        tds.append(f'<td class="l {cls}">{_e(cells[-1])}</td>')
        out.append("<tr>" + "".join(tds) + "</tr>")
    out.append("</table></div>")
    return "\n".join(out)


def _per_seed(summary: Summary, many: bool) -> str:
    """Every seed's primary metric per norm, and its difference to the baseline on the same seed:
    the numbers the paired verdicts are computed from."""
    seeds = sorted({seed for s in summary.rows for seed in s.values})
    if not seeds:
        return ""
    unit = _e(summary.metric.unit)
    base = {cell_key(s.cell): s.values for s in summary.rows if s.norm == summary.baseline}
    heads = ["norm", *(f"seed {seed}" for seed in seeds)]
    out = ["<h2>Per seed</h2>",
           f"<p>{_e(summary.label.capitalize())} ({unit}) of every finished run, and below it the difference "
           f"to {_e(summary.baseline)} on the same seed and cell (the pairs behind the verdicts); an empty cell "
           f"is a run that did not finish.</p>",
           '<div class="wide"><table>' + _head(heads, ("norm",))]
    for s in summary.rows:
        values = [_num(s.values.get(seed), ".2f") if seed in s.values else "" for seed in seeds]
        out.append(f'<tr><td class="l">{_e(_name(s, many))}</td>'
                   + "".join(f"<td>{_e(v)}</td>" for v in values) + "</tr>")
        paired = base.get(cell_key(s.cell), {})
        if s.norm != summary.baseline and paired:
            deltas = [_num(s.values[seed] - paired[seed], ".2f", True) if seed in s.values and seed in paired
                      else "" for seed in seeds]
            out.append(f'<tr><td class="l">  Δ vs {_e(summary.baseline)}</td>'
                       + "".join(f"<td>{_e(d)}</td>" for d in deltas) + "</tr>")
    out.append("</table></div>")
    return "\n".join(out)


def _diagnostics(summary: Summary) -> str:
    """--diagnostics: verdicts for the representation measures (see diagnostic_verdicts.py)."""
    from normkit_lab.analysis.diagnostic_verdicts import MEANING

    if not summary.diagnostics:
        return ""
    many = len({cell_key(d.cell) for d in summary.diagnostics}) > 1
    heads = ["norm", "measure", "n", summary.baseline, "norm value", "Δ (norm − baseline)", "Holm-adjusted CI", "p",
             "Holm p", "verdict"]
    meaning = "; ".join(f"{k}: {v}" for k, v in MEANING.items())
    out = ["<h2>Representation measures</h2>",
           f"<p>Each measure of each norm minus the same measure of {_e(summary.baseline)} on the same seed, "
           f"with a paired t-test (exact sign test when every seed gives the same difference), Holm-adjusted "
           f"within its family (every depth of qq_r2 is one family; zeta one; lambda one), and the t interval "
           f"at the Holm level it was tested at, which excludes 0 exactly when the verdict is higher or lower. "
           f"<i>higher</i>/<i>lower</i>: Holm p &lt; 0.05. ({_e(meaning)}.) The per-norm means "
           f"and figures are in diagnostics.md.</p>",
           '<div class="wide"><table>' + _head(heads, ("norm", "measure", "verdict"))]
    for d in summary.diagnostics:
        name = f"{d.norm} [{cell_label(d.cell)}]" if many and d.cell else d.norm
        ci = interval_text(d.adj_low, d.adj_high, ".3g")
        cells = [name, d.measure, d.n, _num(d.baseline_mean, ".4g"), _num(d.norm_mean, ".4g"),
                 _num(d.diff, ".3g", True), ci, _p(d.p), _p(d.p_holm)]
        tds = [f'<td class="{"l" if k in (0, 1) else ""}">{_e(c)}</td>' for k, c in enumerate(cells)]
        cls = "v-equivalent" if d.verdict in ("higher", "lower") else "v-inconclusive"
        tds.append(f'<td class="l {cls}">{_e(d.verdict)}</td>')
        out.append("<tr>" + "".join(tds) + "</tr>")
    out.append("</table></div>")
    return "\n".join(out)


def _ranking(summary: Summary) -> str:
    """--all-pairs: every pair of norms and the ranking (see pairs.py)."""
    if not summary.ranks:
        return ""
    many = len({cell_key(r.cell) for r in summary.ranks}) > 1
    out = ["<h2>All pairs and ranking</h2>",
           f"<p>Every pair of norms in a cell, paired by seed (Δ = norm − vs), with the verdict rule above "
           f"Holm-adjusted over all {len(summary.pairs)} pairs. Rank: significant wins minus losses, then the "
           f"mean.</p>", "<table>" + _head([*(["cell"] if many else []), "rank", "norm", summary.label, "wins",
                                             "losses", "equivalent"], ("cell", "norm"))]
    for r in summary.ranks:
        cells = [*([cell_label(r.cell) or "-"] if many else []), r.rank, r.norm, _num(r.mean, ".2f"), r.wins,
                 r.losses, r.equivalent]
        out.append("<tr>" + "".join(f'<td class="{"l" if i == len(cells) - 5 else ""}">{_e(c)}</td>'
                                    for i, c in enumerate(cells)) + "</tr>")
    out.append("</table>")
    heads = ["norm", "vs", "n", "Δ", "Holm-adjusted CI", "p", "Holm p", "TOST Holm p", "verdict"]
    out.append('<div class="wide"><table>' + _head(heads, ("norm", "vs", "verdict")))
    for p in summary.pairs:
        d, v = p.diff, p.verdict
        ci = interval_text(*(p.interval or (None, None)), missing=d.note)
        name = f"{p.norm} [{cell_label(p.cell)}]" if many and p.cell else p.norm
        cells = [name, p.other, d.n, _num(d.mean, ".2f", True), ci, _p(v.p), _p(v.p_holm), _p(v.p_tost_holm)]
        tds = [f'<td class="{"l" if i < 2 else ""}">{_e(c)}</td>' for i, c in enumerate(cells)]
        tds.append(f'<td class="l {_verdict_class(v.verdict)}">{_e(v.verdict)}</td>')
        out.append("<tr>" + "".join(tds) + "</tr>")
    out.append("</table></div>")
    return "\n".join(out)


def _metric_section(summary: Summary, many: bool) -> str:
    """A further metric of the same runs: its verdicts and table (its own unit, margin and direction)."""
    m = summary.metric
    return "\n".join([
        f"<h2>Also read: {_e(summary.label)}</h2>",
        f"<p>{_e(summary.label.capitalize())} ({_e(m.unit or 'as reported')}, "
        f"{'higher' if m.higher_is_better else 'lower'} is better), from the <code>{_e(summary.source)}</code> "
        f"field at the {_e(summary.select)} epoch of the same runs, paired by seed against {_e(summary.baseline)}, "
        f"equivalence margin ±{summary.margin:g} {_e(m.unit)}; verdicts by the rule above, in one Holm family "
        f"with the first metric's.</p>",
        _readings(summary, many), _table(summary, many)])


def _ablations(summary: Summary) -> str:
    """--ablate: per norm and declared stage, what switching the stage off changes and the gap left
    without it, then the sentence `normkit report` prints on whether the stage carries the difference."""
    from normkit_lab.analysis.ablations import attribution, family_size

    tests = summary.ablations
    if not tests:
        return ""
    many = len({cell_key(t.cell) for t in tests}) > 1
    unit = summary.metric.unit
    heads = ["norm", *(["cell"] if many else []), "stage off", "n", f"change ({unit})", "Holm-adjusted CI", "Holm p",
             "the stage", f"arm vs {summary.baseline}", "verdict"]
    out = ["<h2>Stage ablations</h2>",
           f"<p>For every norm and every stage its plugin declared, the arm that switches the stage off, paired by "
           f"seed: <i>change</i> is arm minus norm (what switching the stage off changes), <i>arm vs "
           f"{_e(summary.baseline)}</i> the gap left without the stage. Both are tested like the comparison, "
           f"Holm-adjusted over the ablations' {plural(family_size(tests), 'test')} as a family of their own, "
           f"apart from the verdicts above; the interval shown is the change's at its Holm level, so it "
           f"excludes 0 exactly when the stage is shown to help or hurt. A stage carries a norm's difference "
           f"when the norm differs from "
           f"{_e(summary.baseline)} and switching the stage off moves it significantly back.</p>",
           '<div class="wide"><table>' + _head(heads, ("norm", "cell", "stage off", "the stage", "verdict"))]
    for t in tests:
        e, w = t.effect, t.without  # effect is norm - arm: the table shows arm - norm, as normkit report does
        change = None if e.mean is None else 0.0 - e.mean
        interval = "" if t.change_adjusted is None else interval_text(*t.change_adjusted)
        cells = [t.ablation.norm, *([cell_label(t.cell) or "-"] if many else []),
                 f"{t.ablation.stage}: {t.ablation.arm}", e.n, _num(change, ".2f", True), interval,
                 _p(t.effect_test.p_holm), t.role, _num(w.mean if w else None, ".2f", True)]
        tds = [f'<td class="{"l" if h in ("norm", "cell", "stage off", "the stage") else ""}">{_e(c)}</td>'
               for h, c in zip(heads[:-1], cells, strict=True)]
        verdict = t.without_test.verdict if t.without_test else ""
        tds.append(f'<td class="l {_verdict_class(verdict) if verdict else ""}">{_e(verdict)}</td>')
        out.append("<tr>" + "".join(tds) + "</tr>")
    out.append("</table></div>")
    gaps = {(s.norm, cell_key(s.cell)): s.verdict for s in summary.rows}
    lines = [(f"[{cell_label(t.cell)}] " if t.cell else "")
             + attribution(t, gaps.get((t.ablation.norm, cell_key(t.cell))), summary.baseline, unit) for t in tests]
    out.append("<ul>\n" + "\n".join(f"<li>{_e(line)}</li>" for line in lines) + "\n</ul>")
    return "\n".join(out)


def _machine(environment: Any) -> str:
    """One line naming the machine: the device, and every CPU field environment.json records (model,
    family, instruction set, cores), so two CPUs with the same marketing name are told apart; older
    directories record only the model name, and the line says so."""
    env = environment if isinstance(environment, Mapping) else {}
    if "merged_from" in env and isinstance(env["merged_from"], Mapping):
        return "".join(_machine(e) for e in env["merged_from"].values())
    cpu = {k: v for k, v in env.items() if k.startswith("cpu") and v not in (None, "", [], {})}
    if not cpu and "device" not in env:
        return _load(env)
    parts = [f"device {env['device']}"] if env.get("device") else []
    parts += [f"{k.replace('_', ' ')} {', '.join(map(str, v)) if isinstance(v, list) else v}" for k, v in cpu.items()]
    isa = env.get("vector_isa")
    recorded_isa = isinstance(isa, Mapping) and bool(isa.get("cpu") or isa.get("torch"))
    if recorded_isa:
        parts.append(f"vector instructions {isa.get('cpu') or 'unknown'} (torch's kernels use "
                     f"{isa.get('torch') or 'unknown'})")
    if cpu and set(cpu) <= {"cpu", "cpu_count"} and not recorded_isa:
        parts.append("(the CPU name as the operating system reports it; these results record no model number or "
                     "instruction set)")
    return f"<p>Machine: {_e('; '.join(parts))}</p>" + _load(env)


def _load(env: Mapping[str, Any]) -> str:
    """One line on how busy the machine was: torch threads per run, the cores runs could use, and the
    1-, 5- and 15-minute load averages when the runs started and when the directory's first session ended
    (wall times on a loaded machine are slower than CPU times say)."""
    def loads(key: str) -> str | None:
        values = env.get(key)
        if not isinstance(values, list) or not values or any(v is None for v in values):
            return None
        return ", ".join(f"{v:.2f}" for v in values)

    parts = []
    if env.get("threads_per_run") is not None:
        parts.append(f"{env['threads_per_run']} torch thread{'' if env['threads_per_run'] == 1 else 's'} per run")
    if env.get("usable_cores") is not None:
        parts.append(f"{env['usable_cores']} usable cores")
    for key, when in (("load_average_start", "when the runs started"),
                      ("load_average_end", "when the first session of runs ended")):
        text = loads(key)
        if text:
            parts.append(f"load average (1, 5, 15 min) {when} {text}")
    return f"<p>Load: {_e('; '.join(parts))}</p>" if parts else ""


def render_html(summary: Summary, *, title: str, figures: Mapping[str, bytes], config: Mapping[str, Any],
                command: str, environment: Any, sources: Sequence[str] = (), figures_note: str = "",
                tuning: Sequence[Mapping[str, Any]] = (), more: Sequence[Summary] = ()) -> str:
    """The whole page as a string (every interpolated text escaped). `more`: the summaries of further
    metrics read (`--metric a,b`), each with its verdicts and table after the first metric's."""
    many = len({cell_key(s.cell) for s in summary.rows}) > 1
    notes = list(summary.notes)
    for s in summary.rows:
        notes += [f"{_name(s, many)} failed on {err}" for err in s.errors]
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{_e(title)}</title><style>{PAGE_STYLE}</style></head><body>",
        f"<h1>{_e(title)}</h1>",
        *(f'<p class="note">{_e(n)}</p>' for n in notes),
        "<h2>Verdicts</h2>", _readings(summary, many), _how_to_read(summary),
        "<h2>Table</h2>", _table(summary, many),
        f'<p class="caption">{_e(family_caption(config, [summary, *more]))}</p>',
        *(_metric_section(other, many) for other in more),
        _tuning(tuning),
        _per_seed(summary, many),
        _interactions(summary),
        _diagnostics(summary),
        _ranking(summary),
        _ablations(summary),
        "<h2>Figures</h2>",
    ]
    if figures_note:
        parts.append(f"<p>{_e(figures_note)}</p>")
    for name, data in figures.items():
        encoded = base64.b64encode(data).decode("ascii")
        parts.append(f'<img alt="{_e(name)}" title="{_e(name)}" src="data:image/png;base64,{encoded}">')
    parts += [
        "<h2>Configuration</h2>", f"<pre>{_e(yaml.safe_dump(dict(config), sort_keys=False))}</pre>",
        "<h2>Command line</h2>", f"<pre>{_e(command)}</pre>",
    ]
    if sources:
        parts.append("<p>Results read from: " + ", ".join(f"<code>{_e(s)}</code>" for s in sources) + "</p>")
    parts += ["<h2>Environment</h2>", _machine(environment),
              f"<pre>{_e(json.dumps(environment, indent=2, default=str))}</pre>",
              "</body></html>", ""]
    return "\n".join(parts)
