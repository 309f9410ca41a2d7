"""`normkit reproduce`: --list, planning and dry runs (fast), bad input (one line, exit 2), and one slow
run per installed preset at reduced seeds that checks the machinery end to end."""

from __future__ import annotations

import html
import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

import normkit
from normkit.testing import temporary_plugin
from normkit_cli.app import app

runner = CliRunner()
OUTCOMES = ("reproduced", "below margin", "not reproduced", "not attributed", "inconclusive", "supported",
            "not supported")
TINY = {
    "title": "tiny", "claim": "gn matches bn on digits", "citation": {"paper": "a paper", "where": "Table 9"},
    "hypotheses": [{"name": "gn-vs-bn", "test": "difference", "norm": "gn", "baseline": "bn",
                    "metric": "test_acc", "direction": "better", "margin": 0.5}],
    "scales": {"cpu": {"config": {"dataset": "digits", "norms": "bn,gn", "epochs": 1, "seeds": 3,
                                  "model_params": {"depth": 1},
                                  "batch_size": 256}, "expected_runtime_s": 5},
               "paper": {"config": {"norms": "bn,gn", "model": "resnet18", "dataset": "cifar10", "epochs": 200,
                                    "device": "cuda"}, "expected_runtime": "a day"}},
}


class Shipper:
    """A third-party plugin that ships one preset file."""

    def __init__(self, path: Path, name: str = "tiny-demo") -> None:
        self.path, self.name = path, name

    @normkit.hookimpl
    def normkit_register_presets(self, register):
        register(self.name, self.path)


def _one_line_error(result, needle: str) -> None:
    assert result.exit_code == 2, (result.exit_code, result.output)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], result.stderr
    assert "Traceback" not in result.output


def test_list_shows_every_preset_with_its_source() -> None:
    result = runner.invoke(app, ["reproduce", "--list"])
    assert result.exit_code == 0, result.output
    for name in ("proxynorm-random-net-collapse", "proxynorm-pn-rescues-ln", "proxynorm-bn-pn-equivalent",
                 "proxynorm-small-batch", "normalnorm-gaussianity-robustness", "normalnorm-noise-ablation",
                 "gpt-postnorm", "normfree-optimizer"):
        assert name in result.output
    assert "source: Labatie" in result.output and "extension" in result.output
    lines = result.output.splitlines()
    assert lines[0].split() == ["preset", "label", "cpu", "runtime", "scales", "claim"]
    assert any(line.startswith("gpt-postnorm") and "reproduction+prediction" in line for line in lines)
    legend = "\n".join(lines[-3:])
    assert "paper scale: the preset also carries the paper's recipe" in legend and "cpu only: there is no" in legend
    assert "extension = one it states or expects" in legend and "prediction = normkit's own" in legend


def test_dry_run_prints_the_plan_and_trains_nothing(tmp_path) -> None:
    result = runner.invoke(app, ["reproduce", "proxynorm-bn-pn-equivalent", "--dry-run", "--seeds", "3"])
    assert result.exit_code == 0, result.output
    out = result.output
    assert "claim: Adding PN after BN" in out and "Table 2" in out
    assert "small-cnn on digits, norms bn, bn+pn, 3 seeds, 3 epochs: 6 runs" in out
    assert "pn-adds-nothing-to-bn [equivalence, reproduction]: bn+pn equivalent to bn on test_acc within ±0.5" in out
    assert "dry run passed: nothing was trained" in out


def test_paper_dry_run_without_the_dataset_is_one_line(tmp_path) -> None:
    result = runner.invoke(app, ["reproduce", "normalnorm-gaussianity-robustness", "--scale", "paper", "--dry-run",
                                 "--data-dir", str(tmp_path)])
    _one_line_error(result, "dry run: dataset 'cifar10' not found in")
    assert "resnet18 on cifar10" in result.stdout and "200 epochs" in result.stdout


@pytest.mark.parametrize("args, needle", [
    (["reproduce", "no-such-preset"], "unknown preset 'no-such-preset'"),
    (["reproduce", "proxynorm-small-batch", "--scale", "paper"], "has no --scale paper; it has: cpu"),
    (["reproduce", "proxynorm-small-batch", "--scale", "gpu"], "--scale must be cpu or paper"),
    (["reproduce", "proxynorm-small-batch", "--seeds", "x"], "seeds must be a count"),
    (["reproduce", "proxynorm-small-batch", "--list"], "--list lists every preset"),
    (["reproduce", "proxynorm-random-net-collapse", "--data-dir", "/tmp"], "builds random nets"),
])
def test_bad_input_is_one_line(args, needle) -> None:
    _one_line_error(runner.invoke(app, args), needle)


