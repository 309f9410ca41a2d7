"""The stage-ablation table of `normkit compare --ablate` and `normkit report`: per norm and stage, what
switching the stage off changes and whether that stage carries the norm's difference to the baseline."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich import box
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:
    from rich.console import Console

    from normkit_lab.analysis.summary import Summary


def _num(value: float | None, fmt: str) -> str:
    return "" if value is None else format(value, fmt)


def ablation_table(summary: Summary) -> Table:
    """One row per (cell, norm, stage): the change when the stage is off (arm - norm) with its interval
    and Holm p (the ablations' own family), the reading, and the arm's gap to the baseline."""
    from normkit_cli.text import plural
    from normkit_lab.analysis.ablations import family_size
    from normkit_lab.analysis.summary import cell_label, interval_text

    tests = summary.ablations
    many = len({cell_label(t.cell) for t in tests}) > 1
    table = Table(title=Text(f"stage ablations: what switching each stage off changes (arm - norm, paired by seed; "
                             f"Holm over the ablations' {plural(family_size(tests), 'test')}, apart from the "
                             f"verdicts above; adj. CI: the change's interval at its Holm level, excluding 0 "
                             f"exactly when the stage is shown to help or hurt; margin ±{summary.margin:g})"),
                  box=box.SIMPLE_HEAD, title_justify="left", collapse_padding=True, pad_edge=False)
    columns = ["norm", *(["cell"] if many else []), "stage off", "n", "change", "adj. CI", "Holm p", "the stage",
               f"arm vs {summary.baseline}", "verdict"]
    for name in columns:
        table.add_column(name, justify="left" if name in ("norm", "cell", "stage off", "the stage", "verdict")
                         else "right")
    for t in tests:
        e, w = t.effect, t.without
        interval = "" if t.change_adjusted is None else interval_text(*t.change_adjusted)
        values = [t.ablation.norm, *([cell_label(t.cell) or "-"] if many else []),
                  f"{t.ablation.stage}: {t.ablation.arm}", str(e.n),
                  _num(None if e.mean is None else 0.0 - e.mean, "+.2f"), interval,
                  _num(t.effect_test.p_holm, ".3g"), t.role, _num(w.mean if w else None, "+.2f"),
                  t.without_test.verdict if t.without_test else ""]
        table.add_row(*(Text(v) for v in values))
    return table


def print_ablations(summary: Summary, console: Console) -> None:
    """The table, then one sentence per stage saying whether it carries its norm's difference."""
    from normkit_lab.analysis.ablations import attribution
    from normkit_lab.analysis.summary import cell_key, cell_label

    console.print(ablation_table(summary))
    gaps = {(s.norm, cell_key(s.cell)): s.verdict for s in summary.rows}
    for t in summary.ablations:
        where = f"[{cell_label(t.cell)}] " if t.cell else ""
        line = attribution(t, gaps.get((t.ablation.norm, cell_key(t.cell))), summary.baseline, summary.metric.unit)
        console.print(f"ablation: {where}{line}", markup=False, highlight=False, soft_wrap=True)
