"""Comparing norms in the user's own training code: `--command` programs and `train=` functions.

Real programs, no mocks: tiny scripts written into the test's directory run as subprocesses of
`normkit compare` (or of `compare_norms`), report `normkit:` lines, crash, stay silent, lie or hang.
The fast tests use a pure-Python script (no torch import, a fraction of a second per run); the
slow ones train the examples in examples/own-training/ and start Ray.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from normkit_lab import ExecutorOptions, compare_norms, read_result
from normkit_lab.errors import ConfigError
from normkit_lab.records import RunId
from normkit_lab.store.results import ResultsDir
from normkit_lab.study import config as lab_config
from normkit_lab.study.progress import Progress

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples" / "own-training"
PY = sys.executable
NORMKIT = str(Path(sys.executable).with_name("normkit"))

# A training script in miniature: its accuracy depends on the norm and on seeded noise, so verdicts are
# known (bn is better than gn+pn by 5 points), and it writes what it received to {run_dir}/seen.json.
TINY = textwrap.dedent("""
    import argparse, json, os, random, sys, time
    from normkit_lab import report_metrics
    p = argparse.ArgumentParser()
    p.add_argument("--norm"); p.add_argument("--seed", type=int); p.add_argument("--run-dir")
    p.add_argument("--width", type=int, default=8); p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--sleep", type=float, default=0.0)
    a = p.parse_args()
    if a.run_dir:
        env = {k: v for k, v in os.environ.items() if k.startswith("NORMKIT_")}
        stat = open(f"/proc/{os.getppid()}/stat").read()  # the parent is normkit's supervisor: whose child is it?
        grandparent = int(stat[stat.rfind(")") + 2:].split()[1])
        parent = open(f"/proc/{grandparent}/cmdline", "rb").read().replace(b"\\0", b" ").decode()
        json.dump({"argv": sys.argv[1:], "env": env, "parent": parent}, open(os.path.join(a.run_dir, "seen.json"), "w"))
    rng = random.Random(f"{a.norm}/{a.seed}/{a.width}/{a.lr}")
    base = {"bn": 0.90}.get(a.norm, 0.85) - abs(a.lr - 0.1)
    for epoch in range(2):
        time.sleep(a.sleep)
        acc = base + 0.01 * epoch + rng.gauss(0, 0.003)
        report_metrics(epoch=epoch, val_acc=acc + rng.gauss(0, 0.001), test_acc=acc, val_loss=1 - acc)
""")

# Misbehaves on seed 1 in the way NORMKIT_TEST_MODE_<norm> says.
BAD = textwrap.dedent("""
    import json, os, sys, time
    norm, seed = sys.argv[1], int(sys.argv[2])
    mode = os.environ.get("NORMKIT_TEST_MODE_" + norm.upper(), "ok") if seed == 1 else "ok"
    if mode == "crash":
        print("loading data", file=sys.stderr)
        raise RuntimeError("CUDA out of memory (pretend)")
    if mode == "silent":
        sys.exit(0)
    if mode == "lie":
        print('normkit: {"epoch": 0, "test_acc": NaN}', flush=True)
        time.sleep(60)
    if mode == "malformed":
        print('normkit: {"epoch": 0, "test_acc": 0.9', flush=True)
        time.sleep(60)
    if mode == "hang":
        time.sleep(600)
    print("normkit: " + json.dumps({"epoch": 0, "val_acc": 0.9, "test_acc": 0.9 - 0.001 * seed}), flush=True)
