"""Everything a user can throw at the CLI gets one `error:` line, exit 2, no traceback, and leaves
the working and results directories untouched; tracebacks only when asked for."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

import normkit
from normkit.stages import Step
from normkit.testing import temporary_plugin
from normkit_cli.app import app
from normkit_cli.text import plural
from normkit_lab.records import EpochRecord, RunResult
from normkit_lab.store.results import ResultsDir, run_rows
from normkit_lab.study.config import build_config, save_yaml

runner = CliRunner()
BOMB = "norms: [bn]\na: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 10)}]\n" for i in range(8))


def tree_hash(root: Path) -> str:
    """A hash of every path (links included, not followed) and file content under `root`."""
    h = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        h.update(str(path.relative_to(root)).encode())
        if path.is_symlink():
            h.update(b"->" + os.readlink(path).encode())
        elif path.is_file():
            h.update(path.read_bytes())
    return h.hexdigest()


def assert_one_line_error(result, *needles: str) -> None:
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output + result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


BAD_COMPARE = [
    (["--lr", "nan"], "lr must be"),
    (["--lr", "inf"], "lr must be"),
    (["--momentum", "nan"], "momentum must be"),
    (["--gamma", "inf"], "gamma must be"),
    (["--weight-decay", "-inf"], "weight_decay must be"),
    (["--label-smoothing", "nan"], "label_smoothing must be"),
    (["--seeds", "10000000000"], "at most 1,000"),
    (["--seeds", "4294967296"], "at most 1,000"),
    (["--seeds", "0,4294967296"], "above 4294967295"),
    (["--epochs", "100000000"], "epochs must be an integer in [1, 10,000]"),
    (["--seeds", "\u0663"], "seeds must be a count"),  # ARABIC-INDIC DIGIT THREE: int() reads it as 3
    (["--seeds", "0,\u0661"], "seeds must be a count"),
    (["--batch-size", "100000000"], "batch_size must be"),
    (["--model-param", "width=[1"], "--model-param width=... is not valid YAML"),
    (["--model-param", "width={a: [}"], "is not valid YAML"),
    (["--model-param", "width=.nan"], "not finite"),
    (["--model-param", "width=.inf"], "not finite"),
    (["--model-param", "width=1000000"], "parameters; at most"),
    (["--model-param", "depth=100000"], "depth in [1, 1000]"),
    (["--model-param", "width=99999999999999"], "beyond"),
    (["--dataset", "fake", "--dataset-param", "image_size=1"], "at least 2x2"),
    (["--dataset", "fake", "--dataset-param", "size=1000000000"], "size <= 1,000,000"),
    (["--dataset", "fake", "--dataset-param", "image_size=.nan"], "not finite"),
    (["--dataset", "./no-such-folder"], "does not exist"),
    (["--config", "{tmp}/nan.yaml"], "lr must be"),
    (["--config", "{tmp}/bomb.yaml"], "YAML values"),
    (["--config", "{tmp}/binary.yaml"], "not UTF-8"),
    (["--config", "{tmp}/multiline.yaml"], "not valid YAML"),
]


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "nan.yaml").write_text("norms: [bn]\nlr: .nan\n")
    (tmp_path / "bomb.yaml").write_text(BOMB)
    (tmp_path / "binary.yaml").write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe\x00")
    (tmp_path / "multiline.yaml").write_text("norms: [bn\n  epochs: {\n")
    return tmp_path


@pytest.mark.parametrize(("args", "needle"), BAD_COMPARE, ids=[" ".join(a) for a, _ in BAD_COMPARE])
def test_bad_compare_input_is_one_line_and_writes_nothing(workdir, args, needle):
    before = tree_hash(workdir)
    args = [a.replace("{tmp}", str(workdir)) for a in args]
    result = runner.invoke(app, ["compare", "--dataset", "digits", "--norms", "bn", *args, "--out",
                                 str(workdir / "out")])
    assert_one_line_error(result, needle)
    assert tree_hash(workdir) == before


@pytest.mark.parametrize("args", [["compare", "--epochs", "\u0663"], ["compare", "--batch-size", "\uff16\uff14"],
                                  ["compare", "--jobs", "1_0"], ["diagnose", "bn", "--depth", "\u0663"],
                                  ["bench", "--repeats", "\u0665"], ["show", "bn", "--channels", "\u0663"]])
def test_integer_options_take_ascii_digits_only(tmp_path, args):
    """int() reads ARABIC-INDIC or fullwidth digits and underscores; every integer option refuses them."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", "from normkit_cli.app import main; main()", *args,
                           *(["--out", str(tmp_path / "out")] if args[0] == "compare" else [])],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(f"error: Invalid value for '{args[-2]}'") and proc.stderr.count("\n") == 1
    assert "digits 0-9" in proc.stderr and list(tmp_path.iterdir()) == []


