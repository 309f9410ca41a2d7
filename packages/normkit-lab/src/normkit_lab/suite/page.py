"""The scorecard page (report.html) and its performance-profile figure (profile.png).

Self-contained like every normkit page: inline style, the figure embedded as base64 PNG, every text
from results or configs escaped. It reads only the scorecard mapping (scorecard.json).
"""

from __future__ import annotations

import base64
import html
from typing import Any
from urllib.parse import quote

from normkit_lab.analysis.caption import plural
from normkit_lab.analysis.plots import available as plots_available
from normkit_lab.analysis.report_html import PAGE_STYLE

PROFILE_PNG = "profile.png"
_STYLES = ("-", "--", ":", "-.", (0, (6, 1.5, 1, 1.5, 1, 1.5)), (0, (3, 3)))
_STYLE = PAGE_STYLE + """
.miss { color: #888; } .fail { color: #b00020; }
.ex { color: #888; font-style: italic; } .scope { color: #555; font-size: 0.9em; }
"""


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _num(value: float | None, fmt: str, signed: bool = False) -> str:
    return "-" if value is None else format(value, ("+" if signed else "") + fmt)


def profile_png(card: dict[str, Any]) -> bytes | None:
    """The performance profiles of the visible workloads (and of the held-out variants beside them), or
    None without matplotlib or without anything scored."""
    parts = [(title, card[key]) for key, title in (("visible", "visible workloads"), ("held_out", "held-out variants"))
             if card.get(key)]
    if not parts or not plots_available():
        return None
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(parts), figsize=(7.4 * len(parts), 4.2), squeeze=False)
    for ax, (title, agg) in zip(axes[0], parts, strict=True):
        norms = agg["norms"]  # the ranked ones: a norm whose runs failed has no profile
        for i, norm in enumerate(norms):
            # where profiles coincide, each line is drawn thinner than those under it, so every one stays
            # visible as a border around the next; line styles tell them apart too
            width = 3.6 - 2.0 * i / max(len(norms) - 1, 1)
            score = agg["profile_score"].get(norm, 0.0)
            ax.step(agg["taus"], agg["profile"][norm], where="post", linewidth=width,
                    linestyle=_STYLES[i % len(_STYLES)], label=f"{norm} (score {score:.2f})")
        ax.set_xlim(1, agg["r_max"])
        ax.set_ylim(-0.03, 1.03)
        ax.set_xlabel("τ: steps to target within τ × the fastest norm's")
        ax.set_ylabel("fraction of workloads")
        ax.set_title(f"performance profile, {title} ({len(agg['workloads'])})")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))  # outside: curves stay visible
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, dpi=110, format="png")
    plt.close(fig)
    return buf.getvalue()


def _aggregate_table(card: dict[str, Any], key: str, title: str) -> str:
    agg = card.get(key)
    if not agg:
        return ""
    rows = []
    order = sorted(agg["norms"], key=lambda n: agg["mean_rank"][n]["mean"])
    for norm in order:
        rank = agg["mean_rank"][norm]
        cells = [f'<td class="l">{_e(norm)}</td>', f"<td>{rank['mean']:.2f}</td>",
                 f"<td>[{rank['low']:.2f}, {rank['high']:.2f}]</td>", f"<td>{agg['profile_score'][norm]:.2f}</td>"]
        for workload in agg["workloads"]:
            ratio = agg["ratios"][workload].get(norm)
            cells.append(f"<td>{ratio:.2f}</td>" if ratio is not None else '<td class="miss">miss</td>')
        rows.append("<tr>" + "".join(cells) + "</tr>")
    for norm, why in agg["unranked"].items():
        rows.append(f'<tr><td class="l">{_e(norm)}</td><td class="fail wrap" colspan="{3 + len(agg["workloads"])}">'
                    f'not ranked: {_e(why)}</td></tr>')
    heads = "".join(f"<th>{_e(w)}</th>" for w in agg["workloads"])
    return (f"<h2>{_e(title)}</h2><div class='wide'><table><tr><th class='l'>norm</th><th>mean rank</th>"
            f"<th>95% bootstrap</th><th>profile score</th>{heads}</tr>{''.join(rows)}</table></div>"
            f"<p class='scope'>Mean rank: each workload ranks the norms by their mean {'/'.join(_metrics(card))} "
            f"(1 = best; a norm that cannot run a workload shares its last places; a norm with failed or missing "
            f"runs is not ranked), averaged over the "
            f"{plural(len(agg['workloads']), 'workload')}; the interval resamples seeds within each workload "
            f"(2,000 draws), not workloads. Profile score: area under the profile from τ = 1 to {agg['r_max']:g}, "
            f"1 = fastest to target on every workload. Columns: steps to target over the fastest norm's.</p>")


