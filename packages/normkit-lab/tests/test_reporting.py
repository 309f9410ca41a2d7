"""The pieces of the user's-own-code trainers that need no program: reported lines, commands, metrics."""

from __future__ import annotations

import io
import math
from pathlib import Path

import pytest

from normkit_lab.errors import ConfigError
from normkit_lab.metrics import metric_named, metric_spec
from normkit_lab.reporting import ReportError, check_record, parse_line, report_metrics
from normkit_lab.runs.template import CommandTemplate


def test_report_metrics_prints_one_checked_line() -> None:
    out = io.StringIO()
    report_metrics(epoch=3, val_acc=0.971, test_acc=0.968, file=out)
    assert out.getvalue() == 'normkit: {"epoch": 3, "val_acc": 0.971, "test_acc": 0.968}\n'
    assert parse_line(out.getvalue()) == {"epoch": 3, "val_acc": 0.971, "test_acc": 0.968}
    with pytest.raises(ReportError, match="finite"):
        report_metrics(epoch=0, val_loss=math.inf, file=out)


@pytest.mark.parametrize(("values", "previous", "message"), [
    ([1, 2], None, "JSON list, not an object"),
    ({"epoch": -1, "acc": 1.0}, None, "epoch -1"),
    ({"epoch": 2, "acc": 1.0}, 2, "epoch 2 after epoch 2"),
    ({"epoch": 0, "acc": "high"}, None, "acc='high'"),
    ({"epoch": 0, "acc": True}, None, "acc=True"),
    ({"epoch": 0, "acc": None}, None, "acc=None"),
    ({"epoch": 0, "seed": 1.0}, None, "a column of runs.jsonl"),
    ({"epoch": 0, "test acc": 1.0}, None, "identifiers"),
    ({"epoch": 0, "test_acc": 96.8}, None, r"fractions in \[0, 1\] \(report 0.968\), or say the program reports "
                                           r"percent: --metric test_acc:percent"),
    ({"epoch": 0, "params": 1.5}, None, "parameter count"),
    ({"epoch": 0, "test_acc": 1.0000001}, None, r"test_acc=1.0000001 at epoch 0; accuracies are fractions in "
                                                r"\[0, 1\]; report a value in that range"),  # not rounded to 1
    ({"epoch": 0, "test_acc": -1e-9}, None, r"test_acc=-1e-09 at"),
])
def test_a_bad_record_is_refused_with_what_is_wrong(values: object, previous: int | None, message: str) -> None:
    with pytest.raises(ReportError, match=message):
        check_record(values, previous)


def test_epochs_default_to_the_next_one_and_other_lines_are_not_parsed() -> None:
    assert check_record({"acc": 1}, None).epoch == 0
    assert check_record({"acc": 1}, 4).as_dict() == {"epoch": 5, "acc": 1.0}
    assert parse_line("epoch 3: loss 0.1") is None
    with pytest.raises(ReportError, match="not `normkit: ` followed by one JSON object"):
        parse_line("normkit: {epoch: 3}")


def test_a_command_splits_before_its_placeholders_are_filled(tmp_path: Path) -> None:
    template = CommandTemplate.parse("python 'my train.py' --norm {norm} --tag x{{y}} --width={cell.width}")
    assert template.fields() == ["norm", "cell.width"]
    template.check({"width": [1]}, {}, tmp_path)
    argv = template.argv({"norm": "gn(groups=8)+pn; rm -rf /", "cell.width": 64})
    assert argv == ["python", "my train.py", "--norm", "gn(groups=8)+pn; rm -rf /", "--tag", "x{y}", "--width=64"]
    (tmp_path / "my train.py").write_text("print(1)\n")
    (tmp_path / "cfg.yaml").write_text("a: 1\n")
    hashes = CommandTemplate.parse("python 'my train.py' --config=cfg.yaml {norm}").named_files(tmp_path)
    assert sorted(hashes) == ["cfg.yaml", "my train.py"]


def test_a_programs_own_metric_carries_its_direction() -> None:
    f1 = metric_named("test_f1:max")
    assert (f1.field, f1.higher_is_better, f1.select_by, f1.scale, f1.unit) == ("test_f1", True, "val_f1", 1.0, "")
    assert metric_spec("test_wer:min") == "test_wer:min" and metric_spec("test_loss:min") == "test_loss"
    with pytest.raises(ConfigError, match="higher is better; drop the :min"):
        metric_named("test_acc:min")
    with pytest.raises(ConfigError, match="must end in :max"):
        metric_named("f1:up")


def test_the_caption_of_a_command_comparison_names_the_command_not_normkits_recipe() -> None:
    from normkit_lab.analysis.caption import caption
    from normkit_lab.study.config import build_config

    config = build_config({"norms": "bn,bnn", "command": "python train.py --norm {norm}",
                           "tune": {"lr": [0.01, 0.1]}}).to_dict()
    text = caption(config, seeds=5, comparisons=1, baseline="bn")
    assert text.startswith("Shows: `python train.py --norm {norm}` (its own model, data and recipe), lr tuned per "
                           "norm on validation over 0.01, 0.1, 5 seeds paired by seed; the final epoch's test_acc")
    assert "small-cnn" not in text and "batch of" not in text and "--tune lr" not in text
