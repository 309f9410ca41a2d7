"""`normkit report`: the fitted verdict table, --out, one-line errors, and inputs left byte-identical."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from normkit_cli.app import app
from normkit_lab.store.results import ResultsDir
from normkit_lab.study import config

runner = CliRunner()
BN = [0.80, 0.82, 0.84, 0.81]
GAIN = [0.85, 0.86, 0.88, 0.855]
SAME = [0.805, 0.815, 0.845, 0.805]


def invoke(*args: Any, columns: int = 200):
    return runner.invoke(app, [str(a) for a in args], env={"COLUMNS": str(columns)})


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def run_rows(norm: str, seed: int, final: float) -> list[dict[str, Any]]:
    """runs.jsonl rows with the new keys (test_acc, cell, tuned, phase)."""
    return [{"norm": norm, "seed": seed, "status": "ok", "params": 56554, "epoch": i, "train_loss": 1.0 - a,
             "train_acc": a, "val_loss": 1.0 - a, "val_acc": a, "val_top5": None, "test_loss": 1.0 - a,
             "test_acc": a, "epoch_time_s": 0.41, "throughput": 3587.0, "peak_mem_mb": 826.0, "lr": 0.1,
             "cell": {}, "tuned": {}, "phase": "compare", "host": "h"}
            for i, a in enumerate([final - 0.2, final])]


@pytest.fixture
def results_dir(tmp_path) -> Path:
    cfg = config.build_config({"dataset": "digits", "norms": "bn,bnn,ln", "seeds": "4", "epochs": 2, "batch_size": 128})
    store = ResultsDir.create(tmp_path / "cmp", config.save_yaml(cfg), {"host": "h"})
    for seed in range(4):
        store.append_rows(run_rows("bn", seed, BN[seed]) + run_rows("bnn", seed, GAIN[seed])
                          + run_rows("ln", seed, SAME[seed]))
    return store.path


def table_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith((" bn ", " bnn ", " ln "))]


def test_wide_terminal_shows_every_column(results_dir):
    result = invoke("report", results_dir, columns=200)
    assert result.exit_code == 0, result.output
    for header in ("Δ vs bn", "adj. CI", "Holm p", "verdict", "MDE", "s/epoch", "samples/s", "peak MB", "params",
                   "diverged"):
        assert header in result.output
    bnn = next(line for line in table_lines(result.output) if line.startswith(" bnn "))
    assert "better" in bnn and "86.12 ± 0.66" in bnn and "56,554" in bnn
    assert "too narrow" not in result.output
    assert all(len(line) <= 200 for line in result.output.splitlines())


def test_narrow_terminal_drops_and_folds_columns(results_dir):
    result = invoke("report", results_dir, columns=80)
    assert result.exit_code == 0, result.output
    assert all(len(line) <= 80 for line in result.output.splitlines()), result.output
    assert "verdict" in result.output and "Holm p" in result.output
    assert "params" not in result.output.split("\n(too narrow")[0]
    assert "(too narrow for params, peak MB" in result.output
    assert any("better" in line for line in table_lines(result.output))


def test_report_never_writes_into_the_directories_it_reads(results_dir, tmp_path):
    before = snapshot(results_dir)
    assert invoke("report", results_dir).exit_code == 0
    assert invoke("report", results_dir, "--margin", "2", "--select", "best-val", "--baseline", "ln").exit_code == 0
    out = tmp_path / "view"
    result = invoke("report", results_dir, "--out", out)
    assert result.exit_code == 0, result.output
    assert snapshot(results_dir) == before
    assert f"report: {out / 'report.html'}" in result.output
    summary = json.loads((out / "summary.json").read_text())
    assert [(r["norm"], r["verdict"]) for r in summary] == [("bn", "baseline"), ("bnn", "better"),
                                                            ("ln", "inconclusive")]
    assert all(r["metric"] == "test_acc" and r["metric_source"] == "test_acc" for r in summary)
    assert "bnn is better than bn on test accuracy" in (out / "report.html").read_text()


def test_margin_changes_the_verdict(results_dir):
    assert "inconclusive" in next(line for line in table_lines(invoke("report", results_dir).output)
                                  if line.startswith(" ln "))
    wide = invoke("report", results_dir, "--margin", "2")
    assert "equivalent" in next(line for line in table_lines(wide.output) if line.startswith(" ln "))
    assert "margin ±2 %" in wide.output


@pytest.mark.parametrize(("args", "message"), [
    (["--metric", "best_test"], "unknown metric 'best_test'"),
    (["--select", "best-test"], "select must be one of final, best-val"),
    (["--margin", "0"], "--margin must be > 0"),
    (["--margin", "nan"], "--margin must be > 0"),
    (["--baseline", "gn"], "baseline 'gn' is not among"),
])
def test_bad_options_are_one_line_errors(results_dir, tmp_path, args, message):
    before = snapshot(results_dir)
    result = invoke("report", results_dir, *args, "--out", tmp_path / "never")
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], result.output
    assert snapshot(results_dir) == before and not (tmp_path / "never").exists()


def test_damaged_row_is_a_one_line_error(results_dir):
    with (results_dir / "runs.jsonl").open("a") as f:
        f.write('{"seed": 1}\n')
    result = invoke("report", results_dir)
    assert result.exit_code == 2 and "runs.jsonl:" in result.output and "lacks norm" in result.output


# -- a real comparison rendered in a real browser ------------------------------------------------------


@pytest.fixture(scope="module")
def real_compare(tmp_path_factory) -> Path:
    """2 norms x 3 seeds x 2 epochs of small-cnn on digits (about 10-20 s on two cores)."""
    out = tmp_path_factory.mktemp("real") / "cmp"
    result = invoke("compare", "--dataset", "digits", "--norms", "bn,gn+pn", "--seeds", "3", "--epochs", "2",
                    "--batch-size", "128",
                    "--model-param", "depth=2",
                    "--out", out)
    assert result.exit_code == 0, result.output
    return out


@pytest.mark.slow
def test_real_comparison_summary_and_report(real_compare):
    summary = json.loads((real_compare / "summary.json").read_text())
    assert summary[0]["verdict"] == "baseline"
    assert summary[1]["verdict"] in ("better", "worse", "equivalent", "inconclusive")
    assert summary[1]["mde"] is not None and "p_holm" in summary[1]
    text = (real_compare / "report.html").read_text()
    assert text.count("data:image/png;base64,") == 3 and "gn+pn" in text


@pytest.mark.slow
def test_report_html_renders_in_headless_chromium(real_compare, tmp_path):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("chromium is not installed (Debian: apt-get install chromium); the screenshot needs it")
    matplotlib_image = pytest.importorskip("matplotlib.image")
    shot = tmp_path / "report.png"
    subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                    "--disable-background-networking", "--disable-component-update", "--disable-sync",
                    f"--user-data-dir={tempfile.mkdtemp()}", f"--screenshot={shot}", "--window-size=1280,2400",
                    (real_compare / "report.html").resolve().as_uri()],
                   check=True, capture_output=True, timeout=120)
    pixels = matplotlib_image.imread(shot)
    assert pixels.shape[0] == 2400 and pixels.shape[1] == 1280
    assert pixels[..., :3].std() > 0.05  # text, table and figures, not a blank page
    assert (pixels[..., :3].min(axis=2) < 0.2).mean() > 0.005  # dark pixels: there is text


def test_failed_runs_and_cells_are_shown_literally(results_dir):
    cell = {"lr": 1.0}
    rows = [r | {"cell": cell} for seed in range(3) for r in run_rows("bn", seed, BN[seed])]
    rows += [{"norm": "bnn", "seed": 0, "status": "failed", "params": None, "epoch": None, "cell": cell,
              "tuned": {}, "phase": "compare", "error": "RuntimeError: out of memory [bold]x[/bold]"}]
    ResultsDir.open(results_dir).append_rows(rows)
    result = invoke("report", results_dir, columns=200)
    assert result.exit_code == 0, result.output
    assert "failed: bnn [lr=1.0] seed 0: RuntimeError: out of memory [bold]x[/bold]" in result.output
    header = next(line for line in result.output.splitlines() if line.startswith(" norm "))
    assert header.rstrip().endswith("failed") and " lr=1.0 " in result.output


def tuning_rows(chosen: dict[str, float]) -> list[dict[str, Any]]:
    """tuning.json as `--tune lr=0.01,0.05,0.1` writes it: mean val accuracy per (norm, value), the choice."""
    return [{"cell": {}, "norm": norm, "values": {"lr": lr}, "val_acc": 0.9 - abs(lr - best) + 0.001 * i,
             "seeds": [4, 5], "chosen": lr == best}
            for i, (norm, best) in enumerate(chosen.items()) for lr in (0.01, 0.05, 0.1)]


@pytest.fixture
def tuned_dir(tmp_path) -> Path:
    chosen = {"bn": 0.1, "bnn": 0.05, "ln": 0.05}
    cfg = config.build_config({"dataset": "digits", "norms": "bn,bnn,ln", "seeds": "4", "epochs": 2, "batch_size": 128,
                               "tune": "lr=0.01,0.05,0.1", "tune_seeds": "4,5"})
    store = ResultsDir.create(tmp_path / "tuned", config.save_yaml(cfg), {"host": "h"})
    for seed in range(4):
        for norm, finals in (("bn", BN), ("bnn", GAIN), ("ln", SAME)):
            store.append_rows([{**row, "tuned": {"lr": chosen[norm]}} for row in run_rows(norm, seed, finals[seed])])
    store.write_tuning(tuning_rows(chosen))
    return store.path


def test_the_table_says_which_value_tuning_chose_and_warns_at_the_grids_edge(tuned_dir):
    result = invoke("report", tuned_dir, columns=120)
    assert result.exit_code == 0, result.output
    assert "tuned lr" in result.output
    lines = {line.split()[0]: line.split() for line in table_lines(result.output)}
    assert lines["bn"][1] == "0.1" and lines["bnn"][1] == "0.05" and lines["ln"][1] == "0.05"
    assert ("warning: tuning chose lr=0.1 for bn, the largest value tried; the best may lie beyond the grid"
            in " ".join(result.output.split()))
    assert "for bnn" not in result.output and "for ln," not in result.output


def test_report_html_has_a_tuning_table_per_norm(tuned_dir, tmp_path):
    result = invoke("report", tuned_dir, "--out", tmp_path / "again")
    assert result.exit_code == 0, result.output
    page = (tmp_path / "again" / "report.html").read_text()
    section = page.split("<h2>Tuning</h2>", 1)[1].split("<h2>", 1)[0]
    assert "validation accuracy (%), mean over the tuning seeds" in section and "2 tuning seeds (4, 5)" in section
    assert "<th class=\"\">lr=0.01</th><th class=\"\">lr=0.05</th><th class=\"\">lr=0.1</th>" in section
    bn = next(row for row in section.split("<tr>") if row.startswith('<td class="l">bn</td>'))
    assert "<td><b>90</b></td>" in bn and "lr=0.1 is the largest value tried" in bn  # 0.9 -> 90 %, chosen
    ln = next(row for row in section.split("<tr>") if row.startswith('<td class="l">ln</td>'))
    assert "<td><b>90.2</b></td>" in ln and '<td class="l">no</td>' in ln
    assert json.loads((tmp_path / "again" / "tuning.json").read_text()) == tuning_rows(
        {"bn": 0.1, "bnn": 0.05, "ln": 0.05})  # kept, so reading the new directory shows it again
    table = page.split("<h2>Table</h2>", 1)[1].split("</tr>", 1)[0]
    assert table.index("tuned lr (chosen on validation)") < table.index("seeds (n)")  # beside the norm
    assert "seeds to detect a Δ of the margin (±0.5 %)" in table


def test_several_metrics_give_a_table_each_and_one_holm_family(results_dir, tmp_path):
    one = invoke("report", results_dir, "--metric", "test_acc", columns=160)
    both = invoke("report", results_dir, "--metric", "test_acc,test_loss", columns=160)
    assert both.exit_code == 0, both.output
    titles = [line for line in both.output.splitlines() if "over seeds, difference to bn" in line]
    assert len(titles) == 2 and "test accuracy (test_acc" in titles[0] and "test loss (test_loss" in titles[1]
    text = " ".join(both.output.split())
    assert "Holm's adjustment is over all 4 comparisons of the 2 metrics read (test_acc, test_loss)" in text
    assert "each norm against bn with Holm's adjustment over 4 comparisons" in text  # the caption counts them all

    def holm_p(output: str, norm: str) -> float:  # the first table's (test_acc): norm n mean ± se Δ [lo, hi] p
        line = next(line for line in table_lines(output) if line.startswith(f" {norm} "))
        return float(line.split()[8])

    assert holm_p(both.output, "bnn") > holm_p(one.output, "bnn")  # twice the claims: a stricter family
    out = tmp_path / "both"
    assert invoke("report", results_dir, "--metric", "test_acc,test_loss", "--out", out).exit_code == 0
    page = (out / "report.html").read_text()
    assert "<h2>Also read: test loss</h2>" in page and page.count("Holm&#x27;s adjustment is over all 4") == 1
    assert json.loads((out / "summary.json").read_text())[1]["metric"] == "test_acc"


@pytest.mark.parametrize(("metric", "message"), [
    ("test_acc,test_acc", "names test_acc twice"),
    ("test_acc,f1:max", "f1 is your program's own, so normkit does not know its unit and its margin"),
    ("test_acc,", "has an empty name"),
    ("test_acc,nope", "unknown metric 'nope'"),
    ("test_acc,test_bpb", "no finished run has test_bpb, so it cannot be read; the runs record train_loss, "
                          "train_acc, val_loss, val_acc, test_loss, test_acc, lr"),
])
def test_bad_metric_lists_are_one_line_errors(results_dir, metric, message):
    result = invoke("report", results_dir, "--metric", metric)
    assert result.exit_code == 2 and message in result.output and len(result.output.strip().splitlines()) == 1


def test_the_results_directory_keeps_every_metric_so_report_reads_them_all_without_repeating_them(tmp_path):
    """Issue 41: `compare --metric test_acc,test_loss` printed both tables, but config.yaml kept only the
    first metric, so `normkit report DIR` lost the others."""
    cfg = config.build_config({"dataset": "digits", "norms": "bn,bnn,ln", "seeds": "4", "epochs": 2, "batch_size": 128,
                               "metric": "test_acc,test_loss"})
    assert (cfg.metric, cfg.further_metrics) == ("test_acc", ["test_loss"])
    store = ResultsDir.create(tmp_path / "cmp", config.save_yaml(cfg), {"host": "h"})
    assert "metric: test_acc,test_loss" in (store.path / "config.yaml").read_text()
    for seed in range(4):
        store.append_rows(run_rows("bn", seed, BN[seed]) + run_rows("bnn", seed, GAIN[seed]))
    result = invoke("report", store.path, columns=160)
    assert result.exit_code == 0, result.output
    assert "of the 2 metrics read (test_acc, test_loss)" in " ".join(result.output.split())
    assert "test_loss ± s.e." in result.output


def test_a_language_model_comparison_shows_the_ngram_note_in_compare_and_in_report(tmp_path):
    """The note on where runs end against the n-gram tables is part of the summary, so `normkit report`
    prints it as `normkit compare` did (it was written only on the compare path)."""
    out = tmp_path / "lm"
    params = ["--model", "gpt-tiny", "--model-param", "width=16", "--model-param", "depth=1",
              "--model-param", "heads=2", "--model-param", "context=16", "--dataset-param", "seq_len=16",
              "--dataset-param", "max_files=40", "--dataset-param", "train_windows=64",
              "--dataset-param", "eval_windows=16", "--dataset-param", "test_windows=16"]
    compared = invoke("compare", "--norms", "ln,rms", "--seeds", "2", "--epochs", "1", *params, "--out", out)
    assert compared.exit_code == 0, compared.output
    reported = invoke("report", out)
    assert reported.exit_code == 0, reported.output
    for output in (compared.output, reported.output):
        text = " ".join(output.split())  # the note wraps at the console's width
        assert text.count("reference tables fitted on the train split") == 1, output
        assert "of 4 finished runs end below the trigram" in text
        assert "5-gram" in text and "(interpolated Kneser-Ney)" in text and "of 4 below the 5-gram" in text
    page = (out / "report.html").read_text()
    assert "below the 5-gram" in page and "interpolated Kneser-Ney" in page


def test_compare_defaults_to_sequential_seeds_and_report_prints_the_design(tmp_path):
    """No --seeds: `--seeds auto` (looks in config.yaml, looks.json, the design under the table, in compare and
    report alike); fixed seeds stay fixed; --max-seeds with fixed seeds is a one-line error that writes nothing."""
    import json

    out = tmp_path / "auto"
    result = invoke("compare", "--dataset", "digits", "--norms", "bn", "--epochs", "1", "--batch-size", "128",
                    "--model-param", "depth=2",
                    "--max-seeds", "3", "--out", str(out), columns=200)
    assert result.exit_code == 0, result.output
    assert "seeds auto (looks after 3 seeds" in result.output
    assert json.loads((out / "looks.json").read_text())["design"]["looks"] == [3]
    assert {json.loads(line)["seed"] for line in (out / "runs.jsonl").read_text().splitlines()} == {0, 1, 2}
    design = [line for line in result.output.splitlines() if line.startswith("sequential seeds:")]
    assert design and design == [line for line in invoke("report", str(out), columns=200).output.splitlines()
                                 if line.startswith("sequential seeds:")]
    runs = (out / "runs.jsonl").read_text()
    (out / "looks.json").write_text("[]")  # damaged: resuming would meet it again, so no resume hint
    damaged = invoke("compare", "--resume", str(out))
    assert damaged.exit_code == 2 and "is not a looks record" in damaged.output, damaged.output
    assert "--resume" not in damaged.output.split("restore it")[1] and (out / "runs.jsonl").read_text() == runs
    bad = invoke("compare", "--dataset", "digits", "--norms", "bn", "--seeds", "4", "--max-seeds", "8", "--out",
                 str(tmp_path / "bad"))
    assert bad.exit_code == 2 and "apply to --seeds auto" in bad.output and not (tmp_path / "bad").exists()


def _edit_final_row(path: Path, norm: str, seed: int, text: str) -> None:
    """runs.jsonl with the final epoch row of (norm, seed) having its test_acc written as `text`."""
    lines = (path / "runs.jsonl").read_text().splitlines()
    final = max(i for i, line in enumerate(lines) if json.loads(line)["norm"] == norm
                and json.loads(line)["seed"] == seed)
    row = json.loads(lines[final])
    lines[final] = json.dumps(row).replace(f'"test_acc": {row["test_acc"]}', f'"test_acc": {text}')
    (path / "runs.jsonl").write_text("\n".join(lines) + "\n")


def test_an_ok_row_with_a_null_metric_is_reported_not_silently_one_seed_fewer(results_dir):
    """Issue 41: an ok row whose metric was null dropped that seed from the statistics without a word."""
    _edit_final_row(results_dir, "bnn", 1, "null")
    result = invoke("report", results_dir, columns=200)
    assert result.exit_code == 0, result.output
    assert ("failed: bnn seed 1: status ok, but runs.jsonl has no test_acc at its selected epoch (null or "
            "missing), so it is left out of the statistics") in " ".join(result.output.split())


@pytest.mark.parametrize("text", ["NaN", "Infinity", "-Infinity"])
def test_an_ok_row_with_a_nan_metric_is_a_damaged_row(results_dir, text):
    _edit_final_row(results_dir, "bnn", 1, text)
    result = invoke("report", results_dir, columns=200)
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1, result.output
    assert "runs.jsonl:" in result.output and "has test_acc" in result.output and "edited or damaged" in result.output


@pytest.mark.parametrize("rows", ["", "tune"])
def test_report_of_a_directory_without_comparison_runs_exits_2_in_one_line(results_dir, rows):
    """Issue 41: an empty runs.jsonl gave a table of n = 0 rows and exit 0."""
    text = "" if not rows else "".join(json.dumps({**row, "phase": "tune", "seed": 9}) + "\n"
                                       for row in run_rows("bn", 9, 0.8))
    (results_dir / "runs.jsonl").write_text(text)
    before = snapshot(results_dir)
    result = invoke("report", results_dir)
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1, result.output
    assert "holds no comparison run yet" in result.output and "normkit compare --resume" in result.output
    assert snapshot(results_dir) == before


def test_compare_says_when_a_budget_drops_the_default_designs_cells(tmp_path):
    result = invoke("compare", "--dataset", "digits", "--norms", "bn", "--seeds", "1", "--budget", "steps=1", "--out",
                    tmp_path / "o")
    assert result.exit_code == 0, result.output
    assert ("note: --budget replaces the default design of digits (batch_size=2,16 at steps=500 each), so every "
            "run trains at batch_size=2; to keep its cells, add --sweep batch_size=2,16") in " ".join(
        result.output.split())


def _sequential_train(norm: str, seed: int, *, cell: dict[str, Any], report: Any) -> None:
    """bn at 0.90; gn 40 points below (shown at the first look); ln about bn's level with a point of seed noise."""
    import random

    rng = random.Random(f"{norm}/{seed}")
    acc = {"bn": 0.9, "gn": 0.5}.get(norm, 0.9) + rng.gauss(0, 0.0005 if norm == "gn" else 0.01)
    report(epoch=0, val_acc=acc, test_acc=acc)


