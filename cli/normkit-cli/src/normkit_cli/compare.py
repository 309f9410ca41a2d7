"""`normkit compare`: train one model per (norm, seed), paired by seed, and report the comparison.

Option values come from the command line, then `--config FILE.yaml`, then the defaults shown in
`--help`; only options typed on the command line override the file (click's parameter source).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Annotated, Any

import typer

from normkit_cli.ascii_ints import ascii_int
from normkit_cli.defaults import DEFAULTS as D
from normkit_cli.defaults import RUNTIME_KEYS
from normkit_cli.errors import (
    fail,
    interrupted_code,
    is_normkit_error,
    one_line,
    one_line_errors,
    runs_failed,
    show_tracebacks,
)
from normkit_cli.text import plural

EXPERIMENT, TRAINING, DATA, OUTPUT, SCALE = "Experiment", "Training", "Data and device", "Output", "Scale out"
OWN = "Your own training code (docs/own-training.md)"
# Options that steer the command rather than name a config key: they say where and how runs execute.
_CONTROL = ("config", "out", "resume", "allow_version_change", "jobs", "jobs_per_gpu", "executor", "ray_address",
            "slurm_partition", "slurm_time", "slurm_gpus_per_node", "slurm_cpus_per_task", "slurm_param",
            "keep_checkpoints", "log", "all_pairs", "higher_is_better")


def _given(ctx: typer.Context) -> dict[str, Any]:
    """The options the user typed (not defaults), with `--model-param k=v` lists made into dicts."""
    from normkit_lab.study.config import parse_key_values

    given = {}
    for name, value in ctx.params.items():
        source = ctx.get_parameter_source(name)
        if source is not None and source.name != "DEFAULT" and name not in _CONTROL:
            given[name] = value
    for option, key in (("model_param", "model_params"), ("dataset_param", "dataset_params")):
        if option in given:
            given[key] = parse_key_values(given.pop(option), f"--{option.replace('_', '-')}")
    for key in ("tune", "sweep"):
        if given.get(key) == []:
            given.pop(key)
    return given


def grid_edge_warnings(table: list[dict[str, Any]]) -> list[str]:
    """One line per (cell, norm, key) whose chosen value is the smallest or largest value tried:
    the best value may lie beyond the grid, so the tuned arm may be handicapped."""
    from normkit_lab.analysis.tuning import edge_warnings

    return edge_warnings(table)


def print_tuning(table: list[dict[str, Any]], console: Any) -> None:
    """The tuning table: every candidate's mean val accuracy (or, for your own code, the metric's
    validation field) per (cell, norm), the choice marked, then a warning for every choice at an edge
    of its grid."""
    from rich.table import Table

    field = table[0].get("score_field") if table else None
    out = Table(title=f"tuning ({field or 'val accuracy'}, mean over tune seeds)")
    for column in ("cell", "norm", "values", field or "val acc %", "chosen"):
        out.add_column(column)
    for row in table:
        cell = ", ".join(f"{k}={v}" for k, v in row["cell"].items()) or "-"
        values = ", ".join(f"{k}={v}" for k, v in row["values"].items())
        if field is not None:
            value = row.get(field)
            shown = f"{value:.4g}" if value is not None else "failed"
        else:
            acc = row["val_acc"]
            shown = f"{100 * acc:.2f}" if acc > -1 else "diverged"
        out.add_row(cell, row["norm"], values, shown, "*" if row["chosen"] else "")
    console.print(out)
    for line in grid_edge_warnings(table):
        console.print(line, markup=False, soft_wrap=True)


def _flags(keys: set[str]) -> str:
    return ", ".join(f"--{k.replace('_', '-')}" for k in sorted(keys))


@one_line_errors
def compare_cmd(
    ctx: typer.Context,
    norms: Annotated[str | None, typer.Option(help="Required: norm specs to compare, comma-separated, "
                                                   "e.g. bn,bnn,gn+pn (or given by --config/--resume).",
                                              show_default=False, rich_help_panel=EXPERIMENT)] = None,
    model: Annotated[str, typer.Option(help="Model (see `normkit list`).", rich_help_panel=EXPERIMENT)]
    = D["model"],
    dataset: Annotated[str, typer.Option(help="Dataset name (see `normkit list`) or an image-folder path "
                                              "written as a path: ./folder, /abs/folder, ~/folder.",
                                         rich_help_panel=EXPERIMENT)] = D["dataset"],
    epochs: Annotated[int, typer.Option(parser=ascii_int(),
                                        help="Epochs per run (the default budget).",
                                        rich_help_panel=EXPERIMENT)] = D["epochs"],
    budget: Annotated[str | None, typer.Option(metavar="UNIT=N", help="Training length: epochs=N, steps=N "
                                                                      "(optimizer steps) or examples=N; with "
                                                                      "--sweep batch_size=... a steps budget "
                                                                      "trains every cell alike.",
                                               show_default=False, rich_help_panel=EXPERIMENT)] = D["budget"],
    seeds: Annotated[str, typer.Option(help="A count N (seeds 0..N-1), a list 0,1,5 or a range 0-4; "
                                            "every norm runs with the same seeds. auto (the default unless a "
                                            "--config file gives seeds): sequential seeds, "
                                            "3 first, then rounds (looks at 3, 5, 8, 12) only for the "
                                            "comparisons still undecided, error rates kept under the "
                                            "stopping (docs/experiments.md, Sequential seeds).",
                                       rich_help_panel=EXPERIMENT)]
    = "auto",
    max_seeds: Annotated[int | None, typer.Option(parser=ascii_int(), help="With --seeds auto: the most seeds a "
                                                  "comparison may get (default 12).", show_default=False,
                                                  rich_help_panel=EXPERIMENT)] = None,
    max_cpu_minutes: Annotated[float | None, typer.Option(help="With --seeds auto: start no further round once "
                                                          "the runs' training CPU minutes plus the next round's "
                                                          "estimate would exceed this.", show_default=False,
                                                          rich_help_panel=EXPERIMENT)] = None,
    baseline: Annotated[str | None, typer.Option(help="Norm the others are compared to (default: the first).",
                                                 rich_help_panel=EXPERIMENT)] = None,
    select: Annotated[str, typer.Option(help="Epoch a run reports its test metric at: final, or best-val (the "
                                             "epoch with the best validation accuracy). Never picked on test.",
                                        rich_help_panel=EXPERIMENT)] = D["select"],
    metric: Annotated[str, typer.Option(help="Primary metric: test_acc (image models), test_bpb (language "
                                             "models' default), test_loss, ...; see docs/experiments.md.",
                                        rich_help_panel=EXPERIMENT)] = D["metric"],
    margin: Annotated[float | None, typer.Option(help="Equivalence margin in the primary metric's unit "
                                                      "(default: the metric's, 0.5 points of accuracy).",
                                                 rich_help_panel=EXPERIMENT)] = D["margin"],
    command: Annotated[str | None, typer.Option(help="Run this program once per (norm, seed) instead of normkit's "
                                                     "own loop, e.g. \"python train.py --norm {norm} --seed {seed}\"; "
                                                     "placeholders {norm} {seed} {run_dir} {cell.KEY} {KEY}; it "
                                                     "prints `normkit: {json}` lines of metrics. No shell.",
                                                show_default=False, rich_help_panel=OWN)] = None,
    higher_is_better: Annotated[bool | None, typer.Option("--higher-is-better/--lower-is-better",
                                                          help="Direction of your program's own --metric (or write "
                                                               "--metric f1:max / loss:min).",
                                                          show_default=False, rich_help_panel=OWN)] = None,
    timeout: Annotated[float | None, typer.Option(help="Seconds a --command run may take; past it the program is "
                                                       "stopped and the run recorded failed.", show_default=False,
                                                  rich_help_panel=OWN)] = None,
    tune: Annotated[list[str] | None, typer.Option(metavar="KEY=V1,V2,...", help="Tune a numeric training key "
                                                   "per norm on validation (repeatable), e.g. lr=0.03,0.1,0.3.",
                                                   rich_help_panel=EXPERIMENT)] = None,
    tune_seeds: Annotated[str | None, typer.Option(help="Seeds of the tuning runs, disjoint from --seeds: "
                                                        "a list 7,8, a range, or "
                                                        "a count N = the N seeds after --seeds (default 2).",
                                                   rich_help_panel=EXPERIMENT)] = None,
    sweep: Annotated[list[str] | None, typer.Option(metavar="KEY=V1,V2,...", help="Compare the norms at each "
                                                    "value of a training key (repeatable; a grid), e.g. "
                                                    "batch_size=4,16,64.", rich_help_panel=EXPERIMENT)] = None,
    ablate: Annotated[bool, typer.Option(help="Also train, for each norm, the arms that switch off one of its "
                                              "stages (bnn: noise, power transform; X+pn: the proxy step) and "
                                              "report which stage carries its difference (a Holm family of its "
                                              "own).", rich_help_panel=EXPERIMENT)] = D["ablate"],
    model_param: Annotated[list[str] | None, typer.Option(metavar="KEY=VALUE", help="A model parameter "
                                                          "(repeatable), e.g. width=64.",
                                                          rich_help_panel=EXPERIMENT)] = None,
    dataset_param: Annotated[list[str] | None, typer.Option(metavar="KEY=VALUE", help="A dataset "
                                                            "parameter (repeatable).",
                                                            rich_help_panel=EXPERIMENT)] = None,
    batch_size: Annotated[int, typer.Option(parser=ascii_int(),
                                            help="Training batch size.", rich_help_panel=TRAINING)]
    = D["batch_size"],
    lr: Annotated[float | None, typer.Option(help="Peak learning rate (default: the optimizer's: sgd 0.1, "
                                                  "adamw and muon 1e-3).", rich_help_panel=TRAINING)] = D["lr"],
    optimizer: Annotated[str, typer.Option(help="sgd, adamw, or muon (Muon on the hidden matrices, AdamW on the rest).",
                                                  rich_help_panel=TRAINING)] = D["optimizer"],
    weight_decay: Annotated[float | None, typer.Option(help="Weight decay (default: sgd 5e-4, adamw and muon 0.05), "
                                                              "applied alike to every parameter of every arm, "
                                                              "norm affines and pn's extras included.",
                                                rich_help_panel=TRAINING)] = D["weight_decay"],
    norm_weight_decay: Annotated[float | None, typer.Option(help="One weight decay for every norm parameter "
                                                                 "in every arm (default: --weight-decay).",
                                                            rich_help_panel=TRAINING)] = D["norm_weight_decay"],
    weight_decay_policy: Annotated[str, typer.Option(help="uniform (every arm alike) or plugin (each norm's "
                                                          "own declared policy, e.g. pn exempts its affines).",
                                                     rich_help_panel=TRAINING)] = D["weight_decay_policy"],
    momentum: Annotated[float, typer.Option(help="SGD momentum.", rich_help_panel=TRAINING)] = D["momentum"],
    schedule: Annotated[str, typer.Option(help="cosine, step or none.", rich_help_panel=TRAINING)]
    = D["schedule"],
    step_size: Annotated[int, typer.Option(parser=ascii_int(), help="Epochs between lr drops (step schedule).",
                                                  rich_help_panel=TRAINING)] = D["step_size"],
    gamma: Annotated[float, typer.Option(help="lr factor at each drop (step schedule).",
                                         rich_help_panel=TRAINING)] = D["gamma"],
    warmup_epochs: Annotated[int, typer.Option(parser=ascii_int(),
                                               help="Linear lr warmup epochs.", rich_help_panel=TRAINING)]
    = D["warmup_epochs"],
    label_smoothing: Annotated[float, typer.Option(help="Label smoothing.", rich_help_panel=TRAINING)]
    = D["label_smoothing"],
    augment: Annotated[bool, typer.Option(help="Random crop + flip (image datasets).",
                                          rich_help_panel=TRAINING)]
    = D["augment"],
    amp: Annotated[bool, typer.Option(help="Mixed precision (CUDA).", rich_help_panel=TRAINING)] = D["amp"],
    channels_last: Annotated[bool, typer.Option(help="channels_last memory format (CUDA).",
                                                rich_help_panel=TRAINING)]
    = D["channels_last"],
    compile: Annotated[bool, typer.Option(help="torch.compile the model.", rich_help_panel=TRAINING)]
    = D["compile"],
    device: Annotated[str, typer.Option(help="auto, cpu, cuda, cuda:1, mps.", rich_help_panel=DATA)]
    = D["device"],
    data_dir: Annotated[str | None, typer.Option(help="Where datasets are stored.", rich_help_panel=DATA)]
    = D["data_dir"],
    download: Annotated[bool, typer.Option(help="Download a missing torchvision dataset.",
                                           rich_help_panel=DATA)]
    = D["download"],
    num_workers: Annotated[int, typer.Option(parser=ascii_int(), help="DataLoader workers.", rich_help_panel=DATA)]
    = D["num_workers"],
    cpu_threads: Annotated[int | None, typer.Option(help="torch CPU threads per run (default: 1 for models "
                                                         "under a million parameters on CPU, else torch's, "
                                                         "shared out between parallel runs).", rich_help_panel=DATA,
                                                    show_default=False)] = D["cpu_threads"],
    config: Annotated[Path | None, typer.Option(help="YAML file of option values (keys as the options, "
                                                     "e.g. batch_size: 64); command-line flags win.",
                                                rich_help_panel=OUTPUT)] = None,
    out: Annotated[Path | None, typer.Option(help="Results directory (default runs/<timestamp>-compare; "
                                                  "an existing one gets a -1, -2... suffix).",
                                             rich_help_panel=OUTPUT)] = None,
    resume: Annotated[Path | None, typer.Option(help="Continue an interrupted comparison in this directory "
                                                     "with its saved config; finished runs are skipped.",
                                                rich_help_panel=OUTPUT)] = None,
    allow_version_change: Annotated[bool, typer.Option(help="With --resume: continue although torch, normkit or "
                                                             "a plugin has another version than the saved runs "
                                                             "were made with (recorded in environment.json); "
                                                             "else such a resume is refused.",
                                                        rich_help_panel=OUTPUT)] = False,
    diagnostics: Annotated[bool, typer.Option(help="Also measure representations (Q-Q normality, power "
                                                   "decomposition, lambdas, noise robustness); see "
                                                   "docs/diagnostics.md.", rich_help_panel=OUTPUT)]
    = D["diagnostics"],
    all_pairs: Annotated[bool, typer.Option(help="Also compare every pair of norms (Holm over all pairs) and rank "
                                                 "them; `normkit report --all-pairs` does it for saved results.",
                                            rich_help_panel=OUTPUT)] = False,
    keep_checkpoints: Annotated[bool, typer.Option(help="Keep every run's final weights in checkpoints/ "
                                                        "(each run's per-epoch checkpoint is always removed "
                                                        "when it ends).", rich_help_panel=OUTPUT)] = False,
    log: Annotated[list[str] | None, typer.Option(metavar="KIND", help="Also log per-step loss/lr and per-epoch "
                                                  "metrics of every run: tensorboard (needs normkit-lab"
                                                  "\\[tensorboard]). Per-epoch CSV in metrics/ is always written.",
                                                  rich_help_panel=OUTPUT)] = None,
    jobs: Annotated[int | None, typer.Option(parser=ascii_int(),
                                             help="Runs at once on this machine (default: one per GPU on CUDA, "
                                                  "else 1); CPU cores are shared out between them.",
                                             rich_help_panel=SCALE, show_default=False)] = None,
    jobs_per_gpu: Annotated[int, typer.Option(parser=ascii_int(), help="Runs packed on each GPU (small models).",
                                              rich_help_panel=SCALE)] = 1,
    nproc_per_node: Annotated[int, typer.Option(parser=ascii_int(),
                                                help="Processes (GPUs) per run: above 1, each run is launched "
                                                     "with torchrun as DistributedDataParallel with synced batch "
                                                     "statistics; --batch-size stays the global batch.",
                                                rich_help_panel=SCALE)] = D["nproc_per_node"],
    executor: Annotated[str, typer.Option(help="Where runs train: local (this machine), ray (normkit-lab\\[ray]), "
                                               "slurm (normkit-lab\\[slurm], submitit); see docs/scaling.md.",
                                          rich_help_panel=SCALE)] = "local",
    ray_address: Annotated[str | None, typer.Option(help="An existing Ray cluster (default: start a local "
                                                         "instance).", rich_help_panel=SCALE)] = None,
    slurm_partition: Annotated[str | None, typer.Option(help="SLURM partition.", rich_help_panel=SCALE)] = None,
    slurm_time: Annotated[int, typer.Option(parser=ascii_int(), help="SLURM time limit per run, minutes.",
                                            rich_help_panel=SCALE)] = 60,
    slurm_gpus_per_node: Annotated[int, typer.Option(parser=ascii_int(),
                                                     help="GPUs per SLURM job (default: --nproc-per-node on "
                                                          "CUDA, else 0).", rich_help_panel=SCALE,
                                                     show_default=False)] = -1,
    slurm_cpus_per_task: Annotated[int | None, typer.Option(parser=ascii_int(),
                                                            help="CPUs per SLURM job.", rich_help_panel=SCALE,
                                                            show_default=False)] = None,
    slurm_param: Annotated[list[str] | None, typer.Option(metavar="KEY=VALUE", help="Any other submitit "
                                                          "parameter (repeatable), e.g. slurm_account=lab.",
                                                          rich_help_panel=SCALE)] = None,
) -> None:
    """Train the same model on the same data once per (norm, seed) and compare the norms.

    Reports accuracy mean ± s.e. over seeds and the difference to the baseline paired by seed.

    With a 95% t interval and paired t-test p, time/epoch, throughput, memory, params, divergences.

    Everything is saved under --out; see docs/experiments.md. A norm that raises is recorded as
    failed and the others go on (exit 1 when any run failed, 2 for bad input). Ctrl-C or SIGTERM
    keeps the finished runs and each run's last finished epoch (exit 130 or 143); --resume continues.
    --jobs, --executor ray|slurm and --nproc-per-node scale out (docs/scaling.md). --command runs
    your own training program instead of normkit's loop, with everything else unchanged
    (docs/own-training.md).
    """
    from normkit_cli import catalog_cache
    from normkit_cli.quick_check import unknown_norm

    if norms is not None:  # the names checked against the plugin catalog before torch: well under a second
        catalog = catalog_cache.read()
        if catalog is not None and (problem := unknown_norm(norms, catalog)) is not None:
            raise fail(problem)
        if catalog is None and catalog_cache.enabled():
            from normkit_cli.catalog import build_catalog

            build_catalog(shows=False)  # written now, so the next misspelling is answered without torch
    from normkit_cli.report import console as make_console
    from normkit_cli.report import show
    from normkit_lab.executors import make_executor
    from normkit_lab.runs.execute import RunOptions
    from normkit_lab.runs.loggers import check_log_kinds
    from normkit_lab.study import config as lab_config
    from normkit_lab.study.compare import check, create_store, open_store, run_compare
    from normkit_lab.study.plan import run_count
    from normkit_lab.study.progress import choose_progress

    given = _given(ctx)
    if higher_is_better is not None:
        if "metric" not in given:
            raise fail("--higher-is-better/--lower-is-better say which way --metric is better; give --metric too")
        if "," in given["metric"]:
            raise fail("--higher-is-better/--lower-is-better give one metric's direction; with several metrics "
                       "write each one's, e.g. --metric f1:max,test_wer:min")
        given["metric"] = f"{given['metric'].partition(':')[0]}:{'max' if higher_is_better else 'min'}"
    options = RunOptions(keep_checkpoints=keep_checkpoints, log=check_log_kinds(log or ()))
    scale = _executor_options(executor, jobs, jobs_per_gpu, ray_address, slurm_partition, slurm_time,
                              slurm_gpus_per_node, slurm_cpus_per_task, slurm_param)
    if allow_version_change and resume is None:
        raise fail("--allow-version-change lets --resume continue under other versions; give it with --resume")
    if resume is not None:
        if config is not None or out is not None:
            raise fail("--resume continues a directory with its saved config and files; drop --config/--out")
        fixed = set(given) - RUNTIME_KEYS
        if fixed:
            raise fail(f"--resume reuses the config saved in {str(resume)!r}; drop {_flags(fixed)} "
                       f"(only {_flags(set(RUNTIME_KEYS))} may change, and the Scale out and Output "
                       f"options that say how runs execute: --jobs, --executor, --log, --keep-checkpoints, ...)")
        cfg, store = open_store(resume, given, allow_version_change=allow_version_change,
                                warn=lambda line: typer.echo(f"warning: {line}", err=True))
        check(cfg)
        run_executor = make_executor(scale)
    else:
        if "seeds" not in given and (config is None or "seeds" not in lab_config.load_yaml(config)):
            given["seeds"] = "auto"  # compare's default: sequential seeds (the library's default stays 5 fixed)
        values = lab_config.given_values(given, config)
        cfg = lab_config.build_config(values)
        check(cfg, parallel=scale.parallel_runs)
        run_executor = make_executor(scale)  # a missing engine or a bad cluster option: before any file
        store = create_store(cfg, out)
    console = make_console()
    note = lab_config.design_note(values) if resume is None else None
    if note is not None:  # the default design's cells stop running where the user's keys replace it
        console.print(f"note: {note}", soft_wrap=True, markup=False, highlight=False)
    train = cfg.train
    n_tune, n_compare = run_count(cfg)
    cost = (f"{plural(n_tune, 'tuning run')} + {plural(n_compare, 'comparison run')}" if n_tune
            else plural(n_compare, "run"))
    unit, amount = train.budget_unit
    what = (f"with `{cfg.command}`" if cfg.command is not None
            else f"on {train.model}/{train.dataset}, {plural(amount, unit.removesuffix('s'))}")
    arms = cfg.arms[len(cfg.norms):]
    ablating = f" (and their stage ablations {', '.join(arms)})" if arms else ""
    seeds_text = (f"seeds auto (looks after {', '.join(map(str, cfg.looks))} seeds; at most" if cfg.looks
                  else f"seeds {','.join(map(str, cfg.seeds))}:")
    console.print(f"compare {', '.join(cfg.norms)}{ablating} {what}, {seeds_text} {cost}"
                  f"{')' if cfg.looks else ''} -> {store.path}", soft_wrap=True, markup=False, highlight=False)
    resume_hint = f"continue with: normkit compare --resume {store.path}"
    progress = choose_progress()
    try:
        results = run_compare(cfg, store, progress=progress, executor=run_executor, options=options,
                              on_tuned=functools.partial(print_tuning, console=console),
                              allow_version_change=allow_version_change)
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM (one_line_errors raises Terminated for it)
        progress.close()  # again: a Ctrl-C inside its start skips run_compare's close, leaving the bar's line
        saved = len(store.finished())  # open and the cursor hidden; closing twice is harmless
        typer.echo(f"interrupted: {saved} of {plural(n_tune + n_compare, 'run')} are saved in {store.path}; "
                   f"{resume_hint}", err=True)
        raise typer.Exit(interrupted_code(exc)) from None
    except Exception as exc:
        if show_tracebacks():
            raise
        if is_normkit_error(exc) or isinstance(exc, OSError):
            from normkit_lab.errors import DamagedStudyFile

            hint = "" if isinstance(exc, DamagedStudyFile) else f"; {resume_hint}"  # a resume meets it again
            raise fail(f"{exc} (finished runs are kept{hint})") from None
        typer.echo(f"error: compare stopped by an unexpected {type(exc).__name__}: {one_line(str(exc))}; "
                   f"finished runs are kept; {resume_hint}", err=True)
        raise typer.Exit(1) from None
    results.all_pairs = all_pairs
    results.also = list(cfg.further_metrics)  # --metric a,b: a table per metric, one Holm family
    show(results, store, console)
    failed = [run for run in results.runs if run.status == "failed"]
    if failed:
        culprit = "the program (its output is in runs/*/stderr.log)" if cfg.command is not None else "the norm"
        raise runs_failed([run.error or "" for run in failed], culprit, store.path)


def _executor_options(kind: str, jobs: int | None, jobs_per_gpu: int, ray_address: str | None,
                      partition: str | None, time_min: int, gpus: int, cpus: int | None,
                      params: list[str] | None) -> Any:
    """The executor's options from the Scale-out flags (submitit parameter names for SLURM)."""
    from normkit_lab.executors import ExecutorOptions
    from normkit_lab.study.config import parse_key_values

    if kind != "local" and (jobs is not None or jobs_per_gpu != 1):
        raise fail(f"--jobs and --jobs-per-gpu set runs at once on this machine; with --executor {kind} the "
                   f"cluster schedules the runs, so drop them")
    slurm: dict[str, Any] = {"timeout_min": time_min}
    if partition is not None:
        slurm["slurm_partition"] = partition
    if gpus >= 0:
        slurm["gpus_per_node"] = gpus
    if cpus is not None:
        slurm["cpus_per_task"] = cpus
    slurm.update(parse_key_values(params or [], "--slurm-param"))
    return ExecutorOptions(kind=kind, jobs=jobs, jobs_per_gpu=jobs_per_gpu, ray_address=ray_address, slurm=slurm)


def register(app: typer.Typer) -> None:
    app.command("compare")(compare_cmd)