""")


def quiet() -> Progress:
    return Progress()


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def compare(tmp_path: Path, norms: str, command: str, out: str = "out", **options: Any) -> Any:
    return compare_norms(norms, command=command, command_dir=str(tmp_path), out=tmp_path / out,
                         progress=quiet(), **options)


def verdicts(result: Any) -> list[tuple[str, Any]]:
    return [(row["norm"], row["verdict"]) for row in result.summary]


def numbers(result: Any) -> list[tuple[str, Any, Any]]:
    return [(row["norm"], row["metric_mean"], row["diff_mean"]) for row in result.summary]


def seen_all(store: Path, norm: str, seed: int) -> list[dict[str, Any]]:
    """What the program of each compare run of `norm` and `seed` wrote to seen.json (one per cell)."""
    prefix = RunId.of(norm, seed).slug().rsplit("-", 1)[0] + "-"  # compare-<readable norm>-s<seed>-<hash>
    return [json.loads((p / "seen.json").read_text()) for p in sorted((store / "runs").iterdir())
            if p.name.startswith(prefix)]


def seen(store: Path, norm: str, seed: int) -> dict[str, Any]:
    (got,) = seen_all(store, norm, seed)
    return got


# -- fast: the default run ---------------------------------------------------------------------------------


def test_a_tiny_script_gives_verdicts_and_keeps_its_output(tmp_path: Path) -> None:
    write(tmp_path, "tiny.py", TINY)
    result = compare(tmp_path, "bn,gn(groups=8)+pn",
                     f"{PY} tiny.py --norm {{norm}} --seed {{seed}} --run-dir {{run_dir}}", seeds=3)
    assert verdicts(result) == [("bn", "baseline"), ("gn(groups=8)+pn", "worse")]
    assert result.summary[1]["diff_mean"] == pytest.approx(-5.0, abs=0.7)  # percent points, as built-in runs
    assert {row["trainer"] for row in result.runs} == {"command"}
    assert len(result.runs) == 2 * 3 * 2  # a row per run and epoch
    # the spec reaches the program as one argument, with the values in its environment too
    got = seen(result.path, "gn(groups=8)+pn", 2)
    assert got["argv"] == ["--norm", "gn(groups=8)+pn", "--seed", "2", "--run-dir", got["env"]["NORMKIT_RUN_DIR"]]
    assert got["env"]["NORMKIT_NORM"] == "gn(groups=8)+pn" and got["env"]["NORMKIT_SEED"] == "2"
    assert Path(got["env"]["NORMKIT_RUN_DIR"]).parent == (result.path / "runs").resolve()
    run_dir = Path(got["env"]["NORMKIT_RUN_DIR"])
    assert "normkit: {" in (run_dir / "stdout.log").read_text()
    assert (run_dir / "stderr.log").is_file()
    config = yaml.safe_load((result.path / "config.yaml").read_text())
    assert config["command"].endswith("--run-dir {run_dir}")
    assert list(config["code_files"]) == ["tiny.py"] and config["code_files"]["tiny.py"].startswith("sha256:")


# normkit's own loop's recipe (TrainConfig's keys but where runs go and a command's {epochs}): never run by own code
RECIPE = {"model", "model_params", "dataset", "dataset_params", "data_dir", "download", "batch_size", "lr",
          "optimizer", "momentum", "weight_decay", "norm_weight_decay", "weight_decay_policy", "schedule",
          "warmup_epochs", "step_size", "gamma", "label_smoothing", "augment", "amp", "channels_last", "compile",
          "num_workers", "budget"}


def test_config_yaml_and_the_report_record_what_ran_not_normkits_recipe(tmp_path: Path) -> None:
    write(tmp_path, "tiny.py", TINY)
    command = f"{PY} tiny.py --norm {{norm}} --seed {{seed}} --width {{cell.width}} --lr {{lr}}"
    result = compare(tmp_path, "bn,gn+pn", command, seeds=1, sweep=["width=4,8"], tune=["lr=0.1,0.3"], tune_seeds=1,
                     margin=1.0)
    config = yaml.safe_load((result.path / "config.yaml").read_text())
    assert config["command"] == command and config["metric"] == "test_acc" and config["margin"] == 1.0
    assert config["sweep"] == {"width": [4, 8]} and config["tune"] == {"lr": [0.1, 0.3]}
    assert config["seeds"] == [0] and config["tune_seeds"] == [1]
    assert RECIPE.isdisjoint(config) and config["epochs"] == result.config["epochs"]  # {epochs}, as the program got it
    assert config == result.config
    page = (result.path / "report.html").read_text()
    assert "small-cnn" not in page and "digits" not in page and "batch_size" not in page and "momentum" not in page
    assert "tiny.py" in page
    again = lab_config.resolve({}, result.path / "config.yaml")  # reusable as --config: nothing refused
    assert again.command == command and again.sweep == {"width": [4, 8]}
    fn = compare_norms("bn,gn+pn", train=my_train, seeds=1, out=tmp_path / "fn", progress=quiet())
    assert RECIPE.isdisjoint(fn.config) and "epochs" not in fn.config  # a function is given no epochs
    assert fn.config["train_function"] == f"{__name__}:my_train"
    with pytest.raises(ConfigError, match="a train function is given none"):
        compare_norms("bn", train=my_train, epochs=3, out=tmp_path / "x", progress=quiet())


def test_a_crashing_silent_lying_malformed_or_hanging_script_is_a_failed_run_and_the_others_finish(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(tmp_path, "bad.py", BAD)
    for norm, mode in (("BNN", "crash"), ("GN", "silent"), ("LN", "lie"), ("IN", "malformed"), ("RMS", "hang")):
        monkeypatch.setenv(f"NORMKIT_TEST_MODE_{norm}", mode)
    start = time.monotonic()
    result = compare(tmp_path, "bn,bnn,gn,ln,in,rms", f"{PY} bad.py {{norm}} {{seed}}", seeds=2, timeout=3)
    assert time.monotonic() - start < 60  # the liars were stopped at their bad line, not after their sleep
    failed = {row["norm"]: row["error"] for row in result.runs if row["status"] == "failed"}
    assert set(failed) == {"bnn", "gn", "ln", "in", "rms"}
    assert "exited with status 1" in failed["bnn"] and "RuntimeError: CUDA out of memory (pretend)" in failed["bnn"]
    assert "loading data" in failed["bnn"]  # the stderr tail
    assert "reported no metrics" in failed["gn"]
    assert "test_acc=nan" in failed["ln"] and "finite" in failed["ln"]
    assert "not `normkit: ` followed by one JSON object" in failed["in"]
    assert "timeout of 3 s" in failed["rms"]
    ok = sorted((row["norm"], row["seed"]) for row in result.runs if row["status"] == "ok")
    assert ok == sorted([(n, 0) for n in ("bn", "bnn", "gn", "ln", "in", "rms")] + [("bn", 1)])
    assert all(row["failed"] == (row["norm"] != "bn") for row in result.summary)


def test_placeholders_for_cells_and_tuned_values_and_tuning_on_the_programs_validation_metric(tmp_path: Path) -> None:
    write(tmp_path, "tiny.py", TINY)
    result = compare(tmp_path, "bn,gn+pn", f"{PY} tiny.py --norm {{norm}} --seed {{seed}} --run-dir {{run_dir}} "
                     "--width {cell.width} --lr {lr}", seeds=1, sweep={"width": [4, 8]}, tune={"lr": [0.05, 0.1, 0.3]},
                     tune_seeds=1, metric="test_acc")
    assert [(row["cell"], row["values"], row["chosen"]) for row in result.tuning if row["chosen"]] == [
        ({"width": 4}, {"lr": 0.1}, True), ({"width": 4}, {"lr": 0.1}, True),
        ({"width": 8}, {"lr": 0.1}, True), ({"width": 8}, {"lr": 0.1}, True)]
    assert {row["score_field"] for row in result.tuning} == {"val_acc"}
    both = seen_all(result.path, "gn+pn", 0)
    assert sorted(got["argv"][-4:][1] for got in both) == ["4", "8"]
    for got in both:
        assert got["argv"][-4:] == ["--width", got["argv"][-3], "--lr", "0.1"]
        assert json.loads(got["env"]["NORMKIT_CELL"]) == {"width": int(got["argv"][-3])}
        assert got["env"]["NORMKIT_TUNED_LR"] == "0.1" and got["env"]["NORMKIT_CELL_WIDTH"] == got["argv"][-3]


def test_a_lower_is_better_metric_of_the_program_with_its_margin(tmp_path: Path) -> None:
    write(tmp_path, "tiny.py", TINY)
    result = compare(tmp_path, "bn,gn+pn", f"{PY} tiny.py --norm {{norm}} --seed {{seed}}", seeds=3,
                     metric="val_loss:min", margin=0.01)
    assert result.config["metric"] == "val_loss"  # a name normkit knows keeps its own direction
    result = compare(tmp_path, "bn,gn+pn", f"{PY} tiny.py --norm {{norm}} --seed {{seed}}", out="own", seeds=1,
                     metric="train_error:min", margin=0.01)
    assert "never reported train_error" in result.runs[0]["error"]
    with pytest.raises(ConfigError, match="give the equivalence margin"):
        compare(tmp_path, "bn,gn+pn", f"{PY} tiny.py", out="x", metric="f1:max")
    with pytest.raises(ConfigError, match="unknown metric 'f1'.*f1:max"):
        compare(tmp_path, "bn,gn+pn", f"{PY} tiny.py", out="x", metric="f1")


def test_a_changed_script_is_refused_on_resume_and_an_unchanged_one_reruns_the_failed_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = write(tmp_path, "bad.py", BAD)
    monkeypatch.setenv("NORMKIT_TEST_MODE_BNN", "crash")
    first = compare(tmp_path, "bn,bnn", f"{PY} bad.py {{norm}} {{seed}}", seeds=2)
    assert [row["status"] for row in first.runs].count("failed") == 1
    script.write_text(BAD + "# edited\n")
    with pytest.raises(ConfigError, match="bad.py changed since this comparison started"):
        compare_norms("bn,bnn", resume=first.path, progress=quiet())
    script.write_text(BAD)
    monkeypatch.delenv("NORMKIT_TEST_MODE_BNN")
    again = compare_norms("bn,bnn", resume=first.path, progress=quiet())
    assert sorted((row["norm"], row["seed"], row["status"]) for row in again.runs)[-2:] == [
        ("bnn", 1, "failed"), ("bnn", 1, "ok")]  # the failed attempt stays in runs.jsonl; the summary uses the retry
    assert all(row["failed"] == 0 and row["ok"] == 2 for row in again.summary)


@pytest.mark.parametrize(("command", "message"), [
    ("python train.py --norm {nrom}", "placeholder {nrom} in the command is not one of {norm}, {seed}"),
    ("python train.py --width {cell.width}", "cell.KEY needs --sweep KEY="),
    ("pytohn train.py", "program 'pytohn' of the command is not on PATH"),
    ("python 'train.py", "cannot be split into arguments"),
    ("", "command must be a command line"),
])
def test_a_bad_command_is_one_line_before_any_run(tmp_path: Path, command: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("{", r"\{").replace("}", r"\}").replace("(", r"\(")):
        compare(tmp_path, "bn,bnn", command)
    assert not (tmp_path / "out").exists()


def test_a_setting_of_normkits_own_loop_is_refused_with_a_command(tmp_path: Path) -> None:
    with pytest.raises(ConfigError,
                       match=r"lr is a setting of normkit's own training loop.*--tune lr=\.\.\. with \{lr\}"):
        compare(tmp_path, "bn,bnn", f"{PY} tiny.py --norm {{norm}}", lr=0.1)
    with pytest.raises(ConfigError, match="model is a setting"):
        compare_norms("bn,bnn", train=my_train, model="resnet18", out=tmp_path / "x", progress=quiet())


def test_cli_help_shows_command_and_a_bad_placeholder_exits_2(tmp_path: Path) -> None:
    env = {**os.environ, "COLUMNS": "120"}
    shown = subprocess.run([NORMKIT, "compare", "--help"], capture_output=True, text=True, env=env, timeout=120)
    assert shown.returncode == 0
    for flag in ("--command", "--higher-is-better", "--lower-is-better", "--timeout"):
        assert flag in shown.stdout
    bad = subprocess.run([NORMKIT, "compare", "--norms", "bn,bnn", "--command", "python t.py {nrom}"],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert bad.returncode == 2 and bad.stderr.startswith("error: placeholder {nrom}") and "Traceback" not in bad.stderr


def my_train(norm: str, seed: int, *, cell: dict[str, Any], report: Any) -> None:
    """A train= function: importable at the top level of this module, so worker processes find it."""
    import random

    rng = random.Random(f"{norm}/{seed}/{cell.get('width')}")
    for epoch in range(2):
        acc = {"bn": 0.9}.get(norm, 0.85) + 0.01 * epoch + rng.gauss(0, 0.003)
        report(epoch=epoch, val_acc=acc, test_acc=acc)


def failing_train(norm: str, seed: int, *, cell: dict[str, Any], report: Any) -> None:
    if norm == "bnn":
        report(epoch=0, test_acc=97.1)  # percent, not a fraction: refused at the call
    report(epoch=0, test_acc=0.9)


def test_a_train_function_in_this_process(tmp_path: Path) -> None:
    result = compare_norms("bn,gn+pn", train=my_train, seeds=3, metric="test_acc", out=tmp_path / "fn",
                           progress=quiet())
    assert verdicts(result) == [("bn", "baseline"), ("gn+pn", "worse")]
    assert result.config["train_function"] == f"{__name__}:my_train"
    assert list(result.config["code_files"]) == [str(Path(__file__).resolve())]
    swept = compare_norms("bn,gn+pn", train=my_train, seeds=1, out=tmp_path / "swept", progress=quiet(),
                          sweep={"width": [4, 8]})
    by_cell = {(row["cell"]["width"], row["norm"]): row["metric_mean"] for row in swept.summary}
    assert by_cell[(4, "bn")] != by_cell[(8, "bn")]  # the function saw the cell's width
    bad = compare_norms("bn,bnn", train=failing_train, seeds=1, out=tmp_path / "bad", progress=quiet())
    (error,) = [row["error"] for row in bad.runs if row["status"] == "failed"]
    assert "test_acc=97.1" in error and "fractions in [0, 1]" in error


# -- slow: parallel, Ray, killed compares, the examples ----------------------------------------------------


def _cli(tmp_path: Path, *args: str, **kwargs: Any) -> subprocess.Popen[str]:
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "COLUMNS": "120"}
    env.pop("RAY_ADDRESS", None)
    return subprocess.Popen([NORMKIT, "compare", *args], cwd=tmp_path, env=env, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, **kwargs)


def _summary(path: Path) -> list[tuple[str, Any, Any, Any]]:
    rows = json.loads((path / "summary.json").read_text())
    return [(r["norm"], r["verdict"], r["metric_mean"], r["diff_mean"]) for r in rows]


@pytest.mark.xdist_group("ray")
@pytest.mark.slow
def test_sequential_jobs_2_and_ray_give_identical_verdicts(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    write(tmp_path, "tiny.py", TINY)
    command = f"{PY} tiny.py --norm {{norm}} --seed {{seed}} --run-dir {{run_dir}}"
    summaries = {}
    for name, scale in (("seq", []), ("jobs2", ["--jobs", "2"]), ("ray", ["--executor", "ray"])):
        proc = _cli(tmp_path, "--norms", "bn,gn+pn", "--seeds", "3", "--command", command, "--out", name, *scale)
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err
        summaries[name] = _summary(tmp_path / name)
    assert summaries["seq"] == summaries["jobs2"] == summaries["ray"]
    assert [v for _, v, _, _ in summaries["seq"]] == ["baseline", "worse"]
    assert "ray::" in seen(tmp_path / "ray", "bn", 0)["parent"]  # the program's parent was a Ray worker
    assert "ray::" not in seen(tmp_path / "seq", "bn", 0)["parent"]


@pytest.mark.xdist_group("ray")
@pytest.mark.slow
def test_a_train_function_in_a_local_pool_and_on_ray(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("ray")
    monkeypatch.setenv("PYTHONPATH", str(REPO))  # worker processes import this module to find my_train
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    results = [compare_norms("bn,gn+pn", train=my_train, seeds=3, out=tmp_path / name, progress=quiet(),
                             executor=executor)
               for name, executor in (("seq", None), ("pool", ExecutorOptions(jobs=2)),
                                      ("ray", ExecutorOptions(kind="ray")))]
    assert numbers(results[0]) == numbers(results[1]) == numbers(results[2])


@pytest.mark.xdist_group("signals")
@pytest.mark.slow
def test_a_killed_compare_resumes_and_gives_the_uninterrupted_verdicts(tmp_path: Path) -> None:
    write(tmp_path, "tiny.py", TINY)
    command = f"{PY} tiny.py --norm {{norm}} --seed {{seed}} --run-dir {{run_dir}} --sleep 0.5"
    whole = _cli(tmp_path, "--norms", "bn,gn+pn", "--seeds", "3", "--command", command, "--out", "whole")
    assert whole.wait(timeout=600) == 0
    proc = _cli(tmp_path, "--norms", "bn,gn+pn", "--seeds", "3", "--command", command, "--out", "killed")
    runs = tmp_path / "killed" / "runs.jsonl"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and (not runs.exists() or len(runs.read_text().splitlines()) < 4):
        time.sleep(0.1)  # two runs (two epochs each) recorded: the third is training
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    time.sleep(1)
    recorded = {(json.loads(line)["norm"], json.loads(line)["seed"]) for line in runs.read_text().splitlines()}
    assert 2 <= len(recorded) < 6
    leftover = subprocess.run(["pgrep", "-f", f"{tmp_path}/killed/runs"], capture_output=True, text=True)
    assert leftover.stdout == ""  # the program died with normkit (its parent-death signal)
    resumed = _cli(tmp_path, "--resume", "killed")
    out, err = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, err
    assert "already finished" in out
    assert _summary(tmp_path / "killed") == _summary(tmp_path / "whole")


def _compare_example(tmp_path: Path, script: str, *extra: str) -> list[tuple[str, Any, Any, Any]]:
    command = f"{PY} {EXAMPLES / script} --norm {{norm}} --seed {{seed}} --epochs 2"
    proc = _cli(tmp_path, "--norms", "bn,gn(groups=4)+pn", "--seeds", "3", "--command", command, "--metric",
                "test_acc", "--out", "out", *extra)
    _, err = proc.communicate(timeout=900)
    assert proc.returncode == 0, err
    store = ResultsDir.open(tmp_path / "out")
    assert [run.status for run in store.runs()] == ["ok"] * 6, [run.error for run in store.runs()]
    return _summary(tmp_path / "out")


@pytest.mark.slow
def test_the_plain_pytorch_example_compared_with_command(tmp_path: Path) -> None:
    summary = _compare_example(tmp_path, "train.py", "--jobs", "2")
    assert [norm for norm, *_ in summary] == ["bn", "gn(groups=4)+pn"]
    assert all(50 < mean < 100 for _, _, mean, _ in summary)  # it trained: digits accuracy in percent
    assert summary[1][1] in ("better", "worse", "equivalent", "inconclusive")


@pytest.mark.slow
def test_the_lightning_example_compared_with_command(tmp_path: Path) -> None:
    pytest.importorskip("lightning")
    summary = _compare_example(tmp_path, "train_lightning.py", "--jobs", "2")
    assert all(50 < mean < 100 for _, _, mean, _ in summary)


# -- round 2: what a second review found -------------------------------------------------------------------

# Reports what NORMKIT_TEST_LINE_<norm> says, verbatim (with {run_dir} and {python} behaviour on the side).
SAYS = textwrap.dedent("""
    import json, os, sys
    norm = sys.argv[1]
    line = os.environ.get("NORMKIT_TEST_LINE_" + norm.upper())
    if line == "overlong":
        sys.stdout.write('normkit: {"epoch": 0, "test_acc": 0.9, "pad": "' + "x" * (3 << 20) + '"}\\n')
    elif line is not None:
        print(line)
    else:
        print("normkit: " + json.dumps({"epoch": 0, "val_acc": 0.9, "test_acc": 0.9}))
    sys.stdout.flush()