def test_a_bad_preset_file_is_one_line(tmp_path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({**TINY, "hypotheses": [{**TINY["hypotheses"][0], "direction": "sideways"}]}))
    with temporary_plugin(Shipper(path, "bad-demo"), "shipper"):
        _one_line_error(runner.invoke(app, ["reproduce", "bad-demo", "--dry-run"]),
                        "needs direction better or worse, not 'sideways'")
    path.write_text("title: [unclosed\n")
    with temporary_plugin(Shipper(path, "broken-demo"), "shipper"):
        _one_line_error(runner.invoke(app, ["reproduce", "broken-demo"]), "is not valid YAML")


RANDOM = {
    "title": "tiny random net", "claim": "ln collapses", "citation": {"paper": "a paper", "where": "Figure 7"},
    "kind": "random-net",
    "hypotheses": [{"name": "ln-collapses", "test": "diagnostic", "measure": "dataset_share", "depth": 4,
                    "norm": "ln", "baseline": "bn", "direction": "higher", "margin": 0.1}],
    "scales": {"cpu": {"config": {"norms": "bn,ln", "depth": 4, "width": 8, "batch": 4, "image_size": 4,
                                  "seeds": 3}, "expected_runtime_s": 1}},
}


def test_a_random_net_preset_runs_here_with_the_claim_beside_the_outcome(tmp_path) -> None:
    path = tmp_path / "rn.yaml"
    path.write_text(yaml.safe_dump(RANDOM))
    with temporary_plugin(Shipper(path, "rn-demo"), "shipper"):
        result = runner.invoke(app, ["reproduce", "rn-demo", "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    last = result.output.strip().splitlines()[-1]
    assert last.startswith("ln-collapses: ") and last.split(": ", 1)[1].startswith(OUTCOMES)
    assert "3 nets" in last and "dataset share at depth 4" in last
    data = json.loads((tmp_path / "out/reproduction.json").read_text())
    assert data["hypotheses"][0]["line"] == last and data["seeds"] == 3
    page = (tmp_path / "out/report.html").read_text()
    assert "ln collapses" in page and "Figure 7" in page and data["hypotheses"][0]["outcome"] in page
    # the per-net values are stored, so the statistic is recomputed from the files alone
    from normkit_lab.reproduce import load_preset
    from normkit_lab.reproduce.outcomes import judge_random_net

    per_net = json.loads((tmp_path / "out/random_net.json").read_text())["per_net"]
    assert sorted(per_net) == ["bn", "ln"] and len(per_net["ln"]) == 3 and len(per_net["ln"][0]) == 4
    with temporary_plugin(Shipper(path, "rn-demo"), "shipper"):
        again = judge_random_net(load_preset("rn-demo").hypotheses, per_net)
    assert [o.line() for o in again] == [h["line"] for h in data["hypotheses"]]


@pytest.mark.slow
def test_a_third_party_preset_runs_and_ends_with_one_line_per_hypothesis(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(TINY))
    with temporary_plugin(Shipper(path), "shipper"):
        listed = runner.invoke(app, ["reproduce", "--list"])
        assert "tiny-demo" in listed.output
        result = runner.invoke(app, ["reproduce", "tiny-demo", "--out", "runs/tiny"])
    assert result.exit_code == 0, result.output
    last = result.output.strip().splitlines()[-1]
    assert last.startswith("gn-vs-bn: ") and last.split(": ", 1)[1].startswith(OUTCOMES)
    data = json.loads((tmp_path / "runs/tiny/reproduction.json").read_text())
    assert data["preset"] == "tiny-demo" and data["hypotheses"][0]["line"] == last
    page = (tmp_path / "runs/tiny/report.html").read_text()
    assert page.index('id="reproduction"') < page.index("<h2>Verdicts</h2>")
    assert "gn matches bn on digits" in page and "Table 9" in page


@pytest.mark.slow
@pytest.mark.parametrize("name, seeds", [
    ("proxynorm-random-net-collapse", "3"), ("proxynorm-pn-rescues-ln", "3"), ("proxynorm-bn-pn-equivalent", "3"),
    ("proxynorm-small-batch", "3"), ("normalnorm-gaussianity-robustness", "3"), ("normalnorm-noise-ablation", "3"),
    ("gpt-postnorm", "3"),
])
def test_each_preset_runs_at_reduced_seeds(tmp_path, name, seeds) -> None:
    """The machinery end to end (outcomes at full seeds are in docs/reproduce.md): every hypothesis gets one
    of the three outcomes, reproduction.json and report.html hold them beside the claim."""
    from normkit_lab.reproduce import load_preset

    preset = load_preset(name)
    result = runner.invoke(app, ["reproduce", name, "--seeds", seeds, "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()[-len(preset.hypotheses):]
    for h, line in zip(preset.hypotheses, lines, strict=True):
        assert line.startswith(f"{h.name}: ") and line.split(": ", 1)[1].startswith(OUTCOMES), line
    data = json.loads((tmp_path / "out/reproduction.json").read_text())
    assert [h["name"] for h in data["hypotheses"]] == [h.name for h in preset.hypotheses]
    assert html.escape(preset.claim[:40]) in (tmp_path / "out/report.html").read_text()  # as the page escapes it