def _metrics(card: dict[str, Any]) -> list[str]:
    return sorted({w["metric"] for w in card["workloads"]})


def _tuned(n: dict[str, Any]) -> str:
    """`lr=0.01 (edge)`: the values tuning chose, marked where a value is at an end of the grid."""
    def one(k: str, v: Any) -> str:
        return (f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}") + (" (edge)" if k in n["tuned_at_edge"] else "")

    return ", ".join(one(k, v) for k, v in (n["tuned"] or {}).items())


def _href(directory: str) -> str:
    """A task's report as a relative link: `./` first and every character of the name URL-quoted, so
    no name can become a scheme (`javascript:`), an absolute path or a step up."""
    return _e(f"./{quote(directory, safe='')}/report.html")


def _failures(n: dict[str, Any]) -> str:
    count = n["failed"] + n["tuning_failed"]
    if not count:
        return ""
    return f' <span class="fail" title="{_e(n["error"] or "")}">({count} failed)</span>'


def _stopped(n: dict[str, Any]) -> str:
    """` (look 2, 5 seeds)` for a verdict of sequential seeds; an undecided one also says why it stopped."""
    if not n.get("look"):
        return ""
    why = "" if str(n["verdict"]).split(" (")[0] in ("better", "worse", "equivalent") else f"; {n['stop']}"
    return f" (look {n['look']}, {n['diff_n']} seeds{why})"


def _workload(w: dict[str, Any]) -> str:
    rows = []
    for n in w["norms"]:
        if n["excluded"]:
            rows.append(f'<tr><td class="l">{_e(n["norm"])}</td><td class="ex wrap" colspan="8">cannot run here: '
                        f'{_e(n["excluded"])}</td></tr>')
            continue
        verdict = (n["verdict"] or "-") + _stopped(n)
        low, high = ("diff_adj_low", "diff_adj_high") if n.get("diff_adj_low") is not None else ("diff_ci95_low",
                                                                                                  "diff_ci95_high")
        ci = f"[{n[low]:+.2f}, {n[high]:+.2f}]" if n.get(low) is not None and n.get(high) is not None else ""
        tuned = _tuned(n)
        steps = _num(n["steps_to_target"], ",.0f")
        cpu = _num(n["cpu_s_to_target"], ".1f")
        rows.append(
            f'<tr><td class="l">{_e(n["norm"])}</td><td>{_e(tuned)}</td>'
            f'<td>{_num(n["metric_mean"], ".2f")} ± {_num(n["metric_sem"], ".2f")}</td>'
            f'<td>{_num(n["diff_mean"], ".2f", True)} {_e(ci)}</td>'
            f'<td class="l v-{_e(verdict.split()[0])}">{_e(verdict)}</td><td>{_num(n["mde"], ".2f")}</td>'
            f'<td>{n["reached"]}/{n["runs"]}{_failures(n)}</td><td>{steps}</td><td>{cpu}</td></tr>')
    direction = "higher" if w["higher_is_better"] else "lower"
    op = ">=" if w["higher_is_better"] else "<="
    title = w["task"] + (" (held out)" if w["held_out"] else "") + ("" if w["complete"] else " (incomplete)")
    link = (f" Report: <a href='{_href(w['dir'])}'>{_e(w['dir'])}/report.html</a>." if w["dir"] else
            " No norm given can run this workload.")
    return (f"<h3>{_e(title)}: {_e(w['question'])}</h3>"
            f"<p class='scope'>{_e(w['recipe'])}; tuning budget per norm {_e(w['budget'])} on tune seeds "
            f"{_e(w['tune_seeds'])}, chosen on validation; comparison seeds {_e(w['seeds'])}; {_e(w['metric_label'])} "
            f"({_e(w['unit'])}, {direction} is better), paired against {_e(w['baseline'])}; target "
            f"{_e(w['target_field'])} {op} {w['target']:g}.{link}</p>"
            f"<div class='wide'><table><tr><th class='l'>norm</th><th>tuned</th><th>{_e(w['metric'])}</th>"
            f"<th>vs {_e(w['baseline'])} [adj. CI]</th><th class='l'>verdict (Holm)</th><th>MDE</th>"
            f"<th>reached</th><th>steps to target</th><th>CPU s to target</th></tr>{''.join(rows)}</table></div>"
            + ("<p class='scope'>(edge): tuning chose the smallest or largest candidate, so the best value may lie "
               "beyond the workload's grid.</p>" if any(n["tuned_at_edge"] for n in w["norms"]) else "")
            + ("<p class='scope'>(look 1, undecided): a first look spends almost none of the design's alpha, so the "
               "interval it tests at is very wide; the MDE is the difference the full design would detect at the "
               "spread seen, and more seeds (a larger --max-cpu-minutes or --max-seeds) are what would decide it.</p>"
               if any(_undecided_at_first_look(n) for n in w["norms"]) else ""))