""")


@pytest.mark.parametrize(("line", "message"), [
    ('normkit: {"epoch": 0, "test_acc": 0.5, "test_acc": 0.9}', "reported 'test_acc' twice in one line"),
    ('normkit: {"epoch": 0, "test_acc": 0.9, "steps": 1' + "0" * 400 + "}", "steps=1000"),
    ('normkit: {"epoch": 0, "test_acc": 0.9, "steps": 1' + "0" * 5000 + "}", "not `normkit: ` followed by one JSON"),
    ('normkit:{"epoch": 0, "test_acc": 0.9}', "the line 'normkit:{\"epoch\": 0"),
    ("overlong", "longer than 1,048,576 bytes"),
])
def test_a_report_that_cannot_be_read_one_way_is_a_failed_run_with_the_reason(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, line: str, message: str) -> None:
    """A duplicate key (JSON keeps the last), an integer beyond a float, a near-miss prefix and an endless
    line each fail the run with their own one-line reason, never a raw Python error."""
    write(tmp_path, "says.py", SAYS)
    monkeypatch.setenv("NORMKIT_TEST_LINE_BNN", line)
    result = compare(tmp_path, "bn,bnn", f"{PY} says.py {{norm}}", seeds=1)
    (failed,) = [row for row in result.runs if row["status"] == "failed"]
    assert failed["norm"] == "bnn" and message in failed["error"], failed["error"]
    assert "Error:" not in failed["error"].partition(";")[0]  # no Python exception's name in the reason


def test_a_retry_that_reports_nothing_is_failed_not_ok_with_the_earlier_attempts_epochs(tmp_path: Path) -> None:
    """The first attempt reports epoch 0 and hangs (stopped at the timeout: failed); the retry on resume
    prints nothing and exits 0. It must stay failed: the old attempt's epoch 0 is not this run's result."""
    write(tmp_path, "once.py", textwrap.dedent("""
        import os, sys, time
        marker = os.path.join(os.environ["NORMKIT_RUN_DIR"], "tried")
        if os.path.exists(marker):
            sys.exit(0)
        open(marker, "w").close()
        print('normkit: {"epoch": 0, "val_acc": 0.9, "test_acc": 0.9}', flush=True)
        time.sleep(60)
    """))
    first = compare(tmp_path, "bn,bnn", f"{PY} once.py", seeds=1, timeout=2)
    assert [row["status"] for row in first.runs] == ["failed", "failed"]
    again = compare_norms("bn,bnn", resume=first.path, progress=quiet())
    retries = again.runs[2:]
    assert [row["status"] for row in retries] == ["failed", "failed"]
    assert all("reported no metrics" in row["error"] and "earlier attempt" in row["error"] for row in retries)


def test_the_python_placeholder_is_normkits_interpreter(tmp_path: Path) -> None:
    """Also: modules of the program's directory named like the standard library's never reach normkit's
    supervisor of the program (which starts there)."""
    write(tmp_path, "tiny.py", TINY)
    for shadow in ("resource.py", "ctypes.py", "select.py"):
        write(tmp_path, shadow, "raise SystemExit('imported the project\'s own module')\n")
    result = compare(tmp_path, "bn,bnn", "{python} tiny.py --norm {norm} --seed {seed} --run-dir {run_dir}", seeds=1)
    assert [row["status"] for row in result.runs] == ["ok"] * 4
    got = seen(result.path, "bnn", 0)
    banner = (Path(got["env"]["NORMKIT_RUN_DIR"]) / "stdout.log").read_text().splitlines()[0]
    assert json.loads(banner.split(" ", 4)[4])[0] == sys.executable  # `--- normkit: DATE TIME [argv...]`
    assert yaml.safe_load((result.path / "config.yaml").read_text())["command"].startswith("{python} tiny.py")


def test_compare_exits_1_with_a_one_line_summary_when_runs_failed_and_0_when_none_did(tmp_path: Path) -> None:
    write(tmp_path, "bad.py", BAD)
    env = {**os.environ, "NORMKIT_TEST_MODE_BNN": "crash"}
    argv = [NORMKIT, "compare", "--norms", "bn,bnn", "--seeds", "2", "--command", f"{PY} bad.py {{norm}} {{seed}}"]
    failed = subprocess.run([*argv, "--out", "failed"], capture_output=True, text=True, env=env, cwd=tmp_path,
                            timeout=300)
    assert failed.returncode == 1, failed.stderr
    assert failed.stderr.splitlines()[-1].startswith("1 run failed (first: bnn failed: exited with status 1")
    assert (tmp_path / "failed" / "summary.json").is_file()  # the results are written all the same
    env["NORMKIT_TEST_MODE_BNN"] = "ok"
    fine = subprocess.run([*argv, "--out", "fine"], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert fine.returncode == 0 and "failed" not in fine.stderr, fine.stderr


ECHO = textwrap.dedent("""
    import json, os, sys
    json.dump(sys.argv[1:], open(os.path.join(os.environ["NORMKIT_RUN_DIR"], "argv.json"), "w"))
    print('normkit: {"epoch": 0, "val_acc": 0.9, "test_acc": 0.9}')