# -- tampered results directories ---------------------------------------------------------------

RECORD = EpochRecord(0, 1.0, 0.5, 0.9, 0.6, None, 0.5, 100.0, 10.0, 0.1)
ENV = {"host": "h", "torch_version": "2", "device": "cpu"}


def results_dir(root: Path) -> Path:
    cfg = build_config({"dataset": "digits", "norms": "bn,ln", "seeds": "2", "epochs": 1, "batch_size": 128,
                        "model_params": {"depth": 2}})
    store = ResultsDir.create(root / "res", save_yaml(cfg), {"python": "3"})
    for norm in ("bn", "ln"):
        store.append_run(RunResult(norm, 0, "ok", [RECORD], 10), ENV)
    return store.path


def _append(text: bytes):
    def tamper(d: Path) -> None:
        with (d / "runs.jsonl").open("ab") as f:
            f.write(text)
    return tamper


def _replace(name: str, data: bytes):
    def tamper(d: Path) -> None:
        (d / name).write_bytes(data)
    return tamper


def _dangling_link(d: Path) -> None:
    (d / "runs.jsonl").unlink()
    os.symlink(d.parent / "elsewhere.jsonl", d / "runs.jsonl")


TAMPERED = {
    "row not an object": (_append(b"[1, 2, 3]\n"), "runs.jsonl:3 is a JSON list"),
    "row lacks keys": (_append(b'{"norm": "bn", "seed": 1}\n'), "runs.jsonl:3 lacks"),
    "row wrong type": (_append(json.dumps({**run_rows(RunResult("bn", 1, "ok", [RECORD], 10), ENV)[0],
                                           "val_acc": "high"}).encode() + b"\n"), "has val_acc 'high'"),
    "row binary": (_append(b"\x00\xff\xfe\x89\n"), "runs.jsonl:3 is not UTF-8"),
    "row not json": (_append(b"{oops\n"), "runs.jsonl:3 is not a JSON row"),
    "config not yaml": (_replace("config.yaml", b"norms: [bn\n"), "config.yaml"),
    "config binary": (_replace("config.yaml", b"\xff\xd8\xff\xe0binary"), "not UTF-8"),
    "config bomb": (_replace("config.yaml", BOMB.encode()), "YAML values"),
    "dangling runs.jsonl link": (_dangling_link, "is a symbolic link"),
}


@pytest.mark.parametrize("command", ["report", "resume"])
@pytest.mark.parametrize("case", list(TAMPERED))
def test_tampered_results_directory_is_one_line_and_untouched(tmp_path, monkeypatch, command, case):
    monkeypatch.chdir(tmp_path)
    d = results_dir(tmp_path)
    tamper, needle = TAMPERED[case]
    tamper(d)
    before = tree_hash(tmp_path)
    args = ["report", str(d)] if command == "report" else ["compare", "--resume", str(d)]
    result = runner.invoke(app, args)
    assert_one_line_error(result, needle)
    assert tree_hash(tmp_path) == before
    assert not (tmp_path / "elsewhere.jsonl").exists()


@pytest.mark.parametrize("env_text", [b"{broken", b"[1]", b"\xff\xfe"])
def test_broken_environment_json_in_a_merge_is_one_line(tmp_path, monkeypatch, env_text):
    monkeypatch.chdir(tmp_path)
    a = results_dir(tmp_path / "a")
    (a / "environment.json").write_bytes(env_text)
    b = results_dir(tmp_path / "b")
    rows = [json.loads(line) for line in (b / "runs.jsonl").read_text().splitlines()]
    (b / "runs.jsonl").write_text("".join(json.dumps({**r, "seed": 1}) + "\n" for r in rows))
    before = tree_hash(tmp_path)
    result = runner.invoke(app, ["report", str(a), str(b), "--out", str(tmp_path / "merged")])
    assert_one_line_error(result, "environment.json")
    assert tree_hash(tmp_path) == before


