"""`normkit suite`: every norm on every workload under one protocol, scored across workloads.

    normkit suite --list                                  # the workloads, one line each
    normkit suite --norms bn,gn+pn,mynorm                 # the CPU suite here (docs/suite.md)
    normkit suite --norms bn,gn+pn --quick                # a smoke test in seconds per workload
    normkit suite --resume runs/...-suite                 # continue; rewrites the scorecard

Each workload is an ordinary comparison in its own directory inside the suite's (`normkit report
DIR/cnn` reads it); scorecard.json, profile.png and report.html sit at the top.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from normkit_cli.ascii_ints import ascii_int
from normkit_cli.errors import (
    EXIT_RUNS_FAILED,
    fail,
    interrupted_code,
    is_normkit_error,
    one_line,
    one_line_errors,
    show_tracebacks,
)
from normkit_cli.text import plural

# The lab (torch) is imported inside the command: `normkit suite --help` must not load it.


def _list(scale: str) -> None:
    from normkit_lab.suite import available

    workloads = available()
    if not workloads:
        typer.echo("no workloads registered (plugins register them; see docs/suite.md)")
        return
    width = max(len(w.name) for w in workloads)
    for w in workloads:
        variants = ", ".join(w.variants) or "none"
        typer.echo(f"{w.name:<{width}}  {w.recipe(scale)}; tune {w.budget_text(scale)}; target {w.target_text(scale)}")
        typer.echo(f"{'':<{width}}  asks: {w.question} (held out: {variants}; plugin {w.plugin})")


def _runtime(data_dir: Path | None, device: str | None) -> dict[str, Any]:
    return {k: v for k, v in (("data_dir", str(data_dir) if data_dir else None), ("device", device)) if v is not None}


@one_line_errors
def suite_cmd(
    norms: Annotated[str | None, typer.Option(help="Norm specs, comma-separated; the first is every workload's "
                                                   "baseline, e.g. bn,gn+pn,mynorm.", show_default=False)] = None,
    list_: Annotated[bool, typer.Option("--list", help="List the workloads and exit.")] = False,
    seeds: Annotated[str | None, typer.Option(help="Comparison seeds: auto (the default: sequential seeds, as in "
                                                   "normkit compare; each workload adds seeds in rounds, looks "
                                                   "at 3, 5, 8, 12, only to its comparisons still undecided), "
                                                   "or fixed: a count N, a list 0,1,5 or a range 0-4 (tuning "
                                                   "uses the seed after them; --quick: 3).",
                                              show_default=False)] = None,
    max_seeds: Annotated[int | None, typer.Option(parser=ascii_int(), help="With --seeds auto: the most seeds a "
                                                  "comparison may get (default 12).", show_default=False)] = None,
    max_cpu_minutes: Annotated[float | None, typer.Option(help="With --seeds auto: each workload starts no further "
                                                          "round once its runs' training CPU minutes plus the "
                                                          "next round's estimate would exceed this.",
                                                          show_default=False)] = None,
    workloads: Annotated[str | None, typer.Option(help="Only these workloads, comma-separated (default: all).",
                                                  show_default=False)] = None,
    holdout: Annotated[bool, typer.Option(help="Also run every workload's held-out variants; the scorecard shows "
                                               "them beside the visible ones.")] = False,
    quick: Annotated[bool, typer.Option(help="The workloads' quick forms: a smoke test (CI), not a result.")] = False,
    scale: Annotated[str | None, typer.Option(help="cpu (runs here), or paper (each workload's GPU recipe; "
                                                   "docs/suite.md; default cpu).", show_default=False)] = None,
    out: Annotated[Path | None, typer.Option(help="Suite directory (default runs/<timestamp>-suite).",
                                             show_default=False)] = None,
    resume: Annotated[Path | None, typer.Option(help="Continue a suite directory with its saved plan; finished "
                                                     "runs are skipped and the scorecard rewritten.",
                                                show_default=False)] = None,
    allow_version_change: Annotated[bool, typer.Option(help="With --resume: continue although torch, normkit or "
                                                             "a plugin has another version than the saved runs "
                                                             "(recorded in each workload's environment.json).")]
    = False,
    jobs: Annotated[int | None, typer.Option(parser=ascii_int(), help="Runs at once on this machine (default 1 on "
                                                                      "CPU).", show_default=False)] = None,
    executor: Annotated[str, typer.Option(help="Where runs train: local, ray or slurm (docs/scaling.md).")]
    = "local",
    data_dir: Annotated[Path | None, typer.Option(help="Where datasets are stored (paper scale).",
                                                  show_default=False)] = None,
    device: Annotated[str | None, typer.Option(help="Device instead of the workloads' (auto, cpu, cuda, ...).",
                                               show_default=False)] = None,
) -> None:
    """Run every norm on every workload with equal tuning budgets and score them across workloads.

    Per workload: the same learning-rate candidates for every norm on a tuning seed, chosen on
    validation; then the comparison seeds, paired verdicts against the first norm, and the steps and
    CPU seconds to the workload's target. Across workloads: performance profiles and the mean rank
    with a bootstrap interval over seeds. Writes scorecard.json, profile.png and report.html.
    Exit 1 when any run failed (the scorecard shows the failures per norm and does not rank those
    norms), 2 for bad input; --resume continues with the saved plan (docs/suite.md).
    """
    if list_:
        _list("quick" if quick else scale or "cpu")
        return
    from normkit_cli.compare import _executor_options
    from normkit_lab.executors import make_executor
    from normkit_lab.suite.run import SuitePlan, create_suite, open_suite, prepare

    if quick and scale is not None:
        raise fail("--quick is the workloads' smoke-test form; drop --scale with it")
    options = _executor_options(executor, jobs, 1, None, None, 60, -1, None, None)
    if allow_version_change and resume is None:
        raise fail("--allow-version-change lets --resume continue under other versions; give it with --resume")
    if resume is not None:
        given = [flag for flag, value in (("--norms", norms), ("--seeds", seeds), ("--max-seeds", max_seeds),
                                          ("--max-cpu-minutes", max_cpu_minutes), ("--workloads", workloads),
                                          ("--holdout", holdout or None), ("--quick", quick or None),
                                          ("--scale", scale), ("--out", out)) if value is not None]
        if given:
            raise fail(f"--resume continues a suite with its saved plan (suite.json); drop {', '.join(given)} "
                       f"(only --device, --data-dir and the Scale out options may change), or start a new suite")
        suite = open_suite(resume, _runtime(data_dir, device))
        run_executor = make_executor(options)
        prepare(suite, options.parallel_runs, allow_version_change,  # every check before anything trains
                warn=lambda line: typer.echo(f"warning: {line}", err=True))
    else:
        if norms is None:
            raise fail("give the norms to compare, e.g. --norms bn,gn+pn (or --list to see the workloads)")
        names = [w.strip() for w in workloads.split(",") if w.strip()] if workloads is not None else None
        default_seeds = "3" if quick else "auto"  # a smoke test gives no verdicts, so no rounds to decide them
        plan = SuitePlan.make(norms, default_seeds if seeds is None else seeds, names,
                              "quick" if quick else scale or "cpu", holdout, runtime=_runtime(data_dir, device),
                              max_seeds=max_seeds, max_cpu_minutes=max_cpu_minutes)
        run_executor = make_executor(options)  # a missing engine: before any directory is made
        suite = create_suite(plan, out, options.parallel_runs)  # every task checked before its directory
    _run(suite, run_executor, options.parallel_runs)


def _run(suite: Any, run_executor: Any, parallel: int) -> None:
    from normkit_lab.analysis.report import command_line
    from normkit_lab.runs.environment import environment
    from normkit_lab.study.plan import run_count
    from normkit_lab.suite.run import planned_runs, run_suite
    from normkit_lab.suite.scorecard import write_scorecard

    plan = suite.plan
    seeds = (f"seeds auto, looks after {', '.join(map(str, plan.looks))} seeds"
             + (f", at most {plan.max_cpu_minutes:g} CPU minutes a workload" if plan.max_cpu_minutes else "")
             if plan.looks else f"seeds {','.join(map(str, plan.seeds))}")
    typer.echo(f"suite {', '.join(plan.norms)} on {plural(len(plan.tasks()), 'workload')} "
               f"(scale {plan.scale}, {seeds}): at most "
               f"{plural(planned_runs(plan), 'run')} -> {suite.path}")

    def on_task(task: Any, cfg: Any, excluded: dict[str, str]) -> None:
        recipe = task.workload.recipe(plan.scale, task.variant)
        if cfg is None:
            typer.echo(f"{task.name}: {recipe}; no norm given can run it, so each counts as a miss there")
        else:
            n_tune, n_compare = run_count(cfg)
            typer.echo(f"{task.name}: {recipe}; {n_tune} tuning + {n_compare} comparison runs")
        for norm, why in excluded.items():
            typer.echo(f"  {norm} left out: {why}")

    hint = f"continue with: normkit suite --resume {suite.path}"
    started, load_start = time.monotonic(), os.getloadavg()[0]
    try:
        run_suite(suite, executor=run_executor, progress=_progress, on_task=on_task, parallel=parallel)
    except KeyboardInterrupt as exc:
        typer.echo(f"interrupted: finished runs are saved in {suite.path}; {hint}", err=True)
        raise typer.Exit(interrupted_code(exc)) from None
    except Exception as exc:
        if show_tracebacks() or not (is_normkit_error(exc) or isinstance(exc, OSError)):
            raise
        raise fail(f"{exc} (finished runs are kept; {hint})") from None
    session = {"wall_s": time.monotonic() - started, "load_start": load_start, "load_end": os.getloadavg()[0]}
    card = write_scorecard(suite, {**environment(plan.runtime.get("device", "auto")), "session": session},
                           command_line())
    _print(card)
    typer.echo(f"written: {suite.path / 'scorecard.json'}, {suite.path / 'report.html'}"
               + (f", {suite.path / 'profile.png'}" if (suite.path / "profile.png").is_file() else ""))
    if card["failed_runs"]:
        raise _runs_failed(card, suite.path)


def _runs_failed(card: dict[str, Any], path: Path) -> typer.Exit:
    """One line on stderr (failed runs per norm, the first error, how to retry) and the Exit(1) to raise,
    as `normkit compare` does: the scorecard is written, but a CI job must not read "all ran" from it."""
    total = sum(card["failed_runs"].values())
    per_norm = ", ".join(f"{norm} {count}" for norm, count in card["failed_runs"].items())
    first = next(n["error"] for w in card["workloads"] for n in w["norms"] if n["error"])
    typer.echo(f"{plural(total, 'run')} failed ({per_norm}; first: {one_line(first, 300)}); fix the norm, then "
               f"retry them with: normkit suite --resume {path}", err=True)
    return typer.Exit(EXIT_RUNS_FAILED)


def _progress() -> Any:
    """Rich bars on a terminal; elsewhere one line per finished run (a suite has hundreds of epochs)."""
    from normkit_lab.study.progress import PlainProgress, Progress, choose_progress

    class RunLines(PlainProgress):
        def epoch_end(self, run_id: Any, record: Any) -> int:
            """Only finished runs are reported; every epoch is counted (the ETA's pace)."""
            return Progress.epoch_end(self, run_id, record)

    chosen = choose_progress()
    return RunLines() if isinstance(chosen, PlainProgress) else chosen


def _stopped(n: dict[str, Any]) -> str:
    """` (look 2, 5 seeds)`; an undecided cell says why it stopped and the difference the budget could show."""
    if not n.get("look"):
        return ""
    if str(n["verdict"]).split(" (")[0] in ("better", "worse", "equivalent"):
        return f" (look {n['look']}, {n['diff_n']} seeds)"
    mde = "" if n.get("mde") is None else f", MDE {n['mde']:.2g}"
    return f" ({n['stop']} after {n['diff_n']} seeds{mde})"


def _print(card: dict[str, Any]) -> None:
    """Per workload the verdicts (with sequential seeds, each one's look or why it stopped undecided), how many
    non-baseline cells are decided; then the aggregate: mean rank [bootstrap], profile score (a smoke test:
    the metric means only, and a line saying it is one)."""
    if card["smoke_test"]:
        typer.echo(f"this is {card['note']}")
    for w in card["workloads"]:
        cells = []
        for n in w["norms"]:
            if n["excluded"]:
                cells.append(f"{n['norm']} n/a")
            elif n["failed"] or n["tuning_failed"]:
                cells.append(f"{n['norm']} {n['failed'] + n['tuning_failed']} failed")
            elif card["smoke_test"]:
                cells.append(f"{n['norm']} " + ("-" if n["metric_mean"] is None else f"{n['metric_mean']:.2f}"))
            elif n["norm"] == w["baseline"]:
                cells.append(f"{n['norm']} {n['metric_mean']:.2f} (baseline)" if n["metric_mean"] is not None
                             else f"{n['norm']} -")
            else:
                mean = "-" if n["metric_mean"] is None else f"{n['metric_mean']:.2f}"
                cells.append(f"{n['norm']} {mean} {n['verdict'] or '-'}{_stopped(n)}")
            if n["tuned_at_edge"]:
                cells[-1] += f" [{', '.join(n['tuned_at_edge'])} at grid edge]"
        typer.echo(f"{w['task']:<18} {w['metric']}: " + "; ".join(cells))
        if w.get("sequential"):
            typer.echo(f"{'':<18} rounds stopped: {w['sequential']['stopped'] or 'not yet (resume to continue)'}")
    if card.get("decided"):
        from normkit_lab.suite.page import decided_text

        typer.echo(decided_text(card))
    for key, title in (("visible", "visible workloads"), ("held_out", "held-out variants")):
        agg = card.get(key)
        if not agg:
            continue
        typer.echo(f"across the {len(agg['workloads'])} {title}: mean rank [95% bootstrap over seeds], profile score")
        for norm in sorted(agg["norms"], key=lambda n: agg["mean_rank"][n]["mean"]):
            r = agg["mean_rank"][norm]
            typer.echo(f"  {norm:<12} {r['mean']:.2f} [{r['low']:.2f}, {r['high']:.2f}]  "
                       f"{agg['profile_score'][norm]:.2f}")
        for norm, why in agg["unranked"].items():
            typer.echo(f"  {norm:<12} not ranked: {why}")


def register(app: typer.Typer) -> None:
    app.command("suite")(suite_cmd)