def _undecided_at_first_look(n: dict[str, Any]) -> bool:
    """A sequential comparison that stopped (budget or max seeds) after its first look."""
    return n.get("look") == 1 and str(n.get("stop") or "").startswith("undecided")


def _seeds_text(card: dict[str, Any]) -> str:
    if not card.get("looks"):
        return f"comparison seeds {card['seeds']}"
    budget = f", at most {card['max_cpu_minutes']:g} CPU minutes a workload" if card.get("max_cpu_minutes") else ""
    return (f"sequential seeds (looks after {', '.join(map(str, card['looks']))} seeds{budget}: each workload adds "
            f"seeds only to its comparisons still undecided, with alpha spent across the looks; times and ranks use "
            f"the first look's seeds, which every norm has)")


def decided_text(card: dict[str, Any]) -> str:
    """`8 of 9 non-baseline cells decided (better, worse or equivalent); 1 left out (...)`, or ''."""
    d = card.get("decided")
    if not d:
        return ""
    left = f"; {plural(d['left_out'], 'cell')} left out (a norm the workload cannot host)" if d["left_out"] else ""
    return f"{d['decided']} of {plural(d['cells'], 'non-baseline cell')} decided (better, worse or equivalent){left}"


def _decided_text(card: dict[str, Any]) -> str:
    text = decided_text(card)
    return f" {text}." if text else ""


def render(card: dict[str, Any], figure: bytes | None) -> str:
    """The scorecard page of `card` (scorecard.json's mapping)."""
    norms = ", ".join(card["norms"])
    title = f"normkit suite scorecard: {norms}"
    env = card.get("environment") or {}
    session = env.get("session") or {}
    parts = (env.get("cpu"), f"{env['cpu_count']} cores" if env.get("cpu_count") else None,
             f"torch {env.get('versions', {}).get('torch')}" if env.get("versions") else None)
    machine = ", ".join(str(x) for x in parts if x)
    if session:
        machine += (f"\nthis session: {session['wall_s'] / 60:.1f} min wall, load average {session['load_start']:.2f} "
                    f"at start, {session['load_end']:.2f} at end")
    img = (f'<img alt="performance profiles" src="data:image/png;base64,{base64.b64encode(figure).decode()}">'
           if figure else "" if not (card.get("visible") or card.get("held_out"))
           else "<p class='note'>No figure: matplotlib is not installed.</p>")
    missing = (f"<p class='note'>Incomplete (runs not made yet, or failed): {_e(', '.join(card['missing']))}; "
               f"continue with <code>normkit suite --resume DIR</code>.</p>" if card["missing"] else "")
    failed = ", ".join(f"{norm} {count}" for norm, count in card.get("failed_runs", {}).items())
    if failed:
        missing += (f"<p class='note fail'>Failed runs per norm: {_e(failed)}; each workload's table gives the first "
                    f"error. A norm with failed runs is not ranked.</p>")
    if card.get("smoke_test"):
        missing = f"<p class='note'><b>This is {_e(card['note'])}.</b></p>" + missing
    visible = [w for w in card["workloads"] if not w["held_out"]]
    held = [w for w in card["workloads"] if w["held_out"]]
    scope = plural(len(visible), "workload") + (f" and {plural(len(held), 'held-out variant')}" if held else "")
    parts = [
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{_e(title)}</title><style>{_STYLE}</style></head>"
        f"<body><h1>{_e(title)}</h1>", missing,
        f"<p class='caption'>{scope}, "
        f"scale {_e(card['scale'])}, {_e(_seeds_text(card))}. Every norm got the same tuning budget on "
        f"every workload (the same learning-rate candidates on separate tuning seeds, chosen on validation), then "
        f"ran the comparison seeds; verdicts are paired by seed against the first norm that runs there, "
        f"Holm-adjusted within each workload (the intervals too: adj. CI excludes 0 exactly when a difference is "
        f"shown). Time to target is counted at the end of each pass over the data, where validation runs; a miss "
        f"counts as infinite.{_e(_decided_text(card))}</p>",
        img,
        _aggregate_table(card, "visible", "Across the visible workloads"),
        _aggregate_table(card, "held_out", "Across the held-out variants"),
        "<h2>Per workload</h2>", *(_workload(w) for w in visible + held),
        (f"<h2>Provenance</h2><pre>{_e(card['command'])}\n{_e(machine)}</pre>" if card.get("command") else ""),
        "</body></html>",
    ]
    return "".join(parts)
