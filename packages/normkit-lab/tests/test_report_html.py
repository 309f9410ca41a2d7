"""report.html contents (escaped, self-contained) and the figures behind it, from synthetic rows."""

from __future__ import annotations

import base64
import html
import io
import itertools
import re
from typing import Any

import pytest

from normkit_lab.analysis import plots
from normkit_lab.analysis.metric_family import across_metrics
from normkit_lab.analysis.report_html import render_html
from normkit_lab.analysis.summary import Summary, runs_from_rows, summarize
from normkit_lab.analysis.tuning import edge_warnings, tuned_norms
from normkit_lab.metrics import METRICS, metric_named

PNG = b"\x89PNG\r\n\x1a\n"


def rows(norm: str, seed: int, accs: list[float], status: str = "ok", cell: dict | None = None,
         error: str | None = None, with_test: bool = True) -> list[dict[str, Any]]:
    out = [{"norm": norm, "seed": seed, "status": status, "params": 100, "epoch": i, "train_loss": 2.0 - a,
            "train_acc": a, "val_loss": 2.0 - a, "val_acc": a, "val_top5": None, "epoch_time_s": 0.5,
            "throughput": 1000.0, "peak_mem_mb": 50.0, "lr": 0.1 / (i + 1), "cell": cell or {}, "tuned": {},
            "phase": "compare", **({"test_acc": a - 0.01, "test_loss": 2.1 - a} if with_test else {})}
           for i, a in enumerate(accs)]
    if status == "failed":
        out = [{"norm": norm, "seed": seed, "status": "failed", "params": None, "epoch": None,
                "cell": cell or {}, "tuned": {}, "phase": "compare", "error": error}]
    return out


def comparison(norm: str = "gn<b>", with_test: bool = True, cells: tuple[dict, ...] = ({},)) -> tuple[Summary, list]:
    out = []
    for cell in cells:
        for seed in range(4):
            out += rows("bn", seed, [0.5, 0.80 + 0.01 * seed], cell=cell, with_test=with_test)
            out += rows(norm, seed, [0.5, 0.86 + 0.012 * seed], cell=cell, with_test=with_test)
    out += rows(norm, 7, [], status="failed", error="RuntimeError: <oom> & more")
    runs = runs_from_rows(out)
    return summarize(runs, ["bn", norm], "bn", METRICS["test_acc"]), runs


def page(summary: Summary, figures: dict[str, bytes] | None = None, **kw: Any) -> str:
    args = {"title": "small-cnn on digits <&>", "figures": figures or {}, "config": {"dataset": "digits",
                                                                                     "norms": ["bn", "<x>"]},
            "command": "normkit compare --norms 'bn,<x>' && echo", "environment": {"host": "<h>"}} | kw
    return render_html(summary, **args)


def test_page_holds_verdicts_table_config_command_and_environment():
    summary, _ = comparison()
    text = page(summary)
    assert text.startswith("<!DOCTYPE html>") and text.rstrip().endswith("</html>")
    for heading in ("Verdicts", "Table", "Figures", "Configuration", "Command line", "Environment"):
        assert f"<h2>{heading}</h2>" in text
    assert "gn&lt;b&gt; is better than bn on test accuracy" in text
    assert '<td class="l v-better">better</td>' in text
    assert "normkit compare --norms &#x27;bn,&lt;x&gt;&#x27; &amp;&amp; echo" in text
    assert "&quot;host&quot;: &quot;&lt;h&gt;&quot;" in text and "- &lt;x&gt;" in text
    assert "gn&lt;b&gt; failed on seed 7: RuntimeError: &lt;oom&gt; &amp; more" in text
    assert "margin ±0.5 %" in text