@pytest.mark.parametrize("how", ["inside", "nested", "linked", "same"])
def test_report_out_inside_or_linked_into_an_input_is_refused(tmp_path, monkeypatch, how):
    monkeypatch.chdir(tmp_path)
    d = results_dir(tmp_path)
    if how == "linked":  # --out under a link that points into D
        os.symlink(d, tmp_path / "into-d")
        out = tmp_path / "into-d" / "merged"
    else:
        out = {"inside": d / "merged", "nested": d / "metrics" / "x" / "merged", "same": d}[how]
    before = tree_hash(tmp_path)
    result = runner.invoke(app, ["report", str(d), "--out", str(out)])
    assert_one_line_error(result, "is inside input directory", "choose --out outside it")
    assert tree_hash(tmp_path) == before


@pytest.mark.parametrize("args", [["report", "loop"], ["compare", "--resume", "loop"], ["report", "a"]])
def test_a_symlink_loop_as_results_directory_is_one_line(tmp_path, monkeypatch, args):
    monkeypatch.chdir(tmp_path)
    os.symlink("loop", tmp_path / "loop")  # a link to itself
    os.symlink("b", tmp_path / "a")
    os.symlink("a", tmp_path / "b")
    result = runner.invoke(app, args)
    assert_one_line_error(result, f"'{args[-1]}' is a symbolic link that leads nowhere")
    assert "Errno" not in result.stderr and "RuntimeError" not in result.stderr


# -- tracebacks on request, unexpected errors -------------------------------------------------


def test_traceback_env_and_flag_show_the_real_exception(workdir, monkeypatch):
    monkeypatch.setenv("NORMKIT_TRACEBACK", "0")  # restored (to unset) after the test, whatever --traceback sets
    result = runner.invoke(app, ["compare", "--dataset", "digits", "--norms", "nosuchnorm"])
    assert_one_line_error(result, "unknown norm")
    result = runner.invoke(app, ["--traceback", "compare", "--dataset", "digits", "--norms", "nosuchnorm"])
    assert type(result.exception).__name__ == "SpecError"
    monkeypatch.setenv("NORMKIT_TRACEBACK", "1")
    result = runner.invoke(app, ["show", "nosuchnorm"])
    assert type(result.exception).__name__ == "SpecError"


def test_an_unexpected_error_is_one_line_exit_1_naming_the_debug_switch(monkeypatch):
    import normkit

    def broken(*args, **kwargs):
        raise ZeroDivisionError("boom\nsecond line")

    monkeypatch.delenv("NORMKIT_TRACEBACK", raising=False)
    monkeypatch.setattr(normkit, "parse", broken)
    result = runner.invoke(app, ["show", "bn"])
    assert result.exit_code == 1
    assert result.stderr.strip().splitlines() == [
        "error: unexpected ZeroDivisionError: boom second line (a bug; rerun with NORMKIT_TRACEBACK=1 for "
        "the traceback and report it)"]


# -- help and polish ------------------------------------------------------------------------------


def test_bare_diagnose_prints_help_instead_of_training(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["diagnose"])
    assert "Usage: " in result.output and "--random-net" in result.output
    assert not (tmp_path / "runs").exists()