""")


def test_sweep_and_tune_values_reach_the_program_as_typed(tmp_path: Path) -> None:
    """Free keys are the program's: no YAML 1.1 reading (`010` is not 8, `1:30` not 90, `on` not true), no
    scanner error for `` `id` `` or `{a`; numbers written as Python writes them stay numbers for a function."""
    write(tmp_path, "echo.py", ECHO)
    typed = ["010", "1:30", "0x1F", "on", "&a b", "`id`", "@x", "{a", "nan", "1e-3", "8", "0.05"]
    result = compare(tmp_path, "bn,bnn", f"{PY} echo.py {{cell.x}} {{y}}", seeds=1,
                     sweep=f"x={','.join(typed)}", tune="y=010,7", tune_seeds=1)
    compare_runs = [row for row in result.runs if row["phase"] == "compare"]
    got = sorted(json.loads((result.path / "runs" / RunId.of_row(row).slug() / "argv.json").read_text())[0]
                 for row in compare_runs if row["norm"] == "bn")
    assert got == sorted(typed)
    assert {json.dumps(row["cell"]["x"]) for row in compare_runs} >= {'8', '0.05', '"010"', '"nan"', '"1e-3"'}
    assert all(row["status"] == "ok" for row in result.runs)
    assert {row["tuned"]["y"] for row in result.runs if row["phase"] == "tune"} == {"010", 7}
    with pytest.raises(ConfigError, match="not a finite number"):
        compare(tmp_path, "bn,bnn", f"{PY} echo.py {{cell.x}}", out="nan", sweep={"x": [float("nan"), 1.0]})


class UnprintableError(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text for you")


def misbehaving_train(norm: str, seed: int, *, cell: dict[str, Any], report: Any) -> None:
    """bnn moves the working directory; gn, ln and in raise what must be their run's failure only."""
    report(epoch=0, val_acc=0.9, test_acc=0.9)
    if norm == "bnn":
        os.makedirs("elsewhere", exist_ok=True)
        os.chdir("elsewhere")
    elif norm == "gn":
        raise PermissionError(13, "Permission denied", "/data/train.bin")
    elif norm == "ln":
        raise UnprintableError
    elif norm == "in":
        raise GeneratorExit