def test_every_text_is_escaped():
    summary, _ = comparison(norm="<script>alert(1)</script>")
    text = page(summary)
    assert "<script>" not in text and "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    assert not re.search(r"<(?!/?(html|head|meta|title|style|body|h1|h2|p|ul|li|span|div|table|tr|th|td|pre|code|img"
                         r"|b|i)\b|!DOCTYPE)", text)


def test_page_is_self_contained_with_embedded_pngs():
    pytest.importorskip("matplotlib")
    summary, runs = comparison()
    figures = plots.render(summary, runs)
    text = page(summary, figures)
    sources = re.findall(r'<img alt="([^"]+)" title="[^"]+" src="data:image/png;base64,([^"]+)">', text)
    assert [name for name, _ in sources] == ["forest.png", "primary_metric.png", "curves.png"]
    assert all(base64.b64decode(data).startswith(PNG) for _, data in sources)
    assert not re.search(r'(src|href)="(?!data:)', text)  # nothing loaded from elsewhere


def test_fallback_note_is_shown():
    summary, _ = comparison(with_test=False)
    text = page(summary)
    assert '<p class="note">these results have no test_acc' in text and "validation accuracy" in text


def test_no_verdict_and_inconclusive_readings():
    out = rows("bn", 0, [0.8]) + rows("ln", 0, [0.9]) + rows("bn", 1, [0.7]) + rows("ln", 1, [0.75])
    summary = summarize(runs_from_rows(out), ["bn", "ln"], "bn", METRICS["test_acc"])
    assert "at least 3 are needed for any verdict" in page(summary)


def _colors(png: bytes) -> int:
    from matplotlib import image

    pixels = image.imread(io.BytesIO(png), format="png").reshape(-1, 4)
    return len({tuple(p) for p in pixels[:: max(1, len(pixels) // 20000)]})


def test_every_run_diverged_gives_a_note_not_empty_axes():
    pytest.importorskip("matplotlib")
    out = [{"norm": n, "seed": s, "status": "diverged", "params": 1, "epoch": None} for n in ("bn", "ln")
           for s in range(3)]
    runs = runs_from_rows(out)
    summary = summarize(runs, ["bn", "ln"], "bn", METRICS["test_acc"])
    figures = plots.render(summary, runs)
    assert set(figures) == {"forest.png", "primary_metric.png", "curves.png"}
    assert all(_colors(data) > 2 for data in figures.values())  # text drawn, not a blank frame


def test_sweep_figure_only_for_several_cells():
    pytest.importorskip("matplotlib")
    summary, runs = comparison(cells=({"lr": 0.01}, {"lr": 0.1}))
    figures = plots.render(summary, runs)
    assert "sweep.png" in figures and figures["sweep.png"].startswith(PNG)
    assert "sweep.png" not in plots.render(*comparison())


def test_intervals_are_clipped_to_the_valid_range():
    acc, loss = METRICS["test_acc"], METRICS["test_loss"]
    assert (acc.clip(103.0), acc.clip(-2.0), acc.clip(55.0)) == (100.0, 0.0, 55.0)
    assert (loss.clip(-0.5), loss.clip(7.0)) == (0.0, 7.0)


def _figure(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the plot functions return their figure instead of PNG bytes, to look at what they drew."""
    monkeypatch.setattr(plots, "_png", lambda fig: fig)


def test_seed_dots_are_apart_and_joined_across_norms(monkeypatch):
    pytest.importorskip("matplotlib")
    _figure(monkeypatch)
    out = []
    for seed in range(4):  # every seed gives the same bn value: tied dots must still be four places
        out += rows("bn", seed, [0.5, 0.8])
        out += rows("gn", seed, [0.5, 0.86 + 0.01 * seed])
    summary = summarize(runs_from_rows(out), ["bn", "gn"], "bn", METRICS["test_acc"])
    ax = plots.primary_metric(summary).axes[0]
    dots = [line for line in ax.lines if line.get_marker() == "o"]
    assert len(dots) == 2 and len(set(dots[0].get_xdata())) == 4  # four tied bn seeds, four places
    joins = [line for line in ax.lines if line.get_linestyle() == "-" and len(line.get_xdata()) == 2]
    assert len(joins) == 4  # one line per seed from bn to gn
    for line in joins:
        (x0, x1), y0 = line.get_xdata(), line.get_ydata()[0]
        assert x1 - x0 == pytest.approx(1.0) and y0 == pytest.approx(79.0)  # same seed place, next column
    assert sorted(t.get_text() for t in ax.texts) == ["n=4", "n=4"]


@pytest.mark.parametrize("values", [(2, 32), (16, 64)])
def test_sweep_ticks_are_the_swept_values_and_norms_side_by_side(monkeypatch, values):
    pytest.importorskip("matplotlib")
    _figure(monkeypatch)
    out = []
    for v in values:
        for seed in range(3):
            out += rows("bn", seed, [0.5, 0.8 + 0.01 * seed], cell={"batch_size": v})
            out += rows("gn", seed, [0.5, 0.85 + 0.01 * seed], cell={"batch_size": v})
    summary = summarize(runs_from_rows(out), ["bn", "gn"], "bn", METRICS["test_acc"])
    ax = plots.sweep(summary).axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == [str(v) for v in values]
    assert ax.xaxis.get_minor_ticks() == [] or all(not t.label1.get_visible() or not t.label1.get_text()
                                                     for t in ax.xaxis.get_minor_ticks())
    first_x = [line.get_xdata()[0] for line in ax.lines if len(line.get_xdata()) == 2 and line.get_marker() == "o"]
    assert len(first_x) == 2 and first_x[0] != first_x[1]  # dodged, not drawn on top of each other


def test_per_seed_table_holds_every_value_and_its_paired_difference():
    summary, _ = comparison(norm="gn")
    text = page(summary)
    assert "<h2>Per seed</h2>" in text
    section = text.split("<h2>Per seed</h2>", 1)[1].split("<h2>", 1)[0]
    assert [f"seed {s}" in section for s in range(4)] == [True] * 4
    # bn seed 3: test_acc 0.83 - 0.01 -> 82.00 %; gn seed 3: 0.896 - 0.01 -> 88.60 %; paired +6.60
    assert "<td>82.00</td>" in section and "<td>88.60</td>" in section and "<td>+6.60</td>" in section
    assert section.count("Δ vs bn") == 1


@pytest.mark.slow
def test_report_renders_in_headless_chromium(tmp_path):
    """What a person sees: the whole page (tuning table, a second metric, the figures) rendered by Debian's
    Chromium and screenshotted; every part of it drawn, the tables not wider than the window."""
    import shutil
    import subprocess

    pytest.importorskip("matplotlib")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("needs Debian's chromium package (apt-get install chromium)")
    summary, runs = comparison(norm="gn", cells=({"batch_size": 2}, {"batch_size": 16}))
    loss = summarize(runs, ["bn", "gn"], "bn", METRICS["test_loss"])
    tuning = [{"cell": {"batch_size": b}, "norm": n, "values": {"lr": lr}, "val_acc": 0.9 - abs(lr - 0.1),
               "seeds": [8, 9], "chosen": lr == 0.1} for b in (2, 16) for n in ("bn", "gn") for lr in (0.03, 0.1, 0.3)]
    html_path, shot = tmp_path / "report.html", tmp_path / "report.png"
    html_path.write_text(page(summary, figures=plots.render(summary, runs, _cosine_logs(runs, 40, 2)), tuning=tuning,
                              more=across_metrics([summary, loss])[1:]), encoding="utf-8")
    subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    "--window-size=1400,6000", f"--screenshot={shot}", html_path.as_uri()],
                   capture_output=True, timeout=120, check=True)
    from matplotlib import image

    pixels = image.imread(str(shot))[..., :3]
    assert pixels.shape[:2] == (6000, 1400)
    ink = (pixels < 0.6).any(axis=2)  # text, rules and plot lines
    bands = [ink[y:y + 500].mean() for y in range(0, 4000, 500)]  # the page is long: every band holds something
    assert all(b > 0.002 for b in bands), bands


def test_tuning_of_your_own_code_names_its_field_and_a_failed_candidate():
    table = [{"cell": {"batch_size": b}, "norm": "gn", "values": {"lr": lr}, "score_field": "val_f1",
              "val_f1": None if lr == 0.3 else 0.5 + lr, "score": 0.0, "seeds": [9], "chosen": lr == 0.1}
             for b in (2, 16) for lr in (0.01, 0.1, 0.3)]
    tuned = tuned_norms(table)
    assert [(t.cell, t.chosen, t.edges) for t in tuned] == [({"batch_size": 2}, {"lr": 0.1}, []),
                                                             ({"batch_size": 16}, {"lr": 0.1}, [])]
    assert [c.score for c in tuned[0].candidates] == [0.51, 0.6, None]
    summary, _ = comparison(norm="gn")
    section = page(summary, tuning=table).split("<h2>Tuning</h2>", 1)[1].split("<h2>", 1)[0]
    assert "val_f1, mean over the tuning seeds" in section and "1 tuning seed (9)" in section
    assert section.count("failed or diverged") == 2 and section.count("<td><b>0.6</b></td>") == 2
    assert '<td class="l">batch_size=2</td>' in section  # one row per cell
    assert edge_warnings(table) == []
    assert "<h2>Tuning</h2>" not in page(summary)  # not tuned: no section


def test_caption_names_no_path_of_the_source_tree_and_the_machine_is_named():
    summary, _ = comparison(norm="gn")
    from normkit_lab.analysis.caption import summary_caption
    from normkit_lab.study.config import build_config

    configs = [build_config(given).to_dict() for given in ({"dataset": "digits", "norms": "bn,gn+pn"},
                                                           {"dataset": "digits", "norms": "bn,gn", "ablate": True},
                                                           {"norms": "ln,rms", "model": "gpt-tiny"})]
    for terminal in (summary_caption(c, summary) for c in configs):  # the caption `normkit report` prints
        assert not re.search(r"\bdocs/|\.md\b|\bpackages/", terminal), terminal
    config = configs[0]
    text = page(summary, config=config, environment={"device": "cpu", "cpu": "Intel(R) Xeon(R) Processor",
                                                      "cpu_count": 2})
    caption = text.split('<p class="caption">', 1)[1].split("</p>", 1)[0]
    assert "docs/" not in caption and ".md" not in caption
    assert ("<p>Machine: device cpu; cpu Intel(R) Xeon(R) Processor; cpu count 2; (the CPU name as the operating "
            "system reports it") in text
    isa = page(summary, environment={"device": "cpu", "cpu": "Intel(R) Xeon(R) Processor", "cpu_isa": "AVX-512",
                                     "cpu_model_number": 143})
    assert "cpu isa AVX-512; cpu model number 143</p>" in isa and "reports it" not in isa


def _axes_by_title(fig) -> dict[str, Any]:
    return {ax.get_title().split("\n")[0]: ax for ax in fig.axes}


def _cosine_logs(runs, steps_per_epoch: int, epochs: int, peak: float = 0.02) -> dict[str, list]:
    """Step logs as the CSV logger writes them: a cosine schedule decaying to 0 over the run."""
    import math

    total = steps_per_epoch * epochs
    def lr(s: int) -> float:
        return peak * 0.5 * (1 + math.cos(math.pi * (s - 1) / total))

    return {plots.run_key(r): [(s, (s - 1) // steps_per_epoch, 2.0 / s, lr(s)) for s in range(1, total + 1)]
            for r in runs}


def test_one_epoch_curves_show_every_step_and_a_point_per_seed(monkeypatch):
    """One epoch: the loss and the schedule at every step over 0..1 epochs, and validation loss as a point
    per seed and norm (not single dots on an axis labelled 0.95-1.05); the lr decays to 0 within the epoch."""
    pytest.importorskip("matplotlib")
    _figure(monkeypatch)
    out = []
    for seed in range(3):
        out += rows("bn", seed, [0.80 + 0.01 * seed]) + rows("gn", seed, [0.86])
    runs = runs_from_rows(out)
    summary = summarize(runs, ["bn", "gn"], "bn", METRICS["test_acc"])
    axes = _axes_by_title(plots.curves(summary, runs, _cosine_logs(runs, 50, 1)))
    assert set(axes) == {"training loss per step", "validation loss", "learning rate at every step,"}
    loss, lr, val = axes["training loss per step"], axes["learning rate at every step,"], axes["validation loss"]
    assert loss.get_xlim() == (0.0, 1.0) and lr.get_xlim() == (0.0, 1.0)
    assert [len(line.get_xdata()) for line in loss.lines] == [50, 50]  # one point per step, per norm
    (schedule,) = lr.lines  # every norm ran the same schedule: one line, labelled so
    assert schedule.get_label() == "every norm"
    ys = schedule.get_ydata()
    assert ys[0] == pytest.approx(0.02) and ys[-1] < 0.001 and all(a >= b for a, b in itertools.pairwise(ys))
    assert [t.get_text() for t in val.get_xticklabels()] == ["bn", "gn"]
    seeds = [line for line in val.lines if line.get_marker() == "o"]
    assert [len(line.get_xdata()) for line in seeds] == [3, 3]


def test_curves_of_several_epochs_without_step_logs(monkeypatch):
    """Results written before step logs: per-epoch points from 0 epochs trained, the lr panel says it is
    the rate at each epoch's first step; a one-epoch run of them gets no lr panel (a dot says nothing)."""
    pytest.importorskip("matplotlib")
    _figure(monkeypatch)
    summary, runs = comparison(norm="gn")
    axes = _axes_by_title(plots.curves(summary, runs))
    assert set(axes) == {"training loss", "validation loss", "learning rate at each epoch's first step"}
    val = axes["validation loss"]
    assert val.get_xlim()[0] == 0
    assert [list(line.get_xdata()) for line in val.lines if line.get_label() in ("bn", "gn")] == [[1, 2], [1, 2]]
    out = [r for seed in range(3) for r in rows("bn", seed, [0.8]) + rows("gn", seed, [0.85])]
    one = runs_from_rows(out)
    assert set(_axes_by_title(plots.curves(summarize(one, ["bn", "gn"], "bn", METRICS["test_acc"]), one))) == {
        "training loss", "validation loss"}


def test_curves_of_your_own_code_use_its_epochs_and_metrics(monkeypatch):
    """A program's own metrics, at its own epoch numbers (its epoch 0 stays 0), and no panel for a
    learning rate it did not report."""
    pytest.importorskip("matplotlib")
    _figure(monkeypatch)
    out = [{"norm": norm, "seed": seed, "status": "ok", "params": 10, "epoch": epoch, "cell": {}, "tuned": {},
            "phase": "compare", "trainer": "command", "threads": 1, "host": "h",
            "val_f1": 0.5 + 0.1 * epoch + 0.01 * seed, "test_f1": 0.4 + 0.1 * epoch}
           for norm in ("bn", "gn") for seed in range(3) for epoch in range(3)]
    runs = runs_from_rows(out)
    summary = summarize(runs, ["bn", "gn"], "bn", metric_named("test_f1:max"), margin=0.01)
    fig = plots.curves(summary, runs, own_code=True)
    axes = _axes_by_title(fig)
    assert set(axes) == {"val_f1", "test_f1"}
    for ax in axes.values():
        assert [list(line.get_xdata()) for line in ax.lines] == [[0, 1, 2], [0, 1, 2]]
        assert ax.get_xlabel() == "epoch"
    assert "at its epoch numbers" in fig._suptitle.get_text()


def test_a_last_epoch_cut_short_by_a_step_budget_ends_early_on_the_step_axis(monkeypatch):
    pytest.importorskip("matplotlib")
    _figure(monkeypatch)
    out = [r for seed in range(3) for r in rows("bn", seed, [0.7, 0.8]) + rows("gn", seed, [0.75, 0.85])]
    runs = runs_from_rows(out)
    logs = {plots.run_key(r): [(s, 0 if s <= 50 else 1, 1.0 / s, 0.1) for s in range(1, 71)] for r in runs}
    axes = _axes_by_title(plots.curves(summarize(runs, ["bn", "gn"], "bn", METRICS["test_acc"]), runs, logs))
    loss = axes["training loss per step"]
    assert loss.get_xlim() == (0.0, pytest.approx(1.4))  # 50 steps an epoch: 70 steps are 1.4 epochs


def _stage_summary() -> Summary:
    """bnn ~2.3 points under bn; without its noise back at bn, without its power transform still under."""
    values = {"bn": [95.0, 96.0, 95.5, 94.8, 95.9], "bnn": [92.6, 93.9, 93.1, 92.4, 93.5],
              "bn+nn(noise=0.0)": [94.9, 96.1, 95.3, 94.9, 95.7],
              "bn+nn(lambda_min=1.0,lambda_max=1.0)": [92.9, 93.8, 93.4, 92.2, 93.6]}
    out = [row for norm, accs in values.items() for seed, a in enumerate(accs)
           for row in rows(norm, seed, [0.5, a / 100])]
    return summarize(runs_from_rows(out), ["bn", "bnn"], "bn", METRICS["test_acc"])


def test_stage_ablations_show_their_table_and_the_attribution_normkit_report_prints():
    from normkit_lab.analysis.ablations import attribution

    summary = _stage_summary()
    text = page(summary)
    section = text.split("<h2>Stage ablations</h2>", 1)[1].split("<h2>", 1)[0]
    noise, transform = summary.ablations
    assert "Holm-adjusted over the ablations' 4 tests" in section
    assert '<td class="l">noise: bn+nn(noise=0.0)</td>' in section
    assert f"<td class=\"\">{-noise.effect.mean:+.2f}</td>" in section and '<td class="l">hurts</td>' in section
    assert '<td class="l v-equivalent">equivalent</td>' in section  # without its noise, bnn is bn again
    verdict = summary.rows[1].verdict
    for test in (noise, transform):
        line = attribution(test, verdict, "bn", "%")
        assert f"<li>{html.escape(line)}</li>" in section
    assert "noise carries the difference" in section
    assert "<h2>Stage ablations</h2>" not in page(comparison()[0])  # no --ablate: no section


def test_table_shows_steps_and_cpu_seconds_beside_wall_seconds():
    out = []
    for norm, cpu in (("bn", 0.8), ("ln", 1.3)):
        for seed in range(3):
            out += [r | {"steps": 250 * (r["epoch"] + 1), "cpu_time_s": cpu, "epoch_time_s": 2.5}
                    for r in rows(norm, seed, [0.5, 0.8 + 0.01 * seed])]
    summary = summarize(runs_from_rows(out), ["bn", "ln"], "bn", METRICS["test_acc"])
    table = page(summary).split("<h2>Table</h2>", 1)[1].split("</table>", 1)[0]
    heads = re.findall(r"<th[^>]*>([^<]*)</th>", table)
    assert heads[heads.index("steps"):heads.index("samples/s")] == ["steps", "s/epoch", "CPU s/epoch"]
    body = re.findall(r"<tr>(.*?)</tr>", table)[1:]
    cells = [re.findall(r"<td[^>]*>([^<]*)</td>", row) for row in body]
    at = heads.index("steps")
    assert [c[at:at + 3] for c in cells] == [["500", "2.50", "0.80"], ["500", "2.50", "1.30"]]


def test_environment_names_vector_instructions_threads_and_load_at_start_and_end():
    summary, _ = comparison()
    env = {"device": "cpu", "cpu": "Intel(R) Xeon(R) Processor", "vector_isa": {"cpu": "AVX-512", "torch": "AVX512"},
           "usable_cores": 2, "threads_per_run": 1, "load_average_start": [7.21, 8.0, 8.5],
           "load_average_end": [9.1, 8.7, 8.6]}
    text = page(summary, environment=env)
    assert "vector instructions AVX-512 (torch&#x27;s kernels use AVX512)</p>" in text
    assert ("<p>Load: 1 torch thread per run; 2 usable cores; load average (1, 5, 15 min) when the runs started "
            "7.21, 8.00, 8.50; load average (1, 5, 15 min) when the first session of runs ended 9.10, 8.70, "
            "8.60</p>") in text
    older = page(summary, environment={"device": "cpu", "cpu": "x", "load_average_start": [None, None, None]})
    assert "<p>Load:" not in older and "vector instructions" not in older  # nothing recorded: nothing claimed


def test_the_no_figures_hint_names_an_install_that_resolves():
    """normkit-lab is on no package index, so `pip install normkit-lab[plots]` cannot work: name matplotlib."""
    assert plots.PLOTS_HINT == "install matplotlib for plots (pip install matplotlib)"