def test_norms_is_marked_required_in_compare_help():
    result = runner.invoke(app, ["compare", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0 and "Required: norm specs" in result.output


@pytest.mark.parametrize(("n", "text"), [(0, "0 epochs"), (1, "1 epoch"), (2, "2 epochs"), (21, "21 epochs")])
def test_plural(n, text):
    assert plural(n, "epoch") == text


def test_report_table_respects_columns(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    d = results_dir(tmp_path)
    cfg = yaml.safe_load((d / "config.yaml").read_text())
    assert cfg["epochs"] == 1
    for columns in ("60", "200"):
        result = runner.invoke(app, ["report", str(d)], env={"COLUMNS": columns})
        assert result.exit_code == 0, result.output
        assert "1 epoch:" in result.output
        table = [line for line in result.stdout.splitlines() if line.startswith(" bn") or line.startswith("bn")]
        assert table and all(len(line) <= int(columns) for line in table)
    assert "(too narrow for" in runner.invoke(app, ["report", str(d)], env={"COLUMNS": "60"}).output


# -- a norm that raises: recorded as failed, the others run on, resume retries it ---------------


class Explode:
    """A step that raises on the first training forward while `broken` is set (a plugin bug)."""

    broken = True


class ExplodingStep(Step):
    name = "explode"

    def forward(self, x, groups, layer):
        if Explode.broken and not x.is_meta:
            raise RuntimeError("explode: shapes (3, 4) and\n(5, 6) cannot be multiplied")
        return x


def exploding_step(ctx) -> ExplodingStep:
    return ExplodingStep()


class ExplodePlugin:
    @normkit.hookimpl
    def normkit_register_stages(self, register):
        register("explode", exploding_step, kind="step", position="after", summary="raises (tests)")


def test_a_failing_norm_is_recorded_shown_and_retried_on_resume(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CI", "1")
    out = tmp_path / "cmp"
    with temporary_plugin(ExplodePlugin(), "explode-test"):
        Explode.broken = True
        result = runner.invoke(app, ["compare", "--dataset", "digits", "--norms", "bn,bn+explode", "--epochs", "1",
                                     "--batch-size", "128",
                                     "--seeds", "2",
                                     "--model-param", "depth=2", "--model-param", "width=4", "--out", str(out)])
        assert result.exit_code == 1, result.output  # results written, some runs failed
        rows = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
        failed = [r for r in rows if r["status"] == "failed"]
        assert [(r["norm"], r["seed"], r["epoch"]) for r in failed] == [("bn+explode", 0, None),
                                                                         ("bn+explode", 1, None)]
        assert failed[0]["error"].startswith("bn+explode failed: step explode failed on input of shape")
        assert failed[0]["error"].endswith("RuntimeError: explode: shapes (3, 4) and (5, 6) cannot be multiplied")
        assert sum(r["status"] == "ok" for r in rows) == 2
        summary = {r["norm"]: r for r in json.loads((out / "summary.json").read_text())}
        assert (summary["bn+explode"]["failed"], summary["bn"]["failed"]) == (2, 0)
        assert "failed" in result.stdout
        assert "2 runs failed (first: bn+explode failed:" in result.stderr
        assert f"normkit compare --resume {out}" in result.stderr

        Explode.broken = False
        result = runner.invoke(app, ["compare", "--resume", str(out)])
        assert result.exit_code == 0, result.output
        assert "failed (first" not in result.stderr
        summary = {r["norm"]: r for r in json.loads((out / "summary.json").read_text())}
        assert (summary["bn+explode"]["failed"], summary["bn+explode"]["ok"]) == (0, 2)
        assert len((out / "runs.jsonl").read_text().splitlines()) == 6  # failed rows kept as history


# -- usage-level bounds of the other commands, through the real entry point -----------------------


def run_main(argv, monkeypatch, capsys) -> tuple[int, str, str]:
    from normkit_cli.app import main

    monkeypatch.setattr("sys.argv", ["normkit", *argv])
    with pytest.raises(SystemExit) as info:
        main()
    captured = capsys.readouterr()
    return info.value.code, captured.out, captured.err


BAD_OTHER = [
    (["show", "bn", "--channels", "10000000000"], "above normkit's limit of 16,777,216 channels"),
    (["show", "bn", "--channels", "0"], "--channels"),
    (["bench", "--repeats", "100000000"], "--repeats"),
    (["diagnose", "--random-net", "--depth", "1000000"], "--depth"),
    (["diagnose", "--random-net", "--batch", "4096", "--width", "4096", "--image-size", "1024"], "1 GiB"),
    (["diagnose", "--norms", "bn", "--seed", "-1"], "--seed"),
    (["diagnose", "--norms", "bn", "--epochs", "10000000"], "--epochs"),
    (["diagnose", "--norms", "bn", "--model-param", "width=[1"], "is not valid YAML"),
    (["compare", "--dataset", "digits", "--norms", "bn", "--epochs", "lots"], "--epochs"),
    (["compare", "--dataset", "digits", "--norms", "bn", "--no-such-option"], "No such option"),
]


@pytest.mark.parametrize(("argv", "needle"), BAD_OTHER, ids=[" ".join(a) for a, _ in BAD_OTHER])
def test_bad_values_of_other_commands_are_one_line(tmp_path, monkeypatch, capsys, argv, needle):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("NORMKIT_TRACEBACK", raising=False)
    code, out, err = run_main(argv, monkeypatch, capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], err
    assert "Traceback" not in out + err and list(tmp_path.iterdir()) == []


def test_resumed_config_with_non_finite_values_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    d = results_dir(tmp_path)
    text = (d / "config.yaml").read_text().replace("momentum: 0.9", "momentum: .nan")
    (d / "config.yaml").write_text(text)
    before = tree_hash(tmp_path)
    # refused as a hand edit (store.json keeps the values the runs were made with)
    assert_one_line_error(runner.invoke(app, ["compare", "--resume", str(d)]),
                          "was edited after the store was created (momentum: 0.9 -> nan)")
    assert tree_hash(tmp_path) == before


@pytest.mark.parametrize("argv", [["list"], ["show", "gn(groups=8)+pn"], ["plugins"]])
@pytest.mark.parametrize("columns", [60, 100])
def test_tables_respect_columns(argv, columns):
    result = runner.invoke(app, argv, env={"COLUMNS": str(columns)})
    assert result.exit_code == 0, result.output
    assert max(len(line) for line in result.stdout.splitlines()) <= columns


def test_sigterm_in_any_command_exits_143(monkeypatch):
    import signal
    import time

    import normkit

    def killed(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)

    monkeypatch.delenv("NORMKIT_TRACEBACK", raising=False)
    monkeypatch.setattr(normkit, "parse", killed)
    result = runner.invoke(app, ["show", "bn"])
    assert result.exit_code == 143 and result.stderr.strip() == "interrupted"


# -- resuming under other versions ----------------------------------------------------------------

def test_resume_under_another_plugin_version_is_refused_unless_allowed_and_then_recorded(tmp_path, monkeypatch):
    from normkit_lab.runs.environment import environment

    monkeypatch.chdir(tmp_path)
    d = results_dir(tmp_path)
    saved = environment("cpu")
    for plugin in saved["plugins"]:
        if plugin["distribution"] == "normkit-normalnorm":
            running, plugin["version"] = plugin["version"], "0.0.1"
    (d / "environment.json").write_text(json.dumps(saved))
    before = tree_hash(tmp_path)
    assert_one_line_error(runner.invoke(app, ["compare", "--resume", str(d)]),
                          f"(normkit-normalnorm 0.0.1 -> {running})", "--allow-version-change", "--out")
    assert tree_hash(tmp_path) == before

    result = runner.invoke(app, ["compare", "--resume", str(d), "--allow-version-change"])
    assert result.exit_code == 0, result.output
    env = json.loads((d / "environment.json").read_text())
    assert env.pop("resumes")[0]["changes"] == [f"normkit-normalnorm 0.0.1 -> {running}"]
    assert len(env.pop("load_average_end")) == 3  # every session of runs records the load when it ended
    assert env == saved
    assert len((d / "runs.jsonl").read_text().splitlines()) == 4  # the missing seed-1 runs were trained

    result = runner.invoke(app, ["compare", "--resume", str(d)])  # compared with the recorded resume now
    assert result.exit_code == 0 and "warning" not in result.stderr, result.output


def test_resume_of_a_directory_without_versions_warns_once_and_goes_on(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    d = results_dir(tmp_path)  # environment.json is {"python": "3"}
    result = runner.invoke(app, ["compare", "--resume", str(d)])
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 1 and "does not record versions or plugins" in warnings[0], result.stderr
    assert json.loads((d / "environment.json").read_text()) == {"python": "3"}


def test_allow_version_change_without_resume_is_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["compare", "--dataset", "digits", "--norms", "bn", "--allow-version-change"])
    assert_one_line_error(result, "give it with --resume")
    assert list(tmp_path.iterdir()) == []