def test_sequential_verdicts_show_the_look_p_they_were_decided_on_in_the_table_and_the_page(tmp_path):
    """With sequential seeds the Holm p column was empty beside every verdict: now each verdict shows the look's
    p and the alpha that look spent, the same text in `normkit report`, report.html and summary.csv."""
    from normkit_lab.api import compare_norms
    from normkit_lab.study.progress import Progress

    out = tmp_path / "seq"
    result = compare_norms("bn,gn,ln", train=_sequential_train, seeds="auto", max_seeds=5, out=out,
                           progress=Progress())
    rows = {r["norm"]: r for r in result.summary}
    gn = rows["gn"]
    assert gn["verdict"] == "worse" and gn["look_p"] <= gn["look_alpha"] < 0.05
    shown = invoke("report", out, "--out", tmp_path / "page", columns=240)
    assert shown.exit_code == 0, shown.output
    assert "look p (α spent)" in shown.output and "Holm p" not in shown.output
    cells = {line.split()[0]: line for line in table_lines(shown.output) + [
        line for line in shown.output.splitlines() if line.startswith(" gn ")]}
    gn_text = f"{gn['look_p']:.3g} ({gn['look_alpha']:.3g})"
    assert gn_text in cells["gn"]
    ln = rows["ln"]
    ln_text = (f"TOST {ln['look_tost_p']:.3g} ({ln['look_tost_alpha']:.3g})" if ln["verdict"] == "equivalent"
               else f"{ln['look_p']:.3g} ({ln['look_alpha']:.3g})")
    assert ln_text in cells["ln"]
    page = (tmp_path / "page" / "report.html").read_text()
    assert f">{gn_text}<" in page and "look p (α spent)" in page
