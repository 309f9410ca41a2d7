"""`normkit reproduce`: run a published finding's pre-registered reproduction preset.

    normkit reproduce --list                               # the installed presets
    normkit reproduce proxynorm-pn-rescues-ln              # run it here (CPU scale)
    normkit reproduce NAME --scale paper --dry-run         # check the paper's recipe without training

Presets are YAML files that plugins ship (docs/reproduce.md). The output ends with one line per
hypothesis: reproduced, below margin, not reproduced, not attributed (a control of the stated cause
does not hold), or inconclusive (with the MDE and the seeds needed).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Annotated, Any

import typer

from normkit_cli.errors import fail, one_line_errors

# The lab (torch) is imported inside the command: `normkit reproduce --help` must not load it.

SCALES = ("cpu", "paper")


LEGEND = (
    "label: reproduction = a result the cited paper reports; extension = one it states or expects without "
    "measuring it, or a control arm that tests its stated cause; prediction = normkit's own, from its earlier runs",
    "cpu runtime: the preset's CPU scale, as measured on the machine its file names (minutes on 2 cores)",
    "paper scale: the preset also carries the paper's recipe (--scale paper: its model, dataset and length, for a "
    "GPU with the dataset on disk; check it with --dry-run); cpu only: there is no recipe of the paper's to run, "
    "only the CPU scale",
)


def _list() -> None:
    from normkit_lab.reproduce import available

    presets = available()
    if not presets:
        typer.echo("no reproduction presets installed (plugins register them; see docs/reproduce.md)")
        return
    rows = [(p.name, p.labels, p.scales["cpu"].runtime_text, "paper scale" if "paper" in p.scales else "cpu only",
             p.title) for p in presets]
    head = ("preset", "label", "cpu runtime", "scales", "claim")
    widths = [max(len(r[i]) for r in [*rows, head]) for i in range(4)]
    typer.echo("  ".join(f"{v:<{w}}" for v, w in zip(head, widths, strict=False)) + f"  {head[4]}")
    for p, row in zip(presets, rows, strict=True):
        typer.echo("  ".join(f"{v:<{w}}" for v, w in zip(row, widths, strict=False)) + f"  {row[4]}")
        typer.echo(f"{'':<{widths[0]}}  source: {p.cite} (plugin {p.plugin})")
    typer.echo("")
    for line in LEGEND:
        typer.echo(line)


def _overrides(data_dir: Path | None, device: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if data_dir is not None:
        out["data_dir"] = str(data_dir)
    if device is not None:
        out["device"] = device
    return out


@one_line_errors
def reproduce_cmd(
    name: Annotated[str | None, typer.Argument(help="The preset to run (see --list).", show_default=False)] = None,
    list_: Annotated[bool, typer.Option("--list", help="List the installed presets and exit.")] = False,
    seeds: Annotated[str | None, typer.Option(help="Seeds instead of the preset's: a count N, a list 0,1,5 or a "
                                                   "range 0-4 (random nets: a count).", show_default=False)] = None,
    scale: Annotated[str, typer.Option(help="cpu (runs here in minutes) or paper (the paper's recipe, for a "
                                            "GPU and the dataset on disk).")] = "cpu",
    out: Annotated[Path | None, typer.Option(help="Results directory (default runs/<timestamp>-reproduce).",
                                             show_default=False)] = None,
    dry_run: Annotated[bool, typer.Option(help="Check the plan, dataset and device and print the cost; "
                                               "train nothing.")] = False,
    data_dir: Annotated[Path | None, typer.Option(help="Where the preset's dataset is stored.",
                                                  show_default=False)] = None,
    device: Annotated[str | None, typer.Option(help="Device instead of the preset's (auto, cpu, cuda, ...).",
                                               show_default=False)] = None,
) -> None:
    """Run a pre-registered reproduction of a published finding and say whether it reproduced.

    Each preset states a claim with its citation, hypotheses fixed before the run (metric, direction,
    margin, test) and the comparison that tests them. The output ends with one line per hypothesis:
    reproduced, below margin, not reproduced (the opposite is significant), not attributed (shown, but a
    control of the claim's stated cause does not hold) or inconclusive (with the MDE and the seeds
    needed; an equivalence is claimed only when the run could detect a difference of the margin's
    size). report.html in the results directory shows the claim beside the result.
    """
    if list_:
        if name is not None:
            raise fail("--list lists every preset; drop the preset name, or drop --list to run it")
        _list()
        return
    if name is None:
        raise fail("give a preset name (see normkit reproduce --list)")
    if scale not in SCALES:
        raise fail(f"--scale must be cpu or paper, not {scale!r}")
    from normkit_lab.reproduce import load_preset, runner

    preset = load_preset(name)
    plan = runner.plan(preset, scale, seeds, _overrides(data_dir, device))
    for line in plan.lines:
        typer.echo(line)
    if dry_run:
        runner.dry_run(plan, typer.echo)
        typer.echo("dry run passed: nothing was trained")
        return
    _run(plan, out)


def _run(plan: Any, out: Path | None) -> None:
    from normkit_cli.compare import print_tuning
    from normkit_cli.report import console as make_console
    from normkit_cli.report import show
    from normkit_lab.analysis.report import command_line
    from normkit_lab.reproduce import runner
    from normkit_lab.study.progress import choose_progress

    typer.echo("")
    console = make_console()
    rep = runner.run(plan, out, progress=choose_progress(), on_tuned=functools.partial(print_tuning, console=console))
    if rep.results is not None:
        show(rep.results, rep.store, console)
    else:
        typer.echo("dataset-scale power share of post-norm values (near 1 = channel-wise collapse):\n")
        typer.echo(rep.table)
    written = runner.write_reproduction(rep, plan, command_line())
    typer.echo(f"\nwritten: {', '.join(str(p) for p in written)}")
    typer.echo(f"{plan.preset.name}: {len(rep.outcomes)} hypotheses, {plan.seeds} seeds, scale {plan.scale.name}, "
               f"{rep.seconds:.0f} s")
    for outcome in rep.outcomes:
        typer.echo(outcome.line())


def register(app: typer.Typer) -> None:
    app.command("reproduce", no_args_is_help=True)(reproduce_cmd)
