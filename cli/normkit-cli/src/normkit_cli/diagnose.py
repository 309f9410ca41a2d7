"""`normkit diagnose`: representation diagnostics (normality, power decomposition, noise robustness).

    normkit diagnose --random-net                  # the proxy-norm paper's random-net experiment, seconds
    normkit diagnose runs/<dir>                    # re-render a `compare --diagnostics` directory
    normkit diagnose --norms bn,bnn --epochs 3     # fresh models on the default dataset, briefly trained

See docs/diagnostics.md.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated

import typer

from normkit_cli.ascii_ints import ascii_int
from normkit_cli.errors import fail, one_line_errors
from normkit_cli.text import plural
from normkit_lab.limits import (
    MAX_ACTIVATION_ELEMENTS,
    MAX_BATCH_SIZE,
    MAX_CHANNELS,
    MAX_EPOCHS,
    MAX_IMAGE_SIZE,
    MAX_MODEL_DEPTH,
    MAX_SEED,
    MAX_SEEDS,
)

# normkit and the lab (torch) are imported inside the functions: `normkit diagnose --help` must not load them.

FRESH_NORMS = ("bn", "bnn", "ln", "ln+pn")
RANDOM, FRESH, OUTPUT = "Random net (--random-net)", "Fresh models (no DIR)", "Output"


def _norms(norms: str | None, default: list[str]) -> list[str]:
    import normkit

    chosen = normkit.split_specs(norms) if norms else default
    if not chosen:
        raise fail("no norm to diagnose; pass --norms, e.g. --norms bn,ln")
    return chosen


def _random_net(norms: list[str], depth: int, width: int, batch: int, image_size: int, seeds: int,
                out: Path | None) -> None:
    from normkit_lab.diagnostics import figures, random_net
    from normkit_lab.diagnostics.tables import random_net_table
    from normkit_lab.store.results import atomic_write_text, json_text

    start = time.perf_counter()
    runs = random_net.random_net_runs(norms, depth=depth, width=width, batch=batch, image_size=image_size,
                                      seeds=seeds)  # checks every spec before computing any
    result, spread = random_net.mean_over_nets(runs), random_net.spread_over_nets(runs)
    elapsed = time.perf_counter() - start
    typer.echo(f"random net: conv3x3 (circular) -> norm -> random affine -> ReLU, depth {depth}, width {width}, "
               f"batch {batch} of {image_size}x{image_size} Gaussian images, mean of {plural(seeds, 'net')}, "
               f"{elapsed:.1f} s")
    typer.echo("dataset-scale power share of post-norm values (near 1 = channel-wise collapse):\n")
    typer.echo(random_net_table(result, every=max(1, depth // 8), spread=spread))
    if out is None:
        return
    out.mkdir(parents=True, exist_ok=True)
    settings = {"depth": depth, "width": width, "batch": batch, "image_size": image_size, "seeds": seeds}
    atomic_write_text(out / "random_net.json", json_text({"settings": settings, "norms": result,
                                                          "dataset_share_spread": spread}))
    written = [out / "random_net.json"]
    if figures.available():
        title = f"random net, depth {depth}, width {width}"
        written.append(figures.random_net_figure(result, out / "random_net_power.png", title))
        shares = {norm: {"init": [{"depth": d + 1, "power": s} for d, s in enumerate(rows)]}
                  for norm, rows in result.items()}
        written.append(figures.power_figure(shares, out / "random_net_shares.png", {"init": "random net"}))
    typer.echo("\nwritten: " + ", ".join(str(p) for p in written))


def _results_dir(path: Path) -> None:
    from normkit_lab.diagnostics import render
    from normkit_lab.diagnostics.report import load
    from normkit_lab.diagnostics.tables import markdown

    written = render(path)
    typer.echo(markdown(load(path)))
    typer.echo("written: " + ", ".join(str(p) for p in written))


def _fresh(norms: list[str], model: str, dataset: str, epochs: int, seed: int, model_param: list[str],
           out: Path | None) -> None:
    from normkit_lab.diagnostics import DiagnosticsCallback, write_report
    from normkit_lab.diagnostics.report import DIAGNOSTICS_MD
    from normkit_lab.records import failed_run
    from normkit_lab.runs.checks import check_config
    from normkit_lab.runs.training import train_run
    from normkit_lab.spec import TrainConfig
    from normkit_lab.store.results import atomic_write_text, new_results_dir
    from normkit_lab.study.config import parse_key_values

    cfg = TrainConfig(model=model, dataset=dataset, epochs=epochs,
                      model_params=parse_key_values(model_param, "--model-param"))
    check_config(cfg, norms)
    out_dir = new_results_dir(out, kind="diagnose")
    runs, trained = [], []
    for norm in norms:
        start = time.perf_counter()
        try:
            run = train_run(cfg, norm, seed, callbacks=[DiagnosticsCallback()])
        except Exception as exc:  # noqa: BLE001 - one norm's bug must not stop the others
            run = failed_run(norm, seed, exc)
            typer.echo(run.error, err=True)
            continue
        runs.append(run)
        trained.append(norm)
        acc = f"final val acc {100 * run.epochs[-1].val_acc:.1f}%" if run.epochs else "no finished epoch"
        typer.echo(f"{norm}: {plural(epochs, 'epoch')} with diagnostics, {run.status}, {acc}, "
                   f"{time.perf_counter() - start:.1f} s")
    if not runs:
        raise fail("every norm failed (see the lines above), so there is nothing to diagnose")
    settings = {"model": model, "dataset": dataset, "epochs": epochs, "seed": seed, "norms": norms}
    atomic_write_text(out_dir / "diagnose.json", json.dumps(settings) + "\n")
    written = write_report(out_dir, runs, trained)
    typer.echo((out_dir / DIAGNOSTICS_MD).read_text(encoding="utf-8"))
    typer.echo("written: " + ", ".join(str(p) for p in written))


@one_line_errors
def diagnose_cmd(
    results: Annotated[Path | None, typer.Argument(help="A results directory of `normkit compare --diagnostics`: "
                                                        "re-render its tables and figures.")] = None,
    random_net_: Annotated[bool, typer.Option("--random-net", help="Run the proxy-norm paper's random-net "
                                              "experiment (no training).", rich_help_panel=RANDOM)] = False,
    norms: Annotated[str | None, typer.Option(help="Norm specs, comma-separated (random net default: the "
                                                   "installed of bn,ln,ln+pn; fresh default: bn,bnn,ln,ln+pn "
                                                   "where installed).")] = None,
    depth: Annotated[int, typer.Option(parser=ascii_int(min=1, max=MAX_MODEL_DEPTH),
                                       help="Random-net depth.", rich_help_panel=RANDOM)] = 20,
    width: Annotated[int, typer.Option(parser=ascii_int(min=1, max=MAX_CHANNELS),
                                       help="Random-net width (channels).", rich_help_panel=RANDOM)] = 24,
    batch: Annotated[int, typer.Option(parser=ascii_int(min=2, max=MAX_BATCH_SIZE),
                                       help="Random-net batch size.", rich_help_panel=RANDOM)] = 16,
    image_size: Annotated[int, typer.Option(parser=ascii_int(min=1, max=MAX_IMAGE_SIZE),
                                            help="Random-net image size.", rich_help_panel=RANDOM)] = 16,
    seeds: Annotated[int, typer.Option(parser=ascii_int(min=1, max=MAX_SEEDS),
                                       help="Random nets averaged per norm.", rich_help_panel=RANDOM)] = 3,
    model: Annotated[str, typer.Option(help="Model for fresh runs.", rich_help_panel=FRESH)] = "small-cnn",
    model_param: Annotated[list[str] | None, typer.Option(metavar="KEY=VALUE", help="Model parameter "
                                                          "(repeatable).", rich_help_panel=FRESH)] = None,
    dataset: Annotated[str, typer.Option(help="Dataset for fresh runs.", rich_help_panel=FRESH)] = "digits",
    epochs: Annotated[int, typer.Option(parser=ascii_int(min=1, max=MAX_EPOCHS),
                                        help="Training epochs of fresh runs.", rich_help_panel=FRESH)] = 3,
    seed: Annotated[int, typer.Option(parser=ascii_int(min=0, max=MAX_SEED),
                                      help="Seed of fresh runs.", rich_help_panel=FRESH)] = 0,
    out: Annotated[Path | None, typer.Option(help="Output directory (random net: files written only when "
                                                  "given; fresh runs: default runs/<timestamp>-diagnose).",
                                             rich_help_panel=OUTPUT)] = None,
) -> None:
    """Representation diagnostics: Q-Q normality, power decomposition, lambdas, noise robustness.

    Give a results DIR, --random-net, or --norms (fresh models); with no argument, this help.
    """
    from normkit_lab.diagnostics import random_net

    if random_net_:
        if results is not None:
            raise fail("--random-net builds its own nets; drop the results directory argument")
        elements = batch * width * image_size**2
        if elements > MAX_ACTIVATION_ELEMENTS:
            raise fail(f"--batch {batch} x --width {width} x --image-size {image_size}^2 = {elements:,} values per "
                       f"layer; at most {MAX_ACTIVATION_ELEMENTS:,} (1 GiB); lower one of them")
        _random_net(_norms(norms, random_net.installed_norms()), depth, width, batch, image_size,
                    seeds, out)
    elif results is not None:
        if norms or out:
            raise fail("a results directory is re-rendered in place with its own norms; drop --norms/--out")
        _results_dir(results)
    else:
        fresh_default = random_net.installed_norms(FRESH_NORMS)
        _fresh(_norms(norms, fresh_default), model, dataset, epochs, seed, model_param or [], out)


def register(app: typer.Typer) -> None:
    app.command("diagnose", no_args_is_help=True)(diagnose_cmd)