def test_a_train_function_that_chdirs_or_raises_anything_fails_only_its_run_with_a_traceback(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = compare_norms("bn,bnn,gn,ln,in", train=misbehaving_train, seeds=1, metric="test_acc", out="fn",
                           progress=quiet())
    assert Path.cwd() == tmp_path and not list((tmp_path / "elsewhere").iterdir())
    status = {row["norm"]: (row["status"], row.get("error")) for row in result.runs}
    assert status["bn"][0] == status["bnn"][0] == "ok"
    assert status["gn"][1].startswith("gn failed: PermissionError: [Errno 13] Permission denied: '/data/train.bin'")
    assert status["ln"][1].startswith("ln failed: UnprintableError: (its message could not be printed)")
    assert status["in"][1].startswith("in failed: GeneratorExit: (no message)")
    for norm in ("gn", "ln", "in"):
        where = status[norm][1].rpartition("(traceback: ")[2].rstrip(")")
        assert "misbehaving_train" in (tmp_path / "fn" / where).read_text()
    again = read_result("fn")  # a path as text
    assert again.path == Path("fn") and len(again.runs) == 5


def busy_train(norm: str, seed: int, *, cell: dict[str, Any], report: Any) -> None:
    """Spends about 0.3 s of CPU, reporting three epochs."""
    end = time.process_time() + 0.3
    while time.process_time() < end:
        pass
    for epoch in range(3):
        report(epoch=epoch, val_acc=0.9, test_acc=0.9 - 0.01 * epoch, f1=0.5)


BUSY = textwrap.dedent("""
    import subprocess, sys, time
    subprocess.run([sys.executable, "-c", "import time\\nend = time.process_time() + 0.3\\n"
                    "while time.process_time() < end: pass"])  # CPU spent by a child counts too
    for epoch in range(3):
        print('normkit: {"epoch": %d, "val_acc": 0.9, "test_acc": %g, "f1": 0.5}' % (epoch, 0.9 - 0.01 * epoch))
""")


def test_wall_and_cpu_time_are_recorded_and_reported_metrics_reach_tensorboard(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from normkit_lab import RunOptions

    write(tmp_path, "busy.py", BUSY)
    tensorboard = RunOptions(log=("tensorboard",))
    by_command = compare(tmp_path, "bn,bnn", f"{PY} busy.py", seeds=1, run_options=tensorboard)
    by_function = compare_norms("bn,bnn", train=busy_train, seeds=1, out=tmp_path / "fn", progress=quiet(),
                                run_options=tensorboard)
    for result, kind in ((by_command, "command"), (by_function, "function")):
        last = [row for row in result.runs if "extras" in row]
        assert len(last) == 2
        for row in last:
            timing = row["extras"][kind]
            assert timing["cpu_s"] >= 0.25 and timing["wall_s"] >= timing["cpu_s"] * 0.5, timing
        logs = sorted((result.path / "tensorboard").iterdir())
        assert len(logs) == 2
        events = EventAccumulator(str(logs[0]))
        events.Reload()
        assert {"epoch/test_acc", "epoch/f1", "epoch/val_acc"} <= set(events.Tags()["scalars"])
        steps = [(e.step, round(e.value, 4)) for e in events.Scalars("epoch/test_acc")]
        assert steps == [(0, 0.9), (1, 0.89), (2, 0.88)]


# Reports accuracies in percent, as timm's train.py does (report_metrics too, when the comparison says so).
PERCENT = TINY.replace("report_metrics(epoch=epoch, val_acc=acc + rng.gauss(0, 0.001), test_acc=acc, val_loss=1 - acc)",
                       "report_metrics(epoch=epoch, val_acc=100 * (acc + rng.gauss(0, 0.001)), test_acc=100 * acc, "
                       "val_loss=1 - acc)")


def test_a_program_reporting_percent_is_compared_with_an_explicit_recorded_scale(tmp_path: Path) -> None:
    assert PERCENT != TINY
    write(tmp_path, "tiny.py", TINY)
    write(tmp_path, "percent.py", PERCENT)
    fractions = compare(tmp_path, "bn,gn+pn", f"{PY} tiny.py --norm {{norm}} --seed {{seed}}", seeds=3)
    refused = compare(tmp_path, "bn,gn+pn", f"{PY} percent.py --norm {{norm}} --seed {{seed}}", out="refused", seeds=1)
    assert all("--metric test_acc:percent" in row["error"] for row in refused.runs)  # the way out, named
    percent = compare(tmp_path, "bn,gn+pn", f"{PY} percent.py --norm {{norm}} --seed {{seed}}", out="percent",
                      seeds=3, metric="test_acc:percent")
    assert percent.config["metric"] == "test_acc:percent"  # the scale is recorded with the metric
    assert verdicts(percent) == verdicts(fractions) == [("bn", "baseline"), ("gn+pn", "worse")]
    for mine, theirs in zip(percent.summary, fractions.summary, strict=True):  # percent points, margin 0.5 alike
        for key in ("metric_mean", "diff_mean", "margin", "mde", "best_acc_mean"):
            assert mine[key] == (theirs[key] if theirs[key] is None else pytest.approx(theirs[key], abs=1e-9)), key
    assert {row["test_acc"] <= 1 for row in percent.runs} == {True}  # runs.jsonl holds fractions
    with pytest.raises(ConfigError, match="only the accuracies normkit knows"):
        compare(tmp_path, "bn,gn+pn", f"{PY} percent.py", out="x", metric="test_loss:percent")


def test_fractions_under_a_percent_metric_fail_the_run_in_one_line_and_percent_on_a_further_metric_applies(
        tmp_path: Path) -> None:
    """Issue 41: `--metric test_acc:percent` with a program that reports fractions (every accuracy <= 1)
    failed no run and gave "0.90 vs 0.80 %"; `:percent` said on a second metric was not applied."""
    write(tmp_path, "tiny.py", TINY)
    write(tmp_path, "percent.py", PERCENT)
    command = "{py} {script} --norm {{norm}} --seed {{seed}}"
    fractions = compare(tmp_path, "bn,gn+pn", command.format(py=PY, script="tiny.py"), out="fractions", seeds=1,
                        metric="test_acc:percent")
    assert {row["status"] for row in fractions.runs} == {"failed"}
    assert all("reported every accuracy at most 1" in row["error"] and "drop :percent" in row["error"]
               and "\n" not in row["error"] for row in fractions.runs)
    second = compare(tmp_path, "bn,gn+pn", command.format(py=PY, script="percent.py"), out="second", seeds=3,
                     metric="val_loss,test_acc:percent")
    assert {row["status"] for row in second.runs} == {"ok"}
    assert second.config["metric"] == "val_loss,test_acc:percent"  # every metric kept, with its scale
    assert {row["test_acc"] <= 1 for row in second.runs} == {True}  # divided by 100 as recorded


NOISY = textwrap.dedent("""
    import sys
    print('normkit: {"epoch": 0, "val_acc": 0.9, "test_acc": 0.9}', flush=True)
    for _ in range(4000):
        print("x" * 99, flush=True)  # 400 kB of log, past the file size limit of the test
    print('normkit: {"epoch": 1, "val_acc": 0.9, "test_acc": 0.9}', flush=True)
""")


def test_a_full_disk_while_a_program_prints_stops_in_one_line_naming_the_file_and_records_nothing(
        tmp_path: Path) -> None:
    """Issue 41: stdout.log on a full disk gave a traceback from the reader thread. RLIMIT_FSIZE stands in for
    the full disk (Python ignores SIGXFSZ, so a write past it fails with EFBIG, as ENOSPC would)."""
    import resource

    write(tmp_path, "noisy.py", NOISY)

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, resource.RLIM_INFINITY))

    proc = subprocess.run([NORMKIT, "compare", "--norms", "bn", "--seeds", "1", "--command", f"{PY} noisy.py",
                           "--out", "out"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          preexec_fn=limit)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr and "Exception in thread" not in proc.stderr, lines
    assert "stdout.log" in lines[0] and "File too large" in lines[0] and "--resume" in lines[0], lines
    assert ResultsDir(tmp_path / "out").rows() == []  # the machine's failure: nothing recorded, resume retries
